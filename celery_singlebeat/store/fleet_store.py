"""The fleet and its controls, as replicas see them: the contract of :class:`FleetStore`.

What a replica writes so that the others and the operator know it (its
heartbeat, its graceful stop, the catalog of its entries), what it reads of
the operator's controls (the pauses, the control version, and on PostgreSQL a
channel that hears each control change at its commit), and the prune of the
fleet's rows. The operator's side of the same rows is ``Operator``
(``store/sql/operator.py``). The suite: ``tests/integration/test_fleet_contract.py``.

Every method but :meth:`FleetStore.listen` has a default, so a store written
for an earlier release that kept no fleet rows still serves the scheduler: it
then counts itself alone and learns of no control.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence

from .connection import StoreConnection
from .values import CatalogEntry, Pause, ReplicaInfo

__all__ = ["ControlListener", "FleetStore"]


class ControlListener(ABC):
    """What :meth:`FleetStore.listen` returns: hears each control change at its commit.

    A connection (or any channel) of its own, read without a round trip, so a
    replica honours a control within a second while idle at no statement at
    all. PostgreSQL's is ``PostgresControlListener`` (``store/sql/listening.py``).
    """

    @abstractmethod
    def poll(self) -> bool:
        """True when at least one control change (pause, resume, run now) was
        committed since the last poll, or since :meth:`FleetStore.listen` for
        the first; False otherwise. Never blocks and never sends a statement:
        it reads what has already arrived.

        Raises whatever the channel raises once it is lost: the caller closes
        the listener and asks for a new one later; changes made meanwhile are
        read at the next heartbeat (:attr:`FleetStore.controls_version`).
        """

    @abstractmethod
    def close(self) -> None:
        """Release the channel. Idempotent, and quiet on a channel already lost."""

    def probe(self) -> None:
        """Send, by a statement on the store's own connections (never this
        channel's), a notification only this listener knows, so that the
        caller learns whether the channel hears at all: a pooler in
        transaction mode (PgBouncer) takes a LISTEN to a server connection it
        then hands to other clients, and nothing reaches this one again, with
        no error to tell. :attr:`probe_heard` then says whether it arrived
        (:meth:`poll` reads it; it is not a control change). Raises
        :class:`~celery_singlebeat.exceptions.StoreUnavailable` when the
        statement fails. The default sends nothing: a channel that cannot be
        deaf.
        """
        return None

    @property
    def probe_heard(self) -> bool:
        """Whether the notification of the last :meth:`probe` has arrived
        (by the last :meth:`poll`); the default: always."""
        return True


class FleetStore(StoreConnection):
    """The replica rows, catalogs and controls of the fleet sharing the database."""

    #: the control version the last statement that read it returned (or None).
    #: Every control change (pause, resume, run now) raises it in the same
    #: transaction; :meth:`heartbeat` reads it on every store, the claim on
    #: stores that can fold it in, so a replica notices a change without a
    #: statement of its own.
    controls_version: int | None = None

    #: claimed-but-unsent rows in the whole store, as the last :meth:`heartbeat`
    #: counted them (None: not counted; a sweep then always tries a takeover)
    open_claims: int | None = None

    def heartbeat(self, info: ReplicaInfo) -> list[str]:
        """Record ``info`` in the replica's row and return the live replicas.

        Upserts the row with ``seen_us`` = the database's now and clears its
        ``stopped_us``; reads the control version into :attr:`controls_version`,
        the claimed-but-unsent rows into :attr:`open_claims` and, where the
        store keeps stored schedules, their highest revision into
        :attr:`.ScheduleStore.schedule_revision` (so that a heartbeat counts as
        a feed read). Returns the
        ids, sorted, of the replica rows that are live by
        :func:`~celery_singlebeat.timeline.membership.replica_live` at the database's
        now of this call, ``info.id`` always among them (its row was just
        written: live by definition, whether or not the statement's read sees
        its own write). One round trip where the store can (PostgreSQL,
        SQLite). The scheduler shares its entries among these replicas.
        This default keeps no replica rows and returns ``[]``: each replica
        then counts itself alone and proposes every slot at once, as without
        sharing (still each slot once).
        """
        return []

    def stopped(self, replica_id: str) -> None:
        """Mark the replica's row as gone (a graceful stop): ``stopped_us`` = now.

        From this commit on, the row is no longer live (:meth:`heartbeat`
        leaves it out), so the other replicas take over its share of the
        entries at their next heartbeat, not after its row ages."""

    def publish_catalog(self, replica_id: str, entries: Sequence[CatalogEntry]) -> None:
        """Record that ``replica_id`` has exactly ``entries`` (rows of other
        entries of that replica are deleted). Idempotent."""

    def pauses(self) -> list[Pause]:
        """The pauses in force now (``until_us`` NULL or after now), by entry;
        reads :attr:`controls_version` too (the version these pauses are of)."""
        return []

    def prune_fleet(self, retention_us: int) -> int:
        """Delete the fleet's rows that say nothing any more; return how many.

        Those are: replica rows stopped, or not seen, for longer than
        ``retention_us``; the catalog rows of replicas that have no row; the
        run-now request rows whose slot row is gone (pruned once sent). Never a
        live replica's rows (the retention is at least four leases, a live
        replica heartbeats every few seconds). Safe from several replicas at
        once; a periodic prune calls it after :meth:`.SlotStore.prune`.
        """
        return 0

    def listen(self) -> ControlListener | None:
        """A listener of its own that hears every control change committed
        after this call returned (:class:`ControlListener`), or None when the
        store has no such channel (the default; MySQL/MariaDB, SQLite and the
        in-memory store): then a replica learns of a change from
        :attr:`controls_version`, at its next claim or heartbeat. Touches no
        row. Each call opens a new listener, which the caller closes. Raises
        :class:`~celery_singlebeat.exceptions.StoreUnavailable` when the
        channel cannot be opened (the caller tries again later, and the
        heartbeat reads the changes meanwhile); a setting may keep a replica
        from asking (``singlebeat_listen``, for a pooler that cannot carry
        PostgreSQL's LISTEN).
        """
        return None
