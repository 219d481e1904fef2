"""The store's tables, mapped for reading (``managed = False``).

The tables belong to the store: ``manage.py migrate`` creates them through
the core's schema code (``migrations/0001_initial.py``), and every write goes
through the store, where revisions, the change feed, the history and the
revision check are kept: the stored schedules through
:class:`~celery_singlebeat.schedules.api.Schedules`, pauses, run-now and
leases through the operator's controls. These models are for reading (the
admin's lists, a project's own queries); an ORM write on them, whether a
``save()``, a ``delete()`` or a queryset's ``update()``, ``delete()`` or bulk
write, raises :class:`ReadOnlyModelError` before any statement.

Instants are the store's: microseconds since the epoch on the database's
clock (``*_us`` columns); each model's ``*_at`` properties give them as aware
UTC datetimes. A table whose key spans two columns (slots, the slot history)
is mapped with one of them as Django's primary key, which only the admin's
links would use; those models are listed, never opened one row at a time.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any, NoReturn

from django.db import models

from ...exceptions import SingleBeatError
from ...widths import (
    MAX_ACTION,
    MAX_AUTHOR,
    MAX_CATALOG_ID,
    MAX_ENTRY_NAME,
    MAX_GENERATED_ID,
    MAX_HOST,
    MAX_MANAGED_BY,
    MAX_OUTCOME,
    MAX_REASON,
    MAX_REPLICA_ID,
    MAX_SCHEDULE_TEXT,
    MAX_SCHEDULE_WHY,
    MAX_TASK,
    MAX_TASK_ID,
    MAX_VERSION,
)
from .conf import table_prefix

PREFIX = table_prefix()


class ReadOnlyModelError(SingleBeatError):
    """An ORM write on a table the store owns: write through
    ``celery_singlebeat.schedules.Schedules`` (stored schedules) or the
    operator's controls (pause, resume, run now, release a lease) instead, so
    that revisions, the change feed and the history hold."""


def _refuse(what: str, model: Any) -> NoReturn:
    raise ReadOnlyModelError(
        f"{what} on {model.__name__} ({model._meta.db_table}) is refused: the table is "
        "celery-singlebeat's and written only through its API "
        "(celery_singlebeat.schedules.Schedules for stored schedules with connection= inside "
        "transaction.atomic(); the singlebeat commands or the admin's actions for pauses, "
        "run-now and leases), which keeps revisions, the change feed and the history"
    )


class ReadOnlyQuerySet(models.QuerySet):
    """A queryset that reads only: its writes bypass ``save()``, so they are
    refused here too."""

    def update(self, **kwargs: Any) -> NoReturn:
        _refuse("QuerySet.update()", self.model)

    def delete(self) -> NoReturn:  # type: ignore[override]
        _refuse("QuerySet.delete()", self.model)

    def bulk_create(self, *args: Any, **kwargs: Any) -> NoReturn:
        _refuse("bulk_create()", self.model)

    def bulk_update(self, *args: Any, **kwargs: Any) -> NoReturn:
        _refuse("bulk_update()", self.model)

    def create(self, **kwargs: Any) -> NoReturn:
        _refuse("create()", self.model)

    def get_or_create(self, *args: Any, **kwargs: Any) -> NoReturn:
        _refuse("get_or_create()", self.model)

    def update_or_create(self, *args: Any, **kwargs: Any) -> NoReturn:
        _refuse("update_or_create()", self.model)


class ReadOnlyModel(models.Model):
    """A row of a store's table: read with the ORM, written through the store."""

    objects = ReadOnlyQuerySet.as_manager()

    class Meta:
        abstract = True

    def save(self, *args: Any, **kwargs: Any) -> NoReturn:
        _refuse("save()", type(self))

    def delete(self, *args: Any, **kwargs: Any) -> NoReturn:  # type: ignore[override]
        _refuse("delete()", type(self))


def instant(us: int | None) -> datetime | None:
    """A ``*_us`` column as an aware UTC datetime (None stays None)."""
    if us is None:
        return None
    return datetime.fromtimestamp(us / 1_000_000, tz=timezone.utc)


class StoredSchedule(ReadOnlyModel):
    """An entry of the stored schedules (``schedules``); a deleted one is a
    tombstone (``deleted``) until the prune removes it."""

    name = models.CharField(max_length=MAX_ENTRY_NAME, primary_key=True)
    task = models.CharField(max_length=MAX_TASK)
    spec = models.TextField(help_text="the schedule's data form (JSON)")
    args = models.TextField()
    kwargs = models.TextField()
    options = models.TextField()
    enabled = models.SmallIntegerField()
    start_us = models.BigIntegerField(null=True)
    end_us = models.BigIntegerField(null=True)
    max_runs = models.BigIntegerField(null=True)
    policy = models.TextField(null=True)
    jitter_us = models.BigIntegerField()
    description = models.TextField()
    managed_by = models.CharField(max_length=MAX_MANAGED_BY, null=True)
    revision = models.BigIntegerField()
    created_us = models.BigIntegerField()
    updated_us = models.BigIntegerField()
    created_by = models.CharField(max_length=MAX_AUTHOR)
    updated_by = models.CharField(max_length=MAX_AUTHOR)
    deleted = models.SmallIntegerField()

    class Meta:
        managed = False
        db_table = f"{PREFIX}schedules"
        verbose_name = "stored schedule"
        ordering = ("name",)

    def __str__(self) -> str:
        return self.name

    @property
    def updated_at(self) -> datetime | None:
        return instant(self.updated_us)


class ScheduleChange(ReadOnlyModel):
    """One entry's write in the history (``schedule_log``): its revision, who,
    why, and the fields it changed (``changes``, JSON). Keyed by
    (revision, name); ``revision`` is Django's primary key for listing only."""

    revision = models.BigIntegerField(primary_key=True)
    name = models.CharField(max_length=MAX_ENTRY_NAME)
    action = models.CharField(max_length=MAX_ACTION)
    changed_by = models.CharField(max_length=MAX_AUTHOR)
    why = models.CharField(max_length=MAX_SCHEDULE_WHY)
    at_us = models.BigIntegerField()
    changes = models.TextField()

    class Meta:
        managed = False
        db_table = f"{PREFIX}schedule_log"
        verbose_name = "schedule change"
        ordering = ("-revision",)

    @property
    def at(self) -> datetime | None:
        return instant(self.at_us)


class Entry(ReadOnlyModel):
    """An entry the fleet has registered, from any source (``entries``): its
    interval anchor and the last slot recorded for it."""

    name = models.CharField(max_length=MAX_ENTRY_NAME, primary_key=True)
    anchor_us = models.BigIntegerField()
    last_slot_us = models.BigIntegerField(null=True)
    registered_by = models.CharField(max_length=MAX_REPLICA_ID)

    class Meta:
        managed = False
        db_table = f"{PREFIX}entries"
        verbose_name_plural = "entries"
        ordering = ("name",)
        permissions = [
            ("pause_entry", "Can pause and resume an entry"),
            ("run_entry_now", "Can run an entry now"),
        ]

    def __str__(self) -> str:
        return self.name

    @property
    def last_slot_at(self) -> datetime | None:
        return instant(self.last_slot_us)


class Slot(ReadOnlyModel):
    """One run of one entry (``slots``): claimed, then sent, by one replica.
    Keyed by (entry, slot_us); ``slot_us`` is Django's primary key for listing
    only. ``fence`` counts the claims: above 1, the slot was taken over."""

    entry = models.CharField(max_length=MAX_ENTRY_NAME)
    slot_us = models.BigIntegerField(primary_key=True)
    state = models.SmallIntegerField(choices=[(0, "claimed"), (1, "sent")])
    owner = models.CharField(max_length=MAX_REPLICA_ID)
    fence = models.BigIntegerField()
    lease_until_us = models.BigIntegerField()
    claimed_us = models.BigIntegerField()
    sent_us = models.BigIntegerField(null=True)
    batch = models.CharField(max_length=MAX_GENERATED_ID, null=True)

    class Meta:
        managed = False
        db_table = f"{PREFIX}slots"
        verbose_name = "slot"
        ordering = ("-slot_us",)

    @property
    def slot_at(self) -> datetime | None:
        return instant(self.slot_us)

    @property
    def sent_at(self) -> datetime | None:
        return instant(self.sent_us)


class Replica(ReadOnlyModel):
    """A beat replica's row (``replicas``): its heartbeat, its loop, its lag."""

    id = models.CharField(max_length=MAX_REPLICA_ID, primary_key=True)
    host = models.CharField(max_length=MAX_HOST)
    pid = models.IntegerField()
    version = models.CharField(max_length=MAX_VERSION)
    started_us = models.BigIntegerField()
    seen_us = models.BigIntegerField()
    loop_us = models.BigIntegerField()
    offset_us = models.BigIntegerField()
    tracked = models.IntegerField()
    proposes_first = models.IntegerField()
    heartbeat_us = models.BigIntegerField()
    stopped_us = models.BigIntegerField(null=True)
    catalog = models.CharField(max_length=MAX_CATALOG_ID, null=True)
    lost_writes = models.IntegerField()

    class Meta:
        managed = False
        db_table = f"{PREFIX}replicas"
        ordering = ("id",)

    def __str__(self) -> str:
        return self.id


class Lease(ReadOnlyModel):
    """A SingletonTask lease (``locks``): its key, holder and expiry (0 once
    released)."""

    name = models.CharField(max_length=MAX_ENTRY_NAME, primary_key=True)
    token = models.BigIntegerField()
    owner = models.CharField(max_length=MAX_REPLICA_ID)
    grant_id = models.CharField(max_length=MAX_GENERATED_ID)
    expires_us = models.BigIntegerField()
    acquired_us = models.BigIntegerField()

    class Meta:
        managed = False
        db_table = f"{PREFIX}locks"
        ordering = ("name",)
        permissions = [("release_lease", "Can release a SingletonTask lease")]

    def __str__(self) -> str:
        return self.name


class Run(ReadOnlyModel):
    """A SingletonTask execution of a slot (``runs``). Keyed by
    (entry, slot_us); ``run_id`` is Django's primary key for listing only."""

    entry = models.CharField(max_length=MAX_ENTRY_NAME)
    slot_us = models.BigIntegerField()
    run_id = models.CharField(max_length=MAX_GENERATED_ID, primary_key=True)
    state = models.SmallIntegerField(choices=[(0, "running"), (1, "finished")])
    owner = models.CharField(max_length=MAX_REPLICA_ID)
    task_id = models.CharField(max_length=MAX_TASK_ID)
    expires_us = models.BigIntegerField()
    started_us = models.BigIntegerField()
    finished_us = models.BigIntegerField(null=True)
    outcome = models.CharField(max_length=MAX_OUTCOME, null=True)
    attempts = models.IntegerField()
    repeats = models.IntegerField()
    last_repeat_us = models.BigIntegerField(null=True)

    class Meta:
        managed = False
        db_table = f"{PREFIX}runs"
        ordering = ("-slot_us",)


class CatalogEntry(ReadOnlyModel):
    """An entry a replica's catalog lists (``catalog``): the ``beat_schedule``
    entries, with the task and schedule the replicas run. Keyed by
    (entry, catalog); ``entry`` is Django's primary key for listing only."""

    entry = models.CharField(max_length=MAX_ENTRY_NAME, primary_key=True)
    catalog = models.CharField(max_length=MAX_CATALOG_ID)
    task = models.CharField(max_length=MAX_TASK)
    schedule = models.CharField(max_length=MAX_SCHEDULE_TEXT)
    spec = models.TextField()

    class Meta:
        managed = False
        db_table = f"{PREFIX}catalog"
        verbose_name = "beat_schedule entry"
        verbose_name_plural = "beat_schedule entries"
        ordering = ("entry",)


class Pause(ReadOnlyModel):
    """A paused entry (``pauses``): until when, by whom, why."""

    entry = models.CharField(max_length=MAX_ENTRY_NAME, primary_key=True)
    until_us = models.BigIntegerField(null=True)
    paused_by = models.CharField(max_length=MAX_AUTHOR)
    reason = models.CharField(max_length=MAX_REASON)
    at_us = models.BigIntegerField()

    class Meta:
        managed = False
        db_table = f"{PREFIX}pauses"
        ordering = ("entry",)
