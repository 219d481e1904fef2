"""The fleet in the memory store, as replicas see it: the memory ``FleetStore`` contract.

:class:`MemoryFleet` keeps each replica's row (its heartbeat, its graceful
stop) and the catalog of its entries, answers the pauses in force and the
live replicas, and prunes the rows that say nothing any more, each as one
round trip of the store's connection. A heartbeat also counts the open claims
and reads the stored schedules' revision, as the SQL heartbeat does in the
same statement. The operator's side of these rows (pause, resume, run now)
is :mod:`.operator`.
"""

from __future__ import annotations

from collections.abc import Sequence

from ...store.base import CatalogEntry, ControlListener, Pause, ReplicaInfo
from ...timeline.membership import replica_live
from .connection import MemoryConnection

__all__ = ["MemoryFleet"]


class MemoryFleet:
    """The :class:`~celery_singlebeat.store.fleet_store.FleetStore` methods of
    :class:`~.store.MemoryStore`, which delegates each of them here; they
    share the store's connection and state with the other parts."""

    def __init__(self, connection: MemoryConnection) -> None:
        self._connection = connection
        self._state = connection.state

    def heartbeat(self, info: ReplicaInfo) -> list[str]:
        """See :meth:`.FleetStore.heartbeat`."""
        with self._connection.round_trip("heartbeat") as now:
            row = dict(info._asdict(), seen_us=now, stopped_us=None)
            self._state.replicas[info.id] = row
            # and the runs that may have stalled, as the SQL heartbeat counts
            # them (fleet_statements._open_claims)
            policy = self._connection.stalled_runs
            self._connection.open_claims = sum(
                1 for r in self._state.slots.values() if r.state == 0
            ) + sum(
                1
                for r in self._state.runs.values()
                if r.state == 0
                and r.attempts <= policy.resends
                and now - policy.window_us < r.expires_us < now
            )
            self._connection.schedule_revision = self._state.top_revision()
            return sorted(
                rid
                for rid, r in self._state.replicas.items()
                if replica_live(r["seen_us"], r["heartbeat_us"], r["stopped_us"], now)
            )

    def stopped(self, replica_id: str) -> None:
        """See :meth:`.FleetStore.stopped`."""
        with self._connection.round_trip("mark replica stopped") as now:
            if replica_id in self._state.replicas:
                self._state.replicas[replica_id]["stopped_us"] = now

    def publish_catalog(self, replica_id: str, entries: Sequence[CatalogEntry]) -> None:
        """See :meth:`.FleetStore.publish_catalog`."""
        with self._connection.round_trip("publish catalog"):
            self._state.catalog[replica_id] = {e.entry: e for e in entries}

    def prune_fleet(self, retention_us: int) -> int:
        """See :meth:`.FleetStore.prune_fleet` (replica rows and catalogs; run-now
        requests have no rows of their own here)."""
        with self._connection.round_trip("prune fleet") as now:
            gone = [
                rid
                for rid, row in self._state.replicas.items()
                if (row["stopped_us"] or row["seen_us"]) < now - retention_us
            ]
            for rid in gone:
                del self._state.replicas[rid]
            orphans = [rid for rid in self._state.catalog if rid not in self._state.replicas]
            rows = sum(len(self._state.catalog.pop(rid)) for rid in orphans)
            return len(gone) + rows

    def listen(self) -> ControlListener | None:
        """See :meth:`.FleetStore.listen`: no channel here (None); a replica reads
        :attr:`.FleetStore.controls_version`, which the operator's controls
        (:meth:`.MemoryStore.pause`, :meth:`~.MemoryStore.resume`,
        :meth:`~.MemoryStore.request_run`) raise, at its next claim or heartbeat."""
        return None

    def pauses(self) -> list[Pause]:
        """See :meth:`.FleetStore.pauses`."""
        with self._connection.round_trip("read pauses") as now:
            return sorted(
                (p for p in self._state.pauses.values() if p.until_us is None or p.until_us > now),
                key=lambda p: p.entry,
            )
