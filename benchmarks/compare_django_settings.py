"""Django settings for the django-celery-beat replicas of ``compare_failures.py``.

Only what ``django_celery_beat`` needs: its app (models and migrations), a
PostgreSQL database and time zone support. The database is the URL in
``BENCH_DJANGO_DB`` (``postgresql[+driver]://user[:password]@host:port/name``),
a database the comparison creates, migrates and drops; Django talks to it
through psycopg 3, as singlebeat does.
"""

from __future__ import annotations

import os
from urllib.parse import unquote, urlsplit

_url = urlsplit(os.environ.get("BENCH_DJANGO_DB", "postgresql://postgres@127.0.0.1:5432/djcb"))

DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": _url.path.lstrip("/"),
        "USER": unquote(_url.username or "postgres"),
        "PASSWORD": unquote(_url.password or ""),
        "HOST": _url.hostname or "127.0.0.1",
        "PORT": str(_url.port or 5432),
        # a refused connection fails at once; a silent one should not block a tick long
        "OPTIONS": {"connect_timeout": 5},
    }
}
INSTALLED_APPS = ["django_celery_beat"]
USE_TZ = True
TIME_ZONE = "UTC"
SECRET_KEY = "compare-failures: not a secret"
DEFAULT_AUTO_FIELD = "django.db.models.AutoField"
