"""``Schedules``, the stored entries from Python, on SQLite, PostgreSQL and
MariaDB: idempotent upserts, partial updates and stale revisions, bad input
that changes nothing, a write that joins the caller's transaction, the
history, and the names ``beat_schedule`` keeps."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from celery import Celery
from sqlalchemy import create_engine, text

from celery_singlebeat import (
    InvalidEntry,
    ScheduleConflict,
    ScheduleExists,
    ScheduleNotFound,
    Schedules,
)


def test_upsert_update_conflict_and_history(db_url: str, table_prefix: str) -> None:
    with Schedules(db_url, table_prefix=table_prefix, by="alice") as schedules:
        first = schedules.upsert(
            "report", "proj.report", {"crontab": "0 3 * * *", "tz": "Europe/Paris"}, why="new"
        )
        # idempotent: the same entry again writes nothing
        again = schedules.upsert(
            "report", "proj.report", {"crontab": "0 3 * * *", "tz": "Europe/Paris"}
        )
        assert again.revision == first.revision
        with pytest.raises(ScheduleExists):
            schedules.upsert("report", "proj.report", timedelta(hours=1), if_exists="error")
        kept = schedules.upsert("report", "other", timedelta(hours=1), if_exists="keep")
        assert kept.task == "proj.report"

        edited = schedules.update("report", kwargs={"format": "pdf"}, why="pdf")
        assert edited.kwargs == {"format": "pdf"} and edited.task == "proj.report"
        assert edited.revision is not None and first.revision is not None
        assert edited.revision > first.revision
        with pytest.raises(ScheduleConflict) as conflict:
            schedules.update("report", kwargs={}, if_revision=first.revision)
        assert str(first.revision) in str(conflict.value)
        assert str(edited.revision) in str(conflict.value)
        assert schedules.get("report").kwargs == {"format": "pdf"}

        log = schedules.log("report")
        assert [(r.action, r.by, r.why) for r in log] == [
            ("changed", "alice", "pdf"),
            ("created", "alice", "new"),
        ]
        runs = schedules.next_runs("report", 3, now=datetime(2026, 3, 28, tzinfo=timezone.utc))
        # 03:00 in Paris: UTC+1 until the change of 29 March, then UTC+2
        assert [r.isoformat() for r in runs] == [
            "2026-03-28T02:00:00+00:00",
            "2026-03-29T01:00:00+00:00",
            "2026-03-30T01:00:00+00:00",
        ]
        schedules.delete("report")
        with pytest.raises(ScheduleNotFound):
            schedules.get("report")


def test_bad_input_names_the_field_and_writes_nothing(db_url: str, table_prefix: str) -> None:
    with Schedules(db_url, table_prefix=table_prefix) as schedules:
        schedules.upsert("job", "t", timedelta(seconds=30))
        before = schedules.get("job")
        for bad, field in [
            (
                {
                    "start": datetime(2027, 1, 2, tzinfo=timezone.utc),
                    "end": datetime(2027, 1, 1, tzinfo=timezone.utc),
                },
                "end",
            ),
            ({"kwargs": {"x": object()}}, "kwargs"),
            ({"schedule": {"crontab": "0 25 * * *"}}, "hour"),
            ({"jitter": timedelta(seconds=40)}, "jitter"),
            ({"options": {"priority": 300}}, "priority"),
        ]:
            with pytest.raises(InvalidEntry) as raised:
                schedules.update("job", **bad)
            assert "'job'" in str(raised.value) and field in str(raised.value), raised.value
        assert schedules.get("job") == before
        assert [r.action for r in schedules.log("job")] == ["created"]


def test_a_write_joins_the_callers_transaction(db_url: str, table_prefix: str) -> None:
    engine = create_engine(db_url)
    try:
        with Schedules(db_url, table_prefix=table_prefix) as schedules:
            own = f"{table_prefix}orders"
            with engine.begin() as conn:
                conn.execute(text(f"CREATE TABLE {own} (id INTEGER PRIMARY KEY)"))
            conn = engine.connect()
            transaction = conn.begin()
            conn.execute(text(f"INSERT INTO {own} (id) VALUES (1)"))
            schedules.upsert("follow-up", "t", timedelta(hours=1), connection=conn)
            transaction.rollback()
            conn.close()
            with pytest.raises(ScheduleNotFound):
                schedules.get("follow-up")
            with engine.begin() as conn:
                conn.execute(text(f"INSERT INTO {own} (id) VALUES (2)"))
                schedules.upsert("follow-up", "t", timedelta(hours=1), connection=conn)
            assert schedules.get("follow-up").task == "t"
            with engine.begin() as conn:
                assert conn.execute(text(f"SELECT id FROM {own}")).scalars().all() == [2]
                conn.execute(text(f"DROP TABLE {own}"))
    finally:
        engine.dispose()


def test_the_apps_beat_schedule_names_are_refused(db_url: str, table_prefix: str) -> None:
    app = Celery("names", set_as_current=False)
    app.conf.update(
        singlebeat_url=db_url,
        singlebeat_table_prefix=table_prefix,
        beat_schedule={"static": {"task": "t", "schedule": 10.0}},
    )
    with Schedules(app) as schedules:
        with pytest.raises(InvalidEntry, match="beat_schedule defines an entry of this name"):
            schedules.upsert("static", "t", timedelta(seconds=10))
        assert schedules.list() == []
