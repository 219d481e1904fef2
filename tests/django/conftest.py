"""What the Django suite shares (tests/django, ``make test-django``).

pytest-django creates the test database, one per xdist worker, and runs the
migrations, so the store's tables exist in it (``migrations/0001_initial.py``
runs the core's schema code). The database is the one ``SB_DJANGO_DB`` names
(sbproject/settings.py); its service missing skips the suite locally and
fails it under ``CI=true``, as every other suite does (tests/conftest.py).

The store's tables are unmanaged and the store writes them on connections of
its own: the test's transaction does not roll them back, nor does a
transactional test's flush empty them. ``sb_store`` empties them (every table
but the schema's ``meta``, one DELETE each) before and after its test, so a
test that writes through the store, the API or a command asks for it (or for
``schedules_api``, which stands on it), and is marked ``django_db`` if it
is not already (pytest-django creates only the databases marked tests
need). A test that writes through the store
*and* through Django's connection marks itself
``@pytest.mark.django_db(transaction=True)``: on SQLite a write transaction of
Django's holds the only write lock the store's connection would wait for.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

# direct_engine as well: tests/fleet_rows.py imports it from ``conftest``,
# which is this module once pytest has loaded it (tests/conftest.py says why)
from tests_conftest import direct_engine, require

from celery_singlebeat.contrib.django import store as django_store
from celery_singlebeat.schedules.api import Schedules
from celery_singlebeat.store.sql import SqlStore

__all__ = ["direct_engine", "empty_tables"]

#: the service each SB_DJANGO_DB needs (SQLite needs none)
_SERVICES = {"postgres": "postgres", "mysql": "mysql"}


#: the real browser runs in the PostgreSQL run only: its pages read the same
#: rows on every database, which the test client's admin tests check on each;
#: three Chromiums side by side cost make test 40 s of its budget for nothing
collect_ignore = [] if os.environ.get("SB_DJANGO_DB") == "postgres" else ["test_browser.py"]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark ``django_db`` each test that uses the store without the mark:
    pytest-django creates only the test databases its marked tests ask for,
    and the store works in the test database."""
    for item in items:
        uses_store = "sb_store" in getattr(item, "fixturenames", ())
        if uses_store and item.get_closest_marker("django_db") is None:
            item.add_marker(pytest.mark.django_db)


@pytest.fixture(scope="session")
def database_service() -> None:
    """Skip (locally) or fail (CI) when the database ``SB_DJANGO_DB`` names is down."""
    service = _SERVICES.get(os.environ.get("SB_DJANGO_DB", "sqlite"))
    if service is not None:
        require(service)


@pytest.fixture(scope="session")
def stale_sqlite_journals(django_db_modify_db_settings: None) -> None:
    """Remove a killed run's ``-wal`` and ``-shm`` files beside the SQLite
    test database: Django deletes and recreates the database file only, and
    SQLite would take a stale write-ahead log for the new file's."""
    from django.conf import settings

    db = settings.DATABASES["default"]
    if db["ENGINE"].endswith("sqlite3"):
        name = str(db.get("TEST", {}).get("NAME") or "")
        for suffix in ("-wal", "-shm"):
            if name and os.path.exists(name + suffix):
                os.remove(name + suffix)


@pytest.fixture(scope="session")
def django_db_setup(
    database_service: None, stale_sqlite_journals: None, django_db_setup: Any
) -> Iterator[None]:
    """pytest-django's test database, once its service is known to be up; the
    stores this process opened are closed before it is dropped (PostgreSQL
    refuses to drop a database that has connections)."""
    yield
    django_store.close_all()


def empty_tables(sql_store: SqlStore) -> None:
    """Delete every row of the store's tables but the schema's own (``meta``:
    its version and the revision counter, which only grows)."""
    tables = sql_store.tables
    with sql_store.engine.begin() as conn:
        for table in reversed(tables.metadata.sorted_tables):
            if table is not tables.meta:
                conn.execute(table.delete())


@pytest.fixture
def sb_store(django_db_setup: None) -> Iterator[SqlStore]:
    """The project's store (``contrib.django.store.store()``) over the test
    database, its tables empty at the start and emptied at the end."""
    found = django_store.store()
    empty_tables(found)
    yield found
    empty_tables(found)


@pytest.fixture
def schedules_api(sb_store: SqlStore) -> Schedules:
    """The stored-schedules API as the admin and the commands use it
    (``contrib.django.store.schedules``), the editor named ``tests``."""
    return django_store.schedules(by="tests")
