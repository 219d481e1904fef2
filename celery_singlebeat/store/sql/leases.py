"""SingletonTask's keys and runs in SQL: the implementation of :class:`.SingletonStore`.

:class:`SqlLeases` is the part of :class:`~.store.SqlStore` its singleton
methods delegate to, with its statements beside it (``lease_statements.py``).
PostgreSQL answers each operation in one statement (with a read of the holder
when an acquisition lost the key to a concurrent one), SQLite in one (with a
read when the key is busy); MySQL/MariaDB, without RETURNING, write then read
the row back.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

from sqlalchemy.engine import Connection

from ..values import Busy, Lease, Run, RunBegin, RunRecord, RunStatus
from .host import SqlHost, fetch
from .lease_statements import LeaseDialect, lease_dialect_for


class SqlLeases:
    """SingletonTask's lease and run rows: the methods of
    :class:`.SingletonStore`, whose docstrings say what each may touch."""

    def __init__(self, host: SqlHost) -> None:
        self.host = host
        #: the store's one executor
        self.executor = host.executor
        self.sql: LeaseDialect = lease_dialect_for(host.backend, host.tables.prefix)

    def acquire_lease(self, key: str, owner: str, ttl_us: int) -> Lease | Busy:
        grant = uuid.uuid4().hex
        params = {"key": key, "owner": owner, "grant": grant, "ttl_us": ttl_us}
        sql = self.sql

        def work(conn: Connection) -> Lease | Busy:
            if sql.returning:
                rows = fetch(self.host, conn, sql.acquire, **params)
                if not rows:  # SQLite returns nothing when the key is busy
                    return self._holder(conn, key)
                now, token, expires, holder, until = rows[0]
                return self._lease_answer(conn, key, now, token, expires, holder, until)
            conn.execute(self.executor.text(sql.acquire), params)
            _now, token, expires, holder, row_grant = fetch(
                self.host, conn, sql.lease_row, key=key
            )[0]
            if row_grant == grant:
                return Lease(key, int(token), int(expires))
            return Busy(str(holder or "?"), int(expires or 0))

        return self.executor.run("acquire lease", work)

    def _lease_answer(
        self,
        conn: Connection,
        key: str,
        now: Any,
        token: Any,
        expires: Any,
        holder: Any,
        until: Any,
    ) -> Lease | Busy:
        """A PostgreSQL acquisition's answer: the lease, or who holds the key."""
        if token is not None:
            return Lease(key, int(token), int(expires))
        # The holder comes with the answer as the statement's snapshot saw the
        # row; a row missing or free there was taken by a concurrent acquirer
        # that committed meanwhile: read it again.
        if holder is not None and int(until) >= int(now):
            return Busy(str(holder), int(until))
        return self._holder(conn, key)

    def _holder(self, conn: Connection, key: str) -> Busy:
        row = fetch(self.host, conn, self.sql.lease_row, key=key)[0]
        return Busy(str(row[3] or "?"), int(row[2] or 0))

    def begin_slot(
        self, run: Run, key: str, owner: str, task_id: str, ttl_us: int
    ) -> tuple[RunBegin, Lease | Busy | None]:
        params = {
            **_run_params(run, owner, task_id, ttl_us),
            "key": key,
            "grant": uuid.uuid4().hex,
        }

        def work(conn: Connection) -> tuple[RunBegin, Lease | Busy | None]:
            row = fetch(self.host, conn, self.sql.begin_slot, **params)[0]
            now, run_id, state, holder, outcome, token, expires, key_holder, until = row
            begin = _run_begin(run, run_id, state, holder, outcome)
            if begin.status is not RunStatus.STARTED:
                return begin, None
            return begin, self._lease_answer(conn, key, now, token, expires, key_holder, until)

        return self.executor.run("begin slot", work)

    def end_slot(self, run: Run, outcome: str | None, lease: Lease) -> tuple[bool, bool]:
        params = {
            "entry": run.entry,
            "slot_us": run.slot_us,
            "run_id": run.run_id,
            "abandon": outcome is None,
            "outcome": outcome or "",
            "key": lease.key,
            "token": lease.token,
        }
        row = self.executor.run(
            "end slot", lambda conn: fetch(self.host, conn, self.sql.end_slot, **params)[0]
        )
        return int(row[1]) == 1, int(row[2]) == 1

    def renew_lease(self, lease: Lease, ttl_us: int) -> Lease | None:
        params = {"key": lease.key, "token": lease.token, "ttl_us": ttl_us}
        sql = self.sql

        def work(conn: Connection) -> Lease | None:
            if sql.returning:
                rows = fetch(self.host, conn, sql.renew, **params)
                if not rows or rows[0][1] is None:
                    return None
                return lease._replace(expires_us=int(rows[0][1]))
            if conn.execute(self.executor.text(sql.renew), params).rowcount != 1:
                return None
            row = fetch(self.host, conn, sql.lease_row, key=lease.key)[0]
            return lease._replace(expires_us=int(row[2]))

        return self.executor.run("renew lease", work)

    def release_lease(self, lease: Lease) -> bool:
        params = {"key": lease.key, "token": lease.token}
        return self.executor.run(
            "release lease",
            lambda conn: conn.execute(self.executor.text(self.sql.release), params).rowcount == 1,
        )

    def lease_holds(self, key: str, token: int) -> bool:
        rows = self.executor.run(
            "check lease",
            lambda conn: fetch(self.host, conn, self.sql.holds, key=key, token=token),
        )
        return int(rows[0][1]) > 0

    def begin_run(self, run: Run, owner: str, task_id: str, ttl_us: int) -> RunBegin:
        params = _run_params(run, owner, task_id, ttl_us)
        sql = self.sql

        def work(conn: Connection) -> RunBegin:
            if sql.returning:
                row = fetch(self.host, conn, sql.begin_run, **params)[0]
            else:
                conn.execute(self.executor.text(sql.begin_run), params)
                row = fetch(self.host, conn, sql.run_row, entry=run.entry, slot_us=run.slot_us)[0]
            _now, run_id, state, holder, outcome = row
            return _run_begin(run, run_id, state, holder, outcome)

        return self.executor.run("begin run", work)

    def _run_update(self, what: str, statement: str, run: Run, **extra: Any) -> bool:
        params = {"entry": run.entry, "slot_us": run.slot_us, "run_id": run.run_id, **extra}
        return self.executor.run(
            what, lambda conn: conn.execute(self.executor.text(statement), params).rowcount == 1
        )

    def renew_run(self, run: Run, ttl_us: int) -> bool:
        return self._run_update("renew run", self.sql.renew_run, run, ttl_us=ttl_us)

    def finish_run(self, run: Run, outcome: str) -> bool:
        return self._run_update("finish run", self.sql.finish_run, run, outcome=outcome)

    def abandon_run(self, run: Run, *, ran: bool = True) -> bool:
        return self._run_update("abandon run", self.sql.abandon_run, run, unrun=int(not ran))

    def reassert_runs(self, records: Sequence[RunRecord]) -> list[RunRecord]:
        if not records:
            return []
        sql = self.sql

        def work(conn: Connection) -> list[RunRecord]:
            # a worker process's runs of the last window: a few rows, one
            # statement or two each, in one transaction
            again: list[RunRecord] = []
            for record in records:
                params = {
                    "entry": record.run.entry,
                    "slot_us": record.run.slot_us,
                    "run_id": record.run.run_id,
                    "state": 0 if record.outcome is None else 1,
                    "owner": record.owner,
                    "task_id": record.task_id,
                    "expires_us": record.expires_us,
                    "started_us": record.started_us,
                    "finished_us": record.finished_us,
                    "outcome": record.outcome,
                }
                written = conn.execute(self.executor.text(sql.reinsert_run), params).rowcount == 1
                if not written:
                    retaken = conn.execute(self.executor.text(sql.retake_run), params)
                    written = retaken.rowcount == 1
                if not written and record.outcome is not None:
                    refinish = conn.execute(self.executor.text(sql.refinish_run), params)
                    written = refinish.rowcount == 1
                if written:
                    again.append(record)
            return again

        return self.executor.run("write run rows again", work)

    def prune_singletons(self, retention_us: int, every_us: int) -> int | None:
        sql = self.sql

        def work(conn: Connection) -> int | None:
            if (
                conn.execute(self.executor.text(sql.prune_turn), {"every_us": every_us}).rowcount
                != 1
            ):
                return None
            return self.delete_old(conn, retention_us)

        return self.executor.run("prune singletons", work)

    def delete_old(self, conn: Connection, retention_us: int) -> int:
        """What :meth:`prune_singletons` deletes once it has the turn, and the
        operator's prune at once: the run rows and idle lease rows older than
        ``retention_us``; how many went."""
        params = {"retention_us": retention_us}
        runs = conn.execute(self.executor.text(self.sql.prune_runs), params).rowcount
        locks = conn.execute(self.executor.text(self.sql.prune_locks), params).rowcount
        return int(runs) + int(locks)


def _run_params(run: Run, owner: str, task_id: str, ttl_us: int) -> dict[str, Any]:
    """The parameters of a statement that starts a run."""
    return {
        "entry": run.entry,
        "slot_us": run.slot_us,
        "run_id": run.run_id,
        "owner": owner,
        "task_id": task_id,
        "ttl_us": ttl_us,
    }


def _run_begin(run: Run, run_id: Any, state: Any, holder: Any, outcome: Any) -> RunBegin:
    if run_id == run.run_id:
        return RunBegin(RunStatus.STARTED, str(holder), outcome)
    status = RunStatus.FINISHED if int(state) == 1 else RunStatus.RUNNING
    return RunBegin(status, str(holder), outcome)
