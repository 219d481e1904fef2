"""The Django integration: an app for ``INSTALLED_APPS`` and a drop-in scheduler.

``"celery_singlebeat.contrib.django"`` in ``INSTALLED_APPS`` gives a Django
project the coordination tables through ``manage.py migrate``, an admin over
the fleet and the stored schedules, and the ``singlebeat_*`` management
commands; its settings are Celery's, under Celery's Django namespace
(``CELERY_SINGLEBEAT_URL`` and so on), and the database defaults to Django's
``default`` alias. :class:`DatabaseScheduler` (``celery beat -S
django_singlebeat``) reads django-celery-beat's tables as a third entry source,
so that every replica runs beat over them. The core of the package never
imports Django; install the ``django`` extra.

Importing this package imports no Django module: ``config`` resolves a
``django://`` URL through :mod:`.database`, and :class:`DatabaseScheduler` is
imported when first named.
"""

from __future__ import annotations

from typing import Any

from .database import SCHEME, database_url

__all__ = ["SCHEME", "DatabaseScheduler", "database_url"]


def __getattr__(name: str) -> Any:
    # lazy: the scheduler imports Celery's beat and django-celery-beat's models,
    # which a process that only resolves a django:// URL never needs
    if name == "DatabaseScheduler":
        from .scheduler import DatabaseScheduler

        return DatabaseScheduler
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
