"""The change feed: what the operators and the schedule editors changed, read
about once a second.

One statement (:meth:`~..store.schedule_store.ScheduleStore.feed_versions`)
brings back two versions: the highest revision of the stored schedules and the
control version (pauses, resumes, run-now requests). The change watch reads the
stored entries' changes only when the first moved; the controls read the
pauses, and the next tick sweeps for run-now requests, only when the second
moved. Idle, that one statement is all a replica adds, so the bound of a
second from a commit to its effect costs about one statement a second, the
same whatever the number of entries (docs/algorithm.md, "Stored schedules").

Where PostgreSQL's LISTEN reaches the replica, a notification at each commit
makes the next tick read at once, and the periodic read only backs it up
(every :data:`BACKSTOP_S`), since a notification is a hint that a dropped
connection loses, never the truth. A statement that already brought both
versions back (the heartbeat) counts as a read.

A listener can hear its probes and still miss the changes, or go deaf between
two probes (a minute apart): every commit notifies, so a read that finds a
version moved although nothing was heard since the read before tells that the
channel missed it. The replica then reads every :data:`READ_EVERY_S`, as
without a listener, until a notification is heard again; the judgement costs
no statement, only a comparison of what each read brings back anyway.
"""

from __future__ import annotations

import logging

from ..store.base import ControlListener
from .context import ReplicaContext
from .controls import Controls

logger = logging.getLogger("celery_singlebeat.scheduler")

#: seconds between two reads without a listening connection: a change
#: committed just after a read is seen at the next, so this bounds the delay
#: from a commit to its effect, with the wake-up jitter (10 ms) and the tick's
#: few milliseconds on top: under a second, so that even the slowest stays
#: within one. A sweep due before the next read comes at the read instead (its
#: heartbeat brings the same versions back), so idle a replica sends one
#: statement per 0.95 s, heartbeats included (two per sweep on MySQL, whose
#: heartbeat is an upsert and a read: it has no RETURNING; MariaDB's is one)
READ_EVERY_S = 0.95

#: seconds between two reads while a listening connection hears each commit
BACKSTOP_S = 5.0


class Feed:
    """When the next read is due, and what the last one brought back."""

    def __init__(self, ctx: ReplicaContext, controls: Controls) -> None:
        self.ctx = ctx
        self.controls = controls
        #: when both versions were last read, by this step or another (monotonic)
        self.last_read: float | None = None
        #: statements this step sent (the idle-cost benchmark reads it)
        self.reads = 0
        #: what the last read brought back (the schedules' revision, the
        #: control version), and the listener open then: a move is judged only
        #: against a read the same listener was open for, since a listener
        #: opened later could not hear the commits before its LISTEN
        self._versions: tuple[int | None, int | None] = (None, None)
        self._read_with: ControlListener | None = None
        #: whether the listener heard a change since the last read
        self._heard = False
        #: the last read found a move nothing was heard for; judged at the next
        #: tick, since a commit just before the read may have its notification
        #: still on the way (a tick comes within LISTEN_POLL_S while listening,
        #: before the next read at READ_EVERY_S)
        self._unnoticed: str | None = None
        #: the listener found deaf to changes (None: none is)
        self._deaf: ControlListener | None = None

    @property
    def deaf(self) -> bool:
        """Whether the listener open now missed a change (read every READ_EVERY_S)."""
        return self._deaf is not None and self._deaf is self.controls.listener

    def every(self) -> float:
        """Seconds between reads now: a backstop while a listener hears commits."""
        if self.controls.listener is None or self.deaf:
            return READ_EVERY_S
        return BACKSTOP_S

    @property
    def next_read(self) -> float:
        """When the next read is due (monotonic): from the last, at the period
        of now, so that a listener found deaf brings the next read forward."""
        return 0.0 if self.last_read is None else self.last_read + self.every()

    def due(self, monotonic: float, heard: bool) -> bool:
        """Whether this tick reads: its turn came round, or a commit was heard.
        Judges the listener first, by what it heard since the last read."""
        listener = self.controls.listener
        unnoticed, self._unnoticed = self._unnoticed, None
        if heard:
            self._heard = True
            if self.deaf:
                self._deaf = None
                logger.info(
                    "singlebeat: replica %s hears the changes' notifications again; "
                    "reading the change feed every %gs as a backstop",
                    self.ctx.replica_id,
                    BACKSTOP_S,
                )
        elif unnoticed is not None and listener is not None and listener is self._read_with:
            self._deaf = listener
            logger.warning(
                "singlebeat: replica %s heard no notification for a change (%s moved); "
                "reading the change feed every %gs instead of %gs until one is heard",
                self.ctx.replica_id,
                unnoticed,
                READ_EVERY_S,
                BACKSTOP_S,
            )
        return heard or monotonic >= self.next_read

    def read(self, monotonic: float) -> bool:
        """Read both versions; True when the controls changed (the caller makes
        the next tick sweep: a run-now request is a row the sweep takes over).
        The stored entries' changes are the change watch's to read next."""
        self.last_read = monotonic
        # a store written for an earlier release answers 0: no stored entries
        self.ctx.connected_store.feed_versions()
        self.reads += 1
        self._compare()
        return self.controls.changed()

    def read_elsewhere(self, monotonic: float) -> None:
        """A statement of another step (the heartbeat) brought both versions
        back: the next read can wait a whole period from now."""
        self.last_read = monotonic if self.last_read is None else max(self.last_read, monotonic)
        self._compare()

    def _compare(self) -> None:
        """Note a version that moved with nothing heard since the last read,
        while the same listener was open (a deaf one is already judged)."""
        store = self.ctx.connected_store
        versions = (store.schedule_revision, store.controls_version)
        listener = self.controls.listener
        if listener is not None and listener is self._read_with and not self._heard:
            moved = [
                what
                for what, before, now in zip(
                    ("the stored schedules' revision", "the control version"),
                    self._versions,
                    versions,
                )
                if before is not None and now is not None and now != before
            ]
            if moved and not self.deaf:
                self._unnoticed = " and ".join(moved)
        self._versions, self._read_with, self._heard = versions, listener, False


__all__ = ["BACKSTOP_S", "READ_EVERY_S", "Feed"]
