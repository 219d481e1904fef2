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

    def beat_schedule(self) -> dict[str, Any]:
        """``CELERY_BEAT_SCHEDULE``: the static entries, whose names a stored
        entry may not take."""
        return dict(getattr(settings, NAMESPACE + "BEAT_SCHEDULE", None) or {})


def celery_conf() -> DjangoCeleryConf:
    """The project's Celery settings, as the replicas read them."""
    return DjangoCeleryConf()


def table_prefix() -> str:
    """``CELERY_SINGLEBEAT_TABLE_PREFIX``, the prefix of every table the models map."""
    from ...config import read_setting

    return str(read_setting(celery_conf(), "singlebeat_table_prefix"))
