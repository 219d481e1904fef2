"""Three real ``celery beat -S celery_singlebeat.contrib.django.DatabaseScheduler``
replicas over django-celery-beat's tables: one send per slot, a one_off once,
a ``save()`` in force within a second, a bare ``QuerySet.update()`` within its
bound (at this table size, one chunk, whose digest is compared every tick: the next tick), a
disabled task silent from the next tick, ``total_run_count`` equal to the
sends (written once per slot, by the sender), every send within a second of
its slot, and nothing lost when one replica is SIGKILLed."""

from __future__ import annotations

import json
import signal
import time
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
from beats import Beat, RedisReader, django_env, wait_for
from django.db import OperationalError, connection
from django_celery_beat.models import IntervalSchedule, PeriodicTask

from celery_singlebeat.contrib.django.models import Slot

pytestmark = [pytest.mark.slow, pytest.mark.redis]

US = 1_000_000


def _on_sqlite_retry(write: Callable[[], object]) -> None:
    """The test's own write, beside three beat processes writing one SQLite
    file: a write whose transaction began with a read fails at once with
    "database is locked" when another process holds the write lock (SQLite
    will not wait there: it would deadlock). Try again, for up to 10 s."""
    deadline = time.monotonic() + 10
    while True:
        try:
            write()
            return
        except OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.05)


@pytest.mark.django_db(transaction=True)
def test_three_replicas_over_django_celery_beats_tables(tmp_path: Path) -> None:
    from tests_conftest import REDIS_URL, require

    require("redis")
    queue = f"dropin-{uuid.uuid4().hex[:8]}"
    second, _ = IntervalSchedule.objects.get_or_create(every=1, period="seconds")
    two, _ = IntervalSchedule.objects.get_or_create(every=2, period="seconds")
    for name, fields in {
        "every": {},
        "edit": {"kwargs": '{"v": 1}'},
        "upd": {"kwargs": '{"v": 1}'},
        "off": {},
        "once": {"one_off": True, "interval": two},
    }.items():
        PeriodicTask.objects.create(
            name=name,
            task="sbproject.probe",
            queue=queue,
            **{"interval": second, **fields},
        )
    reader = RedisReader(REDIS_URL, queue)
    env = django_env(connection.settings_dict, REDIS_URL)
    beats = [
        Beat(tmp_path, f"beat{i}", "celery_singlebeat.contrib.django.DatabaseScheduler", env)
        for i in range(3)
    ]
    try:
        wait_for(lambda: len(reader.of("every")) >= 3, 25, "three sends of 'every'")
        wait_for(lambda: reader.of("once"), 5, "the one_off's send")
        edited = time.time()
        row = PeriodicTask.objects.get(name="edit")
        row.kwargs = json.dumps({"v": 2})
        _on_sqlite_retry(row.save)
        _on_sqlite_retry(
            lambda: PeriodicTask.objects.filter(name="upd").update(kwargs=json.dumps({"v": 2}))
        )
        off = PeriodicTask.objects.get(name="off")
        off.enabled = False
        _on_sqlite_retry(off.save)
        after = len(reader.of("every"))
        wait_for(lambda: len(reader.of("every")) >= after + 4, 15, "four more sends")
        # a replica dies: the others go on with every slot
        beats[0].proc.kill()
        beats[0].proc.wait(5)
        after = len(reader.of("every"))
        wait_for(lambda: len(reader.of("every")) >= after + 3, 15, "three sends after the kill")
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n" + "\n".join(b.log()[-4000:] for b in beats)) from None
    finally:
        for beat in beats:
            beat.stop()
        sent = reader.close()
    logs = "\n".join(beat.log()[-3000:] for beat in beats)
    assert beats[0].proc.returncode == -signal.SIGKILL
    assert all(beat.proc.returncode == 0 for beat in beats[1:]), logs
    assert sum("coordinating" in beat.log() for beat in beats) == 3, logs
    # singlebeat_url unset: the coordination tables are in Django's database
    name = str(connection.settings_dict["NAME"])
    assert all(f"{name} (lease" in beat.log() for beat in beats), logs

    # nothing lost across the kill: every instant of 'every' from its first
    # send to its last went out, but for a claim the killed replica still holds
    # (another replica publishes it once its lease runs out, after this test)
    every_sent = {s.at_us for s in sent if s.entry == "every"}
    held = set(Slot.objects.filter(entry="every", state=0).values_list("slot_us", flat=True))
    missing = [
        at
        for at in range(min(every_sent), max(every_sent), US)
        if at not in every_sent and at not in held
    ]
    assert missing == [], f"slots of 'every' never sent: {missing}\n{logs}"
    slots = Counter((s.entry, s.at_us) for s in sent)
    assert [slot for slot, n in slots.items() if n > 1] == [], "a slot was sent twice"
    assert len([s for s in sent if s.entry == "once"]) == 1
    once = PeriodicTask.objects.get(name="once")
    assert (once.enabled, once.total_run_count) == (False, 1)
    edited_us = int(edited * US)
    # in force within a second of the save; the bare update within the next tick
    late_edit = [s for s in sent if s.entry == "edit" and s.at_us >= edited_us + US]
    assert late_edit and all("'v': 2" in s.kwargs for s in late_edit), late_edit
    # and sent on time, not in a burst once the replica's clock was read again
    # (a catalog's row count taken for the database's time held every claim
    # back until the next heartbeat: up to 5 s, the drop-in's 3.6 s pickup)
    slow = [
        (s.at_us / US - edited, s.received - edited)
        for s in sent
        if s.entry in ("edit", "every") and s.received - s.at_us / US > 1.0
    ]
    assert slow == [], f"(slot, received) seconds after the save, over 1 s late: {slow}"
    late_upd = [s for s in sent if s.entry == "upd" and s.at_us >= edited_us + 2 * US]
    assert late_upd and all("'v': 2" in s.kwargs for s in late_upd), late_upd
    assert [s for s in sent if s.entry == "off" and s.at_us >= edited_us + US] == []
    # written back once per slot, by its sender
    every = PeriodicTask.objects.get(name="every")
    assert every.total_run_count == len([s for s in sent if s.entry == "every"])
    assert every.last_run_at is not None
    assert int(every.last_run_at.timestamp() * US) == max(
        s.at_us for s in sent if s.entry == "every"
    )
