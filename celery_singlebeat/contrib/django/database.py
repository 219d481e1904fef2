"""A Django project's database as the coordination database.

``singlebeat_url = "django://default"`` (or any other alias in ``DATABASES``)
makes the scheduler connect to the database Django uses, with Django's
credentials. The scheduler still talks to it through SQLAlchemy, on
connections of its own: a replica's statements never run inside a request's
transaction, and never join one by accident.

This module is the bottom of the Django integration: the configuration reads
it (``config`` resolves a ``django://`` URL here), so it imports nothing of
the app above it, and Django only inside its functions.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy.engine import URL

from ...exceptions import ConfigurationError

#: Django ENGINE -> SQLAlchemy drivername: the ENGINEs the store speaks
#: (the system checks name any other)
ENGINES = {
    "django.db.backends.postgresql": "postgresql+psycopg",
    "django.db.backends.postgresql_psycopg2": "postgresql+psycopg",
    "django.contrib.gis.db.backends.postgis": "postgresql+psycopg",
    "django.db.backends.mysql": "mysql+pymysql",
    "django.contrib.gis.db.backends.mysql": "mysql+pymysql",
    "django.db.backends.sqlite3": "sqlite",
    "django.contrib.gis.db.backends.spatialite": "sqlite",
}

SCHEME = "django://"


def database_url(alias: str = "default") -> URL:
    """The SQLAlchemy URL of Django's ``DATABASES[alias]``."""
    try:
        from django.conf import settings
    except ImportError:
        raise ConfigurationError(
            f"singlebeat_url={SCHEME}{alias}: Django is not installed "
            "(pip install 'celery-singlebeat[django]')"
        ) from None
    try:
        databases: dict[str, Any] = settings.DATABASES
    except Exception as exc:  # ImproperlyConfigured when settings are not set up
        raise ConfigurationError(
            f"singlebeat_url={SCHEME}{alias}: Django settings are not configured ({exc}); "
            "set DJANGO_SETTINGS_MODULE before the Celery app reads its configuration"
        ) from None
    if alias not in databases:
        raise ConfigurationError(
            f"singlebeat_url={SCHEME}{alias}: no such alias in DATABASES "
            f"(have: {', '.join(sorted(databases)) or 'none'})"
        )
    return url_of(databases[alias], f"singlebeat_url={SCHEME}{alias}")


def url_of(db: dict[str, Any], where: str) -> URL:
    """The SQLAlchemy URL of one ``DATABASES`` entry (a connection's
    ``settings_dict``); ``where`` starts each error's message."""
    engine = db.get("ENGINE", "")
    drivername = ENGINES.get(engine)
    if drivername is None:
        raise ConfigurationError(
            f"{where}: unsupported Django ENGINE {engine!r}; "
            "use PostgreSQL, MySQL/MariaDB or SQLite, or set singlebeat_url to a URL"
        )
    name = str(db.get("NAME") or "")
    if drivername == "sqlite":
        return URL.create("sqlite", database=name)
    port = db.get("PORT")
    return URL.create(
        drivername,
        username=db.get("USER") or None,
        password=db.get("PASSWORD") or None,
        host=db.get("HOST") or None,
        port=int(port) if port else None,
        database=name or None,
    )


#: the app's module path, as a project lists it in INSTALLED_APPS
APP = "celery_singlebeat.contrib.django"


def default_url() -> str | None:
    """``django://default`` when the process runs a Django project that has
    this app installed, so that its replicas coordinate in the project's own
    database without a setting; None otherwise (the embedded SQLite default).

    Only a process that imported Django's settings already is asked: a plain
    Celery project never imports Django through this check.
    """
    import sys

    if "django.conf" not in sys.modules:
        return None
    from django.conf import settings

    try:
        installed = settings.INSTALLED_APPS
    except Exception:  # ImproperlyConfigured: Django imported, no settings module
        return None
    if any(app == APP or app.startswith(APP + ".") for app in installed):
        return SCHEME + "default"
    return None
