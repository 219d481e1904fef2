"""Settings of the example project, read from the environment.

The same file serves ``docker-compose.yml``, ``k8s/`` and ``make example``
(``run_example.py``): each sets only environment variables, and every name this
file reads is in :data:`ENVIRONMENT` (tests/integration/test_example_deploy.py holds
the deploy files to it). A missing required variable, or a value that does not
parse, stops the process at start-up with a message naming the variable; no
message repeats a value (``DATABASE_URL`` carries a password).
"""

from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

from django.core.exceptions import ImproperlyConfigured

BASE_DIR = Path(__file__).resolve().parent.parent

#: every environment variable this file reads, and what it sets
ENVIRONMENT = {
    "DATABASE_URL": "Django's default database (and so the coordination database): "
    "postgres://USER:PASSWORD@HOST:PORT/NAME, mysql://..., or sqlite:///PATH; required",
    "DJANGO_SECRET_KEY": "Django's SECRET_KEY; required unless DJANGO_DEBUG is on",
    "DJANGO_DEBUG": "1 for Django's debug mode (never in production); default off",
    "DJANGO_ALLOWED_HOSTS": "comma-separated host names the web process answers; "
    "default localhost,127.0.0.1",
    "CELERY_BROKER_URL": "the broker; default redis://127.0.0.1:6379/0",
    "CELERY_TASK_DEFAULT_QUEUE": "the queue beat sends to and the worker reads; default celery",
    "SINGLEBEAT_REPLICA_ID": "this beat replica's name in the database and the logs; "
    "default host:pid:random (Kubernetes: the pod's name)",
    "SINGLEBEAT_HTTP_PORT": "the port of a beat replica's /livez, /readyz (and /metrics); "
    "default none",
    "SINGLEBEAT_STATUS_FILE": "the file the exec probe reads; default none",
    "SINGLEBEAT_LEASE": "seconds a claimed slot stays a replica's; default 15",
    "BEAT_MAX_LOOP_INTERVAL": "the longest beat sleeps between two looks; default 5",
    "SHOP_REFRESH_EVERY": "seconds between two runs of the refresh-prices entry; default 60",
}


def env(name: str, default: str | None = None) -> str | None:
    """The environment variable ``name`` (one of :data:`ENVIRONMENT`), else ``default``."""
    if name not in ENVIRONMENT:  # keeps ENVIRONMENT the complete list
        raise ImproperlyConfigured(f"settings.py reads {name}, which ENVIRONMENT does not list")
    value = os.environ.get(name, "").strip()
    return value or default


def env_required(name: str) -> str:
    """The environment variable ``name``; a clear stop when it is unset."""
    value = env(name)
    if value is None:
        raise ImproperlyConfigured(f"{name} is not set: {ENVIRONMENT[name]}")
    return value


def env_number(name: str, kind: type[int] | type[float]) -> Any:
    """A numeric environment variable, or None when unset."""
    value = env(name)
    if value is None:
        return None
    what = "a positive whole number" if kind is int else "a positive number"
    try:
        number = kind(value)
    except ValueError:
        raise ImproperlyConfigured(f"{name} must be {what}") from None
    if number <= 0:
        raise ImproperlyConfigured(f"{name} must be {what}")
    return number


def env_flag(name: str) -> bool:
    """An on/off environment variable (1, true, yes, on: on)."""
    return (env(name) or "").lower() in ("1", "true", "yes", "on")


_ENGINES = {
    "postgres": "django.db.backends.postgresql",
    "postgresql": "django.db.backends.postgresql",
    "mysql": "django.db.backends.mysql",
    "sqlite": "django.db.backends.sqlite3",
}


def database_from_url(url: str) -> dict[str, Any]:
    """A ``DATABASES`` entry from a ``DATABASE_URL``; query parameters become
    the driver's ``OPTIONS`` (``?sslmode=require``)."""
    parts = urlsplit(url)
    scheme = parts.scheme.split("+", 1)[0]
    if scheme not in _ENGINES:
        # the scheme only: the rest of the URL may hold a password
        raise ImproperlyConfigured(
            f"DATABASE_URL: unsupported scheme {parts.scheme!r} (use postgres://, mysql:// "
            "or sqlite:///)"
        )
    if scheme == "sqlite":
        # sqlite:///relative/path or sqlite:////absolute/path
        return {"ENGINE": _ENGINES[scheme], "NAME": parts.path[1:] or ":memory:"}
    return {
        "ENGINE": _ENGINES[scheme],
        "NAME": unquote(parts.path.lstrip("/")),
        "USER": unquote(parts.username or ""),
        "PASSWORD": unquote(parts.password or ""),
        "HOST": parts.hostname or "",
        "PORT": str(parts.port or ""),
        "OPTIONS": dict(parse_qsl(parts.query)),
        # connections kept between requests, checked before reuse
        "CONN_MAX_AGE": 60,
        "CONN_HEALTH_CHECKS": True,
    }


DEBUG = env_flag("DJANGO_DEBUG")
SECRET_KEY = env("DJANGO_SECRET_KEY") or (
    "debug-only-not-a-secret" if DEBUG else env_required("DJANGO_SECRET_KEY")
)
ALLOWED_HOSTS = [
    host.strip()
    for host in (env("DJANGO_ALLOWED_HOSTS") or "localhost,127.0.0.1").split(",")
    if host.strip()
]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    # the coordination tables (manage.py migrate), the admin over the stored
    # schedules and the fleet, the singlebeat_* management commands
    "celery_singlebeat.contrib.django",
    "shop",
]
MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]
ROOT_URLCONF = "mysite.urls"
WSGI_APPLICATION = "mysite.wsgi.application"
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
DATABASES = {"default": database_from_url(env_required("DATABASE_URL"))}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
USE_TZ = True
TIME_ZONE = "UTC"
STATIC_URL = "/static/"
STATIC_ROOT = BASE_DIR / "static"

# --- Celery (read by mysite/celery.py under the CELERY_ namespace) ----------
CELERY_BROKER_URL = env("CELERY_BROKER_URL", "redis://127.0.0.1:6379/0")
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_TASK_DEFAULT_QUEUE = env("CELERY_TASK_DEFAULT_QUEUE", "celery")
CELERY_TASK_IGNORE_RESULT = True
CELERY_TIMEZONE = TIME_ZONE

# every replica runs beat; each slot of each entry is sent once
CELERY_BEAT_SCHEDULER = "celery_singlebeat.SingleBeatScheduler"
# the coordination tables live in Django's own database (this is also the
# default when the app is installed; said here so a reader sees it)
CELERY_SINGLEBEAT_URL = "django://default"
CELERY_SINGLEBEAT_REPLICA_ID = env("SINGLEBEAT_REPLICA_ID")
# beat replicas only: /livez and /readyz for HTTP probes (workers never listen)
CELERY_SINGLEBEAT_HTTP_PORT = env_number("SINGLEBEAT_HTTP_PORT", int)
# beat replicas only: the file `python -m celery_singlebeat health` reads
CELERY_SINGLEBEAT_STATUS_FILE = env("SINGLEBEAT_STATUS_FILE")
_lease = env_number("SINGLEBEAT_LEASE", float)
if _lease is not None:
    CELERY_SINGLEBEAT_LEASE = _lease
_loop = env_number("BEAT_MAX_LOOP_INTERVAL", float)
if _loop is not None:
    CELERY_BEAT_MAX_LOOP_INTERVAL = _loop

# The entries in code; those added at run time (the admin, the API, the CLI)
# are the stored schedules, which every replica follows within a second.
CELERY_BEAT_SCHEDULE = {
    "refresh-prices": {
        "task": "shop.tasks.refresh_prices",
        "schedule": timedelta(seconds=env_number("SHOP_REFRESH_EVERY", float) or 60),
    },
}
