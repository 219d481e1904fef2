"""Stored schedules: the contract of :class:`ScheduleStore`.

Schedule entries kept in the database and edited at run time, as rows of
plain values (:class:`.ScheduleRow`): the store knows nothing of beat,
Celery or how a schedule is encoded (``spec``, ``args``, ``kwargs``,
``options`` and ``policy`` are JSON texts it only parses to diff them). What
writers need (all-or-nothing batches with a conflict token, the history of
every change) and what replicas need (every row once, then only what changed,
in the order the database committed it, at a cost that grows with the
changes, not with the entries). The suite:
``tests/integration/test_schedule_store_contract.py``.

**Revisions, and why a counter row.** Every batch that changes something
takes one new revision, shared by all its rows, and a replica follows the
table by revision (:meth:`ScheduleStore.schedule_feed`). That only works if
revisions become visible in revision order: a reader that has seen revision
R must already see every revision below R, or it moves its cursor past a
commit still in flight and never reads it. An auto-increment id or a
writer's clock is taken at the start of a transaction and committed whenever
the transaction ends, so they commit out of order. Here the write's first
statement increments a counter row in the meta table
(:data:`.SCHEDULE_REVISION_KEY`) and keeps its row lock until the commit:
writers of stored schedules serialize on it (the next one's increment waits
for this one's commit), so they commit in revision order on every backend.
Readers never read nor lock that row (django-celery-beat's single
``last_update`` row, polled by every reader and written by every writer, is
its hot spot): they read the schedules table through its index on
``revision``, whose maximum is the newest committed revision.

**Retention.** A delete leaves a tombstone, so a replica following the feed
sees it; :meth:`ScheduleStore.prune_schedules` deletes old tombstones and
history rows, having first raised the feed's floor
(:data:`.SCHEDULE_FLOOR_KEY`) to the highest revision of a tombstone it
deletes: a reader whose cursor is below the floor may have missed a delete,
and the feed tells it to reload (``complete=False``).

Every method has a default, so a store written for an earlier release still
serves: its reads return nothing and its writes raise NotImplementedError.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .connection import StoreConnection
from .values import ScheduleFeed, ScheduleLogRow, ScheduleRow, ScheduleWrite

__all__ = ["ScheduleStore"]

_NONE = "this store keeps no stored schedules (a store written for an earlier release)"


class ScheduleStore(StoreConnection):
    """The stored schedules, their change feed and their history."""

    #: the highest schedules revision the last :meth:`feed_versions` read
    #: (None: not read yet). A replica's stored-schedules source compares its
    #: cursor with it, so that a tick in which nothing changed costs no
    #: statement of its own.
    schedule_revision: int | None = None

    def write_schedules(
        self,
        writes: Sequence[ScheduleWrite],
        by: str,
        why: str = "",
        connection: Any = None,
    ) -> list[ScheduleRow]:
        """Apply ``writes`` all or nothing, in one transaction; return the
        resulting row of each write, in order (for a delete, its tombstone).

        Reads and locks the rows the batch names (tombstones too) and the
        revision counter row; writes the rows that change and one history row
        per changed entry. A write that changes nothing (a replace with the
        very same fields, an update to the values stored; JSON texts compare
        as texts) is no change: it takes no revision, writes no history row
        and returns the row as stored. A batch in which nothing changes writes
        nothing. Otherwise the batch takes **one** new revision for all its
        changed rows, each stamped ``updated_us`` (the database's clock) and
        ``updated_by = by``, and ``created_us``/``created_by`` too when it is
        created: a create (or a replace) of a name whose row is a tombstone
        revives the name (its row and its history continue, ``created_*``
        start again). Each changed entry gets a history row
        (:class:`.ScheduleLogRow`) whose ``changes`` are its field-by-field
        diff: ``spec``, ``options`` and ``policy`` as parsed JSON, ``args``
        and ``kwargs`` only as digests (``"sha256:"`` and 12 hex digits) of
        the old and new texts, because arguments may carry secrets and the
        history is shown to operators; a create diffs from null, a delete to
        null.

        Statements: the counter's increment first (two on MySQL/MariaDB),
        the read of the named rows, the rows written, the history rows
        written (one statement each, whatever the batch's size), on
        PostgreSQL a ``NOTIFY`` of the controls channel
        (:func:`.controls_channel`, which :meth:`.FleetStore.listen` hears:
        only a hint, delivered at the commit), then the commit. A transaction
        that failed before its COMMIT was sent is run again whole; never once
        it was sent.

        ``connection``: the caller's own connection, in its own transaction:
        a SQLAlchemy ``Connection``, an ORM ``Session``
        (``session.connection()``) or a Django connection
        (``django.db.connection``, ``connections[alias]``, inside
        ``transaction.atomic()``). The statements then run there, neither
        beginning nor committing: the writes commit or roll back with the
        caller's own rows, and are not retried. The connection must reach the
        store's own database, with the store's table prefix (the store checks
        the dialect and raises ValueError when it differs; it cannot check
        the database), in READ COMMITTED (the default of Django and of
        PostgreSQL). The counter row stays locked until the caller's
        transaction ends, and other writers of stored schedules wait for it;
        a batch that changes nothing there still takes a revision number that
        no row will carry (the feed skips it).

        Raises ValueError before any round trip for a batch no store could
        write (``schedule_edits.check_batch``: an unknown op, a name
        named twice, missing or unknown fields, a wrong type or a JSON field
        that is not JSON, ``by`` over 120 or ``why`` over 1,000 characters);
        :class:`~celery_singlebeat.exceptions.ScheduleExists` (a create of a
        live name), :class:`~celery_singlebeat.exceptions.ScheduleNotFound`
        (an update or delete of a name without a live row),
        :class:`~celery_singlebeat.exceptions.ScheduleConflict` (``if_revision``
        differs from the live row's revision): nothing of the batch is written.
        """
        raise NotImplementedError(_NONE)

    def schedule_rows(self) -> tuple[list[ScheduleRow], int]:
        """Every live row (no tombstone), by name, and a revision R such that
        every write at a revision up to R is reflected in the rows, and a feed
        after R (:meth:`schedule_feed`) reports whatever is not (it may
        repeat some).

        R is the highest revision of the table (tombstones included) or the
        prune's floor, whichever is higher: after the prune deleted the
        newest tombstone, a cursor below the floor would make every feed
        incomplete. (So R may exceed :meth:`feed_versions`: a reader has news
        when that is above its cursor.) One statement that reads the rows, the
        highest revision and the floor in one snapshot: PostgreSQL's statement
        snapshot, InnoDB's consistent read of one statement, SQLite's read
        transaction of one statement. The default: ``([], 0)``.
        """
        return [], 0

    def schedule_row(self, name: str) -> ScheduleRow | None:
        """The live row named ``name``, or None (no row, or a tombstone).
        One statement; the default: None."""
        return None

    def schedule_feed(self, after: int) -> ScheduleFeed:
        """Every row, tombstones included, whose revision is above ``after``,
        ordered by revision (then name), and the cursor to pass next time (the
        highest revision read, or ``after`` when none).

        ``complete`` is False when ``after`` is below the floor the prune
        recorded: tombstones the reader has not seen may have been deleted,
        and it must reload (:meth:`schedule_rows`). One statement reads the
        rows and the floor; an index range scan on ``revision``, so its cost
        grows with the changes after ``after``, never with the number of
        entries. Revisions commit in order (the module says how), so a
        cursor never passes a commit in flight. The default: nothing,
        complete.
        """
        return ScheduleFeed([], after, True)

    def feed_versions(self) -> int:
        """The cheap read a replica makes about once a second: the highest
        revision of the schedules table (``max(revision)`` through its index,
        not the writers' counter row) or the prune's floor, whichever is
        higher, returned (0 when there is neither) and kept in
        :attr:`schedule_revision`; in the same statement the control version,
        kept in :attr:`.FleetStore.controls_version` as the heartbeat keeps
        it. The floor counts because the prune may delete the newest
        tombstone: the table's top then goes down, and a reader whose cursor
        is at that delete must still learn that something moved (its feed then
        says it is incomplete, and it reloads). One statement, one round trip,
        on every backend. The default: 0 (and the control version untouched)."""
        self.schedule_revision = 0
        return 0

    def schedule_log(self, name: str | None = None, limit: int = 100) -> list[ScheduleLogRow]:
        """The history, newest first (by revision, then name): of ``name``
        only, or of every entry; at most ``limit`` rows. One statement (the
        history's index on ``(name, revision)`` for one name). The default: []."""
        return []

    def prune_schedules(self, tombstones_us: int, log_us: int) -> int:
        """Delete the tombstones older than ``tombstones_us`` and the history
        rows older than ``log_us`` (by ``updated_us`` and ``at_us``, on the
        database's clock); return how many rows went.

        In one transaction: first the feed's floor
        (:data:`.SCHEDULE_FLOOR_KEY`) is raised to the highest revision of a
        tombstone about to go (never lowered), then those tombstones go, so a
        feed reads the floor and the rows of one snapshot, and a reader whose
        cursor is below a deleted tombstone learns that it must reload. Live
        rows are never deleted; a tombstone revived meanwhile is not one any
        more. Safe from several replicas at once (the floor row serializes
        them; the deletes are idempotent). Keep ``tombstones_us`` well above
        the longest a replica may go without reading the feed. The default: 0.
        """
        return 0

    def catalogued(self, names: Sequence[str]) -> dict[str, list[str]]:
        """Which of ``names`` a live replica's catalog lists (its
        ``beat_schedule``, or another catalogued source): each such name with
        the ids of those replicas, sorted. A stored entry may not take such a
        name: the replicas that define it would ignore the stored one and the
        others send it, two definitions under one name. Live by the one rule
        (:func:`~celery_singlebeat.timeline.membership.replica_live`, on the database's
        clock), so a stopped release's names are free again once its replicas
        are gone. One statement, whatever the number of names; the default
        (an earlier store, without catalogs): none."""
        return {}

    def sent_count(self, name: str, since_us: int) -> int:
        """How many slot rows (claimed or sent, run-now requests included) the
        entry ``name`` has at or after the slot instant ``since_us``: the runs
        so far of an entry limited to N runs. Slot rows that
        :meth:`.SlotStore.prune` deleted are not counted. One statement; the
        default: 0."""
        return 0
