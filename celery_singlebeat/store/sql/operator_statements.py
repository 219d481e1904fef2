"""The SQL of the operator's reads and controls (``operator.py``), per dialect.

Kept apart from the replicas' statements (``slot_statements.py``,
``fleet_statements.py``) and SingletonTask's (``lease_statements.py``): these
run from an operator's command, never in a tick. Table names: ``{e}``
entries, ``{s}`` slots, ``{m}`` meta, ``{r}`` replicas, ``{c}`` catalog rows,
``{h}`` catalog headers, ``{p}`` pauses, ``{q}`` requests, ``{d}`` schedules,
``{l}`` locks.

Every operation reads the database's clock once (``now``) and binds it as
``:now_us`` into each of its statements, so that all of them judge liveness,
expiry and "now" by one instant, and a test can pass the instant it wants.
A set of names travels as one JSON parameter (``:names``), as in the
replicas' statements.
"""

from __future__ import annotations

from dataclasses import dataclass

from .dialect import LITE_NOW, MY_NOW, PG_NOW, family_of, live_replica, render

#: a replica row ``r`` is live at the operation's instant (membership.py)
_LIVE = live_replica(":now_us")

# The state of an entry's newest slot row, as a code (operator.py names it):
# 0 claimed, 1 sent, 2 abandoned (its lease ran out unsent), 3 requested (a
# run-now no replica took yet, fence 0).
_LAST_STATE = """CASE WHEN ls.state IS NULL THEN NULL WHEN ls.state = 1 THEN 1
                WHEN ls.fence = 0 THEN 3 WHEN ls.lease_until_us < :now_us THEN 2 ELSE 0 END"""

# One row per registered entry: name, anchor, high-water mark, newest slot
# row, its state, newest sent slot, its sender and delay, how many live replicas
# list the entry, and the task, schedule and spec of one catalog row: a live
# replica's (the greatest catalog id, should live replicas differ: a rolling
# deploy), else any catalog's (the greatest id).
#
# Driven by the entries and found by primary-key seeks, per entry: its newest
# slot row, its newest sent row only when the newest is not sent (the usual
# case needs none), and its row in each live catalog. So the cost grows with
# the entries alone, not with the slot rows kept (an every-10 s entry keeps
# 8,640 a day) nor with the catalogs of old releases, and no planner hashes,
# sorts or spills anything. Catalogs are shared by content (schema.py): the
# caller, which read the replica rows first, gives the live catalogs and how
# many live replicas name each (``status_entries``): a handful of ids, bound
# as parameters, and its own integers. SQLite and MariaDB read it this way
# (SQLite at 100,000 entries: 0.4-0.6 s against 0.7-1.0 s grouped; MariaDB
# about the same either way, 1.1-1.3 s); PostgreSQL reads it grouped, below.
_NEWEST = "(SELECT max(x.slot_us) FROM {s} x WHERE x.entry = e.name)"
_NEWEST_SENT = "(SELECT max(y.slot_us) FROM {s} y WHERE y.entry = e.name AND y.state = 1)"
LIVE_COUNT = "__LIVE_COUNT__"
CATALOG_JOINS = "__CATALOG_JOINS__"
LIVE_TASK, LIVE_SCHEDULE, LIVE_SPEC = "__LIVE_TASK__", "__LIVE_SCHEDULE__", "__LIVE_SPEC__"


def _any_catalog(column: str) -> str:
    return (
        f"(SELECT a.{column} FROM {{c}} a WHERE a.entry = e.name ORDER BY a.catalog DESC LIMIT 1)"
    )


_STATUS_ENTRIES = f"""
    SELECT e.name, e.anchor_us, e.last_slot_us, ls.slot_us, {_LAST_STATE},
           CASE WHEN ls.state = 1 THEN ls.slot_us ELSE ss.slot_us END,
           CASE WHEN ls.state = 1 THEN ls.owner ELSE ss.owner END,
           CASE WHEN ls.state = 1 THEN ls.sent_us - ls.slot_us ELSE ss.sent_us - ss.slot_us END,
           {LIVE_COUNT},
           COALESCE({LIVE_TASK}{_any_catalog("task")}),
           COALESCE({LIVE_SCHEDULE}{_any_catalog("schedule")}),
           COALESCE({LIVE_SPEC}{_any_catalog("spec")})
    FROM {{e}} e
    LEFT JOIN {{s}} ls ON ls.entry = e.name AND ls.slot_us = {_NEWEST}
    LEFT JOIN {{s}} ss ON ls.state <> 1 AND ss.entry = e.name AND ss.slot_us = {_NEWEST_SENT}
    {CATALOG_JOINS}"""

# PostgreSQL reads the same rows faster grouped than by seeks (its per-row
# subplans cost more than one merge of sorted parts): at 100,000 entries
# 0.45-0.53 s for this form against 1.47-1.54 s for the seek form above. Each
# part is grouped on indexed columns and comes out in entry order, which the
# planner merges without hashing; the catalog's text is then read by primary
# key, once per entry. Its cost grows with the slot rows kept as well as with
# the entries (docs/cli.md, "How long it takes"). WEIGHT and LIVE_CATALOG take
# the live catalogs (``status_entries``).
WEIGHT = "__LIVE_WEIGHT__"
LIVE_CATALOG = "__LIVE_CATALOG__"
_PG_STATUS_ENTRIES = f"""
    WITH cat AS (
        SELECT c.entry, sum({WEIGHT}) AS live_replicas,
               COALESCE(max(CASE WHEN {LIVE_CATALOG} THEN c.catalog ELSE NULL END),
                        max(c.catalog)) AS rep
        FROM {{c}} c GROUP BY c.entry
    ),
    newest AS (
        SELECT s.entry, max(s.slot_us) AS last_us,
               max(CASE WHEN s.state = 1 THEN s.slot_us ELSE NULL END) AS sent_us
        FROM {{s}} s GROUP BY s.entry
    )
    SELECT e.name, e.anchor_us, e.last_slot_us, newest.last_us, {_LAST_STATE},
           ss.slot_us, ss.owner, ss.sent_us - ss.slot_us,
           COALESCE(cat.live_replicas, 0), rc.task, rc.schedule, rc.spec
    FROM {{e}} e
    LEFT JOIN cat ON cat.entry = e.name
    LEFT JOIN {{c}} rc ON rc.entry = e.name AND rc.catalog = cat.rep
    LEFT JOIN newest ON newest.entry = e.name
    LEFT JOIN {{s}} ls ON ls.entry = e.name AND ls.slot_us = newest.last_us
    LEFT JOIN {{s}} ss ON ss.entry = e.name AND ss.slot_us = newest.sent_us"""

#: one live catalog's join (``__N__``: its number, ``:catN`` its id)
_STATUS_CATALOG_JOIN = """
    LEFT JOIN {c} c__N__ ON c__N__.entry = e.name AND c__N__.catalog = :cat__N__"""


def status_entries(dialect: OperatorDialect, live: dict[str, int]) -> tuple[str, dict[str, str]]:
    """The status statement for this fleet and its parameters: ``live`` maps
    each catalog a live replica names to how many do."""
    order = sorted(live, reverse=True)  # the greatest id's row first
    params = {f"cat{i}": catalog for i, catalog in enumerate(order)}
    joins = "".join(dialect.status_catalog_join.replace("__N__", str(i)) for i in range(len(order)))
    count = " + ".join(
        f"CASE WHEN c{i}.entry IS NULL THEN 0 ELSE {live[catalog]} END"
        for i, catalog in enumerate(order)
    )

    def first(column: str) -> str:
        # SQLite's COALESCE takes two arguments at least
        return "".join(f"c{i}.{column}, " for i in range(len(order))) or "NULL, "

    whens = " ".join(f"WHEN :cat{i} THEN {live[catalog]}" for i, catalog in enumerate(order))
    weight = f"CASE c.catalog {whens} ELSE 0 END" if order else "0"
    in_live = "c.catalog IN (" + ", ".join(f":{key}" for key in params) + ")" if order else "1 = 0"
    statement = (
        dialect.status_entries.replace(WEIGHT, weight)
        .replace(LIVE_CATALOG, in_live)
        .replace(LIVE_COUNT, count or "0")
        .replace(CATALOG_JOINS, joins)
        .replace(LIVE_TASK, first("task"))
        .replace(LIVE_SCHEDULE, first("schedule"))
        .replace(LIVE_SPEC, first("spec"))
    )
    return statement, params


_REPLICAS = """
    SELECT r.id, r.host, r.pid, r.version, r.started_us, r.seen_us, r.loop_us,
           r.offset_us, r.tracked, r.proposes_first, r.heartbeat_us, r.stopped_us, r.catalog,
           r.lost_writes
    FROM {r} r ORDER BY r.id"""

_PAUSES = """
    SELECT p.entry, p.until_us, p.paused_by, p.reason, p.at_us
    FROM {p} p WHERE p.until_us IS NULL OR p.until_us > :now_us
    ORDER BY p.entry"""

_HISTORY_COLUMNS = """
    SELECT s.entry, s.slot_us, s.state, s.owner, s.fence, s.lease_until_us, s.claimed_us,
           s.sent_us, q.requested_by, q.reason, q.at_us
    FROM {s} s LEFT JOIN {q} q ON q.entry = s.entry AND q.slot_us = s.slot_us"""

# Newest first: the entry's primary key range, or the slot_us index.
_HISTORY = (
    _HISTORY_COLUMNS
    + """
    WHERE s.slot_us >= :since_us
    ORDER BY s.slot_us DESC, s.entry DESC LIMIT :limit"""
)
_HISTORY_ENTRY = (
    _HISTORY_COLUMNS
    + """
    WHERE s.entry = :entry AND s.slot_us >= :since_us
    ORDER BY s.slot_us DESC LIMIT :limit"""
)

_LIVE_NAMES = f"""
    SELECT DISTINCT c.entry FROM {{c}} c JOIN {{r}} r ON r.catalog = c.catalog WHERE {_LIVE}"""

_LEASES = """
    SELECT l.name, l.owner, l.token, l.expires_us, l.acquired_us FROM {l} l ORDER BY l.name"""

_LEASE_ROW = """
    SELECT l.name, l.owner, l.token, l.expires_us, l.acquired_us FROM {l} l WHERE l.name = :key"""

# Whatever the token: the operator overrides the holder. Only a held lease is
# touched, so the answer says whether there was one to release.
_LEASE_RELEASE = """
    UPDATE {l} SET expires_us = 0 WHERE name = :key AND expires_us >= :now_us"""

_LEASE_NAMES = "SELECT l.name FROM {l} l"

_PAUSE_ROWS = """
    SELECT p.entry, p.until_us, p.paused_by, p.reason, p.at_us FROM {p} p"""

_RESUME_ALL = "DELETE FROM {p}"

_NEAR_SLOTS = """
    SELECT s.slot_us FROM {s} s
    WHERE s.entry = :entry AND s.slot_us >= :now_us AND s.slot_us < :now_us + :span"""

# A run-now request is an abandoned claim nobody held (fence 0, lease over):
# a sweep takes it over like any abandoned slot (Store.take_over).
_INSERT_REQUEST_SLOT = """
    INSERT INTO {s} (entry, slot_us, state, owner, fence, lease_until_us, claimed_us,
                     sent_us, batch)
    VALUES (:entry, :slot_us, 0, '', 0, 0, :now_us, NULL, NULL)"""

_INSERT_REQUEST = """
    INSERT INTO {q} (entry, slot_us, requested_by, reason, at_us)
    VALUES (:entry, :slot_us, :by, :reason, :now_us)"""

_CONTROLS_READ = "SELECT m.value_us FROM {m} m WHERE m.key = 'controls'"


@dataclass(frozen=True)
class OperatorDialect:
    """Statement texts of the fleet operations for one database family."""

    #: the database's clock, in µs
    now: str
    #: opens a transaction on an autocommit connection; SQLite takes the write
    #: lock at once (IMMEDIATE), so a control never fails to upgrade a read lock
    begin: str
    #: binds ``:now_us``; its markers take the live catalogs (status_entries)
    status_entries: str
    status_catalog_join: str
    replicas: str
    pauses: str
    history: str
    history_entry: str
    #: which of ``:names`` the catalog of a live replica lists, or the stored
    #: schedules have (every replica that follows them has them)
    live_known: str
    #: every entry the catalog of a live replica lists (for close matches)
    live_names: str
    #: the pause rows of ``:names`` (expired ones too) and of "*"
    pause_rows: str
    #: every pause row, expired ones too
    all_pauses: str
    pause_upsert: str
    resume: str
    resume_all: str
    near_slots: str
    insert_request_slot: str
    insert_request: str
    #: raises the control version by one, creating the row when missing
    controls_bump: str
    controls_read: str
    #: PostgreSQL: wakes the replicas that LISTEN (delivered at commit); "" elsewhere
    notify: str
    leases: str
    lease_row: str
    lease_release: str
    lease_names: str


#: the tables the placeholders of these statements name
TABLES = {
    "e": "entries",
    "s": "slots",
    "m": "meta",
    "r": "replicas",
    "c": "catalog",
    "h": "catalogs",
    "p": "pauses",
    "q": "requests",
    "d": "schedules",
    "l": "locks",
}


_COMMON = {
    "status_entries": _STATUS_ENTRIES,
    "status_catalog_join": _STATUS_CATALOG_JOIN,
    "replicas": _REPLICAS,
    "pauses": _PAUSES,
    "history": _HISTORY,
    "history_entry": _HISTORY_ENTRY,
    "live_names": _LIVE_NAMES,
    "all_pauses": _PAUSE_ROWS + " ORDER BY p.entry",
    "resume_all": _RESUME_ALL,
    "near_slots": _NEAR_SLOTS,
    "insert_request_slot": _INSERT_REQUEST_SLOT,
    "insert_request": _INSERT_REQUEST,
    "controls_read": _CONTROLS_READ,
    "leases": _LEASES,
    "lease_row": _LEASE_ROW,
    "lease_release": _LEASE_RELEASE,
    "lease_names": _LEASE_NAMES,
}

_PG_NAMES = "jsonb_array_elements_text(CAST(:names AS jsonb)) AS n(name)"

POSTGRESQL = OperatorDialect(
    now=f"SELECT {PG_NOW}",
    begin="BEGIN",
    live_known=f"""
        SELECT DISTINCT c.entry FROM {{c}} c
        JOIN {_PG_NAMES} ON n.name = c.entry
        JOIN {{r}} r ON r.catalog = c.catalog
        WHERE {_LIVE}
        UNION
        SELECT d.name FROM {{d}} d JOIN {_PG_NAMES} ON n.name = d.name WHERE d.deleted = 0""",
    pause_rows=f"""{_PAUSE_ROWS}
        WHERE p.entry = '*' OR p.entry IN (SELECT n.name FROM {_PG_NAMES})""",
    pause_upsert="""
        INSERT INTO {p} (entry, until_us, paused_by, reason, at_us)
        VALUES (:entry, :until_us, :by, :reason, :now_us)
        ON CONFLICT (entry) DO UPDATE SET until_us = EXCLUDED.until_us,
            paused_by = EXCLUDED.paused_by, reason = EXCLUDED.reason, at_us = EXCLUDED.at_us""",
    resume=f"""
        DELETE FROM {{p}} WHERE entry IN (SELECT n.name FROM {_PG_NAMES})""",
    controls_bump="""
        INSERT INTO {m} AS m (key, value_us) VALUES ('controls', 1)
        ON CONFLICT (key) DO UPDATE SET value_us = m.value_us + 1""",
    notify="SELECT pg_notify(:channel, '')",
    **{**_COMMON, "status_entries": _PG_STATUS_ENTRIES},
)

_MY_NAMES = """JSON_TABLE(:names, '$[*]' COLUMNS (
                name VARCHAR(255) CHARACTER SET utf8mb4 PATH '$')) n"""

MYSQL = OperatorDialect(
    now=f"SELECT {MY_NOW}",
    begin="START TRANSACTION",
    live_known=f"""
        SELECT DISTINCT c.entry FROM {{c}} c
        JOIN {_MY_NAMES} ON n.name COLLATE utf8mb4_bin = c.entry
        JOIN {{r}} r ON r.catalog = c.catalog
        WHERE {_LIVE}
        UNION
        SELECT d.name FROM {{d}} d JOIN {_MY_NAMES} ON n.name COLLATE utf8mb4_bin = d.name
        WHERE d.deleted = 0""",
    pause_rows=f"""{_PAUSE_ROWS}
        WHERE p.entry = '*' OR p.entry IN (
            SELECT n.name COLLATE utf8mb4_bin FROM {_MY_NAMES})""",
    pause_upsert="""
        INSERT INTO {p} (entry, until_us, paused_by, reason, at_us)
        VALUES (:entry, :until_us, :by, :reason, :now_us)
        ON DUPLICATE KEY UPDATE until_us = VALUES(until_us), paused_by = VALUES(paused_by),
            reason = VALUES(reason), at_us = VALUES(at_us)""",
    resume=f"""
        DELETE FROM {{p}} WHERE entry IN (SELECT n.name COLLATE utf8mb4_bin FROM {_MY_NAMES})""",
    controls_bump="""
        INSERT INTO {m} (`key`, value_us) VALUES ('controls', 1)
        ON DUPLICATE KEY UPDATE value_us = value_us + 1""",
    notify="",
    **{
        **_COMMON,
        "controls_read": "SELECT m.value_us FROM {m} m WHERE m.`key` = 'controls'",
    },
)

SQLITE = OperatorDialect(
    now=f"SELECT {LITE_NOW}",
    begin="BEGIN IMMEDIATE",
    live_known=f"""
        SELECT DISTINCT c.entry FROM {{c}} c
        JOIN json_each(:names) n ON n.value = c.entry
        JOIN {{r}} r ON r.catalog = c.catalog
        WHERE {_LIVE}
        UNION
        SELECT d.name FROM {{d}} d JOIN json_each(:names) n ON n.value = d.name
        WHERE d.deleted = 0""",
    pause_rows=f"""{_PAUSE_ROWS}
        WHERE p.entry = '*' OR p.entry IN (SELECT n.value FROM json_each(:names) n)""",
    pause_upsert="""
        INSERT INTO {p} (entry, until_us, paused_by, reason, at_us)
        VALUES (:entry, :until_us, :by, :reason, :now_us)
        ON CONFLICT (entry) DO UPDATE SET until_us = excluded.until_us,
            paused_by = excluded.paused_by, reason = excluded.reason, at_us = excluded.at_us""",
    resume="""
        DELETE FROM {p} WHERE entry IN (SELECT n.value FROM json_each(:names) n)""",
    controls_bump="""
        INSERT INTO {m} (key, value_us) VALUES ('controls', 1)
        ON CONFLICT (key) DO UPDATE SET value_us = value_us + 1""",
    notify="",
    **_COMMON,
)


def operator_dialect_for(backend: str, prefix: str) -> OperatorDialect:
    """The fleet statements for an SQLAlchemy backend name, with table names filled in."""
    family = {"postgresql": POSTGRESQL, "mysql": MYSQL, "sqlite": SQLITE}[family_of(backend)]
    return render(family, prefix, TABLES, keep=("now",))
