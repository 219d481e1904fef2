"""``SingleBeatScheduler``: run ``celery beat`` in every pod, send each run once.

Each tick, every replica computes the slots that are due (same instants on
every replica, see :mod:`.slots`), asks the database to claim all of them in
one statement, publishes the ones it won with a deterministic task id and the
slot in a header, and confirms them in a second statement. A replica that dies
between claim and confirm leaves an abandoned claim; any replica takes it over
once its lease has run out and publishes it again with the same task id.

When the database cannot be reached the replica sends nothing at all: there is
no uncoordinated fallback. It logs once per outage, retries with backoff and
picks up by itself, applying the missed-run policy to what fell due meanwhile.
"""

from __future__ import annotations

import heapq
import logging
import os
import random
import socket
import time
from collections.abc import Set as AbstractSet
from dataclasses import replace
from functools import cached_property
from typing import Any

from celery.beat import ScheduleEntry, Scheduler, _evaluate_entry_args, _evaluate_entry_kwargs
from kombu.exceptions import OperationalError as KombuOperationalError

from . import catalog, decisions, signals
from ._version import __version__
from .clock import US, us_to_datetime
from .config import (
    DEFAULT_MAX_LOOP_INTERVAL,
    ENTRY_OPTIONS,
    Settings,
    parse_missed_policy,
    read_setting,
)
from .decisions import batch_fields, slot_fields, slot_text
from .embedded import stop_worker
from .exceptions import (
    ConfigurationError,
    ConnectionReplaced,
    ScheduleError,
    SchemaError,
    StoreUnavailable,
)
from .failover import SentJournal, hold_seconds
from .fatal import stop_beat
from .observers import check_for_scheduler, for_scheduler
from .publishing import PublishGroup, skip_declared
from .sharing import (
    FALLBACK_BATCH,
    FALLBACK_DELAY_US,
    FIRST_BATCH,
    SHARE_RECHECK,
    bucket_owners,
    entry_buckets,
    live_replicas,
)
from .slots import (
    SLOT_HEADER,
    KeptSpan,
    MissedPolicy,
    SlotSequence,
    plan_due,
    sequence_for,
    slot_header,
    slot_task_id,
)
from .stopping import stop_deferred
from .store.base import (
    EARLY_TOLERANCE_US,
    PAUSE_ALL,
    CatalogEntry,
    Claim,
    Pause,
    ReplicaInfo,
    SlotKey,
    Store,
)
from .store.schema import MAX_ENTRY_NAME
from .telemetry import NOTHING, Telemetry
from .timing import OUTAGE_BACKOFF_MAX_S

#: a child of "celery_singlebeat": configuring that logger still configures this one
logger = logging.getLogger("celery_singlebeat.scheduler")

#: ``options`` keys of a beat_schedule entry that configure us (never sent on).
ENTRY_OPTION_PREFIX = "singlebeat_"

#: how often one replica's turn to prune old slot rows comes round at most.
PRUNE_EVERY_US = 60 * US

#: how often one replica prunes the rows of replicas gone, at most (seconds)
FLEET_PRUNE_EVERY_S = 600.0

#: outage retry delays, in seconds: the first, doubling up to the cap. A failed
#: attempt costs a refused connection, so a short cap is cheap; it bounds how
#: long after the database is back the fleet resumes (a 10 s cap resumed 4.6 to
#: 8.2 s after 30 s outages in the chaos run, and the missed-run policy dropped
#: what fell due meanwhile).
BACKOFF_FIRST = 0.5
BACKOFF_MAX = OUTAGE_BACKOFF_MAX_S

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

#: ``_Tracked.won`` of an entry that won nothing ahead (nearly all): one shared
#: empty set instead of one per entry (216 bytes each).
_NOTHING_WON: frozenset[int] = frozenset()


class _Tracked:
    """An entry as this replica tracks it: its slot sequence and next slot.

    Ordered by ``(next_us, name)`` for the heaps. Slotted, with a shared empty
    ``won``: a replica tracks every entry of the schedule, and with 100,000
    entries that made the process's peak RSS 265 MB instead of 221 MB (together
    with a shared default policy and slotted sequences).
    """

    __slots__ = ("first", "name", "next_us", "policy", "sequence", "won")

    def __init__(
        self, next_us: int, name: str, sequence: SlotSequence, policy: MissedPolicy
    ) -> None:
        self.next_us = next_us
        self.name = name
        self.sequence = sequence
        self.policy = policy
        #: slots at or after ``next_us`` this replica already won: after a claim that
        #: refused some slots as early, the entry is planned again from before them.
        self.won: AbstractSet[int] = _NOTHING_WON
        #: whether this replica proposes the entry's slots first (sharing.py)
        self.first = True

    def __lt__(self, other: _Tracked) -> bool:
        if self.next_us != other.next_us:
            return self.next_us < other.next_us
        return self.name < other.name

    def __repr__(self) -> str:
        return f"_Tracked({self.name!r}, next_us={self.next_us})"


def _is_connection_error(exc: BaseException, producer: Any) -> bool:
    """True when ``exc`` says the broker cannot be reached (not a bad message)."""
    if isinstance(exc, KombuOperationalError):
        return True
    connection = getattr(producer, "connection", None)
    errors = getattr(connection, "connection_errors", ())
    return bool(errors) and isinstance(exc, tuple(errors))


class SingleBeatScheduler(Scheduler):  # type: ignore[misc]
    """A Celery beat scheduler whose replicas coordinate through a SQL database.

    Set ``beat_scheduler = "celery_singlebeat.SingleBeatScheduler"`` and
    ``singlebeat_url`` (any SQLAlchemy URL; default: a SQLite file in the working
    directory), then run ``celery beat`` in every pod.
    """

    #: sleep at most this long between ticks unless ``beat_max_loop_interval`` says otherwise.
    max_interval = DEFAULT_MAX_LOOP_INTERVAL.total_seconds()

    def __init__(self, app: Any, *args: Any, lazy: bool = False, **kwargs: Any) -> None:
        try:
            self._build(app, *args, lazy=lazy, **kwargs)
        except ConfigurationError as exc:
            stop_beat(exc)  # one line, not Celery's traceback (fatal.py)
            raise

    def _build(self, app: Any, *args: Any, lazy: bool, **kwargs: Any) -> None:
        loop = kwargs.get("max_interval") or app.conf.beat_max_loop_interval
        # Validated before anything else, also for the lazy instance celery beat
        # builds for its banner, so a bad setting stops the process at start-up.
        self.settings = Settings.from_conf(app.conf, max_loop_interval=loop)
        if not read_setting(app.conf, "singlebeat_replica_id"):
            # celery beat builds a lazy instance for its banner, then the real one:
            # hand the generated id on, or the banner names a replica that never runs.
            if lazy:
                app._singlebeat_banner_replica_id = self.settings.replica_id
            elif banner_id := app.__dict__.pop("_singlebeat_banner_replica_id", None):
                self.settings = replace(self.settings, replica_id=banner_id)
        self._store: Store | None = None
        self._tracked: dict[str, _Tracked] = {}
        #: entries this replica proposes first, and those it proposes after
        #: FALLBACK_DELAY_US (another live replica's), each by next slot
        self._heap: list[_Tracked] = []
        self._later: list[_Tracked] = []
        self._live: tuple[str, ...] = ()
        #: each entry's sharing bucket (sharing.py), hashed once
        self._buckets: dict[str, int] | None = None
        self._policies: dict[str, MissedPolicy] = {}
        self._ready = False
        self._outage_since: float | None = None
        self._backoff = BACKOFF_FIRST
        self._next_sweep = 0.0
        #: when to read the live replicas again (with each sweep, sooner when
        #: another replica claims slots this one proposes first: views differ)
        self._next_share = 0.0
        self._shared_at = 0.0
        self._sweep_every = max(0.5, self.settings.lease.total_seconds() / 3)
        self._next_prune = 0.0
        self._next_fleet_prune = 0.0
        self._unconfirmed: list[Claim] = []
        #: the slots confirmed lately, written again after a broken connection
        #: (failover.py); the store's interruption count last acted on (None:
        #: never connected, nothing to write again), and until when fallback
        #: proposals and sweeps wait for the other replicas to write theirs
        self._journal = SentJournal(self.settings.failover_window.total_seconds())
        self._interruptions_seen: int | None = None
        self._hold_until = 0.0
        #: when that hold began, on the database's clock: the fallback
        #: proposals it delayed are judged late or on time as of then
        #: (_judged_at), not as of its end
        self._held_since_us: int | None = None
        #: spans of slots a hold kept back until the connection broke again
        #: before they were proposed: judged as of that hold's start, however
        #: long the break (slots.plan_due's ``kept``); and whether the last
        #: tick reached the database (the next failure is then a new break)
        self._kept: list[KeptSpan] = []
        self._answering = False
        #: the database's clock (estimated) when the current tick began
        self._tick_us: int | None = None
        #: slots this replica may still hold in the store without working on them,
        #: so that winning one back is not mistaken for a takeover: key -> (fence
        #: it released them at, or None when a claim's answer was lost; when).
        self._held: dict[SlotKey, tuple[int | None, float]] = {}
        self._warned_unknown: set[str] = set()
        self._broker_down = False
        #: the database clock when this process first connected (its replica row)
        self._started_us: int | None = None
        self._first_count = 0
        #: the catalog this replica published, and when (monotonic)
        self._catalog: list[CatalogEntry] | None = None
        #: the control version last acted on, and the pauses it read then
        self._controls_seen: int | None = None
        self._pauses: dict[str, Pause] = {}
        self._listener: Any = None
        self._listen_retry_at = 0.0
        #: metrics and probes (telemetry.py); built with the real instance
        self.telemetry: Telemetry = self._make_telemetry(lazy)
        #: per-tick figures, read by benchmarks and tests.
        self.stats: dict[str, int] = {
            "claimed": 0,
            "lost": 0,
            "sent": 0,
            "taken_over": 0,
            "skipped": 0,
            "outages": 0,
            "paused": 0,
            "lost_writes": 0,
        }
        super().__init__(app, *args, lazy=lazy, **kwargs)
        if lazy:
            # Celery builds the lazy instance before it sets up logging: a bad entry
            # fails here as one plain traceback. Raised by the real instance, Celery
            # logs it, then re-prints it line by line through its stderr proxy.
            for name, fields in (app.conf.beat_schedule or {}).items():
                entry = self.Entry(**dict(fields, name=name, app=app))
                self._policy_of(name, entry)
                self._check_entry(name, entry)

    # -- Celery's Scheduler API -----------------------------------------------

    @property
    def info(self) -> str:
        return (
            f"    . singlebeat -> {self.settings.safe_url}\n"
            f"    . replica -> {self.settings.replica_id}"
        )

    def setup_schedule(self) -> None:
        super().setup_schedule()
        self._policies = {name: self._policy_of(name, e) for name, e in self.schedule.items()}
        for name, entry in self.schedule.items():
            self._check_entry(name, entry)
        logger.info(
            "singlebeat: replica %s coordinating %d entries through %s "
            "(lease %gs, missed-run policy %s, grace %gs)",
            self.settings.replica_id,
            len(self.schedule),
            self.settings.safe_url,
            self.settings.lease.total_seconds(),
            self.settings.missed.mode,
            self.settings.missed.grace_us / US,
        )

    def tick(self, *args: Any, **kwargs: Any) -> float:
        # A stop (SIGTERM, SIGINT) waits for the tick: cut between a claim and
        # its confirm it would delay or repeat those slots (stopping.py).
        try:
            with stop_deferred():
                if not self._ready:
                    self._connect()
                delay = self._tick()
        except ConnectionReplaced:
            # reconnected, maybe to a promoted standby: the next tick writes back
            # what this replica sent (failover.py) before it decides anything
            self._broke()
            self.telemetry.loop(time.monotonic())
            return 0.0
        except StoreUnavailable as exc:
            self._broke()
            delay = self._outage(exc)
            self.telemetry.loop(time.monotonic())
            return delay
        self._answering = True
        self.telemetry.loop(time.monotonic())
        if self._outage_since is not None:
            logger.warning(
                "singlebeat: database reachable again after %.1fs; sending resumes "
                "(missed-run policy %s applies to what fell due meanwhile)",
                time.monotonic() - self._outage_since,
                self.settings.missed.mode,
            )
            self._outage_since = None
            self._backoff = BACKOFF_FIRST
            self.telemetry.outage(False)
        return delay

    @cached_property
    def producer(self) -> Any:
        """The producer every publish goes through, connecting at its first use.

        Celery's own first waits for the broker in ``ensure_connection()``, up to
        ``broker_connection_max_retries`` (100) with a back-off growing to 30 s:
        a replica whose first publish comes during a broker outage would stall
        its loop for the outage (up to ~47 minutes), neither publishing nor
        releasing what it claimed nor proposing what falls due, which the
        missed-run policy then drops. Connected lazily, the first publish fails
        like any later one, after ``task_publish_retry_policy``.
        """
        return self.Producer(self.connection, auto_declare=False)

    def _make_telemetry(self, lazy: bool) -> Telemetry:
        """The hooks the settings ask for (metrics, probes), or none; the lazy
        (banner) instance only checks that they can be made, as it checks the
        settings, so that a port in use stops beat before its banner."""
        if lazy:
            check_for_scheduler(self.settings)
            return NOTHING
        return for_scheduler(self.settings)

    def sync(self) -> None:
        # Nothing to persist: every decision is already in the database.
        pass

    def close(self) -> None:
        try:
            super().close()
        finally:
            self.telemetry.close()
            if self._listener is not None:
                self._listener.close()
                self._listener = None
            if self._store is not None and self._ready:
                # a graceful stop: operators see it gone at once, not "not seen since"
                try:
                    self._store.stopped(self.settings.replica_id)
                except StoreUnavailable as exc:
                    logger.warning("singlebeat: could not mark replica stopped: %s", exc)
            if self._store is not None:
                self._store.close()
                self._store = None
                self._ready = False

    # -- set-up ----------------------------------------------------------------

    def _policy_of(self, name: str, entry: ScheduleEntry) -> MissedPolicy:
        options = entry.options or {}
        # A misspelt key would otherwise fall back to the default policy unnoticed.
        unknown = sorted(
            k for k in options if k.startswith(ENTRY_OPTION_PREFIX) and k not in ENTRY_OPTIONS
        )
        if unknown:
            raise ConfigurationError(
                f"beat_schedule[{name!r}].options: unknown option(s) {', '.join(unknown)}; "
                f"expected {', '.join(sorted(ENTRY_OPTIONS))}"
            )
        try:
            return parse_missed_policy(ENTRY_OPTION_PREFIX, options, self.settings.missed)
        except ConfigurationError as exc:
            raise ConfigurationError(f"beat_schedule[{name!r}].options: {exc}") from None

    def _check_entry(self, name: str, entry: ScheduleEntry) -> None:
        if len(name.encode()) > MAX_ENTRY_NAME:
            raise ConfigurationError(
                f"beat_schedule entry name {name[:40]!r}... is longer than "
                f"{MAX_ENTRY_NAME} bytes; shorten it"
            )
        try:
            # Ask for one instant: a schedule that cannot say when it runs next
            # (remaining_estimate not implemented) fails now, not at the first tick.
            sequence_for(entry.schedule, 0, self._tz_of(entry)).next_after(int(time.time() * US))
        except ScheduleError as exc:
            raise ConfigurationError(
                f"beat_schedule[{name!r}]: {exc}. Replicas can only agree on the runs of "
                "crontab, interval and solar schedules, or of a schedule whose "
                "remaining_estimate() says when it runs next"
            ) from None

    def _tz_of(self, entry: ScheduleEntry) -> Any:
        return getattr(entry.schedule, "tz", None) or self.app.timezone

    def _open_store(self) -> Store:
        from .store.sql import SqlStore

        store = SqlStore.from_settings(self.settings)
        store.stop_at_reconnect = True
        return store

    def _connect(self) -> None:
        """Check the schema and register the entries (first tick, or after an outage)."""
        if self._store is None:
            self._store = self._open_store()
            if self.telemetry is not NOTHING:
                # each statement's time and outcome: latency metrics, readiness
                self._store.on_round_trip = self.telemetry.round_trip
        try:
            self._store.prepare(self.settings.create_schema)
        except SchemaError as exc:
            # Not an outage: retrying cannot help, so stop the process loudly.
            logger.critical("singlebeat: %s", exc)
            stop_worker(exc)
            raise
        states = self._store.register(list(self.schedule), self.settings.replica_id)
        clock = self._store.clock
        now_us = clock.now_us()
        if self._started_us is None:
            self._started_us = now_us
        self._publish_catalog()
        self._read_controls()
        self._tracked.clear()
        for name, entry in self.schedule.items():
            state = states[name]
            sequence = sequence_for(entry.schedule, state.anchor_us, self._tz_of(entry))
            start = state.last_slot_us if state.last_slot_us is not None else now_us
            next_us = sequence.next_after(start)
            if next_us is None:
                continue
            self._tracked[name] = _Tracked(next_us, name, sequence, self._policies[name])
        # After an outage, keep sharing among the replicas seen before it.
        self._share(self._live or (self.settings.replica_id,), force=True)
        self._ready = True
        self.telemetry.schema_ready()
        logger.info(
            "singlebeat: connected to %s; database clock offset %+.1f ms; %d entries tracked",
            self.settings.safe_url,
            clock.offset_us / 1000,
            len(self._tracked),
        )

    # -- the loop ------------------------------------------------------------

    def _tick(self) -> float:
        store = self._store
        assert store is not None
        self._tick_us = store.clock.now_us()
        monotonic = time.monotonic()
        if self.settings.listen:
            self._poll_controls(monotonic)
        if self._interruptions_seen != store.interruptions:
            self._after_interruption()
        # Before any sweep: our own sweep would otherwise take over (and publish
        # again) claims we published but could not record during an outage.
        if self._unconfirmed:
            pending, self._unconfirmed = self._unconfirmed, []
            self._confirm(pending)
        if monotonic >= self._next_sweep:
            self._next_sweep = monotonic + self._sweep_every
            self._read_live(monotonic, sweeping=True)
            # The heartbeat has just counted the claimed rows of the whole store:
            # with none, nothing can be abandoned (a row abandoned now was claimed
            # then), and the takeover statement is skipped. Idle, that halves
            # what a sweep costs.
            if store.open_claims != 0 and monotonic >= self._hold_until:
                self._take_over()
        elif monotonic >= self._next_share:
            self._read_live(monotonic, sweeping=False)
        if monotonic >= self._next_prune:
            self._next_prune = monotonic + PRUNE_EVERY_US / US
            deleted = store.prune(self.settings.retention_us, PRUNE_EVERY_US)
            if deleted:
                logger.info(
                    "singlebeat: pruned %d slot rows older than %s",
                    deleted,
                    self.settings.retention,
                )
            if deleted is not None and monotonic >= self._next_fleet_prune:
                # replica rows age by the retention (15 min by default): their
                # prune need not cost statements at every minute's turn
                self._next_fleet_prune = monotonic + FLEET_PRUNE_EVERY_S
                gone = store.prune_fleet(self.settings.retention_us)
                if gone:
                    logger.info("singlebeat: pruned %d rows of replicas gone", gone)
        self._send_due()
        now_us = store.clock.now_us()
        delay = self.max_interval
        if self._heap:
            delay = min(delay, (self._heap[0].next_us - now_us) / US)
        if self._later:
            later = (self._later[0].next_us + FALLBACK_DELAY_US - now_us) / US
            # held after a broken connection: the fallbacks wake when it ends,
            # the entries this replica proposes first keep their own time
            delay = min(delay, max(later, self._hold_until - time.monotonic()))
        delay = min(delay, self._next_sweep - time.monotonic())
        if self._listener is not None:
            delay = min(delay, LISTEN_POLL_S)
        return max(delay, 0.0) + random.uniform(0.0, WAKE_JITTER)

    def _send_due(self) -> None:
        store = self._store
        assert store is not None
        if self._kept:
            self._forget_kept()
        now_us = store.clock.now_us()
        due: list[_Tracked] = []
        keys: list[SlotKey] = []
        plans = []
        # Capped, oldest first: a replica claims no more slots than it publishes
        # in a moment, so that a replica that is free does not claim a whole
        # second of other replicas' slots and keep them waiting while it
        # publishes. What is left stays due: the next tick follows at once.
        # Judged as of the hold's start on both heaps: an entry dealt anew
        # during the hold (the replica first for it stopped) comes to the first
        # heap with the slots the hold kept back on the other.
        judged_at_us = self._judged_at(now_us)
        queues: list[tuple[list[_Tracked], int, int, int | None]] = [
            (self._heap, now_us, FIRST_BATCH, judged_at_us)
        ]
        if time.monotonic() >= self._hold_until:
            # held after a broken connection (failover.py): the slot a fallback
            # proposal would win may be one another replica sent, whose row the
            # database lost and that replica is about to write again
            queues.append((self._later, now_us - FALLBACK_DELAY_US, FALLBACK_BATCH, judged_at_us))
        for heap, ready_us, cap, judged_at_us in queues:
            cap += len(keys)
            while heap and heap[0].next_us <= ready_us and len(keys) < cap:
                tracked = heapq.heappop(heap)
                due.append(tracked)
                plan = plan_due(
                    tracked.sequence,
                    tracked.next_us,
                    now_us,
                    tracked.policy,
                    judged_at_us,
                    self._kept,
                )
                plans.append((tracked, plan))
                keys.extend(
                    SlotKey(tracked.name, at) for at in plan.propose if at not in tracked.won
                )
        if not due:
            return
        started = time.monotonic()
        try:
            won = store.claim(self.settings.replica_id, keys, self.settings.lease_us)
        except StoreUnavailable:
            # No answer: keep the slots due, the next attempt proposes them again.
            # The claim may have been applied all the same: the retry then wins
            # our own claims again (fence + 1), which is not a takeover.
            lost_at = time.monotonic()
            for key in keys:
                self._held[key] = (None, lost_at)
            for tracked in due:
                self._push(tracked)
            raise
        mine = {c.key for c in won}
        refused = [key for key in keys if key not in mine] if len(won) < len(keys) else []
        paused: list[SlotKey] = []
        if refused and self._pauses:
            # Refused because the entry is paused (as far as this replica
            # knows): gone, like a slot another replica won. Not "early", even
            # when its instant is a few ms ahead of the database's clock: that
            # would propose it again and again, and send it after the resume.
            paused = [key for key in refused if self._is_paused(key.entry, now_us)]
            if paused:
                refused = [key for key in refused if not self._is_paused(key.entry, now_us)]
                self.stats["paused"] += len(paused)
                self.telemetry.paused(paused)
        early_keys = self._refused_as_early(refused, now_us) if refused else set()
        early: set[str] = {key.entry for key in early_keys}
        won_early: dict[str, list[int]] = {}
        if early:
            for claim in won:
                if claim.entry in early:
                    won_early.setdefault(claim.entry, []).append(claim.slot_us)
        for tracked, plan in plans:
            if tracked.name in early:
                # Proposed before it was due on the database's clock. When our
                # "now" ran ahead (a clock step), this plan also judged slots as
                # missed that are not, and coalesce/skip did not propose them.
                # Forget the plan, its skips included: the entry stays at the slot
                # it stood at before it, and is planned again with the clock the
                # claim's round trip has just corrected. Slots it won now are not
                # proposed again.
                tracked.won = tracked.won | set(won_early.get(tracked.name, ()))
                self._push(tracked)
                continue
            if tracked.won:
                after = plan.next_us
                ahead = {at for at in tracked.won if after is not None and at >= after}
                tracked.won = ahead or _NOTHING_WON
            if plan.skipped:
                self._report_skipped(
                    tracked.name,
                    plan.skipped,
                    plan.skipped_first_us,
                    plan.skipped_last_us,
                    tracked.policy,
                )
            if plan.next_us is not None:
                tracked.next_us = plan.next_us
                self._push(tracked)
            else:
                self._tracked.pop(tracked.name, None)
        # Slots refused before they were due are proposed again: not lost (yet).
        lost = [key for key in refused if key not in early_keys]
        if self._held:
            for key in lost:
                self._held.pop(key, None)  # not ours: our retry would have won it
        taken = {c.key for c in won if self._taken_from_another(c)}
        self.stats["claimed"] += len(won)
        self.stats["lost"] += len(lost)
        if won:
            self.telemetry.claimed(won)
        if lost:
            self.telemetry.lost(lost)
        if lost and self._lost_own_share(due, lost):
            # Another replica claimed slots we propose first: it does not see the
            # live replicas as we do (one just started or stopped). Look again
            # soon rather than at the next sweep, so that the views converge.
            self._next_share = min(self._next_share, self._shared_at + SHARE_RECHECK)
        if logger.isEnabledFor(logging.DEBUG):
            me = self.settings.replica_id
            for key in lost:
                text = slot_text(key.slot_us)
                logger.debug(
                    "singlebeat: replica %s lost slot %s@%s to another replica",
                    me,
                    key.entry,
                    text,
                    extra=slot_fields(
                        decisions.LOST,
                        me,
                        key.entry,
                        key.slot_us,
                        slot_task_id(key.entry, key.slot_us),
                        text=text,
                    ),
                )
        self._publish_and_confirm(won, started, taken)
        self._check_controls()

    def _read_live(self, monotonic: float, sweeping: bool) -> None:
        """The heartbeat: record this replica's row, read the live replicas
        (membership.replica_live: the ones sharing is among) and the control
        version, in one statement where the store can."""
        store = self._store
        assert store is not None
        self._shared_at = monotonic
        self._next_share = monotonic + self._sweep_every
        clock = store.clock
        info = ReplicaInfo(
            id=self.settings.replica_id,
            host=socket.gethostname(),
            pid=os.getpid(),
            version=__version__,
            started_us=self._started_us or clock.now_us(),
            loop_us=clock.now_us(),
            offset_us=clock.offset_us,
            tracked=len(self._tracked),
            proposes_first=self._first_count,
            heartbeat_us=int(self._sweep_every * US),
            lost_writes=self.stats["lost_writes"],
        )
        live = store.heartbeat(info)
        self._share(live_replicas(live, self.settings.replica_id))
        self.telemetry.fleet(len(self._live), store.open_claims)
        # in a sweep, the takeover that takes run-now requests follows at once
        self._check_controls(sweep=not sweeping)

    # -- controls (pause, resume, run now) ---------------------------------------

    def _publish_catalog(self) -> None:
        """Tell the store which entries this replica has: when it connects, and
        again after every broken connection (:meth:`_after_interruption`)."""
        store = self._store
        assert store is not None
        if self._catalog is None:
            # described once: at 100,000 entries that is a second of CPU
            self._catalog = [
                catalog.describe(name, entry.task, entry.schedule, self._tz_of(entry))
                for name, entry in self.schedule.items()
            ]
        store.publish_catalog(self.settings.replica_id, self._catalog)

    def _read_controls(self) -> None:
        """Read the pauses in force; remember the control version they go with."""
        store = self._store
        assert store is not None
        pauses = {p.entry: p for p in store.pauses()}
        version = store.controls_version
        if pauses != self._pauses:
            for name in sorted(pauses.keys() - self._pauses.keys()):
                p = pauses[name]
                logger.info(
                    "singlebeat: replica %s sees %s paused by %s%s%s",
                    self.settings.replica_id,
                    "every entry" if name == PAUSE_ALL else f"entry {name!r}",
                    p.by,
                    f" ({p.reason})" if p.reason else "",
                    f" until {slot_text(p.until_us)}" if p.until_us else "",
                )
            for name in sorted(self._pauses.keys() - pauses.keys()):
                logger.info(
                    "singlebeat: replica %s sees %s resumed",
                    self.settings.replica_id,
                    "every entry" if name == PAUSE_ALL else f"entry {name!r}",
                )
        self._pauses = pauses
        self._controls_seen = version

    def _check_controls(self, sweep: bool = True) -> None:
        """Act on a control change a statement brought back: read the pauses, and
        sweep at once (a run-now request is an abandoned row a sweep takes)."""
        store = self._store
        assert store is not None
        version = store.controls_version
        if version is None or version == self._controls_seen:
            return
        self._read_controls()
        if sweep:
            self._next_sweep = 0.0

    def _poll_controls(self, monotonic: float) -> None:
        """Act on a control change the listening connection heard (PostgreSQL)."""
        store = self._store
        assert store is not None
        if self._listener is None:
            listen = getattr(store, "listen", None)
            # not while the database is unreachable: the outage is reported once
            # already, and the sweep after it reads what changed meanwhile
            if listen is None or monotonic < self._listen_retry_at or self._outage_since:
                return
            self._listen_retry_at = monotonic + self._sweep_every
            try:
                self._listener = listen()
            except StoreUnavailable as exc:
                logger.warning(
                    "singlebeat: cannot listen for control changes (%s); they are "
                    "noticed at the next claim or heartbeat (every %gs) meanwhile",
                    exc,
                    self._sweep_every,
                )
                return
            if self._listener is None:
                self.settings = replace(self.settings, listen=False)  # no such thing here
                return
        try:
            heard = self._listener.poll()
        except Exception as exc:
            logger.info(
                "singlebeat: the connection listening for control changes was lost (%s); "
                "listening again in %gs",
                type(exc).__name__,
                self._sweep_every,
            )
            self._listener.close()
            self._listener = None
            return
        if heard:
            # the sweep's heartbeat reads the new version (and then the pauses),
            # its takeover the run-now requests
            self._next_sweep = 0.0

    def _is_paused(self, entry: str, now_us: int) -> bool:
        """As the pauses last read say (the claim itself is what enforces them)."""
        for name in (entry, PAUSE_ALL):
            pause = self._pauses.get(name)
            if pause is not None and (pause.until_us is None or pause.until_us > now_us):
                return True
        return False

    @staticmethod
    def _lost_own_share(due: list[_Tracked], lost: list[SlotKey]) -> bool:
        """True when another replica won a slot of an entry we propose first."""
        first = {t.name for t in due if t.first}
        return bool(first) and any(key.entry in first for key in lost)

    def _push(self, tracked: _Tracked) -> None:
        heapq.heappush(self._heap if tracked.first else self._later, tracked)

    def _share(self, live: tuple[str, ...], force: bool = False) -> None:
        """Decide which entries this replica proposes first, among ``live`` replicas."""
        if live == self._live and not force:
            return
        me = self.settings.replica_id
        if self._buckets is None:
            self._buckets = entry_buckets(self.schedule)
        buckets = self._buckets
        owners = bucket_owners(live)
        for tracked in self._tracked.values():
            bucket = buckets.get(tracked.name)
            tracked.first = bucket is None or owners[bucket] == me
        self._first_count = sum(1 for t in self._tracked.values() if t.first)
        # Called between ticks: every tracked entry is in one of the two heaps.
        self._heap = [t for t in self._tracked.values() if t.first]
        self._later = [t for t in self._tracked.values() if not t.first]
        heapq.heapify(self._heap)
        heapq.heapify(self._later)
        if live != self._live and (self._live or len(live) > 1):
            logger.info(
                "singlebeat: replica %s sees %d live replica(s); it proposes %d of %d "
                "entries first, the others %d ms after they are due",
                me,
                len(live),
                len(self._heap),
                len(self._tracked),
                FALLBACK_DELAY_US // 1000,
            )
        self._live = live

    def _refused_as_early(self, refused: list[SlotKey], planned_now_us: int) -> set[SlotKey]:
        """The not-won slots that are still in the future: proposed again when due.

        The claim refuses slots more than :data:`EARLY_TOLERANCE_US` ahead of the
        database's clock, and its round trip has just corrected our estimate of
        that clock. A not-won slot still in the future was refused as early, or
        won by a replica that ran ahead within the tolerance (proposing it again
        then simply loses it). Only a slot beyond the tolerance proves that our
        estimate ran ahead (a clock step): that is worth a WARNING; the rest,
        a few ms of estimate error or another replica's early win, is DEBUG.
        """
        store = self._store
        assert store is not None
        now_us = store.clock.now_us()
        early = {key for key in refused if key.slot_us > now_us}
        if not early:
            return early
        stepped = any(key.slot_us > now_us + EARLY_TOLERANCE_US for key in early)
        if stepped:
            logger.warning(
                "singlebeat: replica %s proposed %d slot(s) before they were due on the "
                "database's clock (its clock stepped? it ran %.3fs ahead); proposing them "
                "again when due",
                self.settings.replica_id,
                len(early),
                (planned_now_us - now_us) / US,
                extra=self._early_fields(early),
            )
        elif logger.isEnabledFor(logging.DEBUG):
            logger.debug(
                "singlebeat: replica %s did not win %d slot(s) not yet due on the database's "
                "clock (won early by another replica, within the %d ms tolerance, or its "
                "own clock estimate moved back); proposing them again when due",
                self.settings.replica_id,
                len(early),
                EARLY_TOLERANCE_US // 1000,
                extra=self._early_fields(early),
            )
        return early

    def _early_fields(self, early: set[SlotKey]) -> dict[str, object]:
        first = min(early, key=lambda key: (key.slot_us, key.entry))
        return batch_fields(decisions.EARLY, self.settings.replica_id, len(early), first)

    def _take_over(self) -> None:
        store = self._store
        assert store is not None
        started = time.monotonic()
        if self._held:
            # Forget what another replica has long taken over (or sent) by now.
            horizon = started - 2 * self.settings.retention.total_seconds()
            self._held = {k: v for k, v in self._held.items() if v[1] >= horizon}
        claims = store.take_over(
            self.settings.replica_id, self.settings.lease_us, self.settings.takeover_batch
        )
        if not claims:
            return
        taken: set[SlotKey] = set()
        me = self.settings.replica_id
        for claim in claims:
            text = slot_text(claim.slot_us)
            task_id = slot_task_id(claim.entry, claim.slot_us)
            if claim.fence == 1:
                # fence 0 -> 1: an operator's run-now request, not a replica's claim
                self._held.pop(claim.key, None)
                logger.info(
                    "singlebeat: replica %s claimed run-now request %s@%s (task id %s)",
                    me,
                    claim.entry,
                    text,
                    task_id,
                    extra=slot_fields(
                        decisions.RUN_NOW, me, claim.entry, claim.slot_us, task_id, 1, text=text
                    ),
                )
            elif self._taken_from_another(claim):
                taken.add(claim.key)
                logger.warning(
                    "singlebeat: replica %s took over slot %s@%s (task id %s, fence %d): "
                    "its previous owner did not confirm within the %gs lease",
                    me,
                    claim.entry,
                    text,
                    task_id,
                    claim.fence,
                    self.settings.lease.total_seconds(),
                    extra=slot_fields(
                        decisions.TAKING_OVER,
                        me,
                        claim.entry,
                        claim.slot_us,
                        task_id,
                        claim.fence,
                        text=text,
                    ),
                )
            else:
                logger.info(
                    "singlebeat: replica %s took back slot %s@%s (task id %s, fence %d): "
                    "its own claim, which it had released or whose answer it had lost",
                    me,
                    claim.entry,
                    text,
                    task_id,
                    claim.fence,
                    extra=slot_fields(
                        decisions.TAKING_BACK,
                        me,
                        claim.entry,
                        claim.slot_us,
                        task_id,
                        claim.fence,
                        text=text,
                    ),
                )
        self.stats["taken_over"] += len(taken)
        self.telemetry.claimed(claims)
        if taken:
            self.telemetry.taken_over([c for c in claims if c.key in taken])
        self._publish_and_confirm(claims, started, taken)

    def _taken_from_another(self, claim: Claim) -> bool:
        """True when another replica held ``claim``'s slot before us (a takeover).

        The store only tells that the row changed hands (``fence > 1``), also
        when it went back to this replica: a claim it released (won back at the
        next fence, nobody else held it in between) or a claim whose answer was
        lost (the fence it got is unknown: winning it back is taken as ours,
        which is wrong only if that claim never reached the database and
        another replica held the slot and abandoned it meanwhile).
        """
        held = self._held.pop(claim.key, None)
        if claim.fence == 1:
            return False
        if held is None:
            return True
        fence = held[0]
        return fence is not None and claim.fence != fence + 1

    def _publish_and_confirm(
        self, claims: list[Claim], claimed_at: float, taken_over: set[SlotKey]
    ) -> None:
        """Publish and confirm ``claims``; ``taken_over``: keys another replica held."""
        if not claims:
            return
        store = self._store
        assert store is not None
        # Stop publishing once our lease may have run out: another replica may be
        # taking the slot over, and two publishes would then race. Local monotonic
        # time, measured from *before* the claim was sent, is a safe upper bound.
        deadline = claimed_at + self.settings.lease.total_seconds() * 0.8
        unknown: list[Claim] = []
        published: list[Claim] = []
        failed: list[Claim] = []
        expired: list[Claim] = []
        untried = 0
        first_untried: Claim | None = None
        producer = None
        group: PublishGroup[tuple[Claim, ScheduleEntry]] | None = None
        self._broker_down = False
        try:
            for claim in claims:
                entry = self.schedule.get(claim.entry)
                if entry is None:
                    # A slot of an entry this replica's schedule does not have (rolling
                    # restart, or an entry removed while its slot was in flight): held
                    # back for a replica that has it, also after a broker error or
                    # past the deadline, or it would bounce between sweeps.
                    unknown.append(claim)
                    continue
                if self._broker_down:
                    failed.append(claim)
                    untried += 1
                    first_untried = first_untried or claim
                    continue
                if time.monotonic() >= deadline:
                    expired.append(claim)
                    continue
                if producer is None:
                    producer = skip_declared(self.producer)
                    group = PublishGroup(producer)
                assert group is not None
                outcome = self._publish(entry, claim, producer, deadline, claim.key in taken_over)
                if outcome is None:
                    expired.append(claim)
                elif outcome:
                    published.extend(self._handed_over(group.added((claim, entry)), taken_over))
                else:
                    failed.append(claim)
                if group.full:
                    self._flush(group, deadline, published, failed, expired, taken_over)
            if group is not None:
                self._flush(group, deadline, published, failed, expired, taken_over)
        finally:
            if group is not None:
                group.close()
        if expired:
            logger.warning(
                "singlebeat: lease ran out before %d claimed slots were published "
                "(first %s@%s); releasing them for another replica to send",
                len(expired),
                expired[0].entry,
                slot_text(expired[0].slot_us),
                extra=batch_fields(
                    decisions.EXPIRED, self.settings.replica_id, len(expired), expired[0]
                ),
            )
        if untried:
            logger.error(
                "singlebeat: broker unreachable; released %d claimed slots without trying "
                "them, for whichever replica reaches the broker first",
                untried,
                extra=batch_fields(
                    decisions.UNTRIED, self.settings.replica_id, untried, first_untried
                ),
            )
        if failed or expired or unknown:
            released_at = time.monotonic()
            for claim in failed + expired + unknown:
                self._held[claim.key] = (claim.fence, released_at)
        if failed or expired:
            store.release(self.settings.replica_id, failed + expired)
        if unknown:
            self._leave_unknown(unknown)
        if not published:
            return
        self.stats["sent"] += len(published)
        self._confirm(published)

    def _judged_at(self, now_us: int) -> int | None:
        """The instant proposals are judged on time or late at, when the hold
        after a broken connection delayed them: its start, for the sweep
        interval after its end (they go out as it ends, a busy tick later at
        most); else None (now). The entries this replica proposes first are
        judged so too: one dealt to it anew during the hold (its first replica
        stopped) carries the slots the hold kept back as a fallback.

        Without it, the share of a replica that died or stalled (whose
        entries only fallbacks propose), due during the hold (7 s by default),
        would be more than the grace (5 s) late when the hold ends, and the
        missed-run policy would drop it: runs lost to a wait of our own
        making. Measured so in the chaos run with a failover (11 slots of a
        killed or paused replica's share) before this.
        """
        since = self._held_since_us
        if since is None:
            return None
        bound_us = int((hold_seconds(self._sweep_every) + self._sweep_every) * US)
        return since if now_us <= since + bound_us else None

    def _broke(self) -> None:
        """A statement failed after a tick that reached the database: the
        connection broke (a restart, an outage, a failover). If a hold was
        keeping fallback proposals back, the slots it kept until now were
        delayed by this replica, not by the break: they stay judged as of the
        hold's start (_kept) after the reconnect, however long the break and
        whatever hold follows it. Without it, a restart's hold cut short by an
        outage (or a failover) dropped a dead or paused replica's share due in
        the hold, as missed: the chaos run lost 1 slot so on seed 2 and 6 on
        seed 6. Up to the start of the tick that met the break (or the hold's
        end, if that came first): not its last answer, since a replica that
        proposes nothing first may not have asked the database anything for a
        sweep interval and the slots held meanwhile were held by us; nor the
        failure itself, which may come after a reconnect window (2 s) or a
        statement timeout (15 s), slots of the break's own.
        """
        if not self._answering:
            return  # still the same break (an outage's retries)
        self._answering = False
        store = self._store
        if store is None or self._tick_us is None:
            return
        at_us = self._tick_us
        judged_us = self._judged_at(at_us)
        if judged_us is None or (self._kept and self._kept[-1][1] >= judged_us):
            return
        hold_end_us = judged_us + int(hold_seconds(self._sweep_every) * US)
        self._kept.append((judged_us, min(at_us, hold_end_us)))

    def _forget_kept(self) -> None:
        """Drop the spans of kept slots every entry has planned past (both heaps
        are whole between ticks: their tops are the earliest next slots)."""
        tops = [heap[0].next_us for heap in (self._heap, self._later) if heap]
        lowest = min(tops) if tops else None
        self._kept = [s for s in self._kept if lowest is not None and s[1] >= lowest]

    def _after_interruption(self) -> None:
        """After a broken connection: write again what this replica sent lately,
        and hold fallback proposals and sweeps while the others do the same.

        The database answering now may be a promoted standby that lacks the
        last commits (failover.py). Slots published but not yet recorded (an
        outage between publish and confirm) are written too: they were sent.
        """
        store = self._store
        assert store is not None
        seen = store.interruptions
        if self._interruptions_seen is None:
            # the first connection: nothing sent yet, nobody to wait for
            self._interruptions_seen = seen
            return
        # What the others need of this replica may be gone: its replica row and
        # its catalog are pruned once it is unseen for the retention (a cut
        # longer than that), and a promoted standby may lack them. While no live
        # replica's catalog lists an entry, run-now and pause of it are refused.
        # Both are written again first; idempotent, and a break is rare.
        self._publish_catalog()
        self._read_live(time.monotonic(), sweeping=False)
        confirmed = self._journal.recent()
        sent = confirmed + self._unconfirmed
        written = store.reassert(self.settings.replica_id, sent) if sent else []
        self._interruptions_seen = seen
        self._hold_until = time.monotonic() + hold_seconds(self._sweep_every)
        self._held_since_us = store.clock.now_us()
        # Only a confirm the database acknowledged and no longer has is a lost
        # write. One the break cut off (in _unconfirmed) never committed as far
        # as we know: recording it now is the confirm's retry, not a loss, and
        # counting it would raise the failover alarm after any cut connection.
        acknowledged = set(confirmed)
        again = [claim for claim in written if claim in acknowledged]
        if not again:
            logger.info(
                "singlebeat: replica %s reconnected to the database; its fallback proposals "
                "and sweeps wait %.1fs for the other replicas to write what they sent",
                self.settings.replica_id,
                hold_seconds(self._sweep_every),
            )
            return
        self.stats["lost_writes"] += len(again)
        self.telemetry.lost_writes(len(again))
        first = again[0]
        logger.error(
            "singlebeat: the database lost %d of the slots replica %s sent in the last %gs "
            "(first %s@%s): a failover to a standby that had not received them? Written "
            "again as sent; fallback proposals and sweeps wait %.1fs for the other replicas "
            "to write theirs",
            len(again),
            self.settings.replica_id,
            self._journal.window_s,
            first.entry,
            slot_text(first.slot_us),
            hold_seconds(self._sweep_every),
            extra=batch_fields(decisions.LOST_WRITES, self.settings.replica_id, len(again), first),
        )

    def _confirm(self, published: list[Claim]) -> None:
        store = self._store
        assert store is not None
        try:
            confirmed = store.confirm(self.settings.replica_id, published)
            self._journal.add(confirmed, time.monotonic())
        except StoreUnavailable:
            # Published but not recorded: keep them and confirm first thing when
            # the database is back. Fences make that safe, and if our lease ran
            # out meanwhile the taker re-publishes with the same task id.
            self._unconfirmed.extend(published)
            raise
        if len(confirmed) < len(published):
            ok = set(confirmed)
            for claim in published:
                if claim not in ok:
                    text = slot_text(claim.slot_us)
                    task_id = slot_task_id(claim.entry, claim.slot_us)
                    logger.warning(
                        "singlebeat: slot %s@%s was taken over before replica %s confirmed "
                        "its publish; it is published again with the same task id %s",
                        claim.entry,
                        text,
                        self.settings.replica_id,
                        task_id,
                        extra=slot_fields(
                            decisions.TAKEN_BEFORE_CONFIRM,
                            self.settings.replica_id,
                            claim.entry,
                            claim.slot_us,
                            task_id,
                            claim.fence,
                            text=text,
                        ),
                    )

    def _leave_unknown(self, claims: list[Claim]) -> None:
        """Hand back slots of entries this replica cannot publish, for a while.

        A replica that has the entry (an older version during a rolling restart)
        takes them over; released at once they would bounce between sweeps of
        replicas that cannot send them. A slot nobody can send stays claimed and
        is visible in the slots table (docs/operations.md says how to clear it).
        """
        store = self._store
        assert store is not None
        retry_in_us = self.settings.retention_us
        store.release(self.settings.replica_id, claims, retry_in_us)
        for name in sorted({c.entry for c in claims} - self._warned_unknown):
            self._warned_unknown.add(name)
            mine = [c for c in claims if c.entry == name]
            logger.warning(
                "singlebeat: replica %s holds slot(s) of entry %r, which is not in its "
                "beat_schedule; leaving them to a replica that has it (retry in %gs)",
                self.settings.replica_id,
                name,
                retry_in_us / US,
                extra=batch_fields(
                    decisions.UNKNOWN_ENTRY, self.settings.replica_id, len(mine), mine[0]
                ),
            )

    def _publish(
        self, entry: ScheduleEntry, claim: Claim, producer: Any, deadline: float, taken_over: bool
    ) -> bool | None:
        """Publish one claimed slot: True when sent, False when publishing failed,
        None when the lease may have run out first (nothing was sent).
        ``taken_over``: another replica held the slot before us."""
        task_id = slot_task_id(claim.entry, claim.slot_us)
        slot = us_to_datetime(claim.slot_us)
        details = {
            "entry": claim.entry,
            "slot": slot,
            "task_id": task_id,
            "fence": claim.fence,
            "taken_over": taken_over,
        }
        if signals.slot_claimed.receivers:
            signals.slot_claimed.send(sender=self, **details)
        options = {
            k: v for k, v in (entry.options or {}).items() if not k.startswith(ENTRY_OPTION_PREFIX)
        }
        headers = dict(options.pop("headers", None) or {})
        headers["celery_beat_task"] = True
        headers[SLOT_HEADER] = slot_header(claim.entry, claim.slot_us)
        options.pop("task_id", None)
        try:
            args = _evaluate_entry_args(entry.args)
            kwargs = _evaluate_entry_kwargs(entry.kwargs)
            # Checked again as late as possible: slot_claimed receivers and the
            # argument evaluation above take time, and a process stalled in
            # between (GC pause, SIGSTOP, slow hook) may have lost the slot to a
            # takeover that is publishing it right now.
            if time.monotonic() >= deadline:
                return None
            task = self.app.tasks.get(entry.task)
            if task is not None:
                task.apply_async(
                    args, kwargs, producer=producer, task_id=task_id, headers=headers, **options
                )
            else:
                self.send_task(
                    entry.task,
                    args,
                    kwargs,
                    producer=producer,
                    task_id=task_id,
                    headers=headers,
                    **options,
                )
        except Exception as exc:
            if _is_connection_error(exc, producer):
                # The broker, not this message: the rest of the batch would fail
                # the same way, each after kombu's publish retries.
                self._broker_down = True
            text = slot_text(claim.slot_us)
            logger.exception(
                "singlebeat: publishing slot %s@%s (task %s) failed; releasing the claim "
                "so that a replica sends it again",
                claim.entry,
                text,
                entry.task,
                extra=slot_fields(
                    decisions.PUBLISH_FAILED,
                    self.settings.replica_id,
                    claim.entry,
                    claim.slot_us,
                    task_id,
                    claim.fence,
                    text=text,
                ),
            )
            self.telemetry.publish_failed([claim])
            return False
        return True

    def _flush(
        self,
        group: PublishGroup[tuple[Claim, ScheduleEntry]],
        deadline: float,
        published: list[Claim],
        failed: list[Claim],
        expired: list[Claim],
        taken_over: set[SlotKey],
    ) -> None:
        """Hand the buffered messages to the broker, if our lease still allows it."""
        if not group.pipelined:
            return
        if time.monotonic() >= deadline:
            # Same rule as for one message: never hand one over once the lease
            # may be another replica's. Nothing of the group has left.
            expired.extend(claim for claim, _ in group.discard())
            return
        try:
            published.extend(self._handed_over(group.flush(), taken_over))
        except Exception:
            # The pipeline may have run in part: these messages are uncertain.
            # Released, they are sent again with the same task ids by whichever
            # replica takes them over; the rest of the batch is not tried.
            uncertain = [claim for claim, _ in group.discard()]
            logger.exception(
                "singlebeat: handing %d messages to the broker failed (delivery "
                "uncertain); releasing them so that a replica sends them again",
                len(uncertain),
                extra=batch_fields(
                    decisions.UNCERTAIN,
                    self.settings.replica_id,
                    len(uncertain),
                    uncertain[0] if uncertain else None,
                ),
            )
            failed.extend(uncertain)
            self.telemetry.publish_failed(uncertain)
            self._broker_down = True

    def _handed_over(
        self, done: list[tuple[Claim, ScheduleEntry]], taken_over: set[SlotKey]
    ) -> list[Claim]:
        """Log and signal messages that reached the broker; returns their claims.
        ``taken_over``: keys another replica held before us."""
        # Every message of the group is in the broker already: log them all before
        # any slot_published receiver runs (it may stall, or the process die).
        if done and self.telemetry is not NOTHING:
            store = self._store
            assert store is not None
            self.telemetry.sent([claim for claim, _ in done], store.clock.now_us())
        # The hot path (one line per slot sent, 10,000 a second at full load):
        # with INFO off nothing of it runs, and the fields reuse the message's values.
        if logger.isEnabledFor(logging.INFO):
            me = self.settings.replica_id
            for claim, entry in done:
                text = slot_text(claim.slot_us)
                task_id = slot_task_id(claim.entry, claim.slot_us)
                took_over = claim.key in taken_over
                logger.info(
                    "singlebeat: replica %s %s slot %s@%s: sent %s (task id %s)",
                    me,
                    "took over" if took_over else "won",
                    claim.entry,
                    text,
                    entry.task,
                    task_id,
                    extra=slot_fields(
                        decisions.TOOK_OVER if took_over else decisions.WON,
                        me,
                        claim.entry,
                        claim.slot_us,
                        task_id,
                        claim.fence,
                        text=text,
                    ),
                )
        if signals.slot_published.receivers:
            for claim, _ in done:
                signals.slot_published.send(
                    sender=self,
                    entry=claim.entry,
                    slot=us_to_datetime(claim.slot_us),
                    task_id=slot_task_id(claim.entry, claim.slot_us),
                    fence=claim.fence,
                    taken_over=claim.key in taken_over,
                )
        return [claim for claim, _ in done]

    def _report_skipped(
        self, name: str, count: int, first_us: int | None, last_us: int | None, policy: MissedPolicy
    ) -> None:
        self.stats["skipped"] += count
        self.telemetry.skipped(name, count)
        fields = batch_fields(
            decisions.SKIPPED,
            self.settings.replica_id,
            count,
            SlotKey(name, first_us) if first_us else None,
        )
        fields["entry"] = name
        if last_us:
            fields["last_slot"] = slot_text(last_us)
            fields["last_slot_us"] = last_us
        logger.warning(
            "singlebeat: %s: %d missed slot(s) %s..%s not sent (missed-run policy %s, grace %gs)",
            name,
            count,
            fields.get("slot", "?"),
            fields.get("last_slot", "?"),
            policy.mode,
            policy.grace_us / US,
            extra=fields,
        )
        if signals.slots_skipped.receivers:
            signals.slots_skipped.send(
                sender=self,
                entry=name,
                count=count,
                first=us_to_datetime(first_us) if first_us else None,
                last=us_to_datetime(last_us) if last_us else None,
            )

    def _outage(self, exc: StoreUnavailable) -> float:
        now = time.monotonic()
        if self._outage_since is None:
            self._outage_since = now
            self.stats["outages"] += 1
            self.telemetry.outage(True)
            logger.error(
                "singlebeat: database %s unreachable (%s); replica %s sends nothing until "
                "it is back, retrying with backoff up to %gs",
                self.settings.safe_url,
                exc,
                self.settings.replica_id,
                BACKOFF_MAX,
            )
        else:
            logger.debug("singlebeat: database still unreachable: %s", exc)
        # "Equal jitter": between half the step and the step. Replicas cut off
        # together (a restart, a failover) would otherwise retry in lockstep, each
        # wave hitting a server that is still starting at the same instant.
        delay = random.uniform(self._backoff / 2, self._backoff)
        self._backoff = min(self._backoff * 2, BACKOFF_MAX)
        return delay


__all__ = ["SingleBeatScheduler"]
