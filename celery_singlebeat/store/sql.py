"""The SQL implementation of :class:`~celery_singlebeat.store.base.Store`.

One SQLAlchemy engine in autocommit mode: every operation is a single
statement (two on MySQL/MariaDB, which lack RETURNING), so a tick costs one
round trip, not BEGIN + statement + COMMIT. Driver errors are wrapped here,
once: deadlocks and serialization failures are retried, anything else that
means "the database did not decide" becomes ``StoreUnavailable``.
"""

from __future__ import annotations

import json
import logging
import random
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, TypeVar

from sqlalchemy import create_engine, event, inspect, text
from sqlalchemy.engine import URL, Connection, Engine
from sqlalchemy.exc import DBAPIError, SQLAlchemyError
from sqlalchemy.sql.elements import TextClause

from ..clock import DatabaseClock
from ..exceptions import SchemaError, StoreUnavailable
from ..redact import Secrets
from .base import (
    EARLY_TOLERANCE_US,
    Busy,
    Claim,
    EntryState,
    Lease,
    Run,
    RunBegin,
    RunStatus,
    SlotKey,
    Store,
)
from .lease_statements import LeaseDialect, lease_dialect_for
from .schema import SCHEMA_VERSION, Tables
from .statements import Dialect, dialect_for

if TYPE_CHECKING:
    from ..config import Settings

logger = logging.getLogger("celery_singlebeat.store")

T = TypeVar("T")

# PostgreSQL SQLSTATEs and MySQL error numbers that mean "try the same statement
# again": the database refused to decide *this time*, nothing was written.
_PG_RETRY = {"40P01", "40001", "55P03"}
_MY_RETRY = {1213, 1205}

#: deadlock retries before a statement is reported as failed.
MAX_ATTEMPTS = 5

#: after a pooled connection turned out dead, how long new connections are
#: tried before the failure counts as an outage (seconds, monotonic clock). A
#: server restarting (``pg_ctl restart -m fast``) ends every session and then
#: refuses connections, or answers "the database system is starting up", for a
#: moment: a single immediate reconnect met exactly that and reported an outage.
RECONNECT_WINDOW_S = 2.0
#: the first pause between those reconnects; it doubles, up to RECONNECT_PAUSE_MAX_S
RECONNECT_PAUSE_S = 0.05
RECONNECT_PAUSE_MAX_S = 0.4


def _engine_defaults(url: URL) -> dict[str, Any]:
    """Driver options that keep a lost database from blocking a tick forever."""
    backend = url.get_backend_name()
    if backend == "postgresql":
        return {
            # No pre-ping: it would double the round trips of every tick. A pooled
            # connection the server dropped fails its statement instead, and
            # _run retries that once on a fresh connection.
            "pool_pre_ping": False,
            "pool_size": 2,
            "connect_args": {
                "connect_timeout": 5,
                # kernel gives up on unacknowledged data after 10 s (a cut network
                # otherwise hangs a read for ~15 minutes)
                "tcp_user_timeout": 10_000,
                "keepalives": 1,
                "keepalives_idle": 5,
                "keepalives_interval": 2,
                "keepalives_count": 3,
                # (with psycopg 3.3+, every statement also waits at most 15 s for
                # its answer: psycopg_timeout; connect_args "read_timeout" sets it)
                # no server-side prepared statements: they break behind PgBouncer
                # in transaction pooling mode
                "prepare_threshold": None,
            },
        }
    if backend in ("mysql", "mariadb"):
        return {
            "pool_pre_ping": False,  # see above
            "pool_size": 2,
            "pool_recycle": 3600,
            "connect_args": {"connect_timeout": 5, "read_timeout": 15, "write_timeout": 15},
        }
    return {"connect_args": {"timeout": 15}}


class SqlStore(Store):
    """Coordination state in PostgreSQL, MySQL/MariaDB or SQLite."""

    def __init__(
        self,
        url: URL,
        *,
        table_prefix: str = "singlebeat_",
        engine_options: dict[str, Any] | None = None,
        clock: DatabaseClock | None = None,
    ) -> None:
        self.url = url
        self.backend = url.get_backend_name()
        #: what this store connects with, to scrub from the errors it wraps
        self.secrets = Secrets.of(url, engine_options)
        options = _engine_defaults(url)
        for key, value in (engine_options or {}).items():
            if key == "connect_args":
                options["connect_args"] = {**options.get("connect_args", {}), **value}
            else:
                options[key] = value
        options["isolation_level"] = "AUTOCOMMIT"
        if self.backend == "postgresql" and url.drivername == "postgresql":
            # the plain scheme means psycopg2 to SQLAlchemy; we ship psycopg 3
            url = url.set(drivername="postgresql+psycopg")
        elif url.drivername in ("mysql", "mariadb"):
            # likewise mysqlclient; PyMySQL is the driver of the `mysql` extra
            url = url.set(drivername=f"{url.drivername}+pymysql")
        self.engine: Engine = create_engine(url, **options)
        self._install_session_setup()
        self.tables = Tables(table_prefix)
        self.sql: Dialect = dialect_for(self.backend, table_prefix)
        self.lease_sql: LeaseDialect = lease_dialect_for(self.backend, table_prefix)
        self.clock = clock or DatabaseClock()
        #: statements sent to the database (benchmarks report it per tick).
        self.round_trips = 0
        self._texts: dict[str, TextClause] = {}

        @event.listens_for(self.engine, "before_cursor_execute")
        def _count(*_args: Any) -> None:
            self.round_trips += 1

    @classmethod
    def from_settings(cls, settings: Settings) -> SqlStore:
        """The store the validated ``singlebeat_*`` settings describe."""
        return cls(
            settings.url,
            table_prefix=settings.table_prefix,
            engine_options=dict(settings.engine_options),
        )

    def _install_session_setup(self) -> None:
        if self.backend == "postgresql" and self.engine.dialect.driver == "psycopg":
            from . import psycopg_timeout

            if psycopg_timeout.SUPPORTED:

                @event.listens_for(self.engine, "do_connect")
                def _psycopg_connect(
                    _dialect: Any, _record: Any, cargs: Any, cparams: dict[str, Any]
                ) -> Any:
                    return psycopg_timeout.connect(cargs, cparams)

        elif self.backend in ("mysql", "mariadb"):

            @event.listens_for(self.engine, "connect")
            def _mysql_session(dbapi_conn: Any, _record: Any) -> None:
                cursor = dbapi_conn.cursor()
                # READ COMMITTED: no gap locks, so concurrent claims of disjoint
                # new rows do not deadlock each other
                cursor.execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
                cursor.close()

        elif self.backend == "sqlite":

            @event.listens_for(self.engine, "connect")
            def _sqlite_session(dbapi_conn: Any, _record: Any) -> None:
                cursor = dbapi_conn.cursor()
                cursor.execute("PRAGMA journal_mode=WAL")
                cursor.execute("PRAGMA synchronous=NORMAL")
                cursor.execute("PRAGMA busy_timeout=15000")
                cursor.close()

    # -- plumbing -----------------------------------------------------------

    def _retryable(self, exc: DBAPIError) -> bool:
        orig = exc.orig
        if self.backend == "postgresql":
            return getattr(orig, "sqlstate", None) in _PG_RETRY
        if self.backend in ("mysql", "mariadb"):
            args: tuple[Any, ...] = tuple(getattr(orig, "args", ()))
            return bool(args) and args[0] in _MY_RETRY
        return "locked" in str(orig).lower() or "busy" in str(orig).lower()

    @contextmanager
    def _connect(self) -> Iterator[Connection]:
        with self.engine.connect() as conn:
            yield conn

    def _run(self, what: str, work: Callable[[Connection], T]) -> T:
        """Run ``work`` on a connection, retrying deadlocks; wrap driver errors."""
        attempt = 0
        #: set once a pooled connection was found dead: until when to reconnect
        reconnect_until: float | None = None
        pause = RECONNECT_PAUSE_S
        while True:
            attempt += 1
            connected = False
            try:
                with self._connect() as conn:
                    connected = True
                    return work(conn)
            except DBAPIError as exc:
                if getattr(exc.orig, "singlebeat_no_answer", False):
                    # the server (or the path to it) went silent: a new
                    # connection would wait out its connect_timeout in vain
                    raise self._unavailable(what, exc) from self.secrets.cause(exc)
                if exc.connection_invalidated and reconnect_until is None:
                    # A pooled connection that died while idle (database restart,
                    # proxy timeout): the pool is invalidated, try again on a new
                    # connection before calling it an outage.
                    logger.debug("singlebeat: %s: stale connection, reconnecting", what)
                    reconnect_until = time.monotonic() + RECONNECT_WINDOW_S
                    continue
                lost = not connected or exc.connection_invalidated
                left = reconnect_until - time.monotonic() if reconnect_until is not None else 0.0
                if lost and left > 0:
                    # the server that ended the session may be restarting: wait a
                    # moment for it, rather than report an outage that is none
                    logger.debug(
                        "singlebeat: %s: reconnect failed (%s)",
                        what,
                        self.secrets.scrub(_describe(exc)),
                    )
                    time.sleep(min(pause, left))
                    pause = min(pause * 2, RECONNECT_PAUSE_MAX_S)
                    continue
                if self._retryable(exc) and attempt < MAX_ATTEMPTS:
                    logger.debug(
                        "singlebeat: %s: retrying after %s", what, self.secrets.scrub(str(exc.orig))
                    )
                    time.sleep(random.uniform(0.001, 0.02) * attempt)
                    continue
                raise self._unavailable(what, exc) from self.secrets.cause(exc)
            except SQLAlchemyError as exc:
                raise self._unavailable(what, exc) from self.secrets.cause(exc)

    def _unavailable(self, what: str, exc: SQLAlchemyError) -> StoreUnavailable:
        """The outage a driver error means, its text scrubbed of this store's
        secrets: a driver may repeat its connection parameters in a message, and
        the scheduler, the worker and the CLI all print this one. (Raised from
        ``self.secrets.cause(exc)``, which drops the chain when it repeats one.)"""
        return StoreUnavailable(self.secrets.scrub(f"{what} failed: {_describe(exc)}"))

    def _text(self, statement: str) -> TextClause:
        """The statement as a SQLAlchemy clause, made once: parsing its text
        (bind parameters) on every call was a measurable part of a round trip."""
        clause = self._texts.get(statement)
        if clause is None:
            clause = self._texts[statement] = text(statement)
        return clause

    def _fetch(self, conn: Connection, statement: str, **params: Any) -> list[Any]:
        """Execute, read all rows, and feed the database clock from column 0."""
        sent = self.clock.local_us()
        rows = conn.execute(self._text(statement), params).all()
        received = self.clock.local_us()
        if rows and rows[0][0] is not None:
            self.clock.observe(int(rows[0][0]), sent, received)
        return list(rows)

    # -- Store ----------------------------------------------------------------

    def prepare(self, create: bool) -> None:
        def work(conn: Connection) -> None:
            names = set(inspect(conn).get_table_names())
            wanted = {t.name for t in self.tables.metadata.sorted_tables}
            if not wanted <= names:
                if not create:
                    missing = ", ".join(sorted(wanted - names))
                    raise SchemaError(
                        f"tables missing ({missing}) and singlebeat_create_schema is False: "
                        "create them with `celery -A proj singlebeat create-schema` "
                        "(or celery_singlebeat.create_schema(app)) using a privileged user"
                    )
                # the tables added since (locks, runs), with their indexes
                self.tables.metadata.create_all(conn, checkfirst=True)
            if create:
                # Tables made by an older release lack the indexes added since
                # (ix_<prefix>slots_slot); create_all skips existing tables.
                for table in self.tables.metadata.sorted_tables:
                    if table.name in names:
                        for index in table.indexes:
                            index.create(conn, checkfirst=True)
            conn.execute(
                self._text(self.sql.meta_insert),
                {"key": "schema_version", "value_us": SCHEMA_VERSION},
            )
            for turn in ("prune", "prune_singletons"):
                conn.execute(self._text(self.sql.meta_insert), {"key": turn, "value_us": 0})
            version = conn.execute(
                self.tables.meta.select().where(self.tables.meta.c.key == "schema_version")
            ).one()[1]
            if version > SCHEMA_VERSION:
                raise SchemaError(
                    f"the database schema is version {version}, newer than this "
                    f"celery-singlebeat understands ({SCHEMA_VERSION}): upgrade the package "
                    "on every replica"
                )

        # Several pods creating the schema at the same instant race on the
        # catalog (PostgreSQL raises a unique violation on pg_type, MySQL "table
        # exists"): whoever loses simply checks again.
        for attempt in range(1, MAX_ATTEMPTS + 1):
            try:
                self._run("schema check", work)
                return
            except StoreUnavailable as exc:
                if attempt == MAX_ATTEMPTS or not _looks_like_create_race(exc):
                    raise
                time.sleep(random.uniform(0.05, 0.3))

    def register(self, names: Sequence[str], owner: str = "") -> dict[str, EntryState]:
        payload = json.dumps(sorted(set(names)))

        def work(conn: Connection) -> dict[str, EntryState]:
            if names:
                conn.execute(
                    self._text(self.sql.register_insert), {"names": payload, "owner": owner}
                )
            rows = self._fetch(conn, self.sql.register_select, names=payload)
            out = {}
            for _now, name, anchor, last in rows:
                if name is None:
                    continue
                last_slot = None if last is None or int(last) < 0 else int(last)
                out[name] = EntryState(name, int(anchor), last_slot)
            return out

        return self._run("register entries", work)

    def claim(self, owner: str, slots: Sequence[SlotKey], lease_us: int) -> list[Claim]:
        if not slots:
            return []
        payload = json.dumps(sorted({(s.entry, s.slot_us) for s in slots}))
        if self.sql.returning:
            return self._run(
                "claim",
                lambda conn: _claims(
                    self._fetch(
                        conn,
                        self.sql.claim,
                        owner=owner,
                        slots=payload,
                        lease_us=lease_us,
                        early_us=EARLY_TOLERANCE_US,
                    )
                ),
            )
        batch = uuid.uuid4().hex

        def work(conn: Connection) -> list[Claim]:
            conn.execute(
                self._text(self.sql.claim),
                {
                    "owner": owner,
                    "slots": payload,
                    "lease_us": lease_us,
                    "batch": batch,
                    "early_us": EARLY_TOLERANCE_US,
                },
            )
            return _claims(self._fetch(conn, self.sql.select_batch, batch=batch, owner=owner))

        return self._run("claim", work)

    def confirm(self, owner: str, claims: Sequence[Claim]) -> list[Claim]:
        # once each: MySQL compares the matched row count with the number of claims
        claims = list(dict.fromkeys(claims))
        if not claims:
            return []
        payload = json.dumps([[c.entry, c.slot_us, c.fence] for c in claims])
        if self.sql.returning:
            return self._run(
                "confirm",
                lambda conn: _claims(
                    self._fetch(conn, self.sql.confirm, owner=owner, slots=payload)
                ),
            )

        def work(conn: Connection) -> list[Claim]:
            result = conn.execute(self._text(self.sql.confirm), {"owner": owner, "slots": payload})
            if result.rowcount == len(claims):
                return list(claims)
            # Some were taken over: find out which are ours and sent.
            mine = {
                (row[0], int(row[1]), int(row[2]))
                for row in conn.execute(
                    self.tables.slots.select()
                    .with_only_columns(
                        self.tables.slots.c.entry,
                        self.tables.slots.c.slot_us,
                        self.tables.slots.c.fence,
                    )
                    .where(
                        self.tables.slots.c.owner == owner,
                        self.tables.slots.c.state == 1,
                        self.tables.slots.c.entry.in_({c.entry for c in claims}),
                    )
                )
            }
            return [c for c in claims if (c.entry, c.slot_us, c.fence) in mine]

        return self._run("confirm", work)

    def release(self, owner: str, claims: Sequence[Claim], retry_in_us: int = 0) -> None:
        if not claims:
            return
        payload = json.dumps([[c.entry, c.slot_us, c.fence] for c in claims])
        params = {"owner": owner, "slots": payload, "retry_us": max(0, retry_in_us)}
        self._run("release", lambda conn: conn.execute(self._text(self.sql.release), params))

    def take_over(self, owner: str, lease_us: int, limit: int) -> list[Claim]:
        if self.sql.returning:
            return _oldest_first(
                self._run(
                    "take over",
                    lambda conn: _claims(
                        self._fetch(
                            conn, self.sql.take_over, owner=owner, lease_us=lease_us, limit=limit
                        )
                    ),
                )
            )
        batch = uuid.uuid4().hex

        def work(conn: Connection) -> list[Claim]:
            result = conn.execute(
                self._text(self.sql.take_over),
                {"owner": owner, "lease_us": lease_us, "limit": limit, "batch": batch},
            )
            if result.rowcount == 0:
                self._fetch(conn, self.sql.ping)
                return []
            rows = self._fetch(conn, self.sql.select_batch, batch=batch, owner=owner)
            return _claims([r for r in rows if r[4] in (None, 0)])

        return _oldest_first(self._run("take over", work))

    def prune(self, retention_us: int, every_us: int) -> int | None:
        def work(conn: Connection) -> int | None:
            turn = conn.execute(self._text(self.sql.prune_turn), {"every_us": every_us})
            if turn.rowcount != 1:
                return None
            conn.execute(self._text(self.sql.prune_mark), {"retention_us": retention_us})
            deleted = conn.execute(
                self._text(self.sql.prune_delete), {"retention_us": retention_us}
            )
            return int(deleted.rowcount)

        return self._run("prune", work)

    def recent_owners(self, window_us: int) -> list[str]:
        rows = self._run(
            "recent owners",
            lambda conn: self._fetch(conn, self.sql.recent_owners, window_us=window_us),
        )
        return sorted(str(r[1]) for r in rows if r[1] is not None)

    # -- singleton keys and runs ------------------------------------------------

    def acquire_lease(self, key: str, owner: str, ttl_us: int) -> Lease | Busy:
        grant = uuid.uuid4().hex
        params = {"key": key, "owner": owner, "grant": grant, "ttl_us": ttl_us}
        sql = self.lease_sql

        def work(conn: Connection) -> Lease | Busy:
            if sql.returning:
                rows = self._fetch(conn, sql.acquire, **params)
                if not rows:  # SQLite returns nothing when the key is busy
                    return self._holder(conn, key)
                now, token, expires, holder, until = rows[0]
                return self._lease_answer(conn, key, now, token, expires, holder, until)
            conn.execute(self._text(sql.acquire), params)
            _now, token, expires, holder, row_grant = self._fetch(conn, sql.lease_row, key=key)[0]
            if row_grant == grant:
                return Lease(key, int(token), int(expires))
            return Busy(str(holder or "?"), int(expires or 0))

        return self._run("acquire lease", work)

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
        row = self._fetch(conn, self.lease_sql.lease_row, key=key)[0]
        return Busy(str(row[3] or "?"), int(row[2] or 0))

    def begin_slot(
        self, run: Run, key: str, owner: str, task_id: str, ttl_us: int
    ) -> tuple[RunBegin, Lease | Busy | None]:
        if not self.lease_sql.begin_slot:
            return super().begin_slot(run, key, owner, task_id, ttl_us)
        params = {
            **_run_params(run, owner, task_id, ttl_us),
            "key": key,
            "grant": uuid.uuid4().hex,
        }

        def work(conn: Connection) -> tuple[RunBegin, Lease | Busy | None]:
            row = self._fetch(conn, self.lease_sql.begin_slot, **params)[0]
            now, run_id, state, holder, outcome, token, expires, key_holder, until = row
            begin = _run_begin(run, run_id, state, holder, outcome)
            if begin.status is not RunStatus.STARTED:
                return begin, None
            return begin, self._lease_answer(conn, key, now, token, expires, key_holder, until)

        return self._run("begin slot", work)

    def end_slot(self, run: Run, outcome: str | None, lease: Lease) -> tuple[bool, bool]:
        if not self.lease_sql.end_slot:
            return super().end_slot(run, outcome, lease)
        params = {
            "entry": run.entry,
            "slot_us": run.slot_us,
            "run_id": run.run_id,
            "abandon": outcome is None,
            "outcome": outcome or "",
            "key": lease.key,
            "token": lease.token,
        }
        row = self._run(
            "end slot", lambda conn: self._fetch(conn, self.lease_sql.end_slot, **params)[0]
        )
        return int(row[1]) == 1, int(row[2]) == 1

    def renew_lease(self, lease: Lease, ttl_us: int) -> Lease | None:
        params = {"key": lease.key, "token": lease.token, "ttl_us": ttl_us}
        sql = self.lease_sql

        def work(conn: Connection) -> Lease | None:
            if sql.returning:
                rows = self._fetch(conn, sql.renew, **params)
                if not rows or rows[0][1] is None:
                    return None
                return lease._replace(expires_us=int(rows[0][1]))
            if conn.execute(self._text(sql.renew), params).rowcount != 1:
                return None
            row = self._fetch(conn, sql.lease_row, key=lease.key)[0]
            return lease._replace(expires_us=int(row[2]))

        return self._run("renew lease", work)

    def release_lease(self, lease: Lease) -> bool:
        params = {"key": lease.key, "token": lease.token}
        return self._run(
            "release lease",
            lambda conn: conn.execute(self._text(self.lease_sql.release), params).rowcount == 1,
        )

    def lease_holds(self, key: str, token: int) -> bool:
        rows = self._run(
            "check lease",
            lambda conn: self._fetch(conn, self.lease_sql.holds, key=key, token=token),
        )
        return int(rows[0][1]) > 0

    def begin_run(self, run: Run, owner: str, task_id: str, ttl_us: int) -> RunBegin:
        params = _run_params(run, owner, task_id, ttl_us)
        sql = self.lease_sql

        def work(conn: Connection) -> RunBegin:
            if sql.returning:
                row = self._fetch(conn, sql.begin_run, **params)[0]
            else:
                conn.execute(self._text(sql.begin_run), params)
                row = self._fetch(conn, sql.run_row, entry=run.entry, slot_us=run.slot_us)[0]
            _now, run_id, state, holder, outcome = row
            return _run_begin(run, run_id, state, holder, outcome)

        return self._run("begin run", work)

    def _run_update(self, what: str, statement: str, run: Run, **extra: Any) -> bool:
        params = {"entry": run.entry, "slot_us": run.slot_us, "run_id": run.run_id, **extra}
        return self._run(
            what, lambda conn: conn.execute(self._text(statement), params).rowcount == 1
        )

    def renew_run(self, run: Run, ttl_us: int) -> bool:
        return self._run_update("renew run", self.lease_sql.renew_run, run, ttl_us=ttl_us)

    def finish_run(self, run: Run, outcome: str) -> bool:
        return self._run_update("finish run", self.lease_sql.finish_run, run, outcome=outcome)

    def abandon_run(self, run: Run) -> bool:
        return self._run_update("abandon run", self.lease_sql.abandon_run, run)

    def prune_singletons(self, retention_us: int, every_us: int) -> int | None:
        sql = self.lease_sql

        def work(conn: Connection) -> int | None:
            if conn.execute(self._text(sql.prune_turn), {"every_us": every_us}).rowcount != 1:
                return None
            params = {"retention_us": retention_us}
            runs = conn.execute(self._text(sql.prune_runs), params).rowcount
            locks = conn.execute(self._text(sql.prune_locks), params).rowcount
            return int(runs) + int(locks)

        return self._run("prune singletons", work)

    def ping(self) -> int:
        return self._run("ping", lambda conn: int(self._fetch(conn, self.sql.ping)[0][0]))

    def close(self) -> None:
        self.engine.dispose()


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


def _claims(rows: Sequence[Any]) -> list[Claim]:
    return [Claim(r[1], int(r[2]), int(r[3])) for r in rows if r[1] is not None]


def _oldest_first(claims: list[Claim]) -> list[Claim]:
    # RETURNING gives no order; taken-over slots are published oldest first
    return sorted(claims, key=lambda c: (c.slot_us, c.entry))


def _describe(exc: SQLAlchemyError) -> str:
    """One line without the statement text or its parameters (which may be long)."""
    orig = getattr(exc, "orig", None)
    message = str(orig if orig is not None else exc).strip().splitlines()
    return f"{type(orig or exc).__name__}: {message[0] if message else ''}"


def _looks_like_create_race(exc: StoreUnavailable) -> bool:
    text_ = str(exc).lower()
    return any(word in text_ for word in ("already exists", "duplicate", "unique", "1050"))
