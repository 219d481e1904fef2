"""The SQL of the fleet's rows as the replicas write and read them
(``fleet.py``), per dialect.

A replica's heartbeat (its row, and in the same round trip the control
version, the open claims, the live replicas and the stored schedules'
revision), its graceful stop, the catalog of its entries, the pauses it
honours, a LISTEN channel's probe, and the prune of the fleet's rows. Table
names: ``{s}`` slots, ``{m}`` meta, ``{r}`` replicas, ``{k}`` catalog
rows, ``{h}`` catalog headers, ``{p}`` pauses, ``{d}`` schedules, ``{q}``
run-now requests, ``{u}`` SingletonTask's run rows.
"""

from __future__ import annotations

from dataclasses import dataclass

from .dialect import (
    CONTROLS,
    LITE_NOW,
    MY_CONTROLS,
    MY_NOW,
    PG_NOW,
    family_of,
    live_replica,
    render,
)


@dataclass(frozen=True)
class FleetDialect:
    """Statement texts of the fleet's rows for one database family."""

    #: the database's clock, in µs: the prune reads it once and binds it as
    #: ``:now_us`` into each of its statements
    now: str
    #: upsert the replica's row and read (now, controls version, open claims,
    #: live replica: ``live_replica``); with ``heartbeat_read`` set, the read is
    #: a second statement
    heartbeat: str
    heartbeat_read: str
    #: MariaDB 10.5+ only: the upsert and the read in one statement (its
    #: ``INSERT ... RETURNING``); MySQL has no RETURNING and keeps the two
    heartbeat_returning: str
    stopped: str
    #: upsert the catalog's header row (``:catalog``, ``:entries``) with now
    catalog_header: str
    #: how many rows catalog ``:catalog`` has
    catalog_count: str
    #: insert the rows of ``:catalog`` from ``:rows``, skipping those there
    catalog_insert: str
    #: point the replica's row (if any) at ``:catalog``
    catalog_assign: str
    #: the pauses in force, and the control version they are of
    pauses: str
    #: PostgreSQL: a listener's probe, ``:payload`` on ``:channel``; "" elsewhere
    probe: str
    prune_replicas: str
    prune_catalogs: str
    prune_catalog: str
    prune_requests: str


#: the tables the placeholders of these statements name
TABLES = {
    "s": "slots",
    "m": "meta",
    "r": "replicas",
    "k": "catalog",
    "h": "catalogs",
    "p": "pauses",
    "d": "schedules",
    "q": "requests",
    "u": "runs",
}

#: the stored schedules' highest revision (through its index), which the
#: heartbeat brings back beside the control version: it counts as a feed read
_SCHEDULES = "(SELECT max(revision) FROM {d})"
#: ... and the floor of what the prune kept of them (feed_versions says why)
_FLOOR = "(SELECT value_us FROM {m} WHERE key = 'schedule_floor')"
_MY_FLOOR = "(SELECT value_us FROM {m} WHERE `key` = 'schedule_floor')"


def _open_claims(now: str) -> str:
    """:attr:`.FleetStore.open_claims`: the claimed-but-unsent rows, and the
    runs that may have stalled (running, lapsed within the retention, started
    no more than ``:resends`` times: :meth:`.SlotStore.take_over` may send
    their slots again), so that a sweep tries the takeover while either
    exists. Over-counts (a run still in its grace, a slot sent again and
    waiting for a worker) only cost a takeover statement that finds nothing;
    both counts are ranges over an index (``ix_<prefix>slots_open``,
    ``ix_<prefix>runs_open``)."""
    return f"""((SELECT count(*) FROM {{s}} WHERE state = 0)
             + (SELECT count(*) FROM {{u}} WHERE state = 0 AND attempts <= :resends
                AND expires_us > {now} - :window_us AND expires_us < {now}))"""


# Replicas gone for longer than the retention: stopped, or not seen since.
_PRUNE_REPLICAS = """
    DELETE FROM {r}
    WHERE (stopped_us IS NOT NULL AND stopped_us < :now_us - :retention_us)
       OR seen_us < :now_us - :retention_us"""

# Catalogs no replica row names (the replicas just pruned, or a release no
# longer running) whose header is older than the retention: a publish in flight
# has refreshed its header (and holds its row lock) before its replica's row
# names it. Their rows go in the same transaction, so a reader never sees part
# of a catalog.
_PRUNE_CATALOGS = """
    DELETE FROM {h}
    WHERE published_us < :now_us - :retention_us
      AND NOT EXISTS (SELECT 1 FROM {r} r WHERE r.catalog = {h}.id)"""
_PRUNE_CATALOG = """
    DELETE FROM {k} WHERE NOT EXISTS (SELECT 1 FROM {h} h WHERE h.id = {k}.catalog)"""

# A request row says who asked for a slot row; once the slot row is pruned
# (sent, older than the retention) it says nothing more.
_PRUNE_REQUESTS = """
    DELETE FROM {q} WHERE NOT EXISTS (
        SELECT 1 FROM {s} s WHERE s.entry = {q}.entry AND s.slot_us = {q}.slot_us)"""

#: the prune's statements, alike in every dialect
_PRUNE = {
    "prune_replicas": _PRUNE_REPLICAS,
    "prune_catalogs": _PRUNE_CATALOGS,
    "prune_catalog": _PRUNE_CATALOG,
    "prune_requests": _PRUNE_REQUESTS,
}

POSTGRESQL = FleetDialect(
    now=f"SELECT {PG_NOW}",
    # the write happens whatever the SELECT reads (a data-modifying CTE always runs)
    heartbeat=f"""
        WITH n AS MATERIALIZED (SELECT {PG_NOW} AS us),
        up AS (
            INSERT INTO {{r}} AS r (id, host, pid, version, started_us, seen_us, loop_us,
                offset_us, tracked, proposes_first, heartbeat_us, stopped_us, catalog, lost_writes)
            SELECT :id, :host, :pid, :version, :started_us, n.us, :loop_us, :offset_us,
                :tracked, :first, :heartbeat_us, NULL, :catalog, :lost_writes FROM n
            ON CONFLICT (id) DO UPDATE SET seen_us = EXCLUDED.seen_us,
                lost_writes = EXCLUDED.lost_writes,
                catalog = COALESCE(EXCLUDED.catalog, r.catalog),
                loop_us = EXCLUDED.loop_us, offset_us = EXCLUDED.offset_us,
                tracked = EXCLUDED.tracked, proposes_first = EXCLUDED.proposes_first,
                heartbeat_us = EXCLUDED.heartbeat_us, version = EXCLUDED.version,
                stopped_us = NULL
            RETURNING 1
        )
        SELECT n.us, {CONTROLS}, {_open_claims("n.us")}, o.id,
               {_SCHEDULES}, {_FLOOR}
        FROM n LEFT JOIN (
            SELECT lr.id FROM {{r}} lr, n WHERE {live_replica("n.us", "lr")}
        ) o ON true""",
    heartbeat_read="",
    heartbeat_returning="",
    stopped=f"UPDATE {{r}} SET stopped_us = {PG_NOW} WHERE id = :id",
    catalog_header=f"""
        INSERT INTO {{h}} AS h (id, entries, published_us) VALUES (:catalog, :entries, {PG_NOW})
        ON CONFLICT (id) DO UPDATE SET published_us = EXCLUDED.published_us""",
    catalog_count="SELECT count(*) FROM {k} WHERE catalog = :catalog",
    catalog_insert="""
        INSERT INTO {k} (entry, catalog, task, schedule, spec)
        SELECT v ->> 0, :catalog, v ->> 1, v ->> 2, v ->> 3
        FROM jsonb_array_elements(CAST(:rows AS jsonb)) AS j(v)
        ON CONFLICT (entry, catalog) DO NOTHING""",
    catalog_assign="UPDATE {r} SET catalog = :catalog WHERE id = :replica",
    pauses=f"""
        WITH n AS MATERIALIZED (SELECT {PG_NOW} AS us)
        SELECT n.us, p.entry, p.until_us, p.paused_by, p.reason, p.at_us, {CONTROLS}
        FROM n LEFT JOIN {{p}} p ON p.until_us IS NULL OR p.until_us > n.us""",
    probe="SELECT pg_notify(:channel, :payload)",
    **_PRUNE,
)

#: MySQL/MariaDB: the replica's row upserted (the heartbeat's write)
_MY_HEARTBEAT = f"""
        INSERT INTO {{r}} (id, host, pid, version, started_us, seen_us, loop_us,
            offset_us, tracked, proposes_first, heartbeat_us, stopped_us, catalog, lost_writes)
        VALUES (:id, :host, :pid, :version, :started_us, {MY_NOW}, :loop_us, :offset_us,
            :tracked, :first, :heartbeat_us, NULL, :catalog, :lost_writes)
        ON DUPLICATE KEY UPDATE seen_us = VALUES(seen_us), loop_us = VALUES(loop_us),
            lost_writes = VALUES(lost_writes),
            catalog = COALESCE(VALUES(catalog), catalog),
            offset_us = VALUES(offset_us), tracked = VALUES(tracked),
            proposes_first = VALUES(proposes_first), heartbeat_us = VALUES(heartbeat_us),
            version = VALUES(version), stopped_us = NULL"""

MYSQL = FleetDialect(
    now=f"SELECT {MY_NOW}",
    # MySQL has no RETURNING, no writing CTE: the upsert, then the read
    heartbeat=_MY_HEARTBEAT,
    heartbeat_read=f"""
        SELECT {MY_NOW}, {MY_CONTROLS}, {_open_claims(MY_NOW)}, o.id,
               {_SCHEDULES}, {_MY_FLOOR}
        FROM (SELECT 1 AS one) d LEFT JOIN (
            SELECT lr.id FROM {{r}} lr WHERE {live_replica(MY_NOW, "lr")}
        ) o ON true""",
    # MariaDB refuses a subquery on the table an INSERT writes (error 1093)
    # unless a derived table materialises it; RETURNING is evaluated after the
    # upsert, so the live list includes this replica's fresh row
    heartbeat_returning=_MY_HEARTBEAT
    + f"""
        RETURNING seen_us, {MY_CONTROLS}, {_open_claims(MY_NOW)},
            (SELECT live.ids FROM (SELECT JSON_ARRAYAGG(lr.id) AS ids FROM {{r}} lr
             WHERE {live_replica(MY_NOW, "lr")}) live), {_SCHEDULES}, {_MY_FLOOR}""",
    stopped=f"UPDATE {{r}} SET stopped_us = {MY_NOW} WHERE id = :id",
    catalog_header=f"""
        INSERT INTO {{h}} (id, entries, published_us) VALUES (:catalog, :entries, {MY_NOW})
        ON DUPLICATE KEY UPDATE published_us = VALUES(published_us)""",
    catalog_count="SELECT count(*) FROM {k} WHERE catalog = :catalog",
    catalog_insert="""
        INSERT IGNORE INTO {k} (entry, catalog, task, schedule, spec)
        SELECT c.entry, :catalog, c.task, c.schedule, c.spec
        FROM JSON_TABLE(:rows, '$[*]' COLUMNS (
            entry VARCHAR(255) CHARACTER SET utf8mb4 PATH '$[0]',
            task VARCHAR(255) CHARACTER SET utf8mb4 PATH '$[1]',
            schedule VARCHAR(500) CHARACTER SET utf8mb4 PATH '$[2]',
            spec LONGTEXT CHARACTER SET utf8mb4 PATH '$[3]')) c""",
    catalog_assign="UPDATE {r} SET catalog = :catalog WHERE id = :replica",
    pauses=f"""
        SELECT {MY_NOW}, p.entry, p.until_us, p.paused_by, p.reason, p.at_us, {MY_CONTROLS}
        FROM (SELECT 1 AS one) d LEFT JOIN {{p}} p
            ON p.until_us IS NULL OR p.until_us > {MY_NOW}""",
    probe="",
    **_PRUNE,
)

SQLITE = FleetDialect(
    now=f"SELECT {LITE_NOW}",
    # one statement: RETURNING may read other tables through subqueries
    heartbeat=f"""
        INSERT INTO {{r}} AS r (id, host, pid, version, started_us, seen_us, loop_us,
            offset_us, tracked, proposes_first, heartbeat_us, stopped_us, catalog, lost_writes)
        VALUES (:id, :host, :pid, :version, :started_us, {LITE_NOW}, :loop_us, :offset_us,
            :tracked, :first, :heartbeat_us, NULL, :catalog, :lost_writes)
        ON CONFLICT (id) DO UPDATE SET seen_us = excluded.seen_us,
            lost_writes = excluded.lost_writes,
            catalog = COALESCE(excluded.catalog, r.catalog),
            loop_us = excluded.loop_us, offset_us = excluded.offset_us,
            tracked = excluded.tracked, proposes_first = excluded.proposes_first,
            heartbeat_us = excluded.heartbeat_us, version = excluded.version, stopped_us = NULL
        RETURNING seen_us, {CONTROLS}, {_open_claims(LITE_NOW)},
            (SELECT json_group_array(lr.id) FROM {{r}} lr
             WHERE {live_replica(LITE_NOW, "lr")}), {_SCHEDULES}, {_FLOOR}""",
    heartbeat_read="",
    heartbeat_returning="",
    stopped=f"UPDATE {{r}} SET stopped_us = {LITE_NOW} WHERE id = :id",
    catalog_header=f"""
        INSERT INTO {{h}} AS h (id, entries, published_us) VALUES (:catalog, :entries, {LITE_NOW})
        ON CONFLICT (id) DO UPDATE SET published_us = excluded.published_us""",
    catalog_count="SELECT count(*) FROM {k} WHERE catalog = :catalog",
    catalog_insert="""
        INSERT INTO {k} (entry, catalog, task, schedule, spec)
        SELECT json_extract(c.value, '$[0]'), :catalog, json_extract(c.value, '$[1]'),
            json_extract(c.value, '$[2]'), json_extract(c.value, '$[3]')
        FROM json_each(:rows) c WHERE true
        ON CONFLICT (entry, catalog) DO NOTHING""",
    catalog_assign="UPDATE {r} SET catalog = :catalog WHERE id = :replica",
    pauses=f"""
        SELECT {LITE_NOW}, p.entry, p.until_us, p.paused_by, p.reason, p.at_us, {CONTROLS}
        FROM (SELECT 1 AS one) d LEFT JOIN {{p}} p
            ON p.until_us IS NULL OR p.until_us > {LITE_NOW}""",
    probe="",
    **_PRUNE,
)


def fleet_dialect_for(backend: str, prefix: str) -> FleetDialect:
    """The statements for an SQLAlchemy backend name, with table names filled in."""
    family = {"postgresql": POSTGRESQL, "mysql": MYSQL, "sqlite": SQLITE}[family_of(backend)]
    return render(family, prefix, TABLES)
