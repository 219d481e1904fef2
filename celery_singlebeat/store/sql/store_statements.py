"""The SQL store's own statements (``store.py``), per dialect: the round trip
that only reads the database's clock, and the meta rows ``prepare`` makes.

``{m}`` is the meta table.
"""

from __future__ import annotations

from dataclasses import dataclass

from .dialect import LITE_NOW, MY_NOW, PG_NOW, family_of, render


@dataclass(frozen=True)
class StoreDialect:
    """Statement texts of the store itself for one database family."""

    #: reads the database's clock, and nothing else
    ping: str
    #: inserts the meta row ``:key`` at ``:value_us`` unless it exists
    meta_insert: str


#: the tables the placeholders of these statements name
TABLES = {"m": "meta"}

POSTGRESQL = StoreDialect(
    ping=f"SELECT {PG_NOW}",
    meta_insert="""
        INSERT INTO {m} (key, value_us) VALUES (:key, :value_us)
        ON CONFLICT (key) DO NOTHING""",
)

MYSQL = StoreDialect(
    ping=f"SELECT {MY_NOW}",
    meta_insert="""
        INSERT INTO {m} (`key`, value_us) VALUES (:key, :value_us)
        ON DUPLICATE KEY UPDATE value_us = value_us""",
)

SQLITE = StoreDialect(
    ping=f"SELECT {LITE_NOW}",
    meta_insert="""
        INSERT INTO {m} (key, value_us) VALUES (:key, :value_us)
        ON CONFLICT (key) DO NOTHING""",
)


def store_dialect_for(backend: str, prefix: str) -> StoreDialect:
    """The statements for an SQLAlchemy backend name, with table names filled in."""
    family = {"postgresql": POSTGRESQL, "mysql": MYSQL, "sqlite": SQLITE}[family_of(backend)]
    return render(family, prefix, TABLES)
