"""``singlebeat_url = "django://alias"`` resolves to Django's database.

Runs in a subprocess: Django settings can be configured once per interpreter,
and the other tests must not see them.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from celery_singlebeat.config import Settings
from celery_singlebeat.exceptions import ConfigurationError

pytest.importorskip("django")


def _run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_django_postgres_alias_connects_and_coordinates(pg_url: str, table_prefix: str) -> None:
    result = _run(
        f"""
        import django
        from django.conf import settings
        settings.configure(DATABASES={{
            "default": {{"ENGINE": "django.db.backends.sqlite3", "NAME": "unused.sqlite"}},
            "jobs": {{"ENGINE": "django.db.backends.postgresql", "NAME": "test",
                      "USER": "postgres", "PASSWORD": "pw-django", "HOST": "127.0.0.1",
                      "PORT": "5432"}},
        }})
        django.setup()
        from celery_singlebeat.config import Settings
        from celery_singlebeat.store.sql import SqlStore
        from celery_singlebeat.store.base import SlotKey
        s = Settings.from_conf({{"singlebeat_url": "django://jobs",
                                 "singlebeat_table_prefix": "{table_prefix}"}})
        print("URL", s.safe_url)
        store = SqlStore(s.url, table_prefix=s.table_prefix)
        store.prepare(True)
        store.register(["e"])
        won = store.claim("r", [SlotKey("e", store.ping())], 5_000_000)
        print("WON", len(won))
        store.tables.metadata.drop_all(store.engine)
        store.close()
        """
    )
    assert result.returncode == 0, result.stderr
    assert "URL postgresql+psycopg://postgres:***@127.0.0.1:5432/test" in result.stdout
    assert "WON 1" in result.stdout
    assert "pw-django" not in result.stdout + result.stderr


def test_django_sqlite_and_errors(tmp_path: object) -> None:
    result = _run(
        f"""
        import django
        from django.conf import settings
        settings.configure(DATABASES={{
            "default": {{"ENGINE": "django.db.backends.sqlite3", "NAME": "{tmp_path}/d.sqlite"}},
            "odd": {{"ENGINE": "django.db.backends.oracle", "NAME": "x"}},
        }})
        django.setup()
        from celery_singlebeat.config import Settings
        from celery_singlebeat.exceptions import ConfigurationError
        print("URL", Settings.from_conf({{"singlebeat_url": "django://"}}).safe_url)
        for alias in ("odd", "missing"):
            try:
                Settings.from_conf({{"singlebeat_url": "django://" + alias}})
            except ConfigurationError as exc:
                print("ERR", exc)
        """
    )
    assert result.returncode == 0, result.stderr
    assert f"URL sqlite:///{tmp_path}/d.sqlite" in result.stdout
    assert "ERR singlebeat_url=django://odd: unsupported Django ENGINE" in result.stdout
    assert "ERR singlebeat_url=django://missing: no such alias in DATABASES" in result.stdout


def test_django_url_without_configured_settings_names_the_setting() -> None:
    # In this interpreter Django settings are not configured.
    with pytest.raises(ConfigurationError, match="singlebeat_url=django://default"):
        Settings.from_conf({"singlebeat_url": "django://default"})
