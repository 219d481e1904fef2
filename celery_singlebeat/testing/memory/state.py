"""What the in-memory "database" holds: its rows, table by table, under one lock.

Every part of :class:`~.store.MemoryStore` (its slots, fleet, singletons,
stored schedules, and the operator's side) reads and writes one
:class:`MemoryState`, as the SQL store's statements share one database. The
tables live here, not in the parts, because decisions cross them as SQL
statements join tables: a claim reads the pauses and the stored schedules, a
heartbeat counts the open claims, a failover loses writes in every table.
The row classes are mutable so that a decision changes a row in place, as an
``UPDATE`` does; :class:`SlotRow` is the frozen copy a test reads.
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass, replace
from typing import Any, NamedTuple

from ...store.base import CatalogEntry, Pause, ScheduleLogRow, ScheduleRow, SlotKey

__all__ = [
    "MemoryEntry",
    "MemoryLease",
    "MemoryRun",
    "MemorySlot",
    "MemoryState",
    "SlotRow",
]


class SlotRow(NamedTuple):
    """A snapshot of one slot row, as :meth:`.MemoryStore.slot_rows` reports it."""

    entry: str
    slot_us: int
    #: 0 claimed, 1 sent (confirmed).
    state: int
    owner: str
    fence: int
    lease_until_us: int
    claimed_us: int
    sent_us: int | None


#: how far back :attr:`MemoryState.slot_undo` reaches (a standby that lagged
#: longer loses the newer rows whole, as before the journal)
SLOT_UNDO_US = 300 * 1_000_000


@dataclass
class MemorySlot:
    """A slot row (the SQL ``slots`` table), keyed by its :class:`.SlotKey`."""

    state: int
    owner: str
    fence: int
    lease_until_us: int
    claimed_us: int
    sent_us: int | None = None


@dataclass
class MemoryEntry:
    """An entry's row (the SQL ``entries`` table): its anchor and high-water mark."""

    anchor_us: int
    #: the high-water mark: raised by prune, see the Store contract.
    last_slot_us: int | None = None


@dataclass
class MemoryLease:
    """A singleton key's lease (the SQL ``locks`` table), keyed by the key."""

    token: int
    owner: str
    expires_us: int
    acquired_us: int


@dataclass
class MemoryRun:
    """A run row of SingletonTask (the SQL ``runs`` table), keyed by its slot."""

    run_id: str
    state: int  # 0 running, 1 finished
    owner: str
    task_id: str
    expires_us: int
    started_us: int
    attempts: int = 1
    repeats: int = 0
    last_repeat_us: int | None = None
    finished_us: int | None = None
    outcome: str | None = None


class MemoryState:
    """Every table of the in-memory "database", and the one lock over all of them.

    Whoever reads or writes a table holds :attr:`lock`: the store's round
    trip holds it for one whole decision, which is what makes each decision
    atomic, and a test that doctors a row (expires a lease, say) takes it too.
    """

    def __init__(self) -> None:
        #: held for each whole decision, as a database's transaction would
        self.lock = threading.Lock()
        # the beat's slots (SlotStore)
        self.entries: dict[str, MemoryEntry] = {}
        self.slots: dict[SlotKey, MemorySlot] = {}
        #: (when, key, the row before) of each slot row a write changed, the
        #: last SLOT_UNDO_US of them: what a lagging standby still has, for
        #: lose_writes (a row inserted before the cut and updated after it is
        #: there as it was, not gone)
        self.slot_undo: deque[tuple[int, SlotKey, MemorySlot | None]] = deque()
        #: the slot prune's next turn: replicas sharing the store take turns
        self.prune_next_us = 0
        # SingletonTask's leases and runs (SingletonStore)
        self.leases: dict[str, MemoryLease] = {}
        self.runs: dict[SlotKey, MemoryRun] = {}
        #: the singleton prune's next turn
        self.prune_singletons_next_us = 0
        # the fleet (FleetStore) and the operator's pauses
        self.replicas: dict[str, dict[str, Any]] = {}
        self.catalog: dict[str, dict[str, CatalogEntry]] = {}
        self.pauses: dict[str, Pause] = {}
        #: stored schedules (ScheduleStore): rows by name (tombstones too), the
        #: history, the last revision given (the SQL store's counter row), the
        #: feed's floor
        self.schedules: dict[str, ScheduleRow] = {}
        self.schedule_log: list[ScheduleLogRow] = []
        #: (when, the counter before, name, the row before) of each row a
        #: write changed, so that lose_writes can undo the newest
        self.schedule_undo: list[tuple[int, int, str, ScheduleRow | None]] = []
        self.revision_counter = 0
        self.schedule_floor = 0
        #: the control version the operator's controls raise, and the schema's
        #: version (None: no schema yet): the database's, whichever connection asks
        self.controls_version: int | None = 0
        self.schema_version: int | None = None

    def slot_written(self, key: SlotKey, now_us: int) -> None:
        """Note the row at ``key`` as it is, before a write at ``now_us``
        changes it (the caller holds :attr:`lock`)."""
        undo = self.slot_undo
        while undo and undo[0][0] < now_us - SLOT_UNDO_US:
            undo.popleft()
        row = self.slots.get(key)
        undo.append((now_us, key, None if row is None else replace(row)))

    def top_revision(self) -> int:
        """The highest revision of the stored schedules; the floor too, as the
        SQL store's (:meth:`.ScheduleStore.feed_versions`). The caller holds
        :attr:`lock`."""
        return max(
            max((r.revision for r in self.schedules.values()), default=0), self.schedule_floor
        )
