"""The agenda: the entries a replica tracks, each with its next slot, in two heaps.

Every replica tracks every entry it has (from all its sources) with the next
slot it has not yet planned. Entries it proposes first (:mod:`..sharing`) wait
in one heap, the others in a second heap whose slots it proposes
``FALLBACK_DELAY_US`` late, as a fallback. Both are ordered by next slot, so a
tick looks only at the tops.

Entries come, change and go between ticks (:mod:`..sources`): a changed or
removed entry's old place in a heap is left there and skipped when it comes to
the top (an entry is current while ``tracked[name]`` is that very object), so
a change costs a push, not a rebuild of 100,000 entries.
"""

from __future__ import annotations

import heapq
import logging
from collections.abc import Iterable
from collections.abc import Set as AbstractSet
from typing import Any

from ..sources import EntryDefinition
from ..store.base import EntryState
from ..timeline.clock import US
from ..timeline.slots import MissedPolicy, SlotSequence, sequence_for
from .sharing import FALLBACK_DELAY_US, bucket_of, bucket_owners

#: how many live sets' shares a replica keeps (64 KB each)
_SHARES_KEPT = 4

#: how far back before the tick that sees a changed definition its slots are
#: counted from its commit: the second a change takes to reach every replica,
#: and as much again for a tick delayed on a loaded machine
CHANGE_REACH_US = 2 * US

logger = logging.getLogger("celery_singlebeat.scheduler")

#: ``Tracked.won`` of an entry that won nothing ahead (nearly all): one shared
#: empty set instead of one per entry (216 bytes each).
NOTHING_WON: frozenset[int] = frozenset()


class Tracked:
    """An entry as this replica tracks it: its definition, slot sequence and next slot.

    Ordered by ``(next_us, name)`` for the heaps. Slotted, with a shared empty
    ``won``: a replica tracks every entry of the schedule, and with 100,000
    entries that made the process's peak RSS 265 MB instead of 221 MB (together
    with a shared default policy and slotted sequences).
    """

    __slots__ = ("definition", "first", "name", "next_us", "policy", "sequence", "won")

    def __init__(
        self,
        next_us: int,
        definition: EntryDefinition,
        sequence: SlotSequence,
        policy: MissedPolicy,
    ) -> None:
        self.next_us = next_us
        self.name = definition.name
        self.definition = definition
        self.sequence = sequence
        self.policy = policy
        #: slots at or after ``next_us`` this replica already won: after a claim that
        #: refused some slots as early, the entry is planned again from before them.
        self.won: AbstractSet[int] = NOTHING_WON
        #: whether this replica proposes the entry's slots first (sharing.py)
        self.first = True

    def __lt__(self, other: Tracked) -> bool:
        if self.next_us != other.next_us:
            return self.next_us < other.next_us
        return self.name < other.name

    def __repr__(self) -> str:
        return f"Tracked({self.name!r}, next_us={self.next_us})"


class Agenda:
    """The tracked entries of one replica, and who proposes each first."""

    def __init__(self, replica_id: str, default_policy: MissedPolicy, default_tz: Any) -> None:
        self.replica_id = replica_id
        self.default_policy = default_policy
        self.default_tz = default_tz
        #: entry name -> its tracking; an entry whose slots have all passed is not here
        self.tracked: dict[str, Tracked] = {}
        #: entry name -> its definition, tracked or finished
        self.definitions: dict[str, EntryDefinition] = {}
        #: the slot sequences of the finished ones (a one-off whose instant
        #: passed): a slot of theirs may still be proposed again after a break
        self._ended: dict[str, SlotSequence] = {}
        #: entries this replica proposes first, and those it proposes after
        #: FALLBACK_DELAY_US (another live replica's), each by next slot
        self.first: list[Tracked] = []
        self.later: list[Tracked] = []
        #: the live replicas the share was dealt among
        self.live: tuple[str, ...] = ()
        #: each entry's sharing bucket (sharing.py), hashed once
        self._buckets: dict[str, int] = {}
        #: 1 for each bucket this replica is first for (None: not dealt yet),
        #: for entries that come after the deal: 64 KiB, where the owners'
        #: list would keep 512 KiB
        self._mine: bytearray | None = None
        #: the buckets this replica proposes first, for the last few live sets
        #: seen: a membership that flaps (a replica paused past its heartbeats
        #: and back, a partition) deals the 65,536 buckets once per set
        self._shares: dict[tuple[str, ...], bytearray] = {}
        #: how many entries this replica proposes first (its heartbeat says so)
        self.first_count = 0

    # -- the entries -------------------------------------------------------------

    def tz_of(self, definition: EntryDefinition) -> Any:
        return definition.tz or self.default_tz

    def track(
        self,
        definition: EntryDefinition,
        state: EntryState,
        now_us: int,
        not_before_us: int | None = None,
    ) -> None:
        """Track ``definition`` from its last recorded slot (``state``), or now;
        never from before ``not_before_us`` (a definition found again after a
        failover: :meth:`.SourceWatch.reconnected`)."""
        self.definitions[definition.name] = definition
        sequence = sequence_for(definition.schedule, state.anchor_us, self.tz_of(definition))
        if state.last_slot_us is not None:
            start = state.last_slot_us
        elif definition.since_us is not None:
            # never sent: its slots count from the definition's commit, not from
            # when this replica saw it, so a replica that learns of a new entry
            # late still sends its first slots (the missed-run policy judges them)
            start = definition.since_us
        else:
            start = now_us
        if definition.since_us is not None and definition.since_us > start:
            start = definition.since_us
        if not_before_us is not None and not_before_us > start:
            start = not_before_us
        self._place(definition, sequence, sequence.next_after(start))

    def change(
        self,
        definition: EntryDefinition,
        state: EntryState,
        now_us: int,
        not_before_us: int | None = None,
        read_before_us: int | None = None,
    ) -> None:
        """Follow ``definition`` from its commit (``since_us``): its next slot
        is its first after that, or after ``now_us`` for a definition without
        one (``beat_schedule``'s, which are as old as their process); never
        from before ``not_before_us`` (found again after a failover).

        A replica learns of a change up to a second after its commit, maybe in
        the very tick of a slot of the new definition: counted from that tick,
        such a slot was sent by neither definition (the claim refuses the old
        one's soon after). The slots between the commit and now are the new
        definition's, judged by the missed-run policy. Never from further back
        than :data:`CHANGE_REACH_US`: a definition committed long ago (read
        again after a failover) starts near now, with no burst of its past;
        but from as far back as ``read_before_us``, the poll before the one
        that read the change: a change committed just before an outage and
        read after it was in force all through the outage, and its slots due
        then are the missed-run policy's, as any entry's (the explorer's seed
        404 dropped those due more than 2 s before the first read).
        """
        self.definitions[definition.name] = definition
        sequence = sequence_for(definition.schedule, state.anchor_us, self.tz_of(definition))
        start = now_us
        if definition.since_us is not None:
            reach = now_us - CHANGE_REACH_US
            if read_before_us is not None:
                reach = min(reach, read_before_us)
            start = max(definition.since_us, reach)
        if not_before_us is not None:
            start = max(start, not_before_us)
        self._place(definition, sequence, sequence.next_after(start))

    def sequence_of(self, name: str) -> SlotSequence | None:
        """The slot sequence of ``name``'s definition, tracked or finished."""
        tracked = self.tracked.get(name)
        return tracked.sequence if tracked is not None else self._ended.get(name)

    def remove(self, name: str) -> None:
        """Stop tracking ``name``: its place in a heap is skipped from now on."""
        self.definitions.pop(name, None)
        self._ended.pop(name, None)
        old = self.tracked.pop(name, None)
        if old is not None and old.first:
            self.first_count -= 1

    def _place(
        self, definition: EntryDefinition, sequence: SlotSequence, next_us: int | None
    ) -> None:
        name = definition.name
        old = self.tracked.pop(name, None)
        if old is not None and old.first:
            self.first_count -= 1
        self._ended.pop(name, None)
        if next_us is None:
            self._ended[name] = sequence
            return
        policy = definition.policy or self.default_policy
        tracked = Tracked(next_us, definition, sequence, policy)
        self.tracked[name] = tracked
        if name not in self._buckets:
            self._buckets[name] = bucket_of(name)
        tracked.first = self._mine is None or bool(self._mine[self._buckets[name]])
        self.push(tracked)
        if tracked.first:
            self.first_count += 1

    def clear(self) -> None:
        self.tracked.clear()
        self.definitions.clear()
        self._ended.clear()
        self.first = []
        self.later = []
        self.first_count = 0

    # -- the heaps ---------------------------------------------------------------

    def current(self, tracked: Tracked) -> bool:
        """Whether ``tracked`` is still the entry's tracking (not changed or removed)."""
        return self.tracked.get(tracked.name) is tracked

    def push(self, tracked: Tracked) -> None:
        heapq.heappush(self.first if tracked.first else self.later, tracked)

    def top(self, heap: list[Tracked]) -> Tracked | None:
        """The entry with the earliest next slot in ``heap`` (stale places
        dropped first), left in place."""
        while heap and not self.current(heap[0]):
            heapq.heappop(heap)
        return heap[0] if heap else None

    @staticmethod
    def pop(heap: list[Tracked]) -> Tracked:
        """Take the top off ``heap`` (after :meth:`top` said what it is)."""
        return heapq.heappop(heap)

    def top_us(self, heap: list[Tracked]) -> int | None:
        top = self.top(heap)
        return top.next_us if top is not None else None

    def earliest_us(self) -> int | None:
        """The earliest next slot of any tracked entry (both heaps are whole
        between ticks)."""
        tops = [t for t in (self.top_us(self.first), self.top_us(self.later)) if t is not None]
        return min(tops) if tops else None

    def finished(self, tracked: Tracked) -> None:
        """An entry with no slot left (a one-off whose instant passed)."""
        if self.current(tracked):
            del self.tracked[tracked.name]
            self._ended[tracked.name] = tracked.sequence

    # -- sharing -----------------------------------------------------------------

    def share(self, live: tuple[str, ...], force: bool = False) -> None:
        """Decide which entries this replica proposes first, among ``live`` replicas."""
        if live == self.live and not force:
            return
        me = self.replica_id
        mine = self._shares.pop(live, None)
        if mine is None:
            mine = bytearray(map(me.__eq__, bucket_owners(live)))
            while len(self._shares) >= _SHARES_KEPT:
                del self._shares[next(iter(self._shares))]  # the least recently used
        self._shares[live] = mine
        self._mine = mine
        buckets = self._buckets
        for tracked in self.tracked.values():
            bucket = buckets.get(tracked.name)
            if bucket is None:
                bucket = buckets[tracked.name] = bucket_of(tracked.name)
            tracked.first = bool(mine[bucket])
        # Called between ticks: every tracked entry is in one of the two heaps.
        self.first = [t for t in self.tracked.values() if t.first]
        self.later = [t for t in self.tracked.values() if not t.first]
        heapq.heapify(self.first)
        heapq.heapify(self.later)
        self.first_count = len(self.first)
        if live != self.live and (self.live or len(live) > 1):
            logger.info(
                "singlebeat: replica %s sees %d live replica(s); it proposes %d of %d "
                "entries first, the others %d ms after they are due",
                me,
                len(live),
                len(self.first),
                len(self.tracked),
                FALLBACK_DELAY_US // 1000,
            )
        self.live = live

    def names(self) -> Iterable[str]:
        return self.definitions.keys()


__all__ = ["NOTHING_WON", "Agenda", "Tracked"]
