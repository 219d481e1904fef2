"""The store of the project's coordination tables, for the admin, the
commands and the migration: one per process and database alias, on
connections of its own (a read never joins a request's transaction).

The writes the admin makes *inside* a request's ``transaction.atomic()`` pass
Django's connection to the store explicitly (:func:`schedules`'s
``connection=``), which is the only way a store statement shares a Django
transaction.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

from .conf import beat_schedule, celery_conf, in_django_terms

if TYPE_CHECKING:
    from ...config import Settings
    from ...schedules.api import Schedules
    from ...store.sql import SqlStore
    from ...store.sql.operator import Operator

_lock = threading.Lock()
_stores: dict[str, SqlStore] = {}


def settings() -> Settings:
    """The project's validated settings (``CELERY_SINGLEBEAT_*``), as the
    replicas read them; a ConfigurationError names the Django setting
    (``CELERY_SINGLEBEAT_LEASE``), the one the project wrote."""
    from ...config import Settings
    from ...exceptions import ConfigurationError

    try:
        return Settings.from_conf(celery_conf())
    except ConfigurationError as exc:
        raise ConfigurationError(in_django_terms(str(exc))) from None


def store() -> SqlStore:
    """This process's store over the project's coordination database."""
    from ...store.sql import SqlStore

    found = settings()
    key = f"{found.url!r}|{found.table_prefix}"
    with _lock:
        existing = _stores.get(key)
        if existing is None:
            existing = _stores[key] = SqlStore(found.url, table_prefix=found.table_prefix)
        return existing


def operator() -> Operator:
    """The operator's reads and controls (pause, resume, run now, leases)."""
    from ...store.sql.operator import Operator

    return Operator(store())


def schedules(by: str | None = None) -> Schedules:
    """The stored-schedules API over the project's database; ``by`` names the
    editor in the history (the admin passes the user's name)."""
    from ...schedules.api import Schedules

    api = Schedules(store=store(), by=by, static_names=list(beat_schedule()))
    api.default_tz = timezone()
    return api


def timezone() -> Any:
    """The time zone crontab entries run in: Celery's (``CELERY_TIMEZONE``,
    else Django's ``TIME_ZONE``), as the replicas take it."""
    from zoneinfo import ZoneInfo

    name = celery_conf().get("timezone")
    return ZoneInfo(name) if name else None


def close_all() -> None:
    """Close every store this process opened (tests, and a command's end)."""
    with _lock:
        for each in _stores.values():
            each.close()
        _stores.clear()
