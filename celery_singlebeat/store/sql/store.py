"""The SQL implementation of :class:`~celery_singlebeat.store.base.Store`, every contract.

One SQLAlchemy engine in autocommit mode: every operation is a single
statement (two on MySQL/MariaDB, which lack RETURNING), so a tick costs one
round trip, not BEGIN + statement + COMMIT. Every statement goes through
the store's :class:`~.executor.SqlExecutor` (shared with the
:class:`~.operator.Operator` over it), which wraps driver errors once:
deadlocks and serialization failures are retried, anything else that means
"the database did not decide" becomes ``StoreUnavailable``.

:class:`SqlStore` opens the engine, checks the schema, and serves each
contract through a part of its own, each with its statements beside it:
:class:`~.slots.SqlSlots` (:class:`.SlotStore`), :class:`~.fleet.SqlFleet`
(:class:`.FleetStore`), :class:`~.leases.SqlLeases`
(:class:`.SingletonStore`) and :class:`~.schedules.SqlSchedules`
(:class:`.ScheduleStore`). Its contract methods forward to them, one line
each; the parts share its executor, its clock and the readings its
contracts expose (:mod:`.host`).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from sqlalchemy import create_engine, event, inspect
from sqlalchemy.engine import URL, Connection, Engine

from ...exceptions import SchemaError, StoreUnavailable
from ...redact import Secrets
from ...timeline.clock import DatabaseClock
from ...timeline.timing import ANSWER_TIMEOUT_S, CONNECT_TIMEOUT_S
from ..base import (
    CONTROLS_KEY,
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
    ScheduleFeed,
    ScheduleLogRow,
    ScheduleRow,
    ScheduleWrite,
    SlotKey,
    StalledRuns,
    Store,
    Written,
)
from .executor import MAX_ATTEMPTS, SqlExecutor
from .fleet import FleetPruned, SqlFleet
from .host import fetch
from .leases import SqlLeases
from .schedules import SqlSchedules
from .schema import SCHEMA_VERSION, Tables
from .slots import SqlSlots
from .store_statements import StoreDialect, store_dialect_for

if TYPE_CHECKING:
    from ...config import Settings
    from ..fleet_store import ControlListener


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
                "connect_timeout": int(CONNECT_TIMEOUT_S),
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
            "connect_args": {
                "connect_timeout": int(CONNECT_TIMEOUT_S),
                "read_timeout": int(ANSWER_TIMEOUT_S),
                "write_timeout": 15,
            },
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
        stalled_runs: StalledRuns | None = None,
    ) -> None:
        self.url = url
        #: :attr:`.SlotStore.stalled_runs` (the parts read it)
        self.stalled_runs = stalled_runs if stalled_runs is not None else StalledRuns()
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
        #: what every connection is opened with (the listener's too)
        self.connect_args: dict[str, Any] = dict(options.get("connect_args", {}))
        if self.backend == "postgresql" and url.drivername == "postgresql":
            # the plain scheme means psycopg2 to SQLAlchemy; we ship psycopg 3
            url = url.set(drivername="postgresql+psycopg")
        elif url.drivername in ("mysql", "mariadb"):
            # likewise mysqlclient; PyMySQL is the driver of the `mysql` extra
            url = url.set(drivername=f"{url.drivername}+pymysql")
        self.engine: Engine = create_engine(url, **options)
        self._install_session_setup()
        #: sends every statement of this store and of its parts (one retry loop)
        self.executor = SqlExecutor(self.engine, self.secrets)
        self.tables = Tables(table_prefix)
        #: the store's own statements: ping, and the meta rows prepare makes
        self.store_sql: StoreDialect = store_dialect_for(self.backend, table_prefix)
        #: one part per contract, each with its statements (host.py says what
        #: they share of this store)
        self.fleet = SqlFleet(self)
        self.slots = SqlSlots(self, catalogs=self.fleet.catalogs)
        self.leases = SqlLeases(self)
        self.schedules = SqlSchedules(self)
        self.clock = clock or DatabaseClock()
        #: statements sent to the database (benchmarks report it per tick).
        self.round_trips = 0
        #: claimed-but-unsent rows in the store, as the last heartbeat counted them
        self.open_claims: int | None = None

        #: called with (seconds, ok) after each statement (metrics, readiness)
        self.on_round_trip: Callable[[float, bool], None] | None = None

        @event.listens_for(self.engine, "before_cursor_execute")
        def _count(
            _conn: Any, _cursor: Any, _stmt: Any, _params: Any, context: Any, _many: Any
        ) -> None:
            self.round_trips += 1
            if self.on_round_trip is not None and context is not None:
                context._singlebeat_sent = time.perf_counter()

        @event.listens_for(self.engine, "after_cursor_execute")
        def _answered(
            _conn: Any, _cursor: Any, _stmt: Any, _params: Any, context: Any, _many: Any
        ) -> None:
            hook = self.on_round_trip
            sent = getattr(context, "_singlebeat_sent", None)
            if hook is not None and sent is not None:
                hook(time.perf_counter() - sent, True)

        @event.listens_for(self.engine, "handle_error")
        def _failed(context: Any) -> None:
            hook = self.on_round_trip
            sent = getattr(context.execution_context, "_singlebeat_sent", None)
            if hook is not None:
                hook(time.perf_counter() - sent if sent is not None else 0.0, False)

    @property
    def stop_at_reconnect(self) -> bool:
        """:attr:`.StoreConnection.stop_at_reconnect`, kept by the executor that
        finds the broken connections."""
        return self.executor.stop_at_reconnect

    @stop_at_reconnect.setter
    def stop_at_reconnect(self, value: bool) -> None:
        self.executor.stop_at_reconnect = value

    @property
    def interruptions(self) -> int:
        """:attr:`.StoreConnection.interruptions`, counted where the statements are sent."""
        return self.executor.interruptions

    @interruptions.setter
    def interruptions(self, value: int) -> None:
        self.executor.interruptions = value

    @classmethod
    def from_settings(cls, settings: Settings) -> SqlStore:
        """The store the validated ``singlebeat_*`` settings describe."""
        return cls(
            settings.url,
            table_prefix=settings.table_prefix,
            engine_options=dict(settings.engine_options),
            stalled_runs=StalledRuns(settings.stalled_run_resends, settings.retention_us),
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
                self.executor.text(self.store_sql.meta_insert),
                {"key": "schema_version", "value_us": SCHEMA_VERSION},
            )
            for turn in ("prune", "prune_singletons", CONTROLS_KEY):
                conn.execute(
                    self.executor.text(self.store_sql.meta_insert), {"key": turn, "value_us": 0}
                )
            for key, value in self.schedules.seed(conn):
                conn.execute(
                    self.executor.text(self.store_sql.meta_insert), {"key": key, "value_us": value}
                )
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
                self.executor.run("schema check", work)
                return
            except StoreUnavailable as exc:
                if attempt == MAX_ATTEMPTS or not _looks_like_create_race(exc):
                    raise
                time.sleep(random.uniform(0.05, 0.3))

    # -- slots (slots.py) ------------------------------------------------------

    def register(self, names: Sequence[str], owner: str = "") -> dict[str, EntryState]:
        return self.slots.register(names, owner)

    def claim(
        self,
        owner: str,
        slots: Sequence[SlotKey],
        lease_us: int,
        revisions: Mapping[str, Written] | None = None,
    ) -> list[Claim]:
        return self.slots.claim(owner, slots, lease_us, revisions)

    def confirm(self, owner: str, claims: Sequence[Claim]) -> list[Claim]:
        return self.slots.confirm(owner, claims)

    def reassert(self, owner: str, sent: Sequence[Claim]) -> list[Claim]:
        return self.slots.reassert(owner, sent)

    def release(self, owner: str, claims: Sequence[Claim], retry_in_us: int = 0) -> None:
        self.slots.release(owner, claims, retry_in_us)

    def take_over(
        self, owner: str, lease_us: int, limit: int, seen: int | None = None
    ) -> list[Claim]:
        return self.slots.take_over(owner, lease_us, limit, seen)

    def prune(self, retention_us: int, every_us: int) -> int | None:
        return self.slots.prune(retention_us, every_us)

    def recent_owners(self, window_us: int) -> list[str]:
        return self.slots.recent_owners(window_us)

    # -- the fleet's rows (fleet.py) -------------------------------------------

    def heartbeat(self, info: ReplicaInfo) -> list[str]:
        return self.fleet.heartbeat(info)

    def stopped(self, replica_id: str) -> None:
        self.fleet.stopped(replica_id)

    def publish_catalog(self, replica_id: str, entries: Sequence[CatalogEntry]) -> None:
        self.fleet.publish_catalog(replica_id, entries)

    def pauses(self) -> list[Pause]:
        return self.fleet.pauses()

    def listen(self) -> ControlListener | None:
        return self.fleet.listen()

    def prune_fleet(self, retention_us: int) -> int:
        return self.fleet.prune_fleet(retention_us)

    def prune_fleet_rows(self, retention_us: int) -> FleetPruned:
        """:meth:`prune_fleet`, counted by table (``singlebeat prune`` prints
        them). A missing table raises SchemaError naming the fix."""
        return self.fleet.prune_rows(retention_us)

    # -- singleton keys and runs (leases.py) -----------------------------------

    def acquire_lease(self, key: str, owner: str, ttl_us: int) -> Lease | Busy:
        return self.leases.acquire_lease(key, owner, ttl_us)

    def begin_slot(
        self, run: Run, key: str, owner: str, task_id: str, ttl_us: int
    ) -> tuple[RunBegin, Lease | Busy | None]:
        if not self.leases.sql.begin_slot:  # no one statement for both: the two calls
            return super().begin_slot(run, key, owner, task_id, ttl_us)
        return self.leases.begin_slot(run, key, owner, task_id, ttl_us)

    def end_slot(self, run: Run, outcome: str | None, lease: Lease) -> tuple[bool, bool]:
        if not self.leases.sql.end_slot:  # no one statement for both: the two calls
            return super().end_slot(run, outcome, lease)
        return self.leases.end_slot(run, outcome, lease)

    def renew_lease(self, lease: Lease, ttl_us: int) -> Lease | None:
        return self.leases.renew_lease(lease, ttl_us)

    def release_lease(self, lease: Lease) -> bool:
        return self.leases.release_lease(lease)

    def lease_holds(self, key: str, token: int) -> bool:
        return self.leases.lease_holds(key, token)

    def begin_run(self, run: Run, owner: str, task_id: str, ttl_us: int) -> RunBegin:
        return self.leases.begin_run(run, owner, task_id, ttl_us)

    def renew_run(self, run: Run, ttl_us: int) -> bool:
        return self.leases.renew_run(run, ttl_us)

    def finish_run(self, run: Run, outcome: str) -> bool:
        return self.leases.finish_run(run, outcome)

    def abandon_run(self, run: Run, *, ran: bool = True) -> bool:
        return self.leases.abandon_run(run, ran=ran)

    def reassert_runs(self, records: Sequence[RunRecord]) -> list[RunRecord]:
        return self.leases.reassert_runs(records)

    def prune_singletons(self, retention_us: int, every_us: int) -> int | None:
        return self.leases.prune_singletons(retention_us, every_us)

    # -- stored schedules (schedules.py) ---------------------------------------

    def write_schedules(
        self,
        writes: Sequence[ScheduleWrite],
        by: str,
        why: str = "",
        connection: Any = None,
    ) -> list[ScheduleRow]:
        return self.schedules.write(writes, by, why, connection)

    def schedule_rows(self) -> tuple[list[ScheduleRow], int]:
        return self.schedules.rows()

    def schedule_row(self, name: str) -> ScheduleRow | None:
        return self.schedules.row(name)

    def schedule_feed(self, after: int) -> ScheduleFeed:
        return self.schedules.feed(after)

    def feed_versions(self) -> int:
        return self.schedules.versions()

    def schedule_log(self, name: str | None = None, limit: int = 100) -> list[ScheduleLogRow]:
        return self.schedules.log(name, limit)

    def prune_schedules(self, tombstones_us: int, log_us: int) -> int:
        return self.schedules.prune(tombstones_us, log_us)

    def sent_count(self, name: str, since_us: int) -> int:
        return self.schedules.sent_count(name, since_us)

    def catalogued(self, names: Sequence[str]) -> dict[str, list[str]]:
        return self.schedules.catalogued(names)

    def ping(self) -> int:
        return self.executor.run(
            "ping", lambda conn: int(fetch(self, conn, self.store_sql.ping)[0][0])
        )

    def close(self) -> None:
        self.engine.dispose()


def _looks_like_create_race(exc: StoreUnavailable) -> bool:
    text_ = str(exc).lower()
    return any(word in text_ for word in ("already exists", "duplicate", "unique", "1050"))
