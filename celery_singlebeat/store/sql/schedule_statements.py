"""The SQL of stored schedules (``schedules.py``), per dialect.

Table names: ``{t}`` schedules, ``{g}`` the schedule log, ``{m}`` meta,
``{s}`` slots. The columns of a schedule row are always read and written in
:class:`~.values.ScheduleRow`'s order (:data:`COLUMNS`). A set of names
travels as one JSON parameter (``:names``), as in the replicas' statements;
rows and history rows are written with one ``executemany`` each.

The replicas' reads (``versions``, ``feed``, ``rows``, ``row``) return the
database's clock first, so that they feed the store's clock as every other
statement of a replica does.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..values import SCHEDULE_FLOOR_KEY, SCHEDULE_REVISION_KEY, ScheduleRow
from .dialect import LITE_NOW, MY_NOW, PG_NOW, family_of, live_replica, render

#: the schedules table's columns, in ScheduleRow's order
COLUMNS: tuple[str, ...] = ScheduleRow._fields

_COLS = ", ".join(f"t.{c}" for c in COLUMNS)
_INSERT_COLS = ", ".join(COLUMNS)
_VALUES = ", ".join(f":{c}" for c in COLUMNS)
_LOG_COLS = "revision, name, action, changed_by, why, at_us, changes"


def _set_all(template: str) -> str:
    """The SET list of an upsert: every column but the key, from the new row."""
    return ", ".join(f"{c} = {template.format(c=c)}" for c in COLUMNS if c != "name")


@dataclass(frozen=True)
class ScheduleDialect:
    """Statement texts of stored schedules for one database family."""

    #: opens a transaction on an autocommit connection (SQLite: the write lock at once)
    begin: str
    #: increments the revision counter, creating its row when missing (then
    #: at 1), and keeps its row lock to the commit: the write's first
    #: statement. Returns (now, revision) where it can (``RETURNING``);
    #: MySQL/MariaDB read them with ``bump_read`` (``LAST_INSERT_ID(expr)``
    #: keeps the value for this connection)
    bump: str
    bump_read: str
    #: the rows ``:names`` names, tombstones too, locked where the database can
    named: str
    upsert: str
    log_insert: str
    #: PostgreSQL: wakes the replicas that LISTEN (delivered at commit); "" elsewhere
    notify: str
    #: (now, max revision, control version, floor): feed_versions
    versions: str
    #: (now, floor, row columns...) of rows above ``:after``; one row of NULL
    #: columns when there are none
    feed: str
    #: (now, revision, row columns...) of the live rows; the revision is the
    #: table's highest or the floor, whichever is higher
    rows: str
    #: (now, row columns...) of the live row ``:name``
    row: str
    log_all: str
    log_entry: str
    now: str
    #: raises the floor to the highest revision of a tombstone older than ``:cutoff``
    floor_raise: str
    tombstones_delete: str
    log_delete: str
    sent_count: str
    #: the table's highest revision (0 when empty): where prepare starts the
    #: counter row it creates when missing (with store_statements.py's meta_insert)
    seed_revision: str
    #: (now, name, replica id) for each of ``:names`` a live replica's catalog
    #: lists (binds ``:beats`` and ``:slack_us``, the one rule of liveness)
    catalogued: str


#: the tables the placeholders of these statements name
TABLES = {
    "t": "schedules",
    "g": "schedule_log",
    "m": "meta",
    "s": "slots",
    "k": "catalog",
    "r": "replicas",
}


_R = f"'{SCHEDULE_REVISION_KEY}'"
_F = f"'{SCHEDULE_FLOOR_KEY}'"
_ONE = "(SELECT 1 AS one) d"

_LOG_ALL = f"""
    SELECT {_LOG_COLS} FROM {{g}}
    ORDER BY revision DESC, name LIMIT :limit"""
_LOG_ENTRY = f"""
    SELECT {_LOG_COLS} FROM {{g}} WHERE name = :name
    ORDER BY revision DESC LIMIT :limit"""
_LOG_INSERT = f"""
    INSERT INTO {{g}} ({_LOG_COLS})
    VALUES (:revision, :name, :action, :changed_by, :why, :at_us, :changes)"""
_TOMBSTONES_DELETE = """
    DELETE FROM {t} WHERE deleted = 1 AND updated_us < :cutoff
      AND revision <= (SELECT f.value_us FROM {m} f WHERE f.key = %s)"""
_LOG_DELETE = "DELETE FROM {g} WHERE at_us < :cutoff"


def _catalogued(now: str, names: str) -> str:
    """The catalogued statement: ``names`` is the dialect's set of ``:names``."""
    return f"""
        SELECT {now}, c.entry, r.id FROM {{k}} c JOIN {{r}} r ON r.catalog = c.catalog
        WHERE {live_replica(now, "r")} AND c.entry IN ({names})
        ORDER BY c.entry, r.id"""


def _common(now: str, key: str = "key", greatest: str = "GREATEST") -> dict[str, str]:
    """The statements every dialect writes alike but for its clock (and
    MySQL's quoted ``key``, SQLite's ``max`` of two values)."""
    return {
        "log_insert": _LOG_INSERT,
        "log_all": _LOG_ALL,
        "log_entry": _LOG_ENTRY,
        "now": f"SELECT {now}",
        # the floor is read in the same statement as the rows: one snapshot
        "feed": f"""
            SELECT {now}, (SELECT f.value_us FROM {{m}} f WHERE f.{key} = {_F}), {_COLS}
            FROM {_ONE} LEFT JOIN {{t}} t ON t.revision > :after
            ORDER BY t.revision, t.name""",
        # the revision is the floor when that is higher: the prune may have
        # deleted the newest tombstone, and a cursor below the floor would make
        # every feed after it incomplete, a reload each time
        "rows": f"""
            SELECT {now}, {greatest}(
                       COALESCE((SELECT max(x.revision) FROM {{t}} x), 0),
                       COALESCE((SELECT f.value_us FROM {{m}} f WHERE f.{key} = {_F}), 0)),
                   {_COLS}
            FROM {_ONE} LEFT JOIN {{t}} t ON t.deleted = 0
            ORDER BY t.name""",
        "row": f"""
            SELECT {now}, {_COLS}
            FROM {_ONE} LEFT JOIN {{t}} t ON t.name = :name AND t.deleted = 0""",
        # max(revision) from the index, and the control version the heartbeat
        # reads: never the writers' counter row
        "versions": f"""
            SELECT {now}, (SELECT max(x.revision) FROM {{t}} x),
                   (SELECT c.value_us FROM {{m}} c WHERE c.{key} = 'controls'),
                   (SELECT f.value_us FROM {{m}} f WHERE f.{key} = '{SCHEDULE_FLOOR_KEY}')""",
        "tombstones_delete": _TOMBSTONES_DELETE.replace("f.key", f"f.{key}") % _F,
        "log_delete": _LOG_DELETE,
        "sent_count": f"""
            SELECT {now}, count(*) FROM {{s}} WHERE entry = :name AND slot_us >= :since_us""",
        "seed_revision": "SELECT COALESCE(max(revision), 0) FROM {t}",
    }


POSTGRESQL = ScheduleDialect(
    begin="BEGIN",
    bump=f"""
        INSERT INTO {{m}} AS m (key, value_us) VALUES ({_R}, 1)
        ON CONFLICT (key) DO UPDATE SET value_us = m.value_us + 1
        RETURNING {PG_NOW}, m.value_us""",
    bump_read="",
    named=f"""
        SELECT {_COLS} FROM {{t}} t
        WHERE t.name IN (SELECT jsonb_array_elements_text(CAST(:names AS jsonb)))
        FOR UPDATE""",
    upsert=f"""
        INSERT INTO {{t}} ({_INSERT_COLS}) VALUES ({_VALUES})
        ON CONFLICT (name) DO UPDATE SET {_set_all("EXCLUDED.{c}")}""",
    notify="SELECT pg_notify(:channel, '')",
    floor_raise=f"""
        INSERT INTO {{m}} AS m (key, value_us)
        SELECT {_F}, max(t.revision) FROM {{t}} t
        WHERE t.deleted = 1 AND t.updated_us < :cutoff
        HAVING max(t.revision) IS NOT NULL
        ON CONFLICT (key) DO UPDATE SET value_us = GREATEST(m.value_us, EXCLUDED.value_us)""",
    catalogued=_catalogued(PG_NOW, "SELECT jsonb_array_elements_text(CAST(:names AS jsonb))"),
    **_common(PG_NOW),
)

MYSQL = ScheduleDialect(
    begin="START TRANSACTION",
    # LAST_INSERT_ID(expr) returns expr and keeps it for this connection's
    # next LAST_INSERT_ID(): MySQL's RETURNING for one value
    bump=f"""
        INSERT INTO {{m}} (`key`, value_us) VALUES ({_R}, LAST_INSERT_ID(1))
        ON DUPLICATE KEY UPDATE value_us = LAST_INSERT_ID(value_us + 1)""",
    bump_read=f"SELECT {MY_NOW}, LAST_INSERT_ID()",
    # a locking read reads the newest committed rows whatever the caller's
    # isolation level (a REPEATABLE READ snapshot could be older)
    named=f"""
        SELECT {_COLS} FROM {{t}} t
        WHERE t.name IN (SELECT n.name COLLATE utf8mb4_bin FROM JSON_TABLE(:names, '$[*]'
            COLUMNS (name VARCHAR(255) CHARACTER SET utf8mb4 PATH '$')) n)
        FOR UPDATE""",
    upsert=f"""
        INSERT INTO {{t}} ({_INSERT_COLS}) VALUES ({_VALUES})
        ON DUPLICATE KEY UPDATE {_set_all("VALUES({c})")}""",
    notify="",
    floor_raise=f"""
        INSERT INTO {{m}} (`key`, value_us)
        SELECT {_F}, max(t.revision) FROM {{t}} t
        WHERE t.deleted = 1 AND t.updated_us < :cutoff
        HAVING max(t.revision) IS NOT NULL
        ON DUPLICATE KEY UPDATE value_us = GREATEST({{m}}.value_us, VALUES(value_us))""",
    catalogued=_catalogued(
        MY_NOW,
        """SELECT n.name COLLATE utf8mb4_bin FROM JSON_TABLE(:names, '$[*]'
            COLUMNS (name VARCHAR(255) CHARACTER SET utf8mb4 PATH '$')) n""",
    ),
    **_common(MY_NOW, key="`key`"),
)

SQLITE = ScheduleDialect(
    begin="BEGIN IMMEDIATE",
    bump=f"""
        INSERT INTO {{m}} (key, value_us) VALUES ({_R}, 1)
        ON CONFLICT (key) DO UPDATE SET value_us = value_us + 1
        RETURNING {LITE_NOW}, value_us""",
    bump_read="",
    # no row locks: BEGIN IMMEDIATE (or the caller's first write) holds the
    # database's write lock to the commit
    named=f"""
        SELECT {_COLS} FROM {{t}} t WHERE t.name IN (SELECT value FROM json_each(:names))""",
    upsert=f"""
        INSERT INTO {{t}} ({_INSERT_COLS}) VALUES ({_VALUES})
        ON CONFLICT (name) DO UPDATE SET {_set_all("excluded.{c}")}""",
    notify="",
    floor_raise=f"""
        INSERT INTO {{m}} (key, value_us)
        SELECT {_F}, max(t.revision) FROM {{t}} t
        WHERE t.deleted = 1 AND t.updated_us < :cutoff
        HAVING max(t.revision) IS NOT NULL
        ON CONFLICT (key) DO UPDATE SET value_us = max(value_us, excluded.value_us)""",
    catalogued=_catalogued(LITE_NOW, "SELECT value FROM json_each(:names)"),
    **_common(LITE_NOW, greatest="max"),
)


def schedule_dialect_for(backend: str, prefix: str) -> ScheduleDialect:
    """The statements for an SQLAlchemy backend name, with table names filled in."""
    family = {"postgresql": POSTGRESQL, "mysql": MYSQL, "sqlite": SQLITE}[family_of(backend)]
    return render(family, prefix, TABLES)
