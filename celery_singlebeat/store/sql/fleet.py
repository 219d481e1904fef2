"""The fleet's rows in SQL: the implementation of :class:`.FleetStore`.

:class:`SqlFleet` is the part of :class:`~.store.SqlStore` its fleet methods
delegate to, with its statements beside it (``fleet_statements.py``): what a
replica writes so that the others and the operator know it (its heartbeat, its
graceful stop, its catalog), the pauses it reads, the LISTEN channel that
hears the operator's controls on PostgreSQL, and the prune of the fleet's
rows. The operator's side of the same rows is :class:`~.operator.Operator`.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from contextlib import suppress
from typing import TYPE_CHECKING, Any, NamedTuple

from sqlalchemy.engine import Connection

from ...exceptions import StoreUnavailable
from ...timeline.membership import LIVE_HEARTBEATS, LIVE_SLACK_US
from ..values import CatalogEntry, Pause, ReplicaInfo, controls_channel
from .fleet_statements import FleetDialect, fleet_dialect_for
from .host import SqlHost, fetch, note_controls

if TYPE_CHECKING:
    from ..fleet_store import ControlListener


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


class SqlFleet:
    """The replicas' rows and the controls as they read them: the methods of
    :class:`.FleetStore`, whose docstrings say what each may touch."""

    def __init__(self, host: SqlHost) -> None:
        self.host = host
        #: the store's one executor
        self.executor = host.executor
        self.sql: FleetDialect = fleet_dialect_for(host.backend, host.tables.prefix)
        #: replica id -> the id of the catalog it last published
        self.catalogs: dict[str, str] = {}

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
            "catalog": self.catalogs.get(info.id),
            "lost_writes": info.lost_writes,
            # the runs that may have stalled count as open claims (fleet_statements.py)
            "resends": self.host.stalled_runs.resends,
            "window_us": self.host.stalled_runs.window_us,
        }

        one_row = self.host.backend == "sqlite"

        def work(conn: Connection) -> list[Any]:
            nonlocal one_row
            if not self.sql.heartbeat_read:
                return fetch(self.host, conn, self.sql.heartbeat, **params)
            if _returns_from_upserts(conn):
                # one statement, not two: idle, the heartbeat is one of the
                # statements the feed's budget counts (docs/performance.md)
                one_row = True
                return fetch(self.host, conn, self.sql.heartbeat_returning, **params)
            conn.execute(self.executor.text(self.sql.heartbeat), params)
            return fetch(
                self.host,
                conn,
                self.sql.heartbeat_read,
                beats=LIVE_HEARTBEATS,
                slack_us=LIVE_SLACK_US,
                resends=params["resends"],
                window_us=params["window_us"],
            )

        rows = self.executor.run("heartbeat", work)
        if not rows:
            return [info.id]
        _now, version, open_claims, _live, revision, floor = rows[0]
        self.host.controls_version = None if version is None else int(version)
        self.host.open_claims = int(open_claims)
        # as feed_versions: the floor too (ScheduleStore.feed_versions)
        self.host.schedule_revision = max(int(revision or 0), int(floor or 0))
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
            lambda conn: conn.execute(self.executor.text(self.sql.stopped), {"id": replica_id}),
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
            conn.execute(self.executor.text(self.sql.catalog_header), params)
            # not through fetch: its column 0 is a row count, not the
            # database's time, and the clock must not take it for one
            have = conn.execute(
                self.executor.text(self.sql.catalog_count), {"catalog": catalog}
            ).scalar_one()
            if int(have) < len(ordered):
                conn.execute(self.executor.text(self.sql.catalog_insert), {**params, "rows": rows})
            conn.execute(self.executor.text(self.sql.catalog_assign), params)

        self.executor.run("publish catalog", work)
        # the heartbeat names it too: the replica's row may not exist yet
        self.catalogs[replica_id] = catalog

    def pauses(self) -> list[Pause]:
        # the control version comes along: the pauses read are those of that version
        rows = note_controls(
            self.host,
            self.executor.run("read pauses", lambda conn: fetch(self.host, conn, self.sql.pauses)),
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
        write of :class:`~.operator.Operator` notifies; None on MySQL/MariaDB and
        SQLite. Raises :class:`StoreUnavailable` when it cannot connect."""
        if self.host.backend != "postgresql" or self.host.engine.dialect.driver != "psycopg":
            return None
        from .listening import PostgresControlListener

        what = "listen for controls"
        # A connection of its own, not one of the pool's: taking the pool's
        # warm connection would leave the statements it ran unreported in the
        # server's statistics until it idles 10 s, and the pool would open
        # another. Same parameters as the engine's connections.
        cargs, cparams = self.host.engine.dialect.create_connect_args(self.host.engine.url)
        cparams = {**cparams, **self.host.connect_args}
        cparams.pop("read_timeout", None)  # no libpq option (psycopg_timeout's)
        try:
            import psycopg

            driver = psycopg.connect(*cargs, **cparams)
        except Exception as exc:
            raise StoreUnavailable(
                self.host.secrets.scrub(f"{what} failed: {type(exc).__name__}: {exc}")
            ) from None
        channel = controls_channel(self.host.tables.prefix)

        def send(payload: str) -> None:
            # through the pool, never the listening connection: behind a
            # pooler, a NOTIFY of the listener's own could run on the very
            # server connection its LISTEN left behind and come back to it
            self.executor.run(
                "probe the listening connection",
                lambda conn: conn.execute(
                    self.executor.text(self.sql.probe),
                    {"channel": channel, "payload": payload},
                ),
            )

        try:
            return PostgresControlListener(driver, channel, send)
        except Exception as exc:
            with suppress(Exception):
                driver.close()
            raise StoreUnavailable(
                self.host.secrets.scrub(f"{what} failed: {type(exc).__name__}: {exc}")
            ) from None

    def prune_fleet(self, retention_us: int) -> int:
        return sum(self.prune_rows(retention_us))

    def prune_rows(self, retention_us: int) -> FleetPruned:
        """:meth:`prune_fleet`, counted by table (``singlebeat prune`` prints
        them). A missing table raises SchemaError naming the fix."""
        sql = self.sql

        def work(conn: Connection) -> FleetPruned:
            now = int(conn.execute(self.executor.text(sql.now)).scalar_one())
            params = {"now_us": now, "retention_us": retention_us}
            replicas = conn.execute(self.executor.text(sql.prune_replicas), params).rowcount
            conn.execute(self.executor.text(sql.prune_catalogs), params)
            catalog = conn.execute(self.executor.text(sql.prune_catalog)).rowcount
            requests = conn.execute(self.executor.text(sql.prune_requests)).rowcount
            return FleetPruned(int(replicas), int(catalog), int(requests))

        return self.executor.run("prune fleet", work, schema_errors=True)
