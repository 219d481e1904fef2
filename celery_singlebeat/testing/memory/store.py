"""An in-memory store for your own tests: no database needed.

:class:`MemoryStore` implements the whole storage contract
(:class:`~celery_singlebeat.store.base.Store`) in process memory and passes
the same contract suite as the SQL store. Several schedulers sharing one
``MemoryStore`` behave like replicas sharing one database, so a test can show
that each slot is sent once without starting PostgreSQL. Time comes from a
clock you control (:class:`~celery_singlebeat.testing.FakeClock`), so a test
moves time by hand instead of sleeping.

Typical use, with Celery's in-memory broker and the scheduler that runs on
the store (:class:`~celery_singlebeat.testing.MemoryScheduler`)::

    from datetime import timedelta
    from celery import Celery
    from celery_singlebeat.testing import FakeClock, MemoryScheduler, MemoryStore

    app = Celery("proj", broker="memory://")
    app.conf.beat_schedule = {"ping": {"task": "proj.ping", "schedule": 10.0}}

    clock = FakeClock()
    store = MemoryStore(now_us=clock)
    replica_a = MemoryScheduler(app, store=store)
    replica_b = MemoryScheduler(app, store=store)

    replica_a.tick()            # first tick: checks the schema, registers entries
    replica_b.tick()
    clock.advance(timedelta(seconds=10))
    replica_a.tick()            # wins the slot and publishes it
    replica_b.tick()            # loses it: sends nothing
    assert replica_a.stats["sent"] + replica_b.stats["sent"] == 1

``store.available = False`` simulates a database outage (every operation
raises :class:`.StoreUnavailable`), and
:meth:`MemoryStore.slot_rows` shows what the "database" holds.

The store is one small class per contract, as ``SqlStore`` composes
``SqlSchedules``: :mod:`.slots` (``SlotStore``), :mod:`.fleet`
(``FleetStore``), :mod:`.singletons` (``SingletonStore``), :mod:`.schedules`
(``ScheduleStore``) and :mod:`.operator` (the controls and reads a test does
as an operator would). Each decides over the tables of :mod:`.state` in one
round trip of :mod:`.connection`; :class:`MemoryStore` composes them, and
each of its methods delegates to one of them in one line.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ...store.base import (
    Busy,
    CatalogEntry,
    Claim,
    ControlListener,
    EntryState,
    Lease,
    Pause,
    ReplicaInfo,
    Run,
    RunBegin,
    RunRecord,
    ScheduleFeed,
    ScheduleLogRow,
    ScheduleRow,
    ScheduleWrite,
    SlotKey,
    Store,
    Written,
)
from ...timeline.clock import DatabaseClock
from .connection import MemoryConnection
from .fleet import MemoryFleet
from .operator import MemoryOperator
from .schedules import MemorySchedules
from .singletons import MemorySingletons
from .slots import MemorySlots
from .state import MemoryState, SlotRow

__all__ = ["MemoryStore", "SlotRow"]


class MemoryStore(MemoryConnection, Store):
    """The storage contract in process memory, shared by threads.

    ``now_us`` is the "database" clock (default: the real wall clock); pass a
    :class:`~celery_singlebeat.testing.FakeClock` to control time. Every
    decision is taken under one lock, so concurrent callers (threads, or
    several schedulers in one process) see the same atomicity a database
    gives. Each operation counts as one round trip in ``round_trips`` and
    feeds ``clock``, like the SQL store.

    ``clock`` replaces the :class:`~celery_singlebeat.timeline.clock.DatabaseClock`
    the store keeps in sync; by default it follows ``now_us`` exactly.
    ``state`` (another store's ``state``) makes this store a second
    connection to that store's "database": its own clock estimate,
    availability and breaks, the same rows (the explorer gives each replica
    one, as each replica has its own connection).

    ``on_round_trip`` is called after each operation, as the SQL store
    calls it (with 0 seconds); schedulers sharing one store each set it when
    they connect, so only the last one connected hears it.

    ``state`` is what the "database" holds, every table under one lock
    (``testing.memory.state.MemoryState``): a test that
    changes a row by hand (expires a lease, loses a confirm) holds
    ``state.lock`` while it does.
    """

    def __init__(
        self,
        now_us: Callable[[], int] | None = None,
        *,
        clock: DatabaseClock | None = None,
        state: MemoryState | None = None,
    ) -> None:
        super().__init__(now_us, clock=clock, state=state)
        #: the beat's slots (SlotStore): register, claim, confirm, take over, prune
        self.slots = MemorySlots(self)
        #: the fleet as replicas see it (FleetStore): heartbeat, catalog, pauses
        self.fleet = MemoryFleet(self)
        #: SingletonTask's leases and runs (SingletonStore)
        self.singletons = MemorySingletons(self)
        #: stored schedules (ScheduleStore): their rows, change feed and history
        self.schedules = MemorySchedules(self)
        #: the operator's side: pause, resume, run now, and the rows a test reads
        self.operator = MemoryOperator(self)

    # -- the operator's controls, and what a test reads (operator.py) ---------

    def pause(self, entry: str, until_us: int | None = None, by: str = "test") -> None:
        """What an operator's pause writes (``entry`` "*": every entry)."""
        self.operator.pause(entry, until_us, by)

    def resume(self, entry: str | None = None) -> None:
        """What an operator's resume writes (None: every pause)."""
        self.operator.resume(entry)

    def request_run(self, entry: str) -> SlotKey:
        """What an operator's run-now writes: an abandoned row at fence 0."""
        return self.operator.request_run(entry)

    def slot_rows(self) -> list[SlotRow]:
        """Every slot row, ordered by ``(entry, slot_us)`` (not a round trip)."""
        return self.operator.slot_rows()

    def replica_rows(self) -> dict[str, dict[str, Any]]:
        """Every replica row, as dicts of its columns (not a round trip)."""
        return self.operator.replica_rows()

    def catalog_of(self, replica_id: str) -> dict[str, CatalogEntry]:
        """The catalog a replica published (not a round trip)."""
        return self.operator.catalog_of(replica_id)

    def run_rows(self) -> dict[SlotKey, dict[str, Any]]:
        """Every run row (SingletonTask), as dicts of its columns (not a round trip)."""
        return self.operator.run_rows()

    # -- a failover to a lagging standby: every part's share -------------------

    def lose_writes(self, after_us: int, *, break_connection: bool = True) -> int:
        """What a failover to a standby that lagged behind does: forget every
        write after ``after_us`` on the store's clock (rows claimed or taken
        over then are gone, confirms made then are undone, the stored schedules
        and their revision counter are as they were), and break the
        connection once: :attr:`~celery_singlebeat.store.connection.StoreConnection.interruptions`
        counts it, and with :attr:`.StoreConnection.stop_at_reconnect` the next round trip raises
        :class:`~celery_singlebeat.exceptions.ConnectionReplaced` without doing
        anything. ``break_connection=False``: the clients see no break (a
        pooler in front of the database moved its own connections to the
        promoted standby). SingletonTask's run rows too. Returns how many rows changed.
        A test helper, not a round trip."""
        with self.state.lock:
            changed = self.slots.lose_writes(after_us)
            changed += self.singletons.lose_writes(after_us)
            changed += self.schedules.lose_writes(after_us)
            if break_connection:
                self.break_connection()
        return changed

    # -- the beat's slots (slots.py) ------------------------------------------

    def register(self, names: Sequence[str], owner: str = "") -> dict[str, EntryState]:
        """See :meth:`.SlotStore.register`."""
        return self.slots.register(names, owner)

    def claim(
        self,
        owner: str,
        slots: Sequence[SlotKey],
        lease_us: int,
        revisions: Mapping[str, Written] | None = None,
    ) -> list[Claim]:
        """See :meth:`.SlotStore.claim`."""
        return self.slots.claim(owner, slots, lease_us, revisions)

    def confirm(self, owner: str, claims: Sequence[Claim]) -> list[Claim]:
        """See :meth:`.SlotStore.confirm`."""
        return self.slots.confirm(owner, claims)

    def reassert(self, owner: str, sent: Sequence[Claim]) -> list[Claim]:
        """See :meth:`.SlotStore.reassert`."""
        return self.slots.reassert(owner, sent)

    def release(self, owner: str, claims: Sequence[Claim], retry_in_us: int = 0) -> None:
        """See :meth:`.SlotStore.release`."""
        self.slots.release(owner, claims, retry_in_us)

    def take_over(
        self, owner: str, lease_us: int, limit: int, seen: int | None = None
    ) -> list[Claim]:
        """See :meth:`.SlotStore.take_over`."""
        return self.slots.take_over(owner, lease_us, limit, seen)

    def prune(self, retention_us: int, every_us: int) -> int | None:
        """See :meth:`.SlotStore.prune`; the slot instant tells a row's age."""
        return self.slots.prune(retention_us, every_us)

    def recent_owners(self, window_us: int) -> list[str]:
        """See :meth:`.SlotStore.recent_owners`."""
        return self.slots.recent_owners(window_us)

    # -- the fleet as replicas see it (fleet.py) ------------------------------

    def heartbeat(self, info: ReplicaInfo) -> list[str]:
        """See :meth:`.FleetStore.heartbeat`."""
        return self.fleet.heartbeat(info)

    def stopped(self, replica_id: str) -> None:
        """See :meth:`.FleetStore.stopped`."""
        self.fleet.stopped(replica_id)

    def publish_catalog(self, replica_id: str, entries: Sequence[CatalogEntry]) -> None:
        """See :meth:`.FleetStore.publish_catalog`."""
        self.fleet.publish_catalog(replica_id, entries)

    def prune_fleet(self, retention_us: int) -> int:
        """See :meth:`.FleetStore.prune_fleet` (replica rows and catalogs; run-now
        requests have no rows of their own here)."""
        return self.fleet.prune_fleet(retention_us)

    def listen(self) -> ControlListener | None:
        """See :meth:`.FleetStore.listen`: no channel here (None); a replica reads
        :attr:`.FleetStore.controls_version`, which :meth:`pause`, :meth:`resume` and
        :meth:`request_run` raise, at its next claim or heartbeat."""
        return self.fleet.listen()

    def pauses(self) -> list[Pause]:
        """See :meth:`.FleetStore.pauses`."""
        return self.fleet.pauses()

    # -- SingletonTask's leases and runs (singletons.py) -----------------------

    def acquire_lease(self, key: str, owner: str, ttl_us: int) -> Lease | Busy:
        """See :meth:`.SingletonStore.acquire_lease`."""
        return self.singletons.acquire_lease(key, owner, ttl_us)

    def renew_lease(self, lease: Lease, ttl_us: int) -> Lease | None:
        """See :meth:`.SingletonStore.renew_lease`."""
        return self.singletons.renew_lease(lease, ttl_us)

    def release_lease(self, lease: Lease) -> bool:
        """See :meth:`.SingletonStore.release_lease`."""
        return self.singletons.release_lease(lease)

    def lease_holds(self, key: str, token: int) -> bool:
        """See :meth:`.SingletonStore.lease_holds`."""
        return self.singletons.lease_holds(key, token)

    def begin_run(self, run: Run, owner: str, task_id: str, ttl_us: int) -> RunBegin:
        """See :meth:`.SingletonStore.begin_run`."""
        return self.singletons.begin_run(run, owner, task_id, ttl_us)

    def reassert_runs(self, records: Sequence[RunRecord]) -> list[RunRecord]:
        """See :meth:`.SingletonStore.reassert_runs`."""
        return self.singletons.reassert_runs(records)

    def renew_run(self, run: Run, ttl_us: int) -> bool:
        """See :meth:`.SingletonStore.renew_run`."""
        return self.singletons.renew_run(run, ttl_us)

    def finish_run(self, run: Run, outcome: str) -> bool:
        """See :meth:`.SingletonStore.finish_run`."""
        return self.singletons.finish_run(run, outcome)

    def abandon_run(self, run: Run, *, ran: bool = True) -> bool:
        """See :meth:`.SingletonStore.abandon_run`."""
        return self.singletons.abandon_run(run, ran=ran)

    def prune_singletons(self, retention_us: int, every_us: int) -> int | None:
        """See :meth:`.SingletonStore.prune_singletons`."""
        return self.singletons.prune_singletons(retention_us, every_us)

    # -- stored schedules (schedules.py) --------------------------------------

    def write_schedules(
        self,
        writes: Sequence[ScheduleWrite],
        by: str,
        why: str = "",
        connection: Any = None,
    ) -> list[ScheduleRow]:
        """See :meth:`.ScheduleStore.write_schedules`. A batch is one atomic
        decision under the store's lock, so revisions are visible in order by
        construction. ``connection`` is not supported (there is no caller's
        transaction to join in memory): TypeError."""
        return self.schedules.write_schedules(writes, by, why, connection)

    def schedule_rows(self) -> tuple[list[ScheduleRow], int]:
        """See :meth:`.ScheduleStore.schedule_rows`."""
        return self.schedules.schedule_rows()

    def schedule_row(self, name: str) -> ScheduleRow | None:
        """See :meth:`.ScheduleStore.schedule_row`."""
        return self.schedules.schedule_row(name)

    def schedule_feed(self, after: int) -> ScheduleFeed:
        """See :meth:`.ScheduleStore.schedule_feed`."""
        return self.schedules.schedule_feed(after)

    def feed_versions(self) -> int:
        """See :meth:`.ScheduleStore.feed_versions`; the control version is the
        one :meth:`pause`, :meth:`resume` and :meth:`request_run` raise."""
        return self.schedules.feed_versions()

    def schedule_log(self, name: str | None = None, limit: int = 100) -> list[ScheduleLogRow]:
        """See :meth:`.ScheduleStore.schedule_log`."""
        return self.schedules.schedule_log(name, limit)

    def prune_schedules(self, tombstones_us: int, log_us: int) -> int:
        """See :meth:`.ScheduleStore.prune_schedules`."""
        return self.schedules.prune_schedules(tombstones_us, log_us)

    def catalogued(self, names: Sequence[str]) -> dict[str, list[str]]:
        """See :meth:`.ScheduleStore.catalogued`."""
        return self.schedules.catalogued(names)

    def sent_count(self, name: str, since_us: int) -> int:
        """See :meth:`.ScheduleStore.sent_count`."""
        return self.schedules.sent_count(name, since_us)
