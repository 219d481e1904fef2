"""django-celery-beat's tables as an entry source, in process (pytest-django):
every column's mapping, how soon each kind of edit is seen and what it costs,
and the write-back (only its columns, once per slot, a one_off disabled)."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from decimal import Decimal
from zoneinfo import ZoneInfo

import pytest
from celery.schedules import crontab, schedule, solar
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django_celery_beat.models import (
    ClockedSchedule,
    CrontabSchedule,
    IntervalSchedule,
    PeriodicTask,
    PeriodicTasks,
    SolarSchedule,
)

from celery_singlebeat.contrib.django.periodic_digests import CHUNK, chunk_of
from celery_singlebeat.contrib.django.periodic_tasks import (
    LABEL,
    OneOffSchedule,
    PeriodicTaskSource,
)
from celery_singlebeat.sources import ChangeKind, EntryDefinition
from celery_singlebeat.timeline.bounds import At, BoundedSchedule
from celery_singlebeat.timeline.clock import datetime_to_us
from celery_singlebeat.timeline.slots import sequence_for

pytestmark = pytest.mark.django_db

UTC = timezone.utc


class Clock:
    """The rescan's pace, moved by hand."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def every(seconds: int) -> IntervalSchedule:
    interval, _ = IntervalSchedule.objects.get_or_create(every=seconds, period="seconds")
    return interval


def task(name: str, **fields: object) -> PeriodicTask:
    fields.setdefault("interval", every(10))
    return PeriodicTask.objects.create(name=name, task="proj.probe", **fields)


def first_read(source: PeriodicTaskSource) -> tuple[dict[str, EntryDefinition], object]:
    _, cursor = source.load()
    changes, cursor = source.changes(cursor)
    return {c.name: c.definition for c in changes if c.definition is not None}, cursor


def kinds(changes: object) -> dict[str, ChangeKind]:
    return {c.name: c.kind for c in changes}  # type: ignore[attr-defined]


def test_every_column_maps_to_the_definition() -> None:
    start = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)
    expires = datetime(2030, 6, 1, tzinfo=UTC)
    kolkata = CrontabSchedule.objects.create(minute="*/7", hour="*", timezone="Asia/Kolkata")
    task(
        "full",
        args=json.dumps([1, "two"]),
        kwargs=json.dumps({"k": 3}),
        headers=json.dumps({"h": "x"}),
        queue="q1",
        exchange="ex",
        routing_key="rk",
        priority=7,
        start_time=start,
        expires=expires,
    )
    task("cron", interval=None, crontab=kolkata, expire_seconds=30)
    sun = SolarSchedule.objects.create(
        event="sunrise", latitude=Decimal("48.85"), longitude=Decimal("2.35")
    )
    task("sun", interval=None, solar=sun)
    at = datetime(2031, 3, 4, 5, 6, 7, tzinfo=UTC)
    task(
        "clock",
        interval=None,
        clocked=ClockedSchedule.objects.create(clocked_time=at),
        one_off=True,
    )
    task("once", one_off=True)
    task("off", enabled=False)
    task("celery.backend_cleanup")
    defs, _ = first_read(PeriodicTaskSource(ZoneInfo("Europe/Paris")))

    assert set(defs) == {"full", "cron", "sun", "clock", "once"}
    full = defs["full"]
    assert (full.task, full.args, full.kwargs, full.source) == (
        "proj.probe",
        (1, "two"),
        {"k": 3},
        LABEL,
    )
    assert dict(full.options) == {
        "queue": "q1",
        "exchange": "ex",
        "routing_key": "rk",
        "priority": 7,
        "expires": expires,
        "headers": {"h": "x", "periodic_task_name": "full"},
    }
    assert isinstance(full.schedule, BoundedSchedule)
    assert full.schedule.inner == schedule(timedelta(seconds=10))
    runs = sequence_for(full.schedule, 0, UTC)
    start_us, expires_us = datetime_to_us(start), datetime_to_us(expires)
    # an interval with a start: at the start, then every period; nothing at or after expires
    assert runs.next_after(0) == start_us
    assert runs.next_after(start_us) == start_us + 10_000_000
    assert runs.next_after(expires_us - 10_000_000) is None

    cron = defs["cron"]
    assert isinstance(cron.schedule, crontab) and cron.tz == ZoneInfo("Asia/Kolkata")
    assert cron.options["expires"] == 30
    assert cron.options["headers"] == {"periodic_task_name": "cron"}
    # */7 in Kolkata (UTC+5:30) is not */7 in UTC
    first = sequence_for(cron.schedule, 0, cron.tz).next_after(datetime_to_us(start))
    assert first is not None
    assert datetime.fromtimestamp(first / 1e6, ZoneInfo("Asia/Kolkata")).minute % 7 == 0

    sun_def = defs["sun"]
    assert isinstance(sun_def.schedule, solar) and sun_def.schedule.event == "sunrise"
    assert sun_def.tz == ZoneInfo("Europe/Paris")

    clock = defs["clock"]
    assert isinstance(clock.schedule, OneOffSchedule) and clock.schedule.inner == At(at)
    clock_runs = sequence_for(clock.schedule, 0, UTC)
    assert clock_runs.next_after(0) == datetime_to_us(at)
    assert clock_runs.next_after(datetime_to_us(at)) is None

    once = defs["once"]
    assert isinstance(once.schedule, OneOffSchedule) and once.schedule.bounds.max_runs == 1
    row = PeriodicTask.objects.get(name="once")
    assert once.since_us == datetime_to_us(row.date_changed)
    once_runs = sequence_for(once.schedule, once.since_us, UTC)
    first_run = once_runs.next_after(0)
    assert first_run is not None and once_runs.next_after(first_run) is None


def test_a_row_that_cannot_be_read_is_logged_and_not_sent(caplog: pytest.LogCaptureFixture) -> None:
    task("bad", kwargs="{not json")
    task("good")
    defs, _ = first_read(PeriodicTaskSource())
    assert set(defs) == {"good"}
    assert "'bad' cannot be scheduled (kwargs is not JSON" in caplog.text


def test_an_idle_tick_costs_one_lookup_a_digest_window_and_the_backstop_slice() -> None:
    for i in range(5):
        task(f"t{i}")
    source = PeriodicTaskSource(now=Clock())
    _, cursor = first_read(source)
    with CaptureQueriesContext(connection) as queries:
        changes, cursor = source.changes(cursor)
    assert changes == []
    sql = [q["sql"] for q in queries.captured_queries]
    assert len(sql) == 3, sql
    assert "django_celery_beat_periodictasks" in sql[0]
    assert "GROUP BY" in sql[1].upper()
    assert "LIMIT" in sql[2].upper()
    assert source.reads["rows"] == 0


def many(count: int) -> list[int]:
    """``count`` tasks, stamped an hour ago (out of the stamped rows' read),
    their ids."""
    interval = every(10)
    PeriodicTask.objects.bulk_create(
        PeriodicTask(name=f"t{i:04d}", task="proj.probe", interval=interval, kwargs='{"v": 1}')
        for i in range(count)
    )
    PeriodicTask.objects.update(date_changed=datetime.now(UTC) - timedelta(hours=1))
    return list(PeriodicTask.objects.order_by("id").values_list("id", flat=True))


def chunks_of(*ids: int) -> int:
    return len({chunk_of(pk) for pk in ids})


def test_each_kind_of_change_after_a_bump_reads_only_its_chunks() -> None:
    """A bump compares every chunk's digest (one statement) and reads whole
    only the chunks that differ: never the 600 rows again."""
    ids = many(600)
    clock = Clock()
    source = PeriodicTaskSource(now=clock)
    _, cursor = first_read(source)

    def tick() -> dict[str, ChangeKind]:
        clock.now += 1.0
        nonlocal cursor
        changes, cursor = source.changes(cursor)
        return kinds(changes)

    # a save(): its chunk (and the row, stamped)
    row = PeriodicTask.objects.get(pk=ids[100])
    row.kwargs = '{"v": 2}'
    row.save()
    assert tick() == {row.name: ChangeKind.CHANGED}
    assert source.reads["rows"] <= 1 + CHUNK, source.reads
    # the admin's disable action: update() then a bump, no stamp
    PeriodicTask.objects.filter(pk=ids[300]).update(enabled=False)
    PeriodicTasks.update_changed()
    assert tick() == {f"t{300:04d}": ChangeKind.REMOVED}
    assert source.reads["rows"] <= CHUNK, source.reads
    # two rows of one chunk swapping their flag: the sum of the enabled ids
    # alone could not tell; the bit sets can
    a, b = ids[300], next(pk for pk in ids[301:] if chunk_of(pk) == chunk_of(ids[300]))
    PeriodicTask.objects.filter(pk=a).update(enabled=True)
    PeriodicTask.objects.filter(pk=b).update(enabled=False)
    PeriodicTasks.update_changed()
    names = dict(PeriodicTask.objects.filter(pk__in=[a, b]).values_list("pk", "name"))
    assert tick() == {names[a]: ChangeKind.CHANGED, names[b]: ChangeKind.REMOVED}
    assert source.reads["rows"] <= CHUNK, source.reads
    # a deletion (its signal bumps): a chunk whose set of ids changed
    PeriodicTask.objects.get(pk=ids[500]).delete()
    assert tick() == {f"t{500:04d}": ChangeKind.REMOVED}
    assert source.reads["rows"] <= CHUNK, source.reads
    # a shared schedule row edited: the tasks that use it, found by their
    # foreign key, and no chunk
    lone = IntervalSchedule.objects.create(every=7, period="seconds")
    PeriodicTask.objects.filter(pk__in=ids[:3]).update(interval=lone)
    PeriodicTasks.update_changed()
    assert set(tick()) == {f"t{i:04d}" for i in range(3)}
    lone.every = 8
    lone.save()
    changes = tick()
    assert set(changes) == {f"t{i:04d}" for i in range(3)}
    assert source.reads["rows"] == 3, source.reads
    # nothing changed: a bump reads no row whole
    PeriodicTasks.update_changed()
    assert tick() == {}
    assert source.reads["rows"] == 0, source.reads


def test_save_delete_and_a_shared_schedule_edit_are_seen_at_the_next_tick() -> None:
    a, b = task("a"), task("b")
    source = PeriodicTaskSource()
    _, cursor = first_read(source)

    a.kwargs = json.dumps({"v": 2})
    a.save()
    b.delete()
    c = task("c")
    changes, cursor = source.changes(cursor)
    assert kinds(changes) == {
        "a": ChangeKind.CHANGED,
        "b": ChangeKind.REMOVED,
        "c": ChangeKind.CHANGED,
    }
    assert [ch.definition.kwargs for ch in changes if ch.name == "a"] == [{"v": 2}]  # type: ignore[union-attr]

    # the interval row both use, edited and saved: its post_save bumps
    # last_update, the tasks' date_changed stays
    interval = IntervalSchedule.objects.get(pk=c.interval_id)
    interval.every = 3
    interval.save()
    changes, cursor = source.changes(cursor)
    assert kinds(changes) == {"a": ChangeKind.CHANGED, "c": ChangeKind.CHANGED}
    assert all(ch.definition.schedule == schedule(timedelta(seconds=3)) for ch in changes)  # type: ignore[union-attr]
    changes, cursor = source.changes(cursor)
    assert changes == []


def test_the_admins_enable_and_disable_actions_take_effect(admin_client: object) -> None:
    t = task("t")
    source = PeriodicTaskSource()
    defs, cursor = first_read(source)
    assert "t" in defs
    url = "/admin/django_celery_beat/periodictask/"
    for action, expected in (
        ("disable_tasks", ChangeKind.REMOVED),
        ("enable_tasks", ChangeKind.CHANGED),
    ):
        response = admin_client.post(  # type: ignore[attr-defined]
            url, {"action": action, "_selected_action": [t.pk]}
        )
        assert response.status_code == 302
        changes, cursor = source.changes(cursor)
        assert kinds(changes) == {"t": expected}, action


def test_the_admins_change_form_takes_effect(admin_client: object) -> None:
    t = task("t", kwargs='{"v": 1}')
    source = PeriodicTaskSource()
    _, cursor = first_read(source)
    response = admin_client.post(  # type: ignore[attr-defined]
        f"/admin/django_celery_beat/periodictask/{t.pk}/change/",
        {
            "name": "t",
            "regtask": "",
            "task": "proj.probe",
            "enabled": "on",
            "interval": t.interval_id,
            "args": "[]",
            "kwargs": '{"v": 2}',
            "headers": "{}",
            "description": "",
            "priority": "",
            "expire_seconds": "",
        },
    )
    assert response.status_code == 302, response.content[:2000]
    changes, cursor = source.changes(cursor)
    assert [(c.name, c.definition.kwargs) for c in changes] == [("t", {"v": 2})]  # type: ignore[union-attr]


def test_a_bare_update_is_in_force_within_the_rescan_period() -> None:
    """No bump: the rolling digest comparison finds it within
    ``rescan_period`` reading only its chunk; a same-length text the digests
    cannot see, within ``backstop_period``."""
    ids = many(1000)
    clock = Clock()
    source = PeriodicTaskSource(rescan_period=5.0, backstop_period=100.0, now=clock)
    _, cursor = first_read(source)

    def until(found: object, ticks: int) -> tuple[int, list[object]]:
        nonlocal cursor
        for tick in range(1, ticks + 1):
            clock.now += 1.0
            changes, cursor = source.changes(cursor)
            if changes:
                return tick, list(changes)
            assert source.reads["rows"] == 0, source.reads
            assert source.reads["statements"] <= 4, source.reads
        raise AssertionError(f"{found} not found in {ticks} ticks")

    # kwargs of another length, the row just behind the comparison's position
    PeriodicTask.objects.filter(pk=ids[-1]).update(kwargs='{"v": 10}')
    tick, changes = until("the kwargs", 6)
    assert [(c.name, c.definition.kwargs) for c in changes] == [("t0999", {"v": 10})]  # type: ignore[attr-defined]
    assert source.reads["rows"] <= CHUNK
    # two rows of one chunk swapping their interval: the weighted sum sees it
    other = IntervalSchedule.objects.create(every=11, period="seconds")
    a, b = ids[0], ids[1]
    PeriodicTask.objects.filter(pk=a).update(interval=other)
    tick, changes = until("the first", 6)
    PeriodicTask.objects.filter(pk=a).update(interval=every(10))
    PeriodicTask.objects.filter(pk=b).update(interval=other)
    tick, changes = until("the swap", 6)
    assert set(kinds(changes)) == {"t0000", "t0001"}
    # a row deleted without a signal (raw SQL): its chunk's set of ids
    with connection.cursor() as raw:
        raw.execute(f"DELETE FROM {PeriodicTask._meta.db_table} WHERE id = %s", [ids[500]])
    tick, changes = until("the deletion", 6)
    assert kinds(changes) == {"t0500": ChangeKind.REMOVED}
    # the same length: only the backstop reads it, within its period
    PeriodicTask.objects.filter(pk=ids[10]).update(kwargs='{"v": 3}')
    nonlocal_seen = None
    for tick in range(1, 102):
        clock.now += 1.0
        changes, cursor = source.changes(cursor)
        if changes:
            nonlocal_seen = tick
            assert [(c.name, c.definition.kwargs) for c in changes] == [("t0010", {"v": 3})]  # type: ignore[union-attr]
            break
    assert nonlocal_seen is not None and nonlocal_seen <= 100


def test_write_back_touches_only_its_columns_once_per_slot() -> None:
    t = task("t")
    source = PeriodicTaskSource()
    defs, cursor = first_read(source)
    # an edit made after the source read the row: a full-row save would lose it
    PeriodicTask.objects.filter(pk=t.pk).update(description="edited meanwhile")
    changed_before = PeriodicTask.objects.get(pk=t.pk).date_changed
    slot = datetime(2030, 1, 1, tzinfo=UTC)
    with CaptureQueriesContext(connection) as queries:
        source.sent(defs["t"], [datetime_to_us(slot) - 10_000_000, datetime_to_us(slot)])
    (update,) = [q["sql"] for q in queries.captured_queries]
    assert update.upper().startswith("UPDATE")
    assert "last_run_at" in update and "total_run_count" in update
    for column in ("description", "date_changed", "enabled", "kwargs", '"name" ='):
        assert column not in update.split("WHERE")[0], column
    row = PeriodicTask.objects.get(pk=t.pk)
    assert (row.total_run_count, row.last_run_at, row.description) == (2, slot, "edited meanwhile")
    assert row.date_changed == changed_before
    source.sent(defs["t"], [datetime_to_us(slot) + 10_000_000])
    assert PeriodicTask.objects.get(pk=t.pk).total_run_count == 3
    # the write-back is no edit: nothing to report, also once the rescan went round
    for _ in range(3):
        changes, cursor = source.changes(cursor)
        assert changes == []


def test_a_one_off_is_disabled_after_its_send() -> None:
    task("once", one_off=True)
    source = PeriodicTaskSource()
    defs, cursor = first_read(source)
    bumped = PeriodicTasks.last_change()
    source.sent(defs["once"], [datetime_to_us(datetime(2030, 1, 1, tzinfo=UTC))])
    row = PeriodicTask.objects.get(name="once")
    assert (row.enabled, row.total_run_count) == (False, 1)
    assert PeriodicTasks.last_change() != bumped
    changes, cursor = source.changes(cursor)
    assert kinds(changes) == {"once": ChangeKind.REMOVED}


def test_a_bump_with_nothing_changed_reads_no_row_again() -> None:
    for i in range(20):
        task(f"t{i}")
    source = PeriodicTaskSource()
    _, cursor = first_read(source)
    PeriodicTasks.update_changed()
    changes, cursor = source.changes(cursor)
    assert changes == []
    # last_update, the digests, the four schedule tables, the backstop's
    # slice; no row read because it changed
    assert source.reads["statements"] == 7, source.reads
    assert source.reads["rows"] == 0, source.reads


def test_a_database_error_is_an_outage_and_a_reconnection_reads_everything() -> None:
    from django.db import transaction

    from celery_singlebeat.exceptions import StoreUnavailable

    task("a"), task("b")
    source = PeriodicTaskSource()
    _, cursor = first_read(source)
    table = PeriodicTasks._meta.db_table
    if connection.vendor != "mysql":  # MySQL's DDL commits: the rename would stay
        outage = pytest.raises(StoreUnavailable, match="django-celery-beat tables")
        with outage, transaction.atomic():
            with connection.cursor() as raw:
                raw.execute(f"ALTER TABLE {table} RENAME TO {table}_gone")
            source.changes(cursor)
    # a row deleted behind every signal: the full read after a reconnection finds it
    with connection.cursor() as raw:
        raw.execute(f"DELETE FROM {PeriodicTask._meta.db_table} WHERE name = %s", ["b"])
    changes, cursor = source.changes(source.reconnected(cursor))
    assert kinds(changes) == {"b": ChangeKind.REMOVED}


def test_the_scheduler_is_named_three_ways_and_defaults_to_djangos_database() -> None:
    from importlib.metadata import entry_points

    from celery import Celery
    from kombu.utils.imports import symbol_by_name

    from celery_singlebeat.contrib.django.scheduler import DatabaseScheduler

    (point,) = [
        p for p in entry_points(group="celery.beat_schedulers") if p.name == "django_singlebeat"
    ]
    assert point.load() is DatabaseScheduler
    assert symbol_by_name("celery_singlebeat.contrib.django.DatabaseScheduler") is DatabaseScheduler
    app = Celery("t", set_as_current=False)
    scheduler = DatabaseScheduler(app, lazy=True)
    assert scheduler.settings.url.database == connection.settings_dict["NAME"]
    assert isinstance(scheduler.periodic_tasks, PeriodicTaskSource)
    mine = Celery("t", set_as_current=False)
    mine.conf.singlebeat_url = "sqlite:////tmp/elsewhere.sqlite"
    assert DatabaseScheduler(mine, lazy=True).settings.url.database == "/tmp/elsewhere.sqlite"
