"""The storage boundary: one contract per audience, and :class:`Store`, all of them.

Every method is one atomic decision taken by the database (a constant number
of round trips, whatever the number of slots), and every instant is in
microseconds since the Unix epoch, UTC, **on the database's clock**: stores
learn that clock from each round trip into :attr:`.StoreConnection.clock`.

Each audience holds a store by its own contract, each with its contract
suite, run against every store (in-memory, SQLite, PostgreSQL, MariaDB):

* :class:`~.connection.StoreConnection`: what they all share (the schema
  check, the database's clock, the round trip hook, the connection's breaks,
  :attr:`~.connection.StoreConnection.stop_at_reconnect`, ``close``);
* :class:`~.slot_store.SlotStore`: the beat's slots (register, claim,
  confirm, release, take over, prune, and writing back after a failover);
* :class:`~.fleet_store.FleetStore`: the fleet and its controls as the
  replicas see them (heartbeat, catalog, pauses, control version, and
  :meth:`~.fleet_store.FleetStore.listen` for a channel that hears them);
* :class:`~.singleton_store.SingletonStore`: SingletonTask's leases and runs;
* :class:`~.schedule_store.ScheduleStore`: stored schedules (entries kept in
  the database and edited at run time), their change feed and their history.

:class:`Store` is all of them at once: what the scheduler opens, and what
``SqlStore`` (``store/sql/``) and :class:`~celery_singlebeat.testing.MemoryStore`
implement. The value types the contracts speak in are in :mod:`.values`;
every name stays importable from here.

Vocabulary, used by every contract below:

* a **slot row** exists once a slot has been claimed; its key is
  ``(entry, slot_us)`` and it is unique, so at most one replica holds a slot;
* a row is **claimed** (``state = 0``) while its owner publishes the task, and
  **sent** (``state = 1``) once the owner confirmed the publish;
* a claim's **lease** ends at ``lease_until_us``; a claimed row whose lease has
  ended is **abandoned** and may be taken over;
* the **fence** of a row starts at 1 and grows by one each time the row changes
  hands, so an owner can prove it still holds the claim it won;
* an entry's **high-water mark** is the latest slot that may have been deleted
  by :meth:`.SlotStore.prune`; a slot at or below it is never won, so a deleted row
  can never be won a second time, whatever a lagging replica proposes.

Workers (:class:`~celery_singlebeat.SingletonTask`) use two more kinds of row:

* a **lease** on a singleton key (a string naming what may run once at a
  time) is held until ``expires_us``; its **token** grows every time the lease
  changes hands, never otherwise, and is never smaller than the database's
  time of the hand-over, so it keeps growing even after an idle lease row was
  pruned. A lease whose ``expires_us`` has passed is **free**; a released
  lease is free at once;
* a **run** row records the execution of one slot (``entry``, ``slot_us``) by
  a worker: **running** (``finished`` false) until ``expires_us``, which the
  worker renews while it runs, then **finished**. Each start of a run has its
  own ``run_id``, so a worker can only finish or renew the start it made.

Stored schedules have two more:

* a **schedule row** per stored entry (:class:`~.values.ScheduleRow`), at the
  **revision** of the batch that last changed it; revisions commit in
  revision order, so a reader that has seen revision R has seen every write
  up to R; a deleted entry's row stays as a **tombstone** until pruned, so
  the **feed** (the rows above a cursor revision) reports the delete;
* a **history row** per changed entry per revision: who, when, why, and the
  field-by-field diff.
"""

from __future__ import annotations

from .connection import StoreConnection
from .fleet_store import ControlListener, FleetStore
from .schedule_store import ScheduleStore
from .singleton_store import SingletonStore
from .slot_store import SlotStore
from .values import (
    CONTROLS_KEY,
    EARLY_TOLERANCE_US,
    EDITABLE,
    LIVE_HEARTBEATS,
    LIVE_SLACK_US,
    PAUSE_ALL,
    SCHEDULE_FLOOR_KEY,
    SCHEDULE_REVISION_KEY,
    STALE_DEFINITION_US,
    Busy,
    CatalogEntry,
    Claim,
    EntryState,
    Lease,
    Pause,
    ReplicaInfo,
    Run,
    RunBegin,
    RunRecord,
    RunStatus,
    ScheduleFeed,
    ScheduleLogRow,
    ScheduleRow,
    ScheduleWrite,
    SlotKey,
    StalledRuns,
    Written,
    controls_channel,
)

__all__ = [
    "CONTROLS_KEY",
    "EARLY_TOLERANCE_US",
    "EDITABLE",
    "LIVE_HEARTBEATS",
    "LIVE_SLACK_US",
    "PAUSE_ALL",
    "SCHEDULE_FLOOR_KEY",
    "SCHEDULE_REVISION_KEY",
    "STALE_DEFINITION_US",
    "Busy",
    "CatalogEntry",
    "Claim",
    "ControlListener",
    "EntryState",
    "FleetStore",
    "Lease",
    "Pause",
    "ReplicaInfo",
    "Run",
    "RunBegin",
    "RunRecord",
    "RunStatus",
    "ScheduleFeed",
    "ScheduleLogRow",
    "ScheduleRow",
    "ScheduleStore",
    "ScheduleWrite",
    "SingletonStore",
    "SlotKey",
    "SlotStore",
    "StalledRuns",
    "Store",
    "StoreConnection",
    "Written",
    "controls_channel",
]


class Store(SlotStore, FleetStore, SingletonStore, ScheduleStore):
    """Shared state of all replicas and workers: every audience's contract at once.

    Implementations: SQL (``store.sql``) and in-memory
    (``celery_singlebeat.testing.memory``); both pass every contract suite. It adds
    nothing to its contracts (``tests/unit/test_store_contracts.py`` holds it
    to that): a method belongs to exactly one audience, and a consumer that
    needs one audience takes that contract, not this.

    Methods raise :class:`~celery_singlebeat.exceptions.StoreUnavailable` when the
    database cannot take the decision; they never return a partial answer.
    """
