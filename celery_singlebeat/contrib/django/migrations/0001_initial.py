"""The coordination tables, created by the core's schema code.

The DDL has one source, the store's (``store/sql/schema.py``): this migration
runs it on the database being migrated, with the configured table prefix, and
creates (or checks) exactly what ``celery -A proj singlebeat create-schema``
does. It is idempotent: a project whose tables the core already made (beat
ran before the app was installed) migrates without error. The models are
declared unmanaged, so Django's own DDL never touches the tables.

Reversing it changes nothing: the tables hold the fleet's history and the
stored schedules, which ``migrate celery_singlebeat zero`` should not destroy.
"""

from __future__ import annotations

from typing import Any

from django.db import migrations, models

from celery_singlebeat.contrib.django.conf import table_prefix

#: the tables' names follow CELERY_SINGLEBEAT_TABLE_PREFIX, as the models' do:
#: with names written here, a project with another prefix would see
#: ``makemigrations`` write a migration into the installed package
PREFIX = table_prefix()


def create_schema(apps: Any, schema_editor: Any) -> None:
    from celery_singlebeat.contrib.django.database import url_of
    from celery_singlebeat.store.sql import SqlStore

    connection = schema_editor.connection
    url = url_of(connection.settings_dict, f"migrate (database {connection.alias!r})")
    store = SqlStore(url, table_prefix=table_prefix())
    try:
        store.prepare(create=True)
    finally:
        store.close()


class Migration(migrations.Migration):
    # the store creates the tables on connections of its own: no transaction of
    # Django's may hold SQLite's write lock meanwhile
    atomic = False
    initial = True
    dependencies: list[tuple[str, str]] = []

    operations = [
        migrations.RunPython(create_schema, migrations.RunPython.noop, elidable=False),
        # the models' state only: they are unmanaged, Django runs no DDL for them
        migrations.CreateModel(
            name="CatalogEntry",
            fields=[
                ("entry", models.CharField(max_length=255, primary_key=True, serialize=False)),
                ("catalog", models.CharField(max_length=64)),
                ("task", models.CharField(max_length=255)),
                ("schedule", models.CharField(max_length=500)),
                ("spec", models.TextField()),
            ],
            options={
                "verbose_name": "beat_schedule entry",
                "verbose_name_plural": "beat_schedule entries",
                "db_table": f"{PREFIX}catalog",
                "ordering": ("entry",),
                "managed": False,
            },
        ),
        migrations.CreateModel(
            name="Entry",
            fields=[
                ("name", models.CharField(max_length=255, primary_key=True, serialize=False)),
                ("anchor_us", models.BigIntegerField()),
                ("last_slot_us", models.BigIntegerField(null=True)),
                ("registered_by", models.CharField(max_length=120)),
            ],
            options={
                "verbose_name_plural": "entries",
                "db_table": f"{PREFIX}entries",
                "ordering": ("name",),
                "permissions": [
                    ("pause_entry", "Can pause and resume an entry"),
                    ("run_entry_now", "Can run an entry now"),
                ],
                "managed": False,
            },
        ),
        migrations.CreateModel(
            name="Lease",
            fields=[
                ("name", models.CharField(max_length=255, primary_key=True, serialize=False)),
                ("token", models.BigIntegerField()),
                ("owner", models.CharField(max_length=120)),
                ("grant_id", models.CharField(max_length=32)),
                ("expires_us", models.BigIntegerField()),
                ("acquired_us", models.BigIntegerField()),
            ],
            options={
                "db_table": f"{PREFIX}locks",
                "ordering": ("name",),
                "permissions": [("release_lease", "Can release a SingletonTask lease")],
                "managed": False,
            },
        ),
        migrations.CreateModel(
            name="Pause",
            fields=[
                ("entry", models.CharField(max_length=255, primary_key=True, serialize=False)),
                ("until_us", models.BigIntegerField(null=True)),
                ("paused_by", models.CharField(max_length=120)),
                ("reason", models.CharField(max_length=500)),
                ("at_us", models.BigIntegerField()),
            ],
            options={
                "db_table": f"{PREFIX}pauses",
                "ordering": ("entry",),
                "managed": False,
            },
        ),
        migrations.CreateModel(
            name="Replica",
            fields=[
                ("id", models.CharField(max_length=120, primary_key=True, serialize=False)),
                ("host", models.CharField(max_length=255)),
                ("pid", models.IntegerField()),
                ("version", models.CharField(max_length=64)),
                ("started_us", models.BigIntegerField()),
                ("seen_us", models.BigIntegerField()),
                ("loop_us", models.BigIntegerField()),
                ("offset_us", models.BigIntegerField()),
                ("tracked", models.IntegerField()),
                ("proposes_first", models.IntegerField()),
                ("heartbeat_us", models.BigIntegerField()),
                ("stopped_us", models.BigIntegerField(null=True)),
                ("catalog", models.CharField(max_length=64, null=True)),
                ("lost_writes", models.IntegerField()),
            ],
            options={
                "db_table": f"{PREFIX}replicas",
                "ordering": ("id",),
                "managed": False,
            },
        ),
        migrations.CreateModel(
            name="Run",
            fields=[
                ("entry", models.CharField(max_length=255)),
                ("slot_us", models.BigIntegerField()),
                ("run_id", models.CharField(max_length=32, primary_key=True, serialize=False)),
                ("state", models.SmallIntegerField(choices=[(0, "running"), (1, "finished")])),
                ("owner", models.CharField(max_length=120)),
                ("task_id", models.CharField(max_length=255)),
                ("expires_us", models.BigIntegerField()),
                ("started_us", models.BigIntegerField()),
                ("finished_us", models.BigIntegerField(null=True)),
                ("outcome", models.CharField(max_length=32, null=True)),
                ("attempts", models.IntegerField()),
                ("repeats", models.IntegerField()),
                ("last_repeat_us", models.BigIntegerField(null=True)),
            ],
            options={
                "db_table": f"{PREFIX}runs",
                "ordering": ("-slot_us",),
                "managed": False,
            },
        ),
        migrations.CreateModel(
            name="ScheduleChange",
            fields=[
                ("revision", models.BigIntegerField(primary_key=True, serialize=False)),
                ("name", models.CharField(max_length=255)),
                ("action", models.CharField(max_length=16)),
                ("changed_by", models.CharField(max_length=120)),
                ("why", models.CharField(max_length=1000)),
                ("at_us", models.BigIntegerField()),
                ("changes", models.TextField()),
            ],
            options={
                "verbose_name": "schedule change",
                "db_table": f"{PREFIX}schedule_log",
                "ordering": ("-revision",),
                "managed": False,
            },
        ),
        migrations.CreateModel(
            name="Slot",
            fields=[
                ("entry", models.CharField(max_length=255)),
                ("slot_us", models.BigIntegerField(primary_key=True, serialize=False)),
                ("state", models.SmallIntegerField(choices=[(0, "claimed"), (1, "sent")])),
                ("owner", models.CharField(max_length=120)),
                ("fence", models.BigIntegerField()),
                ("lease_until_us", models.BigIntegerField()),
                ("claimed_us", models.BigIntegerField()),
                ("sent_us", models.BigIntegerField(null=True)),
                ("batch", models.CharField(max_length=32, null=True)),
            ],
            options={
                "verbose_name": "slot",
                "db_table": f"{PREFIX}slots",
                "ordering": ("-slot_us",),
                "managed": False,
            },
        ),
        migrations.CreateModel(
            name="StoredSchedule",
            fields=[
                ("name", models.CharField(max_length=255, primary_key=True, serialize=False)),
                ("task", models.CharField(max_length=255)),
                ("spec", models.TextField(help_text="the schedule's data form (JSON)")),
                ("args", models.TextField()),
                ("kwargs", models.TextField()),
                ("options", models.TextField()),
                ("enabled", models.SmallIntegerField()),
                ("start_us", models.BigIntegerField(null=True)),
                ("end_us", models.BigIntegerField(null=True)),
                ("max_runs", models.BigIntegerField(null=True)),
                ("policy", models.TextField(null=True)),
                ("jitter_us", models.BigIntegerField()),
                ("description", models.TextField()),
                ("managed_by", models.CharField(max_length=255, null=True)),
                ("revision", models.BigIntegerField()),
                ("created_us", models.BigIntegerField()),
                ("updated_us", models.BigIntegerField()),
                ("created_by", models.CharField(max_length=120)),
                ("updated_by", models.CharField(max_length=120)),
                ("deleted", models.SmallIntegerField()),
            ],
            options={
                "verbose_name": "stored schedule",
                "db_table": f"{PREFIX}schedules",
                "ordering": ("name",),
                "managed": False,
            },
        ),
    ]
