"""Tables of the SQL store, and their version.

Instants are BIGINT microseconds since the epoch (UTC, database clock) in every
dialect: it sidesteps MySQL's session-time-zone DATETIME conversions and
SQLite's lack of a time type, and keeps comparisons plain integer comparisons.
Entry names compare byte for byte (``utf8mb4_bin`` on MySQL/MariaDB).
"""

from __future__ import annotations

from sqlalchemy import BigInteger, Column, Index, Integer, MetaData, SmallInteger, String, Table
from sqlalchemy.dialects import mysql

#: Bump when the tables change incompatibly; a release refuses a newer schema
#: than its own. Added tables and indexes do not bump it (``prepare`` creates
#: what is missing), so replicas of two releases can share a database while a
#: deployment rolls.
SCHEMA_VERSION = 1

#: Longest entry name a slot key can hold (InnoDB's key length bounds it).
MAX_ENTRY_NAME = 255

_Name = String(MAX_ENTRY_NAME).with_variant(
    mysql.VARCHAR(MAX_ENTRY_NAME, charset="utf8mb4", collation="utf8mb4_bin"), "mysql", "mariadb"
)


class Tables:
    """The tables, named with the configured prefix: three for the scheduler,
    two for :class:`~celery_singlebeat.SingletonTask`."""

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
        # SingletonTask: one row per singleton key (see Store.acquire_lease)
        self.locks = Table(
            f"{prefix}locks",
            self.metadata,
            Column("name", _Name, primary_key=True),
            Column("token", BigInteger, nullable=False),
            Column("owner", String(120), nullable=False),
            # MySQL has no RETURNING: an acquisition marks the row with its own id
            Column("grant_id", String(32), nullable=False),
            Column("expires_us", BigInteger, nullable=False),  # 0 once released
            Column("acquired_us", BigInteger, nullable=False),
        )
        # SingletonTask: one row per executed slot (see Store.begin_run)
        self.runs = Table(
            f"{prefix}runs",
            self.metadata,
            Column("entry", _Name, primary_key=True),
            Column("slot_us", BigInteger, primary_key=True, autoincrement=False),
            Column("run_id", String(32), nullable=False),
            Column("state", SmallInteger, nullable=False),  # 0 running, 1 finished
            Column("owner", String(120), nullable=False),
            Column("task_id", String(255), nullable=False),
            Column("expires_us", BigInteger, nullable=False),
            Column("started_us", BigInteger, nullable=False),
            Column("finished_us", BigInteger, nullable=True),
            Column("outcome", String(32), nullable=True),
            # starts of this slot: more than one after a worker died mid-run
            Column("attempts", Integer, nullable=False),
            # deliveries dropped as duplicates, and the last one's instant
            Column("repeats", Integer, nullable=False),
            Column("last_repeat_us", BigInteger, nullable=True),
        )
