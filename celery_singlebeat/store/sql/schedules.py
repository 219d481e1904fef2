"""Stored schedules in SQL: the implementation of :class:`.ScheduleStore`.

:class:`SqlSchedules` is the part of :class:`~.store.SqlStore` its stored
schedules' methods delegate to: it sends every statement through the store's
one :class:`~.executor.SqlExecutor` (its retries, its error wrapping, its rule
that a transaction is never run again once its COMMIT was sent), and decides
the writes with :mod:`~celery_singlebeat.store.schedule_edits`, as the
in-memory store does. The statements are beside it, in
``schedule_statements.py``.

A write may also run on the caller's connection, in the caller's transaction
(``connection=``): a SQLAlchemy ``Connection`` or ``Session``, or a Django
connection. The write is then the same statements through a small seam
(:class:`_Runner`): SQLAlchemy runs them itself; for Django they are compiled
by SQLAlchemy's dialect of the same family into the driver's ``%s`` style and
sent through Django's cursor. Django is never imported here.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any

from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError

from ...exceptions import StoreUnavailable
from ...timeline.membership import LIVE_HEARTBEATS, LIVE_SLACK_US
from ..schedule_edits import Edit, check_batch, plan
from ..values import (
    SCHEDULE_FLOOR_KEY,
    SCHEDULE_REVISION_KEY,
    ScheduleFeed,
    ScheduleLogRow,
    ScheduleRow,
    ScheduleWrite,
    controls_channel,
)
from .host import SqlHost
from .schedule_statements import ScheduleDialect, schedule_dialect_for

__all__ = ["SqlSchedules"]

#: SQLAlchemy backend names and Django vendors, by family
_FAMILY = {"postgresql": "postgresql", "mysql": "mysql", "mariadb": "mysql", "sqlite": "sqlite"}


class _Unchanged(Exception):
    """Raised inside a write's own transaction when nothing changed, so that
    the executor rolls the counter's increment back; carries the answer."""

    def __init__(self, rows: list[ScheduleRow]) -> None:
        super().__init__()
        self.rows = rows


class _Runner(ABC):
    """Where a write's statements run: the store's transaction or the caller's."""

    @abstractmethod
    def rows(self, statement: str, params: dict[str, Any]) -> list[Sequence[Any]]:
        """Run one statement; its rows (none for a statement that returns none)."""

    @abstractmethod
    def many(self, statement: str, params: list[dict[str, Any]]) -> None:
        """Run one statement for each set of parameters (``executemany``)."""


class _AlchemyRunner(_Runner):
    def __init__(self, conn: Connection, host: SqlHost) -> None:
        self.conn = conn
        self.host = host

    def rows(self, statement: str, params: dict[str, Any]) -> list[Sequence[Any]]:
        result = self.conn.execute(self.host.executor.text(statement), params)
        return list(result.all()) if result.returns_rows else []

    def many(self, statement: str, params: list[dict[str, Any]]) -> None:
        self.conn.execute(self.host.executor.text(statement), params)


class _CallerAlchemyRunner(_AlchemyRunner):
    """The caller's SQLAlchemy connection: driver errors wrapped, never retried."""

    def rows(self, statement: str, params: dict[str, Any]) -> list[Sequence[Any]]:
        try:
            return super().rows(statement, params)
        except DBAPIError as exc:
            raise self.host.executor.unavailable("write schedules", exc) from (
                self.host.secrets.cause(exc)
            )

    def many(self, statement: str, params: list[dict[str, Any]]) -> None:
        try:
            super().many(statement, params)
        except DBAPIError as exc:
            raise self.host.executor.unavailable("write schedules", exc) from (
                self.host.secrets.cause(exc)
            )


class _DjangoRunner(_Runner):
    """A Django connection: statements compiled to the driver's ``%s`` style."""

    def __init__(self, connection: Any, family: str, host: SqlHost) -> None:
        self.connection = connection
        self.host = host
        from sqlalchemy.dialects import mysql, postgresql, sqlite

        module = {"postgresql": postgresql, "mysql": mysql, "sqlite": sqlite}[family]
        self.dialect = module.dialect(paramstyle="format")
        self._compiled: dict[str, tuple[str, tuple[str, ...]]] = {}

    def _compile(self, statement: str) -> tuple[str, tuple[str, ...]]:
        known = self._compiled.get(statement)
        if known is None:
            compiled = self.host.executor.text(statement).compile(dialect=self.dialect)
            known = (compiled.string, tuple(compiled.positiontup or ()))
            self._compiled[statement] = known
        return known

    def _fail(self, exc: Exception) -> StoreUnavailable:
        return StoreUnavailable(
            self.host.secrets.scrub(f"write schedules failed: {type(exc).__name__}: {exc}")
        )

    def rows(self, statement: str, params: dict[str, Any]) -> list[Sequence[Any]]:
        sql, order = self._compile(statement)
        try:
            with self.connection.cursor() as cursor:
                cursor.execute(sql, [params[name] for name in order])
                if cursor.description is None:
                    return []
                return list(cursor.fetchall())
        except Exception as exc:
            raise self._fail(exc) from self.host.secrets.cause(exc)

    def many(self, statement: str, params: list[dict[str, Any]]) -> None:
        sql, order = self._compile(statement)
        try:
            with self.connection.cursor() as cursor:
                cursor.executemany(sql, [[p[name] for name in order] for p in params])
        except Exception as exc:
            raise self._fail(exc) from self.host.secrets.cause(exc)


class SqlSchedules:
    """Stored schedules in the SQL store's tables: the methods of
    :class:`.ScheduleStore`, whose docstrings say what each may touch."""

    def __init__(self, host: SqlHost) -> None:
        self.host = host
        self.prefix = host.tables.prefix
        self.family = _FAMILY[host.backend]
        self.sql: ScheduleDialect = schedule_dialect_for(host.backend, self.prefix)

    # -- plumbing -----------------------------------------------------------

    def _read(self, what: str, statement: str, **params: Any) -> list[Any]:
        """One autocommit statement through the executor; its rows, the
        database's clock (column 0) fed to the store's clock."""

        def work(conn: Connection) -> list[Any]:
            clock = self.host.clock
            sent = clock.local_us()
            rows = list(conn.execute(self.host.executor.text(statement), params).all())
            if rows and rows[0][0] is not None:
                clock.observe(int(rows[0][0]), sent, clock.local_us())
            return rows

        return self.host.executor.run(what, work)

    def seed(self, conn: Connection) -> list[tuple[str, int]]:
        """The meta rows of stored schedules prepare creates when missing: the
        revision counter (at the table's highest revision: 0 on a new table)
        and the feed's floor."""
        top = int(conn.execute(self.host.executor.text(self.sql.seed_revision)).scalar_one())
        return [(SCHEDULE_REVISION_KEY, top), (SCHEDULE_FLOOR_KEY, 0)]

    # -- writes -------------------------------------------------------------

    def write(
        self, writes: Sequence[ScheduleWrite], by: str, why: str, connection: Any
    ) -> list[ScheduleRow]:
        writes = list(writes)
        check_batch(writes, by, why)
        if not writes:
            return []
        if connection is not None:
            return self._write(self._caller(connection), writes, by, why)[0]

        def work(conn: Connection) -> list[ScheduleRow]:
            rows, changed = self._write(_AlchemyRunner(conn, self.host), writes, by, why)
            if not changed:
                raise _Unchanged(rows)  # roll the counter's increment back
            return rows

        try:
            return self.host.executor.run("write schedules", work, begin=self.sql.begin)
        except _Unchanged as unchanged:
            return unchanged.rows

    def _write(
        self, run: _Runner, writes: list[ScheduleWrite], by: str, why: str
    ) -> tuple[list[ScheduleRow], bool]:
        """The statements of one batch on ``run``; the rows, and whether any changed."""
        sql = self.sql
        # first: the counter, whose lock orders the commits (schedule_store.py)
        sent = self.host.clock.local_us()
        answer = run.rows(sql.bump, {})
        if sql.bump_read:
            answer = run.rows(sql.bump_read, {})
        now, revision = int(answer[0][0]), int(answer[0][1])
        self.host.clock.observe(now, sent, self.host.clock.local_us())
        named = run.rows(sql.named, {"names": json.dumps([w.name for w in writes])})
        stored = {row.name: row for row in map(_row, named)}
        edits = plan(writes, stored, by, revision, now)
        changed = [e for e in edits if e.action is not None]
        if changed:
            run.many(sql.upsert, [_row_params(e.after) for e in changed])
            run.many(sql.log_insert, [_log_params(e, by, why, now) for e in changed])
            if sql.notify:
                run.rows(sql.notify, {"channel": controls_channel(self.prefix)})
        return [e.after for e in edits], bool(changed)

    def _caller(self, connection: Any) -> _Runner:
        """The seam for the caller's connection, once its dialect is checked."""
        session_type: Any = None
        try:
            from sqlalchemy.orm import Session

            session_type = Session
        except ImportError:  # pragma: no cover - the ORM ships with SQLAlchemy
            pass
        if session_type is not None and isinstance(connection, session_type):
            connection = connection.connection()
        if isinstance(connection, Connection):
            self._check_family(connection.dialect.name, "SQLAlchemy connection")
            return _CallerAlchemyRunner(connection, self.host)
        vendor = getattr(connection, "vendor", None)
        if isinstance(vendor, str) and callable(getattr(connection, "cursor", None)):
            self._check_family(vendor, "Django connection")
            return _DjangoRunner(connection, _FAMILY[vendor], self.host)
        raise TypeError(
            "connection: expected a SQLAlchemy Connection or Session, or a Django "
            f"connection (django.db.connection), not {type(connection).__name__}"
        )

    def _check_family(self, name: str, what: str) -> None:
        if _FAMILY.get(name) != self.family:
            raise ValueError(
                f"the {what} given is a {name} connection, but this store's database is "
                f"{self.host.backend}: pass a connection to the store's own database "
                "(the same database and table prefix)"
            )

    # -- reads --------------------------------------------------------------

    def rows(self) -> tuple[list[ScheduleRow], int]:
        found = self._read("read schedules", self.sql.rows)
        top = found[0][1] if found else None
        rows = [_row(r[2:]) for r in found if r[2] is not None]
        return sorted(rows, key=lambda r: r.name), 0 if top is None else int(top)

    def row(self, name: str) -> ScheduleRow | None:
        found = self._read("read schedule", self.sql.row, name=name)
        return _row(found[0][1:]) if found and found[0][1] is not None else None

    def feed(self, after: int) -> ScheduleFeed:
        found = self._read("read schedule feed", self.sql.feed, after=after)
        floor = int(found[0][1] or 0) if found else 0
        rows = [_row(r[2:]) for r in found if r[2] is not None]
        cursor = max((r.revision for r in rows), default=after)
        return ScheduleFeed(rows, max(cursor, after), after >= floor)

    def versions(self) -> int:
        found = self._read("read feed versions", self.sql.versions)
        _now, top, controls, floor = found[0]
        self.host.controls_version = None if controls is None else int(controls)
        # the floor too: once the prune deleted the newest tombstone, the
        # table's top revision went down, and a reader whose cursor is at that
        # delete would never hear of it (its feed is incomplete: it reloads)
        revision = max(int(top or 0), int(floor or 0))
        self.host.schedule_revision = revision
        return revision

    def catalogued(self, names: Sequence[str]) -> dict[str, list[str]]:
        if not names:
            return {}
        found = self._read(
            "read the catalogued names",
            self.sql.catalogued,
            names=json.dumps(list(names)),
            beats=LIVE_HEARTBEATS,
            slack_us=LIVE_SLACK_US,
        )
        by_name: dict[str, list[str]] = {}
        for _now, name, replica in found:
            by_name.setdefault(str(name), []).append(str(replica))
        return by_name

    def log(self, name: str | None, limit: int) -> list[ScheduleLogRow]:
        params: dict[str, Any]
        if name is None:
            statement, params = self.sql.log_all, {"limit": limit}
        else:
            statement, params = self.sql.log_entry, {"name": name, "limit": limit}
        found = self.host.executor.run(
            "read schedule log",
            lambda conn: list(conn.execute(self.host.executor.text(statement), params).all()),
        )
        return [
            ScheduleLogRow(
                int(r[0]), str(r[1]), str(r[2]), str(r[3]), str(r[4]), int(r[5]), str(r[6])
            )
            for r in found
        ]

    def sent_count(self, name: str, since_us: int) -> int:
        found = self._read("count sent slots", self.sql.sent_count, name=name, since_us=since_us)
        return int(found[0][1])

    # -- prune --------------------------------------------------------------

    def prune(self, tombstones_us: int, log_us: int) -> int:
        sql = self.sql

        def work(conn: Connection) -> int:
            text = self.host.executor.text
            now = int(conn.execute(text(sql.now)).scalar_one())
            cutoff = {"cutoff": now - tombstones_us}
            # the floor first, in the same transaction: a feed sees both or neither
            conn.execute(text(sql.floor_raise), cutoff)
            tombstones = conn.execute(text(sql.tombstones_delete), cutoff).rowcount
            log = conn.execute(text(sql.log_delete), {"cutoff": now - log_us}).rowcount
            return int(tombstones) + int(log)

        return self.host.executor.run("prune schedules", work, begin=sql.begin)


def _row(values: Sequence[Any]) -> ScheduleRow:
    """A schedule row as the database returned its columns (COLUMNS' order)."""
    (name, task, spec, args, kwargs, options, enabled, start_us, end_us, max_runs, policy,
     jitter_us, description, managed_by, revision, created_us, updated_us, created_by,
     updated_by, deleted) = values  # fmt: skip
    return ScheduleRow(
        name=str(name),
        task=str(task),
        spec=str(spec),
        args=str(args),
        kwargs=str(kwargs),
        options=str(options),
        enabled=bool(enabled),
        start_us=_int_or_none(start_us),
        end_us=_int_or_none(end_us),
        max_runs=_int_or_none(max_runs),
        policy=None if policy is None else str(policy),
        jitter_us=int(jitter_us),
        description=str(description),
        managed_by=None if managed_by is None else str(managed_by),
        revision=int(revision),
        created_us=int(created_us),
        updated_us=int(updated_us),
        created_by=str(created_by),
        updated_by=str(updated_by),
        deleted=bool(deleted),
    )


def _int_or_none(value: Any) -> int | None:
    return None if value is None else int(value)


def _row_params(row: ScheduleRow) -> dict[str, Any]:
    params = row._asdict()
    params["enabled"] = int(row.enabled)
    params["deleted"] = int(row.deleted)
    return params


def _log_params(edit: Edit, by: str, why: str, now_us: int) -> dict[str, Any]:
    return {
        "revision": edit.after.revision,
        "name": edit.after.name,
        "action": edit.action,
        "changed_by": by,
        "why": why,
        "at_us": now_us,
        "changes": edit.changes,
    }
