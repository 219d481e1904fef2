"""Django system checks: the app's settings, read as the replicas will read them.

``manage.py check`` (and every command that runs the checks: ``runserver``,
``migrate``) reports a setting the replicas would refuse at start-up, so that
a typo fails the deploy's first step instead of every beat pod. Each problem
is one check message naming the Django setting to fix. No check connects to a
database: the checks run in every ``manage.py`` invocation, and a database
that is down is not a misconfiguration.

========================== ==========================================================
``celery_singlebeat.E001`` a ``CELERY_SINGLEBEAT_*`` (or ``CELERY_BEAT_MAX_LOOP_INTERVAL``)
                           value the replicas refuse
``celery_singlebeat.E002`` the coordination database is an in-memory SQLite database,
                           which no other process can share
``celery_singlebeat.E003`` the coordination database's Django ENGINE is not one the
                           store speaks (PostgreSQL, MySQL/MariaDB, SQLite)
``celery_singlebeat.W001`` a ``CELERY_SINGLEBEAT_*`` setting no release reads (a typo?)
``celery_singlebeat.W002`` a ``SINGLEBEAT_*`` setting without Celery's ``CELERY_``
                           namespace, which Celery never reads
========================== ==========================================================
"""

from __future__ import annotations

import difflib
import re
from typing import Any

from django.conf import settings as django_settings
from django.core.checks import CheckMessage, Error, Warning

from .conf import NAMESPACE, django_setting, in_django_terms
from .database import ENGINES, SCHEME

#: the tag ``manage.py check --tag celery_singlebeat`` selects
TAG = "celery_singlebeat"

#: Django ENGINEs whose databases are SQLite files (or memory)
_SQLITE = ("django.db.backends.sqlite3", "django.contrib.gis.db.backends.spatialite")


def check_settings(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """Every problem of the app's settings, each naming the setting to fix."""
    database = _coordination_database()
    # a database the store cannot use fails the settings' read too: said once
    return [*_unknown_settings(), *(database or _values())]


def _unknown_settings() -> list[CheckMessage]:
    from ...config import SETTINGS_BY_NAME

    found: list[CheckMessage] = []
    known = [django_setting(name) for name in SETTINGS_BY_NAME]
    for key in dir(django_settings):
        if key.startswith(NAMESPACE + "SINGLEBEAT_") and key not in known:
            close = difflib.get_close_matches(key, known, n=1)
            found.append(
                Warning(
                    f"{key} is not a celery-singlebeat setting; no replica reads it",
                    hint=f"did you mean {close[0]}?" if close else "see docs/configuration.md",
                    obj=key,
                    id="celery_singlebeat.W001",
                )
            )
        elif key.startswith("SINGLEBEAT_") and NAMESPACE + key in known:
            found.append(
                Warning(
                    f"{key} is never read: Celery reads its settings from Django's under "
                    f"the {NAMESPACE} namespace",
                    hint=f"rename it {NAMESPACE}{key}",
                    obj=key,
                    id="celery_singlebeat.W002",
                )
            )
    return found


def _alias() -> str | None:
    """The Django alias the coordination database is, or None (a URL of its own)."""
    from ...config import read_setting
    from .conf import celery_conf

    url = read_setting(celery_conf(), "singlebeat_url")
    if isinstance(url, str) and url.startswith(SCHEME):
        return url[len(SCHEME) :] or "default"
    return None


def _coordination_database() -> list[CheckMessage]:
    alias = _alias()
    databases: dict[str, Any] = getattr(django_settings, "DATABASES", {})
    if alias is None or alias not in databases:
        return []  # a URL, or an alias the settings' own check names (E001)
    setting = django_setting("singlebeat_url")
    where = f"{setting}={SCHEME}{alias}"
    db = databases[alias]
    engine = db.get("ENGINE", "")
    if engine not in ENGINES:
        return [
            Error(
                f"{where}: DATABASES[{alias!r}]['ENGINE'] is {engine!r}, a database "
                "celery-singlebeat cannot coordinate in",
                hint="use PostgreSQL, MySQL/MariaDB or SQLite for that alias, or set "
                f"{setting} to an SQLAlchemy URL of one",
                obj=setting,
                id="celery_singlebeat.E003",
            )
        ]
    name = str(db.get("NAME") or "")
    if engine in _SQLITE and _in_memory(name):
        return [
            Error(
                f"{where}: DATABASES[{alias!r}] is an in-memory SQLite database "
                f"(NAME {name!r}), which the beat replicas, the workers and the admin, "
                "each a process of its own, cannot share",
                hint=f"give DATABASES[{alias!r}]['NAME'] a file path, or set {setting} "
                "to a database the processes share",
                obj=setting,
                id="celery_singlebeat.E002",
            )
        ]
    return []


def _in_memory(name: str) -> bool:
    # Django's sqlite3 backend: "" and ":memory:", and a URI asking for memory
    return name in ("", ":memory:") or (name.startswith("file:") and "mode=memory" in name)


def _values() -> list[CheckMessage]:
    from ...exceptions import ConfigurationError
    from .store import settings

    try:
        settings()
    except ConfigurationError as exc:
        message = in_django_terms(str(exc))
        named = _NAMED.search(message)
        return [Error(message, obj=named.group(0) if named else None, id="celery_singlebeat.E001")]
    return []


#: the first Django setting a message names
_NAMED = re.compile(NAMESPACE + r"[A-Z0-9_]+")
