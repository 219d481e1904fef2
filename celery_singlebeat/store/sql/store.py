"""The SQL implementation of :class:`~celery_singlebeat.store.base.Store`, every contract.

One SQLAlchemy engine in autocommit mode: every operation is a single
statement (two on MySQL/MariaDB, which lack RETURNING), so a tick costs one
round trip, not BEGIN + statement + COMMIT. Every statement goes through
the store's :class:`~.executor.SqlExecutor` (shared with its
:class:`~.fleet.Fleet`), which wraps driver errors once: deadlocks and
serialization failures are retried, anything else that means "the database
did not decide" becomes ``StoreUnavailable``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import random
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from contextlib import suppress
from typing import TYPE_CHECKING, Any, NamedTuple

from sqlalchemy import create_engine, event, inspect
from sqlalchemy.engine import URL, Connection, Engine

from ...exceptions import SchemaError, StoreUnavailable
from ...redact import Secrets
from ...timeline.clock import DatabaseClock
from ...timeline.membership import LIVE_HEARTBEATS, LIVE_SLACK_US
from ...timeline.timing import ANSWER_TIMEOUT_S, CONNECT_TIMEOUT_S
from ..base import (
    CONTROLS_KEY,
    EARLY_TOLERANCE_US,
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
    Store,
    Written,
    controls_channel,
)
from .executor import MAX_ATTEMPTS, SqlExecutor
from .fleet_statements import FleetDialect, fleet_dialect_for
from .lease_statements import LeaseDialect, lease_dialect_for
from .schedules import SqlSchedules
from .schema import SCHEMA_VERSION, Tables
from .slot_statements import SlotDialect, slot_dialect_for
from .store_statements import StoreDialect, store_dialect_for

if TYPE_CHECKING:
    from ...config import Settings
    from ..fleet_store import ControlListener

logger = logging.getLogger("celery_singlebeat.store")

#: the write a slot of no stored entry is proposed under: none to check
_NO_WRITE = Written(0, 0)


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


class FleetPruned(NamedTuple):
    """The rows a fleet prune deleted, by table."""

    replicas: int
    #: catalog rows (of catalogs no replica row names any more)
    catalog: int
    #: request rows whose slot row is gone
    requests: int


def _returns_from_upserts(conn: Connection) -> bool:
    """Whether the server takes ``INSERT ... RETURNING``: MariaDB from 10.5
    (SQLAlchemy knows the server once a connection is open); MySQL does not."""
    dialect = conn.dialect
    version = getattr(dialect, "server_version_info", None) or ()
    return bool(getattr(dialect, "is_mariadb", False)) and tuple(version[:2]) >= (10, 5)


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
        #: what every connection is opened with (the listener's too)
        self._connect_args: dict[str, Any] = dict(options.get("connect_args", {}))
        if self.backend == "postgresql" and url.drivername == "postgresql":
            # the plain scheme means psycopg2 to SQLAlchemy; we ship psycopg 3
            url = url.set(drivername="postgresql+psycopg")
        elif url.drivername in ("mysql", "mariadb"):
            # likewise mysqlclient; PyMySQL is the driver of the `mysql` extra
            url = url.set(drivername=f"{url.drivername}+pymysql")
        self.engine: Engine = create_engine(url, **options)
        self._install_session_setup()
        #: sends every statement of this store and of its Fleet (one retry loop)
        self.executor = SqlExecutor(self.engine, self.secrets)
        self.tables = Tables(table_prefix)
        self.sql: SlotDialect = slot_dialect_for(self.backend, table_prefix)
        self.store_sql: StoreDialect = store_dialect_for(self.backend, table_prefix)
        #: the replicas' heartbeat, catalog, pauses, LISTEN probe and prune
        self.fleet_sql: FleetDialect = fleet_dialect_for(self.backend, table_prefix)
        #: replica id -> the id of the catalog it last published
        self._catalogs: dict[str, str] = {}
        self.lease_sql: LeaseDialect = lease_dialect_for(self.backend, table_prefix)
        #: stored schedules: their statements and methods (schedules_sql.py)
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

    def _fetch(self, conn: Connection, statement: str, **params: Any) -> list[Any]:
        """Execute, read all rows, and feed the database clock from column 0."""
        sent = self.clock.local_us()
        rows = conn.execute(self.executor.text(statement), params).all()
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

    def register(self, names: Sequence[str], owner: str = "") -> dict[str, EntryState]:
        payload = json.dumps(sorted(set(names)))

        def work(conn: Connection) -> dict[str, EntryState]:
            if names:
                conn.execute(
                    self.executor.text(self.sql.register_insert), {"names": payload, "owner": owner}
                )
            rows = self._fetch(conn, self.sql.register_select, names=payload)
            out = {}
            for _now, name, anchor, last in rows:
                if name is None:
                    continue
                last_slot = None if last is None or int(last) < 0 else int(last)
                out[name] = EntryState(name, int(anchor), last_slot)
            return out

        return self.executor.run("register entries", work)

    def claim(
        self,
        owner: str,
        slots: Sequence[SlotKey],
        lease_us: int,
        revisions: Mapping[str, Written] | None = None,
    ) -> list[Claim]:
        if not slots:
            return []
        # each slot with the write it is proposed under (0, 0: no stored entry)
        revs = revisions or {}
        payload = json.dumps(
            sorted({(s.entry, s.slot_us, *revs.get(s.entry, _NO_WRITE)) for s in slots})
        )
        if self.sql.returning:
            return self.executor.run(
                "claim",
                lambda conn: _claims(
                    self._note_controls(
                        self._fetch(
                            conn,
                            self.sql.claim,
                            owner=owner,
                            slots=payload,
                            lease_us=lease_us,
                            early_us=EARLY_TOLERANCE_US,
                            stale_us=STALE_DEFINITION_US,
                        )
                    )
                ),
            )
        batch = uuid.uuid4().hex

        def work(conn: Connection) -> list[Claim]:
            conn.execute(
                self.executor.text(self.sql.claim),
                {
                    "owner": owner,
                    "slots": payload,
                    "lease_us": lease_us,
                    "batch": batch,
                    "early_us": EARLY_TOLERANCE_US,
                    "stale_us": STALE_DEFINITION_US,
                },
            )
            return _claims(
                self._note_controls(
                    self._fetch(conn, self.sql.select_batch, batch=batch, owner=owner)
                )
            )

        return self.executor.run("claim", work)

    def confirm(self, owner: str, claims: Sequence[Claim]) -> list[Claim]:
        # once each: MySQL compares the matched row count with the number of claims
        claims = list(dict.fromkeys(claims))
        if not claims:
            return []
        payload = json.dumps([[c.entry, c.slot_us, c.fence] for c in claims])
        if self.sql.returning:
            return self.executor.run(
                "confirm",
                lambda conn: _claims(
                    self._fetch(conn, self.sql.confirm, owner=owner, slots=payload)
                ),
            )

        def work(conn: Connection) -> list[Claim]:
            result = conn.execute(
                self.executor.text(self.sql.confirm), {"owner": owner, "slots": payload}
            )
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

        return self.executor.run("confirm", work)

    def reassert(self, owner: str, sent: Sequence[Claim]) -> list[Claim]:
        sent = list(dict.fromkeys(sent))
        if not sent:
            return []
        payload = json.dumps([[c.entry, c.slot_us, c.fence] for c in sent])
        params = {"owner": owner, "slots": payload}
        return self._won("write sent slots again", self.sql.reassert, params, sent=True)

    def release(self, owner: str, claims: Sequence[Claim], retry_in_us: int = 0) -> None:
        if not claims:
            return
        payload = json.dumps([[c.entry, c.slot_us, c.fence] for c in claims])
        params = {"owner": owner, "slots": payload, "retry_us": max(0, retry_in_us)}
        self.executor.run(
            "release", lambda conn: conn.execute(self.executor.text(self.sql.release), params)
        )

    def take_over(self, owner: str, lease_us: int, limit: int) -> list[Claim]:
        # run-now rows only for the entries of the catalog this replica published
        params = {
            "owner": owner,
            "lease_us": lease_us,
            "limit": limit,
            "catalog": self._catalogs.get(owner),
        }
        return self._won("take over", self.sql.take_over, params, sent=False)

    def _won(self, what: str, statement: str, params: dict[str, Any], sent: bool) -> list[Claim]:
        """The rows a statement won for ``params["owner"]``, oldest first.

        With RETURNING they come back with it; on MySQL the statement marks them
        with a batch id of its own and a second statement reads them back, only
        when the first changed a row. ``sent``: the rows it wins are sent ones
        (reassert) rather than claims (take_over).
        """
        if self.sql.returning:
            return _oldest_first(
                self.executor.run(
                    what, lambda conn: _claims(self._fetch(conn, statement, **params))
                )
            )
        batch = uuid.uuid4().hex
        owner = params["owner"]

        def work(conn: Connection) -> list[Claim]:
            if (
                conn.execute(self.executor.text(statement), {**params, "batch": batch}).rowcount
                == 0
            ):
                # nothing to read back; the heartbeat sent with every sweep
                # feeds the clock (a ping here cost MySQL one statement a sweep)
                return []
            rows = self._fetch(conn, self.sql.select_batch, batch=batch, owner=owner)
            return _claims([r for r in rows if sent or r[4] in (None, 0)])

        return _oldest_first(self.executor.run(what, work))

    def prune(self, retention_us: int, every_us: int) -> int | None:
        def work(conn: Connection) -> int | None:
            turn = conn.execute(self.executor.text(self.sql.prune_turn), {"every_us": every_us})
            if turn.rowcount != 1:
                return None
            conn.execute(self.executor.text(self.sql.prune_mark), {"retention_us": retention_us})
            deleted = conn.execute(
                self.executor.text(self.sql.prune_delete), {"retention_us": retention_us}
            )
            return int(deleted.rowcount)

        return self.executor.run("prune", work)

    def _note_controls(self, rows: list[Any]) -> list[Any]:
        """Keep the control version a statement read in its last column."""
        if rows and rows[0][-1] is not None:
            self.controls_version = int(rows[0][-1])
        return rows

    def heartbeat(self, info: ReplicaInfo) -> list[str]:
        params = {
            "id": info.id,
            "host": info.host,
            "pid": info.pid,
            "version": info.version,
            "started_us": info.started_us,
            "loop_us": info.loop_us,
            "offset_us": info.offset_us,
            "tracked": info.tracked,
            "first": info.proposes_first,
            "heartbeat_us": info.heartbeat_us,
            "beats": LIVE_HEARTBEATS,
            "slack_us": LIVE_SLACK_US,
            "catalog": self._catalogs.get(info.id),
            "lost_writes": info.lost_writes,
        }

        one_row = self.backend == "sqlite"

        def work(conn: Connection) -> list[Any]:
            nonlocal one_row
            if not self.fleet_sql.heartbeat_read:
                return self._fetch(conn, self.fleet_sql.heartbeat, **params)
            if _returns_from_upserts(conn):
                # one statement, not two: idle, the heartbeat is one of the
                # statements the feed's budget counts (docs/performance.md)
                one_row = True
                return self._fetch(conn, self.fleet_sql.heartbeat_returning, **params)
            conn.execute(self.executor.text(self.fleet_sql.heartbeat), params)
            return self._fetch(
                conn, self.fleet_sql.heartbeat_read, beats=LIVE_HEARTBEATS, slack_us=LIVE_SLACK_US
            )

        rows = self.executor.run("heartbeat", work)
        if not rows:
            return [info.id]
        _now, version, open_claims, _live, revision, floor = rows[0]
        self.controls_version = None if version is None else int(version)
        self.open_claims = int(open_claims)
        # as feed_versions: the floor too (ScheduleStore.feed_versions)
        self.schedule_revision = max(int(revision or 0), int(floor or 0))
        if one_row:
            # one row; the live replicas come as a JSON array
            live = {str(r) for r in json.loads(rows[0][3] or "[]") if r is not None}
        else:
            live = {str(r[3]) for r in rows if r[3] is not None}
        # PostgreSQL's read does not see the upsert of its own statement (one
        # snapshot): a first heartbeat, or the first after a stop, would miss
        # the row it has just made live.
        return sorted(live | {info.id})

    def stopped(self, replica_id: str) -> None:
        self.executor.run(
            "mark replica stopped",
            lambda conn: conn.execute(
                self.executor.text(self.fleet_sql.stopped), {"id": replica_id}
            ),
        )

    def publish_catalog(self, replica_id: str, entries: Sequence[CatalogEntry]) -> None:
        # Content-addressed (schema.py says why): the id is a digest of the
        # entries, so every replica of one release names the same catalog.
        # The header is upserted first: it holds the row lock a concurrent
        # prune needs, and its fresh published_us keeps the catalog out of
        # that prune's reach until this replica's row names it. The rows are
        # written only when the catalog is not all there (the first replica of
        # a release, or after a prune), in the same transaction, so a reader
        # sees a catalog whole or not at all.
        ordered = sorted(entries, key=lambda e: e.entry)
        rows = json.dumps([[e.entry, e.task, e.schedule, e.spec] for e in ordered])
        catalog = hashlib.sha256(rows.encode()).hexdigest()[:32]
        params = {"catalog": catalog, "entries": len(ordered), "replica": replica_id}

        def work(conn: Connection) -> None:
            conn.execute(self.executor.text(self.fleet_sql.catalog_header), params)
            have = self._fetch(conn, self.fleet_sql.catalog_count, catalog=catalog)
            if int(have[0][0]) < len(ordered):
                conn.execute(
                    self.executor.text(self.fleet_sql.catalog_insert), {**params, "rows": rows}
                )
            conn.execute(self.executor.text(self.fleet_sql.catalog_assign), params)

        self.executor.run("publish catalog", work)
        # the heartbeat names it too: the replica's row may not exist yet
        self._catalogs[replica_id] = catalog

    def pauses(self) -> list[Pause]:
        # the control version comes along: the pauses read are those of that version
        rows = self._note_controls(
            self.executor.run("read pauses", lambda conn: self._fetch(conn, self.fleet_sql.pauses))
        )
        return sorted(
            (
                Pause(
                    str(r[1]), None if r[2] is None else int(r[2]), str(r[3]), str(r[4]), int(r[5])
                )
                for r in rows
                if r[1] is not None
            ),
            key=lambda p: p.entry,
        )

    def listen(self) -> ControlListener | None:
        """:meth:`.FleetStore.listen`: on PostgreSQL (psycopg) a connection of
        its own that LISTENs on the prefix's channel
        (:class:`~.listening.PostgresControlListener`), which every control
        write of :class:`~.fleet.Fleet` notifies; None on MySQL/MariaDB and
        SQLite. Raises :class:`StoreUnavailable` when it cannot connect."""
        if self.backend != "postgresql" or self.engine.dialect.driver != "psycopg":
            return None
        from .listening import PostgresControlListener

        what = "listen for controls"
        # A connection of its own, not one of the pool's: taking the pool's
        # warm connection would leave the statements it ran unreported in the
        # server's statistics until it idles 10 s, and the pool would open
        # another. Same parameters as the engine's connections.
        cargs, cparams = self.engine.dialect.create_connect_args(self.engine.url)
        cparams = {**cparams, **self._connect_args}
        cparams.pop("read_timeout", None)  # no libpq option (psycopg_timeout's)
        try:
            import psycopg

            driver = psycopg.connect(*cargs, **cparams)
        except Exception as exc:
            raise StoreUnavailable(
                self.secrets.scrub(f"{what} failed: {type(exc).__name__}: {exc}")
            ) from None
        channel = controls_channel(self.tables.prefix)

        def send(payload: str) -> None:
            # through the pool, never the listening connection: behind a
            # pooler, a NOTIFY of the listener's own could run on the very
            # server connection its LISTEN left behind and come back to it
            self.executor.run(
                "probe the listening connection",
                lambda conn: conn.execute(
                    self.executor.text(self.fleet_sql.probe),
                    {"channel": channel, "payload": payload},
                ),
            )

        try:
            return PostgresControlListener(driver, channel, send)
        except Exception as exc:
            with suppress(Exception):
                driver.close()
            raise StoreUnavailable(
                self.secrets.scrub(f"{what} failed: {type(exc).__name__}: {exc}")
            ) from None

    def prune_fleet(self, retention_us: int) -> int:
        return sum(self.prune_fleet_rows(retention_us))

    def prune_fleet_rows(self, retention_us: int) -> FleetPruned:
        """:meth:`prune_fleet`, counted by table (``singlebeat prune`` prints
        them). A missing table raises SchemaError naming the fix."""
        sql = self.fleet_sql

        def work(conn: Connection) -> FleetPruned:
            now = int(conn.execute(self.executor.text(sql.now)).scalar_one())
            params = {"now_us": now, "retention_us": retention_us}
            replicas = conn.execute(self.executor.text(sql.prune_replicas), params).rowcount
            conn.execute(self.executor.text(sql.prune_catalogs), params)
            catalog = conn.execute(self.executor.text(sql.prune_catalog)).rowcount
            requests = conn.execute(self.executor.text(sql.prune_requests)).rowcount
            return FleetPruned(int(replicas), int(catalog), int(requests))

        return self.executor.run("prune fleet", work, schema_errors=True)

    def recent_owners(self, window_us: int) -> list[str]:
        rows = self.executor.run(
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
            conn.execute(self.executor.text(sql.acquire), params)
            _now, token, expires, holder, row_grant = self._fetch(conn, sql.lease_row, key=key)[0]
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

        return self.executor.run("begin slot", work)

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
        row = self.executor.run(
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
            if conn.execute(self.executor.text(sql.renew), params).rowcount != 1:
                return None
            row = self._fetch(conn, sql.lease_row, key=lease.key)[0]
            return lease._replace(expires_us=int(row[2]))

        return self.executor.run("renew lease", work)

    def release_lease(self, lease: Lease) -> bool:
        params = {"key": lease.key, "token": lease.token}
        return self.executor.run(
            "release lease",
            lambda conn: (
                conn.execute(self.executor.text(self.lease_sql.release), params).rowcount == 1
            ),
        )

    def lease_holds(self, key: str, token: int) -> bool:
        rows = self.executor.run(
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
                conn.execute(self.executor.text(sql.begin_run), params)
                row = self._fetch(conn, sql.run_row, entry=run.entry, slot_us=run.slot_us)[0]
            _now, run_id, state, holder, outcome = row
            return _run_begin(run, run_id, state, holder, outcome)

        return self.executor.run("begin run", work)

    def _run_update(self, what: str, statement: str, run: Run, **extra: Any) -> bool:
        params = {"entry": run.entry, "slot_us": run.slot_us, "run_id": run.run_id, **extra}
        return self.executor.run(
            what, lambda conn: conn.execute(self.executor.text(statement), params).rowcount == 1
        )

    def renew_run(self, run: Run, ttl_us: int) -> bool:
        return self._run_update("renew run", self.lease_sql.renew_run, run, ttl_us=ttl_us)

    def finish_run(self, run: Run, outcome: str) -> bool:
        return self._run_update("finish run", self.lease_sql.finish_run, run, outcome=outcome)

    def abandon_run(self, run: Run) -> bool:
        return self._run_update("abandon run", self.lease_sql.abandon_run, run)

    def reassert_runs(self, records: Sequence[RunRecord]) -> list[RunRecord]:
        if not records:
            return []
        sql = self.lease_sql

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
                if not written and record.outcome is not None:
                    refinish = conn.execute(self.executor.text(sql.refinish_run), params)
                    written = refinish.rowcount == 1
                if written:
                    again.append(record)
            return again

        return self.executor.run("write run rows again", work)

    def prune_singletons(self, retention_us: int, every_us: int) -> int | None:
        sql = self.lease_sql

        def work(conn: Connection) -> int | None:
            if (
                conn.execute(self.executor.text(sql.prune_turn), {"every_us": every_us}).rowcount
                != 1
            ):
                return None
            params = {"retention_us": retention_us}
            runs = conn.execute(self.executor.text(sql.prune_runs), params).rowcount
            locks = conn.execute(self.executor.text(sql.prune_locks), params).rowcount
            return int(runs) + int(locks)

        return self.executor.run("prune singletons", work)

    # -- stored schedules (schedules_sql.py) ------------------------------------

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
        self.schedule_revision = self.schedules.versions()
        return self.schedule_revision

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
            "ping", lambda conn: int(self._fetch(conn, self.store_sql.ping)[0][0])
        )

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


def _looks_like_create_race(exc: StoreUnavailable) -> bool:
    text_ = str(exc).lower()
    return any(word in text_ for word in ("already exists", "duplicate", "unique", "1050"))
