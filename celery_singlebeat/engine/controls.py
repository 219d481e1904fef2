"""The operators' controls as one replica sees them: pauses, resumes, run now.

The database enforces every control (a claim refuses a paused entry's slot; a
run-now request is an abandoned slot row the next sweep takes over); a replica
reads them only to act sooner and to tell them apart in its logs. It learns
of a change from the control version its claims and heartbeats bring back,
and on PostgreSQL also from a LISTEN connection (:mod:`..store.listening`),
which makes the next tick sweep at once.
"""

from __future__ import annotations

import logging

from ..decisions import slot_text
from ..exceptions import StoreUnavailable
from ..store.base import PAUSE_ALL, ControlListener, Pause
from .context import ReplicaContext

logger = logging.getLogger("celery_singlebeat.scheduler")


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
        try:
            return bool(self.listener.poll())
        except Exception as exc:
            logger.info(
                "singlebeat: the connection listening for control changes was lost (%s); "
                "listening again in %gs",
                type(exc).__name__,
                ctx.sweep_every,
            )
            self.close()
            return False

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
