"""SingletonTask's leases and runs in the memory store: the memory ``SingletonStore`` contract.

:class:`MemorySingletons` takes, renews, releases and checks the lease of a
singleton key (its token grows at every hand-over, never otherwise), starts,
renews, finishes and abandons the run row of a slot, writes back the run rows
a worker recorded before a failover, and prunes the old ones, each as one
round trip of the store's connection, deciding as the SQL statements do.
:meth:`MemorySingletons.lose_writes` is the runs' share of a failover to a
lagging standby.
"""

from __future__ import annotations

from collections.abc import Sequence

from ...store.base import Busy, Lease, Run, RunBegin, RunRecord, RunStatus, SlotKey
from .connection import MemoryConnection
from .state import MemoryLease, MemoryRun

__all__ = ["MemorySingletons"]


class MemorySingletons:
    """The :class:`~celery_singlebeat.store.singleton_store.SingletonStore`
    methods of :class:`~.store.MemoryStore`, which delegates each of them
    here; they share the store's connection and state with the other parts."""

    def __init__(self, connection: MemoryConnection) -> None:
        self._connection = connection
        self._state = connection.state

    def acquire_lease(self, key: str, owner: str, ttl_us: int) -> Lease | Busy:
        """See :meth:`.SingletonStore.acquire_lease`."""
        with self._connection.round_trip("acquire lease") as now:
            row = self._state.leases.get(key)
            if row is not None and row.expires_us >= now:
                return Busy(row.owner, row.expires_us)
            token = now if row is None else max(row.token + 1, now)
            self._state.leases[key] = MemoryLease(token, owner, now + ttl_us, now)
            return Lease(key, token, now + ttl_us)

    def renew_lease(self, lease: Lease, ttl_us: int) -> Lease | None:
        """See :meth:`.SingletonStore.renew_lease`."""
        with self._connection.round_trip("renew lease") as now:
            row = self._state.leases.get(lease.key)
            if row is None or row.token != lease.token or row.expires_us <= 0:
                return None
            row.expires_us = now + ttl_us
            return lease._replace(expires_us=row.expires_us)

    def release_lease(self, lease: Lease) -> bool:
        """See :meth:`.SingletonStore.release_lease`."""
        with self._connection.round_trip("release lease"):
            row = self._state.leases.get(lease.key)
            if row is None or row.token != lease.token or row.expires_us <= 0:
                return False
            row.expires_us = 0
            return True

    def lease_holds(self, key: str, token: int) -> bool:
        """See :meth:`.SingletonStore.lease_holds`."""
        with self._connection.round_trip("check lease") as now:
            row = self._state.leases.get(key)
            return row is not None and row.token == token and row.expires_us > now

    def begin_run(self, run: Run, owner: str, task_id: str, ttl_us: int) -> RunBegin:
        """See :meth:`.SingletonStore.begin_run`."""
        with self._connection.round_trip("begin run") as now:
            key = SlotKey(run.entry, run.slot_us)
            row = self._state.runs.get(key)
            if row is None:
                self._state.runs[key] = MemoryRun(run.run_id, 0, owner, task_id, now + ttl_us, now)
                return RunBegin(RunStatus.STARTED, owner, None)
            if row.state == 0 and row.expires_us < now:
                row.attempts += 1
                row.run_id, row.owner, row.task_id = run.run_id, owner, task_id
                row.expires_us, row.started_us = now + ttl_us, now
                return RunBegin(RunStatus.STARTED, owner, None)
            row.repeats += 1
            row.last_repeat_us = now
            status = RunStatus.FINISHED if row.state == 1 else RunStatus.RUNNING
            return RunBegin(status, row.owner, row.outcome)

    def reassert_runs(self, records: Sequence[RunRecord]) -> list[RunRecord]:
        """See :meth:`.SingletonStore.reassert_runs`."""
        if not records:
            return []
        with self._connection.round_trip("write run rows again"):
            again: list[RunRecord] = []
            for record in records:
                run = record.run
                key = SlotKey(run.entry, run.slot_us)
                row = self._state.runs.get(key)
                finished = record.outcome is not None
                if row is None:
                    self._state.runs[key] = MemoryRun(
                        run.run_id,
                        1 if finished else 0,
                        record.owner,
                        record.task_id,
                        record.expires_us,
                        record.started_us,
                        finished_us=record.finished_us,
                        outcome=record.outcome,
                    )
                elif (
                    row.state == 0
                    and row.run_id != run.run_id
                    and row.started_us < record.started_us
                    and row.expires_us < record.started_us
                ):
                    # the row as it was before this record's start retook it
                    row.attempts += 1
                    row.run_id, row.state = run.run_id, 1 if finished else 0
                    row.owner, row.task_id = record.owner, record.task_id
                    row.expires_us, row.started_us = record.expires_us, record.started_us
                    row.finished_us, row.outcome = record.finished_us, record.outcome
                elif finished and row.state == 0 and row.run_id == run.run_id:
                    row.state, row.finished_us, row.outcome = 1, record.finished_us, record.outcome
                else:
                    continue
                again.append(record)
            return again

    def _own_run(self, run: Run) -> MemoryRun | None:
        row = self._state.runs.get(SlotKey(run.entry, run.slot_us))
        if row is None or row.run_id != run.run_id or row.state != 0:
            return None
        return row

    def renew_run(self, run: Run, ttl_us: int) -> bool:
        """See :meth:`.SingletonStore.renew_run`."""
        with self._connection.round_trip("renew run") as now:
            row = self._own_run(run)
            if row is not None:
                row.expires_us = now + ttl_us
            return row is not None

    def finish_run(self, run: Run, outcome: str) -> bool:
        """See :meth:`.SingletonStore.finish_run`."""
        with self._connection.round_trip("finish run") as now:
            row = self._own_run(run)
            if row is not None:
                row.state, row.finished_us, row.outcome = 1, now, outcome
            return row is not None

    def abandon_run(self, run: Run, *, ran: bool = True) -> bool:
        """See :meth:`.SingletonStore.abandon_run`."""
        with self._connection.round_trip("abandon run"):
            row = self._own_run(run)
            if row is not None:
                if row.expires_us > 0 and not ran:
                    row.attempts -= 1
                row.expires_us = 0
            return row is not None

    def prune_singletons(self, retention_us: int, every_us: int) -> int | None:
        """See :meth:`.SingletonStore.prune_singletons`."""
        with self._connection.round_trip("prune singletons") as now:
            if self._state.prune_singletons_next_us > now:
                return None
            self._state.prune_singletons_next_us = now + every_us
            cutoff = now - retention_us
            runs = [
                k
                for k, r in self._state.runs.items()
                if (r.state == 1 and (r.finished_us or 0) < cutoff)
                or (r.state == 0 and r.expires_us < now and r.started_us < cutoff)
            ]
            leases = [
                name
                for name, row in self._state.leases.items()
                if row.expires_us < now and row.acquired_us < cutoff and row.token < cutoff
            ]
            for k in runs:
                del self._state.runs[k]
            for name in leases:
                del self._state.leases[name]
            return len(runs) + len(leases)

    def lose_writes(self, after_us: int) -> int:
        """The runs' share of :meth:`.MemoryStore.lose_writes`: runs started
        after ``after_us`` are gone, runs finished then are running again.
        Returns how many rows changed. The caller holds the state's lock."""
        changed = 0
        for key, run in list(self._state.runs.items()):
            if run.started_us > after_us:
                del self._state.runs[key]
                changed += 1
            elif run.finished_us is not None and run.finished_us > after_us:
                run.state, run.finished_us, run.outcome = 0, None, None
                changed += 1
        return changed
