"""Tables of the SQL store, and their version.

Instants are BIGINT microseconds since the epoch (UTC, database clock) in every
dialect: it sidesteps MySQL's session-time-zone DATETIME conversions and
SQLite's lack of a time type, and keeps comparisons plain integer comparisons.
Entry names compare byte for byte (``utf8mb4_bin`` on MySQL/MariaDB).
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Column,
    Index,
    Integer,
    MetaData,
    SmallInteger,
    String,
    Table,
    Text,
)
from sqlalchemy.dialects import mysql

from ...widths import (
    MAX_ACTION,
    MAX_AUTHOR,
    MAX_CATALOG_ID,
    MAX_GENERATED_ID,
    MAX_HOST,
    MAX_MANAGED_BY,
    MAX_META_KEY,
    MAX_OUTCOME,
    MAX_REASON,
    MAX_REPLICA_ID,
    MAX_SCHEDULE_TEXT,
    MAX_SCHEDULE_WHY,
    MAX_TASK,
    MAX_TASK_ID,
    MAX_VERSION,
)

# the longest entry name a slot key can hold (InnoDB's key length bounds it);
# a leaf, because the stored schedules refuse longer names without a store
from ...widths import MAX_ENTRY_NAME as MAX_ENTRY_NAME

#: Bump when the tables change incompatibly; a release refuses a newer schema
#: than its own. Added tables and indexes do not bump it (``prepare`` creates
#: what is missing), so replicas of two releases can share a database while a
#: deployment rolls.
SCHEMA_VERSION = 1

_Name = String(MAX_ENTRY_NAME).with_variant(
    mysql.VARCHAR(MAX_ENTRY_NAME, charset="utf8mb4", collation="utf8mb4_bin"), "mysql", "mariadb"
)

#: a JSON text or a description: MySQL's TEXT stops at 64 KiB
_Text = Text().with_variant(mysql.MEDIUMTEXT(charset="utf8mb4"), "mysql", "mariadb")


class Tables:
    """The tables, named with the configured prefix: three for the scheduler,
    two for :class:`~celery_singlebeat.SingletonTask`, four for operating the
    fleet (replicas, the entries each replica has, pauses, run-now requests),
    two for stored schedules (the entries and their history)."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.metadata = MetaData()
        self.meta = Table(
            f"{prefix}meta",
            self.metadata,
            Column("key", String(MAX_META_KEY), primary_key=True),
            Column("value_us", BigInteger, nullable=False),
        )
        self.entries = Table(
            f"{prefix}entries",
            self.metadata,
            Column("name", _Name, primary_key=True),
            Column("anchor_us", BigInteger, nullable=False),
            # raised by prune before it deletes rows, see Store.prune
            Column("last_slot_us", BigInteger, nullable=True),
            Column("registered_by", String(MAX_REPLICA_ID), nullable=False),
        )
        self.slots = Table(
            f"{prefix}slots",
            self.metadata,
            Column("entry", _Name, primary_key=True),
            Column("slot_us", BigInteger, primary_key=True, autoincrement=False),
            Column("state", SmallInteger, nullable=False),  # 0 claimed, 1 sent
            Column("owner", String(MAX_REPLICA_ID), nullable=False),
            Column("fence", BigInteger, nullable=False),
            Column("lease_until_us", BigInteger, nullable=False),
            Column("claimed_us", BigInteger, nullable=False),
            Column("sent_us", BigInteger, nullable=True),
            # MySQL has no RETURNING: a claim marks its rows with a batch id, then reads them
            Column("batch", String(MAX_GENERATED_ID), nullable=True),
            Index(f"ix_{prefix}slots_open", "state", "lease_until_us"),
            Index(f"ix_{prefix}slots_batch", "batch"),
            # range scans by slot instant: the prune's old sent rows, and the
            # replicas that won a recent slot (Store.recent_owners; work sharing
            # reads the replica rows instead: membership.py)
            Index(f"ix_{prefix}slots_slot", "slot_us"),
        )
        # SingletonTask: one row per singleton key (see Store.acquire_lease)
        self.locks = Table(
            f"{prefix}locks",
            self.metadata,
            Column("name", _Name, primary_key=True),
            Column("token", BigInteger, nullable=False),
            Column("owner", String(MAX_REPLICA_ID), nullable=False),
            # MySQL has no RETURNING: an acquisition marks the row with its own id
            Column("grant_id", String(MAX_GENERATED_ID), nullable=False),
            Column("expires_us", BigInteger, nullable=False),  # 0 once released
            Column("acquired_us", BigInteger, nullable=False),
        )
        # SingletonTask: one row per executed slot (see Store.begin_run)
        self.runs = Table(
            f"{prefix}runs",
            self.metadata,
            Column("entry", _Name, primary_key=True),
            Column("slot_us", BigInteger, primary_key=True, autoincrement=False),
            Column("run_id", String(MAX_GENERATED_ID), nullable=False),
            Column("state", SmallInteger, nullable=False),  # 0 running, 1 finished
            Column("owner", String(MAX_REPLICA_ID), nullable=False),
            Column("task_id", String(MAX_TASK_ID), nullable=False),
            Column("expires_us", BigInteger, nullable=False),
            Column("started_us", BigInteger, nullable=False),
            Column("finished_us", BigInteger, nullable=True),
            Column("outcome", String(MAX_OUTCOME), nullable=True),
            # starts of this slot: more than one after a worker died mid-run
            Column("attempts", Integer, nullable=False),
            # deliveries dropped as duplicates, and the last one's instant
            Column("repeats", Integer, nullable=False),
            Column("last_repeat_us", BigInteger, nullable=True),
            # the running rows by expiry: the heartbeat counts, and the
            # takeover sends again, the slots whose run stalled (a worker died
            # mid-run) by a range over the few running rows, not the table
            Index(f"ix_{prefix}runs_open", "state", "expires_us"),
        )

        # -- operating the fleet (docs/operations.md) ---------------------------
        # One row per beat process, kept fresh by its sweeps (Store.heartbeat);
        # a graceful stop sets stopped_us, a killed replica just stops being seen.
        self.replicas = Table(
            f"{prefix}replicas",
            self.metadata,
            Column("id", String(MAX_REPLICA_ID), primary_key=True),
            Column("host", String(MAX_HOST), nullable=False),
            Column("pid", Integer, nullable=False),
            Column("version", String(MAX_VERSION), nullable=False),
            Column("started_us", BigInteger, nullable=False),
            # database clock of the last heartbeat: its last successful round trip
            # that the row records (at most one sweep old while it runs)
            Column("seen_us", BigInteger, nullable=False),
            # the replica's estimate of the database clock at its last loop
            Column("loop_us", BigInteger, nullable=False),
            Column("offset_us", BigInteger, nullable=False),
            Column("tracked", Integer, nullable=False),
            Column("proposes_first", Integer, nullable=False),
            # how often it heartbeats: a reader calls it gone after a few misses
            Column("heartbeat_us", BigInteger, nullable=False),
            Column("stopped_us", BigInteger, nullable=True),
            # the id of the catalog it published (a digest of its entries)
            Column("catalog", String(MAX_CATALOG_ID), nullable=True),
            # slots it had sent that a failover lost, written again (failover.py)
            Column("lost_writes", Integer, nullable=False, default=0),
        )
        # The entries each replica has, with what an operator needs to read them
        # (Store.publish_catalog): a control for a name no live replica has is
        # refused, and a run-now is taken only by a replica that can send it.
        #
        # Stored by content: a catalog's id is a digest of its entries, and the
        # replicas that run the same beat_schedule (every pod of one release)
        # share one copy. N replicas of E entries keep E rows, not N x E: a pod
        # that starts writes nothing when its catalog is there, and status reads
        # E rows whatever the fleet's size. The header row is written with every
        # publish; prune removes a catalog only when no replica row names it
        # and its header is older than the retention (a publish in flight has
        # refreshed it).
        self.catalogs = Table(
            f"{prefix}catalogs",
            self.metadata,
            Column("id", String(MAX_CATALOG_ID), primary_key=True),
            Column("entries", Integer, nullable=False),
            Column("published_us", BigInteger, nullable=False),
        )
        self.catalog = Table(
            f"{prefix}catalog",
            self.metadata,
            # entry first: status groups by entry along the primary key
            Column("entry", _Name, primary_key=True),
            Column("catalog", String(MAX_CATALOG_ID), primary_key=True),
            Column("task", String(MAX_TASK), nullable=False),
            # human text ("every 10s", "crontab(*/5 * * * *) Europe/Paris")
            Column("schedule", String(MAX_SCHEDULE_TEXT), nullable=False),
            # the schedule's catalog form, JSON a reader rebuilds the slot
            # sequence from (timeline.catalog_form.spec_of writes it)
            Column("spec", Text, nullable=False),
            Index(f"ix_{prefix}catalog_catalog", "catalog"),
        )
        # Paused entries; entry "*" pauses all. Claims and takeovers skip a slot
        # of a paused entry while until_us is NULL or in the future.
        self.pauses = Table(
            f"{prefix}pauses",
            self.metadata,
            Column("entry", _Name, primary_key=True),
            Column("until_us", BigInteger, nullable=True),
            Column("paused_by", String(MAX_AUTHOR), nullable=False),
            Column("reason", String(MAX_REASON), nullable=False),
            Column("at_us", BigInteger, nullable=False),
        )
        # Run-now requests: each is also an abandoned slot row (fence 0) that a
        # sweep takes over and sends like any slot; this row says who asked.
        self.requests = Table(
            f"{prefix}requests",
            self.metadata,
            Column("entry", _Name, primary_key=True),
            Column("slot_us", BigInteger, primary_key=True, autoincrement=False),
            Column("requested_by", String(MAX_AUTHOR), nullable=False),
            Column("reason", String(MAX_REASON), nullable=False),
            Column("at_us", BigInteger, nullable=False),
        )

        # -- stored schedules (store/schedule_store.py) -------------------------
        # One row per stored entry; a deleted entry stays as a tombstone
        # (deleted = 1) until prune_schedules, so the feed reports the delete.
        # A replica follows the table by revision through ix_..._revision: the
        # feed is a range scan from its cursor and feed_versions reads
        # max(revision) from the index, so neither grows with the entries.
        # Revisions are handed out by the meta row 'schedule_revision', which
        # only writers lock (they commit in revision order: ScheduleStore's
        # docstring says why); readers never touch it. Not unique: a batch's
        # rows share its revision.
        self.schedules = Table(
            f"{prefix}schedules",
            self.metadata,
            Column("name", _Name, primary_key=True),
            Column("task", String(MAX_TASK), nullable=False),
            # JSON texts the store does not interpret; spec: the schedule's
            # data form (schedules.kinds.schedule_to_data writes it)
            Column("spec", _Text, nullable=False),
            Column("args", _Text, nullable=False),
            Column("kwargs", _Text, nullable=False),
            Column("options", _Text, nullable=False),
            Column("enabled", SmallInteger, nullable=False),  # 0 or 1
            Column("start_us", BigInteger, nullable=True),
            Column("end_us", BigInteger, nullable=True),
            Column("max_runs", BigInteger, nullable=True),
            Column("policy", _Text, nullable=True),
            Column("jitter_us", BigInteger, nullable=False),
            Column("description", _Text, nullable=False),
            Column("managed_by", String(MAX_MANAGED_BY), nullable=True),
            Column("revision", BigInteger, nullable=False),
            Column("created_us", BigInteger, nullable=False),
            Column("updated_us", BigInteger, nullable=False),
            Column("created_by", String(MAX_AUTHOR), nullable=False),
            Column("updated_by", String(MAX_AUTHOR), nullable=False),
            Column("deleted", SmallInteger, nullable=False),  # 1: a tombstone
            Index(f"ix_{prefix}schedules_revision", "revision"),
        )
        # One row per changed entry per revision: who, when (database clock),
        # why, and the field-by-field diff (JSON; args and kwargs as digests).
        self.schedule_log = Table(
            f"{prefix}schedule_log",
            self.metadata,
            Column("revision", BigInteger, primary_key=True, autoincrement=False),
            Column("name", _Name, primary_key=True),
            Column("action", String(MAX_ACTION), nullable=False),  # created, changed, deleted
            Column("changed_by", String(MAX_AUTHOR), nullable=False),
            Column("why", String(MAX_SCHEDULE_WHY), nullable=False),
            Column("at_us", BigInteger, nullable=False),
            Column("changes", _Text, nullable=False),
            # one entry's history, newest first
            Index(f"ix_{prefix}schedule_log_name", "name", "revision"),
            # the prune's range of old rows
            Index(f"ix_{prefix}schedule_log_at", "at_us"),
        )
