"""The widths of the store's columns, each written once.

``store/sql/schema.py`` makes each column this wide, and each check that refuses
what would not fit names the same number in its message (the entry sources,
the stored schedules, the operator's controls). A leaf that imports nothing,
so that none of them imports another, or the schema and SQLAlchemy, for a
number. Widths are in characters, but the entry name's, in UTF-8 bytes.
"""

from __future__ import annotations

#: an entry's name, in UTF-8 bytes: every ``entry`` and entry ``name`` column,
#: the slot key's first part (InnoDB's key length bounds it)
MAX_ENTRY_NAME = 255
#: a Celery task's registered name (the catalog's and the stored schedules' ``task``)
MAX_TASK = 255
#: a Celery task id (a run's ``task_id``)
MAX_TASK_ID = 255
#: the human text of a schedule in the catalog (``every 10s``, ``crontab(...)``)
MAX_SCHEDULE_TEXT = 500
#: the import file that manages a stored entry (``managed_by``)
MAX_MANAGED_BY = 255
#: a replica's or a worker's id (``singlebeat_replica_id``): the replicas' ``id``,
#: every ``owner``, the entries' ``registered_by``
MAX_REPLICA_ID = 120
#: who made a change: every ``by`` column (``paused_by``, ``requested_by``, the
#: stored schedules' ``created_by``/``updated_by``, their history's ``changed_by``)
MAX_AUTHOR = 120
#: an operator's reason for a pause or a run-now (``reason``)
MAX_REASON = 500
#: why a stored entry was changed (the schedule history's ``why``)
MAX_SCHEDULE_WHY = 1000
#: what the schedule history's row did: ``created``, ``changed`` or ``deleted``
MAX_ACTION = 16
#: a meta row's key
MAX_META_KEY = 64
#: a release's version (the replicas' ``version``)
MAX_VERSION = 64
#: a replica's host name
MAX_HOST = 255
#: a catalog's id, a digest of its entries in hex (``catalogs.id``, every ``catalog``)
MAX_CATALOG_ID = 64
#: an id made of a UUID's 32 hex digits: a claim's ``batch``, a lease's
#: ``grant_id``, a run's ``run_id``
MAX_GENERATED_ID = 32
#: how a run ended (a run's ``outcome``)
MAX_OUTCOME = 32

__all__ = [
    "MAX_ACTION",
    "MAX_AUTHOR",
    "MAX_CATALOG_ID",
    "MAX_ENTRY_NAME",
    "MAX_GENERATED_ID",
    "MAX_HOST",
    "MAX_MANAGED_BY",
    "MAX_META_KEY",
    "MAX_OUTCOME",
    "MAX_REASON",
    "MAX_REPLICA_ID",
    "MAX_SCHEDULE_TEXT",
    "MAX_SCHEDULE_WHY",
    "MAX_TASK",
    "MAX_TASK_ID",
    "MAX_VERSION",
]
