"""The operators' controls as one replica sees them: pauses, resumes, run now.

The database enforces every control (a claim refuses a paused entry's slot; a
run-now request is an abandoned slot row the next sweep takes over); a replica
reads them only to act sooner and to tell them apart in its logs. It learns
of a change from the control version its claims and heartbeats bring back,
and on PostgreSQL also from a LISTEN connection (:mod:`..store.sql.listening`),
which makes the next tick sweep at once.
"""

from __future__ import annotations

import logging

from ..exceptions import StoreUnavailable
from ..store.base import PAUSE_ALL, ControlListener, Pause
from ..timeline.clock import slot_text
from .context import ReplicaContext

logger = logging.getLogger("celery_singlebeat.scheduler")

#: seconds a listener's probe may take to come back before the channel is
#: judged deaf: a notification arrives within milliseconds of its commit, and
#: a replica polls its listener every LISTEN_POLL_S
PROBE_WAIT_S = 2.0

#: seconds between two probes of a channel that heard its last one: a
#: listening connection can go deaf later too (a middlebox that forgot it)
PROBE_EVERY_S = 60.0


class Controls:
    """The pauses in force, the control version they go with, the listener."""

    def __init__(self, ctx: ReplicaContext) -> None:
        self.ctx = ctx
        #: the control version last acted on, and the pauses it read then
        self.seen: int | None = None
        self.pauses: dict[str, Pause] = {}
        #: whether to listen for changes (PostgreSQL); off once the store says
        #: it has no such channel
        self.listening = ctx.settings.listen
        self.listener: ControlListener | None = None
        self._listen_retry_at = 0.0
        #: the listener's probe: when the next is due, and by when the one
        #: sent must have come back (None: none outstanding)
        self._next_probe = 0.0
        self._probe_deadline: float | None = None
        #: whether the listener open now has heard a probe of its own yet
        self._proven = False

    def read(self) -> None:
        """Read the pauses in force; remember the control version they go with."""
        store = self.ctx.connected_store
        pauses = {p.entry: p for p in store.pauses()}
        version = store.controls_version
        me = self.ctx.replica_id
        if pauses != self.pauses:
            for name in sorted(pauses.keys() - self.pauses.keys()):
                p = pauses[name]
                logger.info(
                    "singlebeat: replica %s sees %s paused by %s%s%s",
                    me,
                    "every entry" if name == PAUSE_ALL else f"entry {name!r}",
                    p.by,
                    f" ({p.reason})" if p.reason else "",
                    f" until {slot_text(p.until_us)}" if p.until_us else "",
                )
            for name in sorted(self.pauses.keys() - pauses.keys()):
                logger.info(
                    "singlebeat: replica %s sees %s resumed",
                    me,
                    "every entry" if name == PAUSE_ALL else f"entry {name!r}",
                )
        self.pauses = pauses
        self.seen = version

    def changed(self) -> bool:
        """Act on a control change the last statement brought back: read the
        pauses. True when there was one (a run-now request may wait for a sweep)."""
        version = self.ctx.connected_store.controls_version
        if version is None or version == self.seen:
            return False
        self.read()
        return True

    def heard(self, monotonic: float, in_outage: bool) -> bool:
        """Whether the listening connection heard a control change (PostgreSQL);
        opens it first, and again after it was lost, at most once a sweep."""
        ctx = self.ctx
        store = ctx.connected_store
        if self.listener is None:
            # not while the database is unreachable: the outage is reported once
            # already, and the sweep after it reads what changed meanwhile
            if monotonic < self._listen_retry_at or in_outage:
                return False
            self._listen_retry_at = monotonic + ctx.sweep_every
            try:
                self.listener = store.listen()
            except StoreUnavailable as exc:
                logger.warning(
                    "singlebeat: cannot listen for control changes (%s); they are "
                    "noticed at the next claim or heartbeat (every %gs) meanwhile",
                    exc,
                    ctx.sweep_every,
                )
                return False
            if self.listener is None:
                self.listening = False  # no such thing here
                return False
            self._next_probe, self._probe_deadline, self._proven = monotonic, None, False
        try:
            heard = bool(self.listener.poll())
            self._check_probe(monotonic)
            return heard
        except StoreUnavailable as exc:
            # the probe's statement failed: the database is away, which the
            # tick reports; the channel is proven again once it is back
            logger.debug("singlebeat: probing the listening connection failed: %s", exc)
            self._next_probe = monotonic + ctx.sweep_every
            return False
        except Exception as exc:
            logger.info(
                "singlebeat: the connection listening for control changes was lost (%s); "
                "listening again in %gs",
                type(exc).__name__,
                ctx.sweep_every,
            )
            self.close()
            return False

    def _check_probe(self, monotonic: float) -> None:
        """Prove the listening channel: send a probe when one is due, and close
        the channel when its probe did not come back in time. A channel deaf
        from the start is a pooler that cannot carry LISTEN: listening stops
        for good (the feed reads every READ_EVERY_S instead); one that heard
        before and went deaf is opened again at the next sweep."""
        listener = self.listener
        assert listener is not None
        if self._probe_deadline is None:
            if monotonic >= self._next_probe:
                listener.probe()
                self._probe_deadline = monotonic + PROBE_WAIT_S
            return
        if listener.probe_heard:
            self._probe_deadline = None
            self._proven = True
            self._next_probe = monotonic + PROBE_EVERY_S
            return
        if monotonic < self._probe_deadline:
            return
        if self._proven:
            logger.info(
                "singlebeat: the connection listening for changes stopped hearing "
                "(its probe did not come back within %gs); listening again in %gs",
                PROBE_WAIT_S,
                self.ctx.sweep_every,
            )
        else:
            logger.warning(
                "singlebeat: the connection listening for changes hears nothing (its "
                "probe did not come back within %gs: a pooler in transaction mode, such "
                "as PgBouncer, cannot carry LISTEN); changes are read from the database "
                "about once a second instead; set singlebeat_listen = False to skip "
                "the attempt",
                PROBE_WAIT_S,
            )
            self.listening = False
        self.close()

    def is_paused(self, entry: str, now_us: int) -> bool:
        """As the pauses last read say (the claim itself is what enforces them)."""
        for name in (entry, PAUSE_ALL):
            pause = self.pauses.get(name)
            if pause is not None and (pause.until_us is None or pause.until_us > now_us):
                return True
        return False

    def close(self) -> None:
        if self.listener is not None:
            self.listener.close()
            self.listener = None
