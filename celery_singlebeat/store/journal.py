"""What a replica remembers so that a database failover does not double runs.

A failover promotes a standby and moves the database's address. With
asynchronous replication the standby may lack the last commits of the old
primary: slot rows this replica claimed and confirmed, whose sends happened,
are gone. Another replica's fallback proposal (or a sweep) would then win
those slots again and send them a second time.

So each replica keeps the slots it confirmed during the last
``singlebeat_failover_window`` (:class:`SentJournal`), and after any broken
connection (:attr:`.StoreConnection.interruptions`) writes them again
(:meth:`.SlotStore.reassert`) before it proposes anything old. Meanwhile it
holds its fallback proposals and sweeps for :func:`hold_seconds`: long enough
for every other live replica, which saw the same broken connection, to write
its own again first.

The same tail may hold claims of a replica that cannot write them again (it
died, or stalled, just before the failover): their rows are gone, and the
slots would never be proposed again, since every replica has moved past
them. So each replica also keeps, for the same window, the slots it proposed
and saw another replica win (a :class:`Journal` of keys), and proposes them
again when the hold ends: a slot whose row the others wrote back is refused,
one whose row is gone is won and sent with its task id (a copy of a message
its first claimer did publish is dropped by the worker's per-slot dedupe).
docs/guarantees.md, "Database failover", says what this leaves.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from typing import Generic, TypeVar

from .base import Claim

_T = TypeVar("_T")

#: added to a sweep interval in :func:`hold_seconds`: a busy replica's tick
#: and one reconnect (the store retries a broken connection for up to 2 s)
HOLD_MARGIN_S = 2.0


def hold_seconds(sweep_every_s: float) -> float:
    """How long fallback proposals and sweeps wait after a broken connection.

    Every replica touches the database at least once a sweep (its heartbeat),
    and it writes its sent slots again at its first round trip after the
    break: so a sweep interval and a margin after our own reconnect, the
    others' have landed.
    """
    return sweep_every_s + HOLD_MARGIN_S


class Journal(Generic[_T]):
    """What a replica wrote, or saw written, during the ``window_s`` seconds
    before its last addition (local monotonic time), in batches as added.

    Memory is bounded by the rate of additions times the window (10,000 slots
    a second for 10 s: 100,000 items).
    """

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self._batches: deque[tuple[float, tuple[_T, ...]]] = deque()
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def add(self, items: Iterable[_T], at: float) -> None:
        """Remember ``items``, written at monotonic instant ``at``."""
        if self.window_s <= 0:
            return
        batch = tuple(items)
        if batch:
            self._batches.append((at, batch))
            self._count += len(batch)
        self._trim(at)

    def recent(self) -> list[_T]:
        """The items added within the window before the last addition,
        oldest first. Measured from the last addition, not from now: a
        failover loses the commits just before the old primary died, however
        long the promotion took."""
        return [item for _, batch in self._batches for item in batch]

    def _trim(self, now: float) -> None:
        horizon = now - self.window_s
        while self._batches and self._batches[0][0] < horizon:
            self._count -= len(self._batches.popleft()[1])


class SentJournal(Journal[Claim]):
    """The claims this replica confirmed during the ``window_s`` seconds
    before its last confirm: written again after a broken connection."""
