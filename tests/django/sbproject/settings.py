"""Settings of the Django suite's project (tests/django).

``SB_DJANGO_DB`` picks the database: ``sqlite`` (a file, the default),
``postgres`` or ``mysql`` (the services of tests/conftest.py; ``SB_TEST_PG``
and ``SB_TEST_MYSQL`` override their URLs). pytest-django creates a test
database of its own per xdist worker (its name ends ``_gw0``, ``_gw1``); the
beat processes and ``manage.py`` subprocesses a test starts read the same
settings with ``SB_DJANGO_NAME`` naming that database.

The test databases are named for this checkout (``RUN``): two checkouts
running the suite at once on one PostgreSQL, MariaDB or /tmp would otherwise
create, clobber and drop each other's ``test_test_gw0``.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path
from urllib.parse import urlsplit

BASE = Path(__file__).resolve().parent
SECRET_KEY = "tests-only-not-a-secret"
DEBUG = False
ALLOWED_HOSTS = ["*"]
USE_TZ = True
TIME_ZONE = "UTC"

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_celery_beat",
    "celery_singlebeat.contrib.django",
]
MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
ROOT_URLCONF = "sbproject.urls"
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]
STATIC_URL = "/static/"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"


#: this checkout's part of the test databases' names
RUN = hashlib.sha1(str(BASE).encode()).hexdigest()[:8]


def _database(kind: str) -> dict[str, object]:
    if kind == "sqlite":
        folder = Path(os.environ.get("SB_DJANGO_DIR") or tempfile.gettempdir())
        # pytest-django appends each xdist worker's name to TEST's NAME
        name = os.environ.get("SB_DJANGO_NAME") or str(folder / f"sb-django-{RUN}.sqlite")
        # a file, not Django's in-memory test database: the store and the beat
        # processes connect to it on connections of their own
        return {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": name,
            "TEST": {"NAME": name},
            "OPTIONS": {"timeout": 30},
        }
    if kind == "postgres":
        url = urlsplit(os.environ.get("SB_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test"))
        engine = "django.db.backends.postgresql"
    elif kind == "mysql":
        url = urlsplit(os.environ.get("SB_TEST_MYSQL", "mysql://root@127.0.0.1:3306/test"))
        engine = "django.db.backends.mysql"
    else:
        raise RuntimeError(f"SB_DJANGO_DB={kind!r}: use sqlite, postgres or mysql")
    given = os.environ.get("SB_DJANGO_NAME")
    name = given or (url.path.lstrip("/") or "test")
    return {
        "ENGINE": engine,
        "NAME": name,
        "TEST": {"NAME": given or f"test_sb_{RUN}"},
        "USER": url.username or "",
        "PASSWORD": url.password or "",
        "HOST": url.hostname or "127.0.0.1",
        "PORT": str(url.port or ""),
    }


if os.environ.get("SB_DJANGO_DB") == "mysql":
    try:
        import MySQLdb  # noqa: F401  (mysqlclient, Django's driver, where it built)
    except ImportError:
        # PyMySQL, which the store uses too, standing in for mysqlclient: it
        # needs no C library to build, so make test runs on a machine with
        # only Python. Django checks the version it would import.
        import pymysql

        pymysql.version_info = (2, 2, 1, "final", 0)
        pymysql.install_as_MySQLdb()

DATABASES = {"default": _database(os.environ.get("SB_DJANGO_DB", "sqlite"))}

CELERY_BROKER_URL = os.environ.get("SB_DJANGO_BROKER", "memory://")
CELERY_SINGLEBEAT_TABLE_PREFIX = os.environ.get("SB_DJANGO_PREFIX", "singlebeat_")
