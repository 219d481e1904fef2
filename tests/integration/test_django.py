"""``singlebeat_url = "django://alias"`` resolves to Django's database.

Runs in a subprocess: Django settings can be configured once per interpreter,
and the other tests must not see them. Django comes with the ``dev`` extra: a
missing Django skips these tests locally and fails them under ``CI=true``, as a
missing service does (tests/conftest.py). The PostgreSQL alias points at
``SB_TEST_PG`` (``PG_URL``), so a run through PgBouncer goes through it too.
"""

from __future__ import annotations

import importlib.util
import socket
import subprocess
import sys
import textwrap
from urllib.parse import quote, quote_plus

import pytest
from conftest import IN_CI
from sqlalchemy.engine import URL, make_url

from celery_singlebeat.config import Settings
from celery_singlebeat.exceptions import ConfigurationError

#: a password of the test's own, to see it masked (trust authentication ignores it)
PASSWORD = "pw-django"


@pytest.fixture(autouse=True)
def django_installed() -> None:
    """Skip (locally) or fail (CI) when Django is not importable."""
    if importlib.util.find_spec("django") is not None:
        return
    message = "Django is not installed (pip install -e '.[dev]')"
    if IN_CI:
        pytest.fail(f"{message}; CI=true: a missing dev dependency is a failure")
    pytest.skip(message)


def _run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_django_postgres_alias_connects_and_coordinates(pg_url: str, table_prefix: str) -> None:
    url = make_url(pg_url)
    # The URL's own password when it has one (the server may want it), else ours.
    password = url.password or PASSWORD
    jobs = {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": url.database or "",
        "USER": url.username or "",
        "PASSWORD": str(password),
        "HOST": url.host or "",
        "PORT": str(url.port or ""),
    }
    masked = URL.create(
        "postgresql+psycopg",
        username=url.username,
        password=password,
        host=url.host,
        port=url.port,
        database=url.database,
    ).render_as_string(hide_password=True)
    result = _run(
        f"""
        import django
        from django.conf import settings
        settings.configure(DATABASES={{
            "default": {{"ENGINE": "django.db.backends.sqlite3", "NAME": "unused.sqlite"}},
            "jobs": {jobs!r},
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
    assert "***" in masked and f"URL {masked}\n" in result.stdout, (masked, result.stdout)
    assert "WON 1" in result.stdout
    assert str(password) not in result.stdout + result.stderr


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


def test_django_password_reaches_no_output_even_on_an_error() -> None:
    """A ``django://`` alias whose PASSWORD needs URL-encoding, at a port where
    nothing listens: the shown URL, the settings' repr and the error of the
    refused connection (its traceback included) name the database, never the
    password, raw or encoded."""
    secret = "Pa55-w0rd-s3cr3t/@:?&"
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed again: nothing listens there
    jobs = {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": "jobs_db",
        "USER": "beat",
        "PASSWORD": secret,
        "HOST": "127.0.0.1",
        "PORT": str(port),
    }
    result = _run(
        f"""
        import traceback
        import django
        from django.conf import settings
        settings.configure(DATABASES={{"default": {jobs!r}}})
        django.setup()
        from celery_singlebeat import create_schema
        from celery_singlebeat.config import Settings
        from celery_singlebeat.exceptions import StoreUnavailable
        s = Settings.from_conf({{"singlebeat_url": "django://default"}})
        print("URL", s.safe_url)
        print("REPR", repr(s))
        try:
            create_schema("django://default")
        except StoreUnavailable as exc:
            traceback.print_exc()
            print("ERR", exc)
        """
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    for form in (secret, quote(secret, safe=""), quote_plus(secret), "Pa55-w0rd-s3cr3t"):
        assert form not in output, output
    assert f"URL postgresql+psycopg://beat:***@127.0.0.1:{port}/jobs_db\n" in result.stdout
    assert "ERR schema check failed: OperationalError: " in result.stdout, output
    assert f"port {port} failed" in result.stdout, output
