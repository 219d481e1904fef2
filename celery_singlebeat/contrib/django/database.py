"""Use a Django project's database for coordination.

``app.conf.singlebeat_url = "django://default"`` (or any other alias in
``DATABASES``) makes the scheduler connect to the database Django uses, with
Django's credentials; install the ``django`` extra. The scheduler still talks to
it through SQLAlchemy: Django's ORM is not used, so no model or migration is
needed, and the tables are created like for any other URL.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy.engine import URL

from ...exceptions import ConfigurationError

#: Django ENGINE -> SQLAlchemy drivername.
_ENGINES = {
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
    db = databases[alias]
    engine = db.get("ENGINE", "")
    drivername = _ENGINES.get(engine)
    if drivername is None:
        raise ConfigurationError(
            f"singlebeat_url={SCHEME}{alias}: unsupported Django ENGINE {engine!r}; "
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
