"""Tables of the SQL store, and their version.

Instants are BIGINT microseconds since the epoch (UTC, database clock) in every
dialect: it sidesteps MySQL's session-time-zone DATETIME conversions and
SQLite's lack of a time type, and keeps comparisons plain integer comparisons.
Entry names compare byte for byte (``utf8mb4_bin`` on MySQL/MariaDB).
"""

from __future__ import annotations

from sqlalchemy import BigInteger, Column, Index, MetaData, SmallInteger, String, Table
from sqlalchemy.dialects import mysql

#: Bump when the tables change; a release refuses a newer schema than its own.
SCHEMA_VERSION = 1

#: Longest entry name a slot key can hold (InnoDB's key length bounds it).
MAX_ENTRY_NAME = 255

_Name = String(MAX_ENTRY_NAME).with_variant(
    mysql.VARCHAR(MAX_ENTRY_NAME, charset="utf8mb4", collation="utf8mb4_bin"), "mysql", "mariadb"
)


class Tables:
    """The three tables, named with the configured prefix."""

    def __init__(self, prefix: str) -> None:
        self.metadata = MetaData()
        self.meta = Table(
            f"{prefix}meta",
            self.metadata,
            Column("key", String(64), primary_key=True),
            Column("value_us", BigInteger, nullable=False),
        )
        self.entries = Table(
            f"{prefix}entries",
            self.metadata,
            Column("name", _Name, primary_key=True),
            Column("anchor_us", BigInteger, nullable=False),
            # raised by prune before it deletes rows, see Store.prune
            Column("last_slot_us", BigInteger, nullable=True),
            Column("registered_by", String(120), nullable=False),
        )
        self.slots = Table(
            f"{prefix}slots",
            self.metadata,
            Column("entry", _Name, primary_key=True),
            Column("slot_us", BigInteger, primary_key=True, autoincrement=False),
            Column("state", SmallInteger, nullable=False),  # 0 claimed, 1 sent
            Column("owner", String(120), nullable=False),
            Column("fence", BigInteger, nullable=False),
            Column("lease_until_us", BigInteger, nullable=False),
            Column("claimed_us", BigInteger, nullable=False),
            Column("sent_us", BigInteger, nullable=True),
            # MySQL has no RETURNING: a claim marks its rows with a batch id, then reads them
            Column("batch", String(32), nullable=True),
            Index(f"ix_{prefix}slots_open", "state", "lease_until_us"),
            Index(f"ix_{prefix}slots_batch", "batch"),
            # range scans by slot instant: the prune's old sent rows, and the
            # replicas that won a recent slot (work sharing, Store.recent_owners)
            Index(f"ix_{prefix}slots_slot", "slot_us"),
        )
