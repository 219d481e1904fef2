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
"""

from __future__ import annotations

from .context import ReplicaContext
from .controls import Controls

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

    def every(self) -> float:
        """Seconds between reads now: a backstop while a listener hears commits."""
        return BACKSTOP_S if self.controls.listener is not None else READ_EVERY_S

    @property
    def next_read(self) -> float:
        """When the next read is due (monotonic): from the last, at the period
        of now, so that a listener found deaf brings the next read forward."""
        return 0.0 if self.last_read is None else self.last_read + self.every()

    def due(self, monotonic: float, heard: bool) -> bool:
        """Whether this tick reads: its turn came round, or a commit was heard."""
        return heard or monotonic >= self.next_read

    def read(self, monotonic: float) -> bool:
        """Read both versions; True when the controls changed (the caller makes
        the next tick sweep: a run-now request is a row the sweep takes over).
        The stored entries' changes are the change watch's to read next."""
        self.last_read = monotonic
        # a store written for an earlier release answers 0: no stored entries
        self.ctx.connected_store.feed_versions()
        self.reads += 1
        return self.controls.changed()

    def read_elsewhere(self, monotonic: float) -> None:
        """A statement of another step (the heartbeat) brought both versions
        back: the next read can wait a whole period from now."""
        self.last_read = monotonic if self.last_read is None else max(self.last_read, monotonic)


__all__ = ["BACKSTOP_S", "READ_EVERY_S", "Feed"]
