"""The Django app's core: its tables, its read-only models, its settings, its
transactions and its system checks, on the database ``SB_DJANGO_DB`` names
(``make test-django`` runs this module on SQLite, PostgreSQL and MariaDB)."""

from __future__ import annotations

import os
import uuid
from typing import Any

import pytest
from celery import Celery
from django.apps import apps
from django.conf import settings as django_settings
from django.core.checks import run_checks
from django.core.management import call_command
from django.db import connection, transaction
from django.test import override_settings
from sqlalchemy import create_engine, inspect

from celery_singlebeat.config import DEFAULT_URL, Overrides, Settings
from celery_singlebeat.contrib.django import models as sb_models
from celery_singlebeat.contrib.django import store as django_store
from celery_singlebeat.contrib.django.checks import check_settings
from celery_singlebeat.contrib.django.conf import celery_app, celery_conf
from celery_singlebeat.contrib.django.database import database_url, default_url
from celery_singlebeat.exceptions import ConfigurationError
from celery_singlebeat.schedules.api import Schedules
from celery_singlebeat.store.admin import create_schema
from celery_singlebeat.store.sql import SqlStore
from celery_singlebeat.store.sql.schema import Tables

KIND = os.environ.get("SB_DJANGO_DB", "sqlite")

#: every model the app declares, each over one of the store's tables
MODELS = [m for m in apps.get_app_config("celery_singlebeat").get_models()]


def _prefix(tag: str) -> str:
    return f"t{tag}{uuid.uuid4().hex[:6]}_"


def _shape(url: Any, prefix: str) -> dict[str, Any]:
    """The tables of ``prefix`` as SQLAlchemy's inspector reads them back,
    the prefix taken out of every name: columns (type, nullability), primary
    key, indexes and unique constraints."""
    engine = create_engine(url)
    try:
        found = inspect(engine)
        shape: dict[str, Any] = {}
        for table in sorted(t for t in found.get_table_names() if t.startswith(prefix)):
            shape[table[len(prefix) :]] = {
                "columns": [
                    (c["name"], str(c["type"]), c["nullable"]) for c in found.get_columns(table)
                ],
                "pk": found.get_pk_constraint(table)["constrained_columns"],
                "indexes": sorted(
                    (i["name"].replace(prefix, "*"), tuple(i["column_names"]), bool(i["unique"]))
                    for i in found.get_indexes(table)
                ),
                "unique": sorted(
                    tuple(u["column_names"]) for u in found.get_unique_constraints(table)
                ),
            }
        return shape
    finally:
        engine.dispose()


def _drop(url: Any, prefix: str) -> None:
    engine = create_engine(url)
    try:
        Tables(prefix).metadata.drop_all(engine)
    finally:
        engine.dispose()


# -- the tables -----------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_migrate_makes_the_tables_create_schema_makes() -> None:
    url = database_url()
    by_core, by_migrate = _prefix("c"), _prefix("m")
    try:
        create_schema(url, table_prefix=by_core)
        # a project whose tables the core made already (beat ran before the
        # app was installed): migrate runs over them without an error
        for prefix in (by_migrate, by_core):
            with override_settings(CELERY_SINGLEBEAT_TABLE_PREFIX=prefix):
                call_command("migrate", "celery_singlebeat", "zero", verbosity=0)
                call_command("migrate", "celery_singlebeat", verbosity=0)
        core, migrated = _shape(url, by_core), _shape(url, by_migrate)
        assert set(core) == {
            t.name[len(by_core) :] for t in Tables(by_core).metadata.tables.values()
        }
        assert migrated == core
    finally:
        _drop(url, by_core)
        _drop(url, by_migrate)


@pytest.mark.django_db
def test_models_map_the_store_tables_columns() -> None:
    """Django's models describe the tables the store creates: each model's
    table exists and each field is one of its columns, of a matching kind."""
    shape = _shape(database_url(), django_settings.CELERY_SINGLEBEAT_TABLE_PREFIX)
    prefix = django_settings.CELERY_SINGLEBEAT_TABLE_PREFIX
    assert len(MODELS) == 9
    for model in MODELS:
        columns = {
            name: kind for name, kind, _ in shape[model._meta.db_table[len(prefix) :]]["columns"]
        }
        for field in model._meta.concrete_fields:
            assert field.column in columns, (model.__name__, field.column)
            integer = field.get_internal_type().endswith("IntegerField")
            assert ("INT" in columns[field.column].upper()) == integer, (model, field.column)


@pytest.mark.django_db
def test_makemigrations_finds_nothing_to_do() -> None:
    # exits 1 when the models and the migration disagree
    call_command("makemigrations", "celery_singlebeat", check=True, dry_run=True, verbosity=0)


# -- read-only models -----------------------------------------------------------


@pytest.mark.django_db
def test_orm_writes_are_refused_and_write_nothing(schedules_api: Schedules) -> None:
    schedules_api.upsert("kept", "proj.tick", {"every": 60})
    before = {m: list(m.objects.values()) for m in MODELS}
    assert before[sb_models.StoredSchedule][0]["name"] == "kept"
    for model in MODELS:
        existing = model.objects.first()
        instance = existing if existing is not None else model()
        writes = {
            "save()": instance.save,
            "delete()": instance.delete,
            "QuerySet.update()": lambda m=model: m.objects.update(),
            "QuerySet.delete()": lambda m=model: m.objects.all().delete(),
            "create()": lambda m=model: m.objects.create(),
            "bulk_create()": lambda m=model: m.objects.bulk_create([m()]),
        }
        for what, write in writes.items():
            with pytest.raises(sb_models.ReadOnlyModelError, match=r"refused") as refused:
                write()
            assert what in str(refused.value) and model._meta.db_table in str(refused.value)
    assert {m: list(m.objects.values()) for m in MODELS} == before


# -- settings -------------------------------------------------------------------

_GIVEN = {
    "CELERY_SINGLEBEAT_LEASE": 20,
    "CELERY_SINGLEBEAT_REPLICA_ID": "replica-a",
    "CELERY_SINGLEBEAT_TABLE_PREFIX": "other_",
    "CELERY_BEAT_MAX_LOOP_INTERVAL": 4,
}


def test_settings_read_under_celerys_namespace() -> None:
    project_app = Celery("project", set_as_current=False)
    with override_settings(**_GIVEN):
        project_app.config_from_object("django.conf:settings", namespace="CELERY")
        read = {
            "the app's conf": Settings.from_conf(celery_conf()),
            "the commands' app": Settings.from_conf(celery_app().conf),
            "a project's Celery app": Settings.from_conf(project_app.conf),
            "the store's": django_store.settings(),
            # what the CLI and Schedules(app) read: their overrides over the
            # conf, whose names under a namespace answer get() but not `in`
            "an overlay on a project's app": Settings.from_conf(
                Overrides({"singlebeat_create_schema": False}, project_app.conf)
            ),
        }
    for where, found in read.items():
        assert found.lease.total_seconds() == 20, where
        assert found.replica_id == "replica-a", where
        assert found.table_prefix == "other_", where
        assert found.url == database_url("default"), where


def test_url_defaults_to_djangos_database_only_with_the_app_installed() -> None:
    assert "CELERY_SINGLEBEAT_URL" not in dir(django_settings)
    assert default_url() == "django://default"
    assert Settings.from_conf({}).url == database_url("default")
    without = [a for a in django_settings.INSTALLED_APPS if not a.startswith("celery_singlebeat")]
    with override_settings(INSTALLED_APPS=without):
        assert default_url() is None
        assert str(Settings.from_conf({}).url) == DEFAULT_URL


@pytest.mark.parametrize(
    ("given", "named"),
    [
        ({"CELERY_SINGLEBEAT_LEASE": "soon"}, "CELERY_SINGLEBEAT_LEASE"),
        (
            {"CELERY_SINGLEBEAT_LEASE": 2, "CELERY_BEAT_MAX_LOOP_INTERVAL": 5},
            "CELERY_SINGLEBEAT_LEASE",
        ),
        ({"CELERY_SINGLEBEAT_TABLE_PREFIX": "no-dashes"}, "CELERY_SINGLEBEAT_TABLE_PREFIX"),
        ({"CELERY_SINGLEBEAT_URL": "django://missing"}, "CELERY_SINGLEBEAT_URL"),
    ],
)
def test_a_bad_setting_names_the_django_setting(given: dict[str, Any], named: str) -> None:
    with override_settings(**given):
        with pytest.raises(ConfigurationError, match=named):
            django_store.settings()
        # the replicas, through the project's Celery app, name Celery's key
        with pytest.raises(ConfigurationError, match=named[len("CELERY_") :].lower()):
            Settings.from_conf(celery_app().conf)


# -- transactions ---------------------------------------------------------------


class _Rollback(Exception):
    pass


def _user_row(name: str) -> None:
    from django.contrib.auth.models import Group

    Group.objects.create(name=name)


def _groups() -> set[str]:
    from django.contrib.auth.models import Group

    return set(Group.objects.values_list("name", flat=True))


def _seen_by_another_connection(name: str) -> bool:
    engine = create_engine(database_url())
    try:
        with engine.connect() as other:
            table = Tables(django_settings.CELERY_SINGLEBEAT_TABLE_PREFIX).schedules
            found = other.execute(table.select().where(table.c.name == name)).first()
            return found is not None
    finally:
        engine.dispose()


@pytest.mark.django_db(transaction=True)
def test_a_store_write_never_joins_the_users_transaction(
    schedules_api: Schedules, sb_store: SqlStore
) -> None:
    # SQLite has one writer: while the user's transaction holds the write
    # lock, the store's own connection would wait for it. There the user
    # writes after the store has committed; elsewhere before.
    users_first = KIND != "sqlite"
    with pytest.raises(_Rollback), transaction.atomic():
        if users_first:
            _user_row("uncommitted-before")
        schedules_api.upsert("own", "proj.tick", {"every": 60})
        # committed on the store's connection: another connection sees it now
        assert _seen_by_another_connection("own")
        _user_row("uncommitted-after")
        raise _Rollback
    assert _groups() == set()
    assert schedules_api.get("own").revision >= 1
    assert [r.name for r in schedules_api.log()] == ["own"]


@pytest.mark.django_db(transaction=True)
def test_a_write_given_djangos_connection_rolls_back_with_the_user(
    schedules_api: Schedules, sb_store: SqlStore
) -> None:
    schedules_api.upsert("before", "proj.tick", {"every": 60})
    revision = sb_store.feed_versions()
    with pytest.raises(_Rollback), transaction.atomic():
        _user_row("mine")
        saved = schedules_api.upsert("joined", "proj.tick", {"every": 30}, connection=connection)
        assert saved.revision > revision
        schedules_api.update("before", connection=connection, description="inside")
        raise _Rollback
    assert _groups() == set()
    assert [e.name for e in schedules_api.list()] == ["before"]
    assert schedules_api.get("before").description == ""
    # the revision, the change feed and the history rolled back too
    assert sb_store.feed_versions() == revision
    assert sb_store.schedule_feed(revision).rows == []
    assert [r.name for r in schedules_api.log()] == ["before"]
    assert not _seen_by_another_connection("joined")

    # and commits with it, at the next revision: the counter rolled back too
    with transaction.atomic():
        _user_row("mine")
        saved = schedules_api.upsert("joined", "proj.tick", {"every": 30}, connection=connection)
    assert saved.revision == revision + 1
    assert _groups() == {"mine"} and _seen_by_another_connection("joined")


# -- system checks --------------------------------------------------------------


def _ids(**given: Any) -> dict[str, Any]:
    with override_settings(**given):
        return {m.id: m for m in check_settings()}


def test_checks_pass_on_the_suites_settings() -> None:
    assert check_settings() == []
    assert [m for m in run_checks(tags=["celery_singlebeat"])] == []


@pytest.mark.filterwarnings("ignore:Overriding setting DATABASES")
@pytest.mark.parametrize("name", [":memory:", "", "file:memdb1?mode=memory&cache=shared"])
def test_check_refuses_an_in_memory_sqlite(name: str) -> None:
    databases = {
        **django_settings.DATABASES,
        "mem": {"ENGINE": "django.db.backends.sqlite3", "NAME": name},
    }
    found = _ids(DATABASES=databases, CELERY_SINGLEBEAT_URL="django://mem")
    assert list(found) == ["celery_singlebeat.E002"]
    error = found["celery_singlebeat.E002"]
    assert error.obj == "CELERY_SINGLEBEAT_URL" and "in-memory SQLite" in error.msg
    assert "DATABASES['mem']['NAME']" in error.hint


@pytest.mark.filterwarnings("ignore:Overriding setting DATABASES")
def test_check_refuses_an_unsupported_engine() -> None:
    databases = {
        **django_settings.DATABASES,
        "ora": {"ENGINE": "django.db.backends.oracle", "NAME": "x"},
    }
    found = _ids(DATABASES=databases, CELERY_SINGLEBEAT_URL="django://ora")
    assert list(found) == ["celery_singlebeat.E003"]
    assert "DATABASES['ora']['ENGINE']" in found["celery_singlebeat.E003"].msg


def test_check_names_a_bad_value_and_a_typo() -> None:
    found = _ids(CELERY_SINGLEBEAT_LEASE=0.5, CELERY_SINGLEBEAT_LEASES=30)
    assert set(found) == {"celery_singlebeat.E001", "celery_singlebeat.W001"}
    assert found["celery_singlebeat.E001"].obj == "CELERY_SINGLEBEAT_LEASE"
    assert found["celery_singlebeat.E001"].msg.startswith("CELERY_SINGLEBEAT_LEASE")
    assert found["celery_singlebeat.W001"].obj == "CELERY_SINGLEBEAT_LEASES"
    assert "CELERY_SINGLEBEAT_LEASE?" in found["celery_singlebeat.W001"].hint
    # registered by the app: manage.py check runs it
    with override_settings(SINGLEBEAT_URL="sqlite:///x.sqlite"):
        missed = run_checks(tags=["celery_singlebeat"])
    assert [(m.id, m.obj) for m in missed] == [("celery_singlebeat.W002", "SINGLEBEAT_URL")]


def test_the_store_is_the_workers_own_test_database(sb_store: SqlStore) -> None:
    assert sb_store.url == database_url()
    name = str(connection.settings_dict["NAME"])
    assert sb_store.url.database == name
    # each xdist worker its own database (its own SQLite file), named for this checkout
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    assert name.endswith(f"_{worker}" if worker else name)
    from sbproject.settings import RUN

    assert RUN in name
