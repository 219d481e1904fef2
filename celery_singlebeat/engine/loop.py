"""The engine: one replica's tick, as the ordered list of its steps.

Each tick, every replica computes the slots that are due (the same instants on
every replica, see :mod:`..slots`), asks the database to claim all of them in
one statement, publishes the ones it won with a deterministic task id and the
slot in a header, and confirms them in a second statement. A replica that dies
between claim and confirm leaves an abandoned claim; any replica takes it over
once its lease has run out and publishes it again with the same task id.

The steps live in modules of their own (CONTRIBUTING.md has the map); this
module orders them and decides how long to sleep. It knows nothing of Celery's
``Scheduler`` class: the adapter (:mod:`..scheduler`) builds it, hands it the
entry sources, calls :meth:`Engine.tick` and reports outages. Nor does it know
any kind of source (``beat_schedule``, stored schedules): what differs between
them is said by the :class:`~celery_singlebeat.sources.EntrySource` interface,
and what the host stops on a fatal error is a callable it passes in.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from ..config import Settings
from ..exceptions import SchemaError, StoreUnavailable
from ..observe.telemetry import NOTHING, Telemetry
from ..sources import EntryDefinition, EntrySource
from ..store.base import Store
from ..timeline.clock import US
from .agenda import Agenda, Tracked
from .claiming import Claiming
from .context import ReplicaContext
from .controls import Controls
from .environment import Environment
from .feed import Feed
from .heartbeat import Membership
from .hold import Hold
from .outage import Outage
from .ownership import HeldSlots
from .sending import Sending
from .sharing import FALLBACK_DELAY_US
from .takeover import Takeover
from .upkeep import Upkeep
from .watch import SourceWatch

logger = logging.getLogger("celery_singlebeat.scheduler")

#: up to this many seconds added to each sleep. Replicas wake for a slot at the
#: instant their estimate of the database clock reaches it, so without jitter the
#: replica whose estimate runs furthest ahead (a fraction of a millisecond) wins
#: every slot and the others never send; a few ms more than the estimates differ
#: lets every replica win its share, at the cost of sending up to that much later.
WAKE_JITTER = 0.01

#: while a replica listens for control changes (PostgreSQL), it sleeps at most
#: this long between ticks, so that it acts on one within a second of its
#: commit; an idle tick that hears nothing sends no statement.
LISTEN_POLL_S = 0.5


def _carry_on(error: BaseException) -> None:
    """A host with nothing to stop besides the engine: the error is raised."""


class Engine:
    """One replica's engine: its steps, their shared state, and the tick."""

    def __init__(
        self,
        settings: Settings,
        *,
        env: Environment,
        telemetry: Telemetry,
        open_store: Callable[[], Store],
        app: Any,
        producer: Callable[[], Any],
        default_tz: Any,
        max_interval: float,
        signal_sender: Any = None,
        fatal: Callable[[BaseException], object] = _carry_on,
    ) -> None:
        """``fatal`` is called with an error that retrying cannot mend (a
        schema that does not match), before the engine raises it: the Celery
        adapter stops the ``celery worker -B`` that hosts this beat, if any
        (:func:`celery_singlebeat.beat.embedded.stop_worker`). By default
        nothing is done beyond raising."""
        ctx = ReplicaContext(settings, env, telemetry, signal_sender)
        self.ctx = ctx
        self._open_store = open_store
        self._fatal = fatal
        self.max_interval = max_interval
        self.agenda = Agenda(settings.replica_id, settings.missed, default_tz)
        # one watch for the engine's life: the steps below keep its methods,
        # and the host's sources come to it later (use_sources)
        self.watch = SourceWatch(ctx, self.agenda)
        self.hold = Hold(ctx)
        self.controls = Controls(ctx)
        self.feed = Feed(ctx, self.controls)
        self.held = HeldSlots()
        self.membership = Membership(ctx, self.agenda, self.watch.uncatalogued)
        self.claiming = Claiming(
            ctx, self.agenda, self.hold, self.controls, self.held, self.watch.written
        )
        self.takeover = Takeover(ctx, self.held, self.watch.read_up_to)
        self.sending = Sending(
            ctx, self.agenda, self.held, self.hold, app, producer, self.watch.written_back
        )
        self.upkeep = Upkeep(ctx)
        self.outage = Outage(ctx)
        self.ready = False
        #: when to sweep next (monotonic): heartbeat, then takeover
        self.next_sweep = 0.0

    # -- public seams (tests, the simulation, the benchmarks) ---------------------

    @property
    def store(self) -> Store | None:
        """The store, once connected."""
        return self.ctx.store

    @property
    def stats(self) -> dict[str, int]:
        return self.ctx.stats

    @property
    def sweep_every(self) -> float:
        """Seconds between sweeps (and heartbeats): a third of the lease."""
        return self.ctx.sweep_every

    @property
    def tracked(self) -> dict[str, Tracked]:
        """Entry name -> how this replica tracks it (next slot, whether it is first)."""
        return self.agenda.tracked

    @property
    def live(self) -> tuple[str, ...]:
        """The live replicas this replica last dealt the entries among."""
        return self.agenda.live

    def entries(self) -> dict[str, EntryDefinition]:
        """Every entry by name: as loaded until the first connect, then as tracked."""
        if self.ready:
            return dict(self.agenda.definitions)
        return {d.name: d for d in self.watch.load()}

    def sweep_now(self) -> None:
        """Make the next tick sweep (heartbeat, takeover) whatever the time."""
        self.next_sweep = 0.0

    def periodic_marks(self) -> tuple[float, float, float]:
        """When the next sweep, share check and prune are due (monotonic): a
        tick that changed them did periodic work besides sending. The feed read
        (about once a second) is counted apart: :attr:`feed`'s ``reads``."""
        return (self.next_sweep, self.membership.next_share, self.upkeep.next_prune)

    def use_sources(self, sources: Sequence[EntrySource]) -> None:
        """The sources of this replica's entries, as the host builds them (the
        Celery adapter: ``beat_schedule``'s, those given by hand, the stored
        schedules unless ``singlebeat_schedules`` is off), loaded at the first
        connect. The engine knows each only through the
        :class:`~celery_singlebeat.sources.EntrySource` interface; two with one
        label are a ConfigurationError."""
        self.watch.follow(sources)

    def connected_store(self) -> Store:
        """The store, for a source that reads it (the engine asks a source
        for its changes only while connected)."""
        return self.ctx.connected_store

    def load_sources(self) -> int:
        """Load every source now (a name in two sources stops beat at start-up);
        how many entries they have."""
        return len(self.watch.load())

    # -- connecting --------------------------------------------------------------

    def connect(self) -> None:
        """Check the schema, register the entries, publish the catalog (first tick)."""
        ctx = self.ctx
        if ctx.store is None:
            store = self._open_store()
            if ctx.telemetry is not NOTHING:
                # each statement's time and outcome: latency metrics, readiness
                store.on_round_trip = ctx.telemetry.round_trip
            ctx.store = store
        store = ctx.store
        try:
            store.prepare(ctx.settings.create_schema)
        except SchemaError as exc:
            # Not an outage: retrying cannot help, so stop the process loudly.
            logger.critical("singlebeat: %s", exc)
            self._fatal(exc)
            raise
        definitions = self.watch.load()
        names = [d.name for d in definitions]
        states = store.register(names, ctx.replica_id)
        self.watch.registered.add(names, ctx.env.monotonic())
        clock = store.clock
        now_us = clock.now_us()
        if self.membership.started_us is None:
            self.membership.started_us = now_us
        agenda = self.agenda
        agenda.clear()
        for definition in definitions:
            agenda.track(definition, states[definition.name], now_us)
        self.watch.tracked()
        self.membership.publish_catalog()
        self.controls.read()
        # After an outage, keep sharing among the replicas seen before it.
        agenda.share(agenda.live or (ctx.replica_id,), force=True)
        self.ready = True
        ctx.telemetry.schema_ready()
        logger.info(
            "singlebeat: connected to %s; database clock offset %+.1f ms; %d entries tracked",
            ctx.settings.safe_url,
            clock.offset_us / 1000,
            len(agenda.tracked),
        )

    # -- the tick ----------------------------------------------------------------

    def tick(self) -> float:
        """One pass of the loop; returns how long to sleep before the next.

        The order, and why:

        1. a commit heard (PostgreSQL's LISTEN): read the feed within the tick;
        2. after a broken connection, before anything is decided: write back
           the catalog, the heartbeat and what this replica sent, then hold
           (a promoted standby may lack them; the others do the same);
        3. confirm what an outage left published but unrecorded, before any
           sweep: our own takeover would otherwise publish it again;
        4. the feed (about once a second): a control change makes this tick
           sweep; a sweep due before the next read comes now instead, since
           its heartbeat reads the same versions;
        5. the sweep's heartbeat, or a sooner read of the live replicas when
           the views differed;
        6. the entries' changes from their sources, after every read of the
           versions and before anything is planned, so that no claim follows
           a definition older than the last read; then the sweep's takeover
           (not during the hold), which may take a run-now request of an
           entry the watch has just added;
        7. the prune, when its turn comes round;
        8. the claim of what is due, then sending and confirming it;
        9. the sleep: until the next slot of either heap, the hold's end, the
           next sweep, the next feed read, or the next listen poll.
        """
        ctx = self.ctx
        store = ctx.connected_store
        env = ctx.env
        self.hold.tick_us = store.clock.now_us()
        monotonic = env.monotonic()
        heard = self.controls.listening and self.controls.heard(
            monotonic, self.outage.since is not None
        )
        if self.hold.interrupted():
            self._after_interruption()
        self.sending.confirm_pending()
        if self.feed.due(monotonic, heard):
            if self.next_sweep - monotonic < self.feed.every():
                # the sweep would come before the next read: sweep now, its
                # heartbeat reads the same two versions (one statement, not two)
                self.next_sweep = monotonic
            elif self.feed.read(monotonic):
                # the pauses are read; a run-now request is a row the sweep takes
                self.next_sweep = 0.0
        sweeping = monotonic >= self.next_sweep
        if sweeping:
            self.next_sweep = monotonic + ctx.sweep_every
            self.membership.beat(monotonic)
            self.feed.read_elsewhere(monotonic)
            self.controls.changed()
        elif monotonic >= self.membership.next_share:
            self._beat(monotonic)
        touched = self.watch.poll(store.clock.now_us())
        if touched:
            self.membership.publish_catalog(touched)
        # The heartbeat has just counted the claimed rows of the whole store:
        # with none, nothing can be abandoned (a row abandoned now was claimed
        # then), and the takeover statement is skipped. Idle, that halves what a
        # sweep costs. After the watch: a run-now request of an entry added
        # since the last tick is one this replica can send.
        if sweeping and store.open_claims != 0 and not self.hold.holding(monotonic):
            self.sending.send(*self.takeover.take_over())
        if self.upkeep.due(monotonic):
            self.upkeep.prune(monotonic)
        claimed = self.claiming.claim_due()
        if claimed is not None:
            if claimed.lost_own_share:
                self.membership.recheck_soon()
            self.sending.send(claimed.won, claimed.started, claimed.taken)
            if self.controls.changed():
                self.next_sweep = 0.0
        self.watch.apply_deferred(store.clock.now_us())
        return self._sleep()

    def _beat(self, monotonic: float) -> None:
        """The heartbeat outside a sweep: a control change it brings back makes
        the next tick sweep (a run-now request is a row a sweep takes)."""
        self.membership.beat(monotonic)
        self.feed.read_elsewhere(monotonic)
        if self.controls.changed():
            self.next_sweep = 0.0

    def _after_interruption(self) -> None:
        if self.hold.first_connection():
            return
        seen = self.ctx.connected_store.interruptions
        # What the others need of this replica may be gone: its replica row and
        # its catalog are pruned once it is unseen for the retention (a cut
        # longer than that), and a promoted standby may lack them. While no live
        # replica's catalog lists an entry, run-now and pause of it are refused.
        # Both are written again first; idempotent, and a break is rare.
        self.membership.publish_catalog()
        self._beat(self.ctx.env.monotonic())
        # a promoted standby may lack the entries registered lately, and the
        # last changes of the sources kept in the database (and reuse their
        # revision numbers): register those again, read these again
        self.watch.register_again()
        self.watch.reconnected()
        self.hold.begin(self.sending.unconfirmed, seen)

    def _sleep(self) -> float:
        ctx = self.ctx
        env = ctx.env
        agenda = self.agenda
        now_us = ctx.connected_store.clock.now_us()
        delay = self.max_interval
        first_us = agenda.top_us(agenda.first)
        if first_us is not None:
            delay = min(delay, (first_us - now_us) / US)
        later_us = agenda.top_us(agenda.later)
        if later_us is not None:
            later = (later_us + FALLBACK_DELAY_US - now_us) / US
            # held after a broken connection: the fallbacks wake when it ends,
            # the entries this replica proposes first keep their own time
            delay = min(delay, max(later, self.hold.until - env.monotonic()))
        if self.hold.recover:
            # the slots to propose again go out as the hold ends (Hold.recovery)
            delay = min(delay, self.hold.until - env.monotonic())
        delay = min(delay, self.next_sweep - env.monotonic(), self.feed.next_read - env.monotonic())
        if self.controls.listener is not None:
            delay = min(delay, LISTEN_POLL_S)
        return max(delay, 0.0) + env.random.uniform(0.0, WAKE_JITTER)

    # -- outages and the end -------------------------------------------------------

    def answered(self) -> None:
        """The tick reached the database."""
        self.hold.answering = True
        self.outage.answered()

    def broke(self) -> None:
        """A statement failed: the connection broke (or stayed broken)."""
        self.hold.broke()

    def close(self) -> None:
        """Stop listening, mark this replica stopped (a graceful stop: operators
        see it gone at once, not "not seen since"), close the store."""
        ctx = self.ctx
        self.controls.close()
        store = ctx.store
        if store is not None and self.ready:
            try:
                store.stopped(ctx.replica_id)
            except StoreUnavailable as exc:
                logger.warning("singlebeat: could not mark replica stopped: %s", exc)
        if store is not None:
            store.close()
            ctx.store = None
            self.ready = False


__all__ = ["LISTEN_POLL_S", "WAKE_JITTER", "Engine"]
