"""docs/examples/redbeat_to_singlebeat.py, the copy the redbeat migration guide
runs: real redbeat entries saved in a real Redis, copied into stored schedules
on SQLite, then sent by the schedule they had."""

from __future__ import annotations

import importlib.util
import sys
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from celery import Celery
from celery.schedules import crontab, schedule

from celery_singlebeat import Schedules

EXAMPLE = Path(__file__).resolve().parents[2] / "docs" / "examples" / "redbeat_to_singlebeat.py"


def _example() -> Any:
    spec = importlib.util.spec_from_file_location("redbeat_to_singlebeat", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def redbeat_app(redis_url: str, tmp_path: Path) -> Any:
    pytest.importorskip("redbeat")
    from conftest import require
    from redbeat.schedulers import get_redis

    require("redis")
    prefix = f"sb-test-{uuid.uuid4().hex[:8]}:"
    app = Celery("redbeat-migration", set_as_current=False)
    app.conf.update(
        broker_url="memory://",
        redbeat_redis_url=redis_url,
        redbeat_key_prefix=prefix,
        singlebeat_url=f"sqlite:///{tmp_path / 'sb.sqlite'}",
        beat_schedule={"static-one": {"task": "t.static", "schedule": 60.0}},
    )
    yield app
    client = get_redis(app)
    keys = list(client.scan_iter(match=prefix + "*"))
    if keys:
        client.delete(*keys)


def test_dynamic_entries_are_copied_and_statics_left_to_beat_schedule(redbeat_app: Any) -> None:
    from redbeat.schedulers import RedBeatSchedulerEntry, ensure_conf, get_redis

    conf = ensure_conf(redbeat_app)
    # what redbeat's beat does at start-up: beat_schedule's entries saved as statics
    static = RedBeatSchedulerEntry("static-one", "t.static", schedule(60), app=redbeat_app)
    static.save()
    get_redis(redbeat_app).sadd(conf.statics_key, "static-one")
    RedBeatSchedulerEntry(
        "every-30s",
        "t.poll",
        schedule(timedelta(seconds=30)),
        args=[1],
        app=redbeat_app,
        options={"queue": "feeds", "priority": 3},
    ).save()
    RedBeatSchedulerEntry(
        "nightly", "t.report", crontab(minute=0, hour=3), kwargs={"fmt": "pdf"}, app=redbeat_app
    ).save()
    RedBeatSchedulerEntry("off", "t.off", schedule(120), enabled=False, app=redbeat_app).save()
    RedBeatSchedulerEntry("bad name " + "x" * 300, "t.bad", schedule(5), app=redbeat_app).save()

    example = _example()
    with Schedules(redbeat_app, by="migration") as schedules:
        dry = example.copy_entries(redbeat_app, schedules, dry_run=True)
        assert schedules.list() == []  # a dry run writes nothing
        copied = example.copy_entries(redbeat_app, schedules)
        again = example.copy_entries(redbeat_app, schedules)
        stored = {entry.name: entry for entry in schedules.list()}
        runs = schedules.next_runs("every-30s", 2)

    assert sorted(dry.written) == sorted(copied.written) == ["every-30s", "nightly", "off"]
    assert [name for name, _ in copied.refused] == ["bad name " + "x" * 300]
    assert "longer than" in copied.refused[0][1] or "255" in copied.refused[0][1]
    assert sorted(again.kept) == ["every-30s", "nightly", "off"] and again.written == []
    assert "static-one" not in stored
    poll = stored["every-30s"]
    assert poll.task == "t.poll" and list(poll.args) == [1]
    assert poll.options.get("queue") == "feeds" and poll.options.get("priority") == 3
    assert stored["nightly"].kwargs == {"fmt": "pdf"}
    assert stored["off"].enabled is False
    assert (runs[1] - runs[0]) == timedelta(seconds=30)
