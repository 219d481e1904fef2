"""Shared fixtures: real services, with one rule.

A test that needs a service skips when the service is absent, except in CI
(``CI=true``), where an absent service is a failure: a green CI run must mean
every backend was exercised.

What only the acceptance tests use (the ``rig``, the RabbitMQ URL) is in
tests/acceptance/conftest.py, which hands on this module's ``__all__``: see
there why.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from sqlalchemy import create_engine
from sqlalchemy.engine import URL, Engine, make_url

#: what test modules, harness.py and tests/fleet_rows.py import from ``conftest``
__all__ = [
    "AMQP_URL",
    "IN_CI",
    "MYSQL_URL",
    "PG_URL",
    "REDIS_URL",
    "behind_pooler",
    "direct_engine",
    "drop_tables",
    "pg_backend_of",
    "require",
    "service_up",
    "shut_socket",
]

# Also importable as ``tests_conftest``: every conftest.py outside a package is
# the module ``conftest``, and pytest replaces it with the next one it loads, so
# tests/acceptance/conftest.py reaches this module by that second name.
sys.modules.setdefault("tests_conftest", sys.modules[__name__])

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")

#: tests/django runs under pytest-django with its project's settings
#: (``make test-django``: ``--ds=sbproject.settings``, once per database); any
#: other run leaves it alone, since Django's settings are one per process
collect_ignore = (
    [] if os.environ.get("DJANGO_SETTINGS_MODULE") == "sbproject.settings" else ["django"]
)

PG_URL = os.environ.get("SB_TEST_PG", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
MYSQL_URL = os.environ.get("SB_TEST_MYSQL", "mysql+pymysql://root@127.0.0.1:3306/test")
REDIS_URL = os.environ.get("SB_TEST_REDIS", "redis://127.0.0.1:6379")
AMQP_URL = os.environ.get("SB_TEST_AMQP", "amqp://guest:guest@127.0.0.1:5672//")


def _address(url: str, port: int) -> tuple[str, int]:
    """Host and port of a service URL (``SB_TEST_PG`` may point at PgBouncer)."""
    parts = urlsplit(url)
    return parts.hostname or "127.0.0.1", parts.port or port


_ADDRESSES = {
    "postgres": _address(PG_URL, 5432),
    "mysql": _address(MYSQL_URL, 3306),
    "redis": _address(REDIS_URL, 6379),
    "rabbitmq": _address(AMQP_URL, 5672),
}


def service_up(name: str) -> bool:
    """True when the service's TCP port accepts a connection."""
    try:
        with socket.create_connection(_ADDRESSES[name], timeout=1):
            return True
    except OSError:
        return False


def require(name: str) -> None:
    """Skip (locally) or fail (CI) when the service is down."""
    if service_up(name):
        return
    host, port = _ADDRESSES[name]
    message = f"{name} is not reachable on {host}:{port}"
    if IN_CI:
        pytest.fail(f"{message} (CI=true: a missing service is a failure)")
    pytest.skip(message)


def direct_engine(url: str | URL, **kwargs: Any) -> Engine:
    """An engine for a test's own look at the tables (not the store's engine).

    With psycopg, no server-side prepared statements, as the store does: psycopg
    prepares a statement run five times on one connection (executemany at once),
    and behind PgBouncer in transaction pooling mode the prepared statement stays
    on a server connection that other clients then get: "prepared statement
    _pg3_0 already exists" (``make test-pgbouncer``)."""
    url = make_url(url)
    if url.get_driver_name() == "psycopg":
        kwargs["connect_args"] = {"prepare_threshold": None, **kwargs.get("connect_args", {})}
    return create_engine(url, **kwargs)


def pg_backend_of(dbapi_connection: Any) -> int | None:
    """The pid of the PostgreSQL server process at the other end of this
    psycopg connection's own socket; None when a pooler stands between them
    (``make test-pgbouncer``).

    Behind PgBouncer in transaction pooling mode the client's connection ends
    at the pooler, and each transaction runs on whichever server connection
    is free: ending "its" backend ends another client's session (or the
    killer's own), and the client's connection stays up. Told apart by the
    two ends of the socket: the server that answers must listen on the port
    we connected to, and see our own port as its client's."""
    import socket

    sock = socket.socket(fileno=os.dup(dbapi_connection.pgconn.socket))
    try:
        local_port, peer_port = sock.getsockname()[1], sock.getpeername()[1]
    finally:
        sock.close()
    with dbapi_connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_backend_pid(), inet_server_port(), client_port"
            " FROM pg_stat_activity WHERE pid = pg_backend_pid()"
        )
        pid, server_port, client_port = cursor.fetchone()
    dbapi_connection.rollback()  # end the transaction the query opened
    return int(pid) if (server_port, client_port) == (peer_port, local_port) else None


def shut_socket(dbapi_connection: Any) -> None:
    """Break a psycopg connection from the client's side (both directions
    shut, as a reset does): the next statement finds it broken. What a
    test does in place of ending the server process behind a pooler."""
    import socket

    sock = socket.socket(fileno=os.dup(dbapi_connection.pgconn.socket))
    try:
        sock.shutdown(socket.SHUT_RDWR)
    finally:
        sock.close()


def behind_pooler(url: str | URL) -> bool:
    """True when ``url`` reaches PostgreSQL through a pooler (:func:`pg_backend_of`)."""
    engine = direct_engine(url)
    try:
        with engine.connect() as conn:
            raw = conn.connection.dbapi_connection
            return pg_backend_of(raw) is None
    finally:
        engine.dispose()


def drop_tables(url: str | URL, table_prefix: str) -> None:
    """Drop a test's tables (``table_prefix``) through an engine of its own."""
    from celery_singlebeat.store.sql.schema import Tables

    engine = direct_engine(url)
    try:
        Tables(table_prefix).metadata.drop_all(engine)
    finally:
        engine.dispose()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark ``shared_postgres`` every test that reaches the PostgreSQL of
    ``SB_TEST_PG``: through the ``pg_url`` fixture, or the ``db_url`` fixture's
    PostgreSQL turn. ``make test-pgbouncer`` runs these acceptance tests again
    with ``SB_TEST_PG`` pointing at PgBouncer; the others (SQLite, MariaDB, a
    private PostgreSQL cluster of the test's own) would not go through it, so
    running them a second time would measure nothing new. Derived from the
    fixtures rather than written by hand, so that a new test is picked up; a test
    that asks for the URL some other way (``request.getfixturevalue``) carries
    the marker itself."""
    for item in items:
        callspec = getattr(item, "callspec", None)
        params = callspec.params if callspec is not None else {}
        if "pg_url" in getattr(item, "fixturenames", ()) or params.get("db_url") == "postgres":
            item.add_marker(pytest.mark.shared_postgres)


@pytest.fixture
def table_prefix() -> str:
    """A fresh table prefix per test, so tests never see each other's rows."""
    return f"t{uuid.uuid4().hex[:10]}_"


@pytest.fixture(params=["sqlite", "postgres", "mysql"])
def db_url(request: pytest.FixtureRequest, tmp_path: object) -> Iterator[str]:
    """The URL of each real database in turn."""
    kind = request.param
    if kind == "sqlite":
        yield f"sqlite:///{tmp_path}/singlebeat.sqlite"
        return
    require(kind)
    yield PG_URL if kind == "postgres" else MYSQL_URL


@pytest.fixture
def pg_url() -> str:
    require("postgres")
    return PG_URL


@pytest.fixture
def mysql_url() -> str:
    require("mysql")
    return MYSQL_URL


@pytest.fixture
def redis_url() -> str:
    require("redis")
    return REDIS_URL


@pytest.fixture(scope="session")
def pgbouncer_url() -> Iterator[str]:
    """A PgBouncer of the test session's own, in transaction pooling mode, in
    front of the PostgreSQL on 127.0.0.1:5432 (``.ci/pgbouncer.sh``): for the
    tests of what a pooler breaks (LISTEN), which ``make test`` runs too. One
    per xdist worker, each on its own port."""
    require("postgres")
    binary = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"
    if not os.access(binary, os.X_OK):
        message = "pgbouncer is not installed (apt-get install pgbouncer)"
        if IN_CI:
            pytest.fail(f"{message} (CI=true: a missing service is a failure)")
        pytest.skip(message)
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw")
    port = 6440 + int(worker or 0)
    script = Path(__file__).resolve().parents[1] / ".ci" / "pgbouncer.sh"
    workdir = tempfile.mkdtemp(prefix="sb-pgbouncer-")
    env = {
        **os.environ,
        "PGBOUNCER_PORT": str(port),
        "PGBOUNCER_DIR": workdir,
        "PG_HOST": "127.0.0.1",
        "PG_PORT": "5432",
    }
    subprocess.run([str(script), "start"], env=env, check=True, capture_output=True)
    try:
        yield f"postgresql+psycopg://postgres@127.0.0.1:{port}/test"
    finally:
        subprocess.run([str(script), "stop"], env=env, check=False, capture_output=True)
        shutil.rmtree(workdir, ignore_errors=True)
