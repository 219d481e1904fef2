"""The app's settings: Celery's, read from Django's settings module.

A Django project configures Celery with
``app.config_from_object("django.conf:settings", namespace="CELERY")``, so
``CELERY_SINGLEBEAT_URL`` is what the replicas read as ``singlebeat_url``.
The admin and the management commands run without that Celery app; they read
the same keys here, through :func:`celery_conf`, so that every process of the
project agrees on the database and the table prefix. Unset,
``singlebeat_url`` is ``django://default``: the database of Django's
``default`` alias (``database.default_url``).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from typing import Any

from django.conf import settings

#: Celery's namespace for its settings in a Django settings module
NAMESPACE = "CELERY_"


class DjangoCeleryConf(Mapping[str, Any]):
    """Django's settings seen as a Celery app's ``conf``: ``singlebeat_url``
    is ``CELERY_SINGLEBEAT_URL``, ``timezone`` is ``CELERY_TIMEZONE`` (else
    Django's ``TIME_ZONE``), ``beat_schedule`` is ``CELERY_BEAT_SCHEDULE``."""

    def _key(self, name: str) -> str:
        return NAMESPACE + name.upper()

    def __getitem__(self, name: str) -> Any:
        key = self._key(name)
        if hasattr(settings, key):
            return getattr(settings, key)
        if name == "timezone" and getattr(settings, "TIME_ZONE", None):
            return settings.TIME_ZONE
        if name == "singlebeat_url":
            from .database import SCHEME

            return SCHEME + "default"
        raise KeyError(name)

    def __iter__(self) -> Iterator[str]:
        for key in dir(settings):
            if key.startswith(NAMESPACE):
                yield key[len(NAMESPACE) :].lower()

    def __len__(self) -> int:
        return sum(1 for _ in self)


def celery_conf() -> DjangoCeleryConf:
    """The project's Celery settings, as the replicas read them."""
    return DjangoCeleryConf()


def beat_schedule() -> dict[str, Any]:
    """``CELERY_BEAT_SCHEDULE``, Celery's own setting (not one of
    celery-singlebeat's definitions): the entries whose names a stored
    schedule may not take."""
    return dict(getattr(settings, NAMESPACE + "BEAT_SCHEDULE", None) or {})


def table_prefix() -> str:
    """``CELERY_SINGLEBEAT_TABLE_PREFIX``, the prefix of every table the models map."""
    from ...config import read_setting

    return str(read_setting(celery_conf(), "singlebeat_table_prefix"))


#: a word that may be a setting's name in a configuration error's message
_WORD = re.compile(r"\b[a-z][a-z0-9_]*\b")

#: Celery's own settings the configuration's messages name beside ours
_CELERY_SETTINGS = frozenset({"beat_max_loop_interval", "beat_schedule"})


def django_setting(name: str) -> str:
    """The Django setting a Celery setting is read from: ``singlebeat_lease``
    is ``CELERY_SINGLEBEAT_LEASE``."""
    return NAMESPACE + name.upper()


def in_django_terms(message: str) -> str:
    """A configuration error's message naming the Django settings the user
    wrote: ``singlebeat_lease=0s: ...`` becomes ``CELERY_SINGLEBEAT_LEASE=0s:
    ...``. Only the names of settings are rewritten, never other words."""
    from ...config import SETTINGS_BY_NAME

    known = _CELERY_SETTINGS | set(SETTINGS_BY_NAME)
    return _WORD.sub(
        lambda m: django_setting(m.group(0)) if m.group(0) in known else m.group(0), message
    )


def celery_app() -> Any:
    """A Celery app configured from Django's settings as a project's own is
    (``config_from_object("django.conf:settings", namespace="CELERY")``), for
    the management commands that run the CLI's click commands, which read an
    app's ``conf``, ``timezone`` and ``beat_schedule``. It is not made the
    current app, and loads no fixup: a command must not change the process's
    Celery."""
    from celery import Celery

    app = Celery("django", set_as_current=False, fixups=[])
    app.config_from_object("django.conf:settings", namespace=NAMESPACE.rstrip("_"))
    return app
