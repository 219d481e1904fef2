"""What every statements module of the SQL store shares: the database's clock
in each family's SQL, the rule of liveness, and how a family's statements get
their table names.

Each part of the store keeps its statements in a module beside it
(``slot_statements.py`` beside ``slots.py``, and so on): a frozen dataclass of
statement texts per database family (PostgreSQL, MySQL/MariaDB, SQLite), whose
``{x}`` placeholders name tables. Each module says which letter is which table
(its ``TABLES``), and :func:`render` fills them in for a table prefix.

Sets of slots or names travel as one JSON parameter (``[[entry, slot_us,
fence], ...]``, ``["name", ...]``) expanded by the database
(``jsonb_to_recordset``, ``JSON_TABLE``, ``json_each``): the statement text
stays constant whatever the batch size, so one tick is one statement, and no
driver parameter limit applies.

The clock expressions below are the database's clock in microseconds; a
statement reads it once where it can, so that every comparison inside a
statement uses the same instant.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import fields, replace
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

#: the database's clock in µs: PostgreSQL, MySQL/MariaDB, SQLite
PG_NOW = "(CAST(EXTRACT(EPOCH FROM clock_timestamp()) * 1000000 AS BIGINT))"
MY_NOW = "(TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)))"
LITE_NOW = "(CAST((julianday('now') - 2440587.5) * 86400000000 AS INTEGER))"

#: the control version and whether every entry is paused, read once per statement
CONTROLS = "(SELECT value_us FROM {m} WHERE key = 'controls')"
#: ... on MySQL/MariaDB, where ``key`` is a reserved word
MY_CONTROLS = "(SELECT value_us FROM {m} WHERE `key` = 'controls')"

#: SQLAlchemy backend names -> the family whose statements they run
_FAMILIES = {"postgresql": "postgresql", "mysql": "mysql", "mariadb": "mysql", "sqlite": "sqlite"}

#: a frozen dataclass of statement texts
D = TypeVar("D", bound="DataclassInstance")


def live_replica(now: str, alias: str = "r") -> str:
    """:func:`celery_singlebeat.timeline.membership.replica_live` in SQL: the replicas
    table's row ``alias`` is live at ``now`` (an SQL expression of the
    database's clock). Binds ``:beats`` and ``:slack_us``, which the store sets
    to ``LIVE_HEARTBEATS`` and ``LIVE_SLACK_US``: every statement that judges
    liveness (the heartbeat, the operator's reads and controls, the stored
    schedules' catalogued names) uses it."""
    return (
        f"{alias}.stopped_us IS NULL"
        f" AND {alias}.seen_us >= {now} - :beats * {alias}.heartbeat_us - :slack_us"
    )


def family_of(backend: str) -> str:
    """The family (``postgresql``, ``mysql``, ``sqlite``) of an SQLAlchemy
    backend name: MariaDB runs MySQL's statements."""
    return _FAMILIES[backend]


def render(
    dialect: D,
    prefix: str,
    tables: Mapping[str, str],
    *,
    now: str | None = None,
    keep: Collection[str] = (),
) -> D:
    """``dialect`` (a frozen dataclass of statement texts) with every ``{x}``
    placeholder of its texts replaced by ``prefix`` + the table ``tables``
    names for ``x``; with ``now``, each ``{now}`` by that clock expression
    first. Fields that are not texts, and those named in ``keep``, stay as
    they are."""
    names = {key: f"{prefix}{table}" for key, table in tables.items()}
    values: dict[str, Any] = {}
    for item in fields(dialect):
        value = getattr(dialect, item.name)
        if isinstance(value, str) and item.name not in keep:
            if now is not None:
                value = value.replace("{now}", now)
            value = value.format(**names)
        values[item.name] = value
    return replace(dialect, **values)
