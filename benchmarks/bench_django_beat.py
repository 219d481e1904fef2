"""django-celery-beat's own ``DatabaseScheduler`` against the drop-in
(``celery_singlebeat.contrib.django.DatabaseScheduler``) over the same tables,
side by side in one run, on PostgreSQL (a database this run creates and drops)
and a Redis queue of its own.

Per number of periodic tasks (10,000 with ``--quick``; 10,000 and 100,000
otherwise), all but one far apart (every 6 hours) and one probe every second,
each side runs **3 replicas** of real ``celery beat -S ...`` processes of the
Django suite's project (tests/django/sbproject):

* **start-up**: from the processes' start to the probe's first message;
* **sends per run**: the probe's messages over a window divided by the runs due
  in it (1.00 is every run once; django-celery-beat's replicas each send it);
* **duplicates per slot** (ours: slots named by ``singlebeat_slot`` sent more
  than once; theirs: sends per run minus one);
* **change pickup**: from a ``save()`` of the probe's kwargs (five, at varied
  offsets within its second) to its first message carrying them (median and
  max), and, for the drop-in, to the log line of the last replica that put
  it in force.

Then, in process, at the largest size: the drop-in source's cost per tick
idle (statements, digest rows, backstop rows, ms and CPU ms), after a
``PeriodicTasks`` bump with nothing changed, after one ``save()``, after a
bump with 1,000 distinct crontabs, and how many 1 s ticks a bare
``QuerySet.update()`` takes to be seen at the worst position (the chunk the
rolling digest comparison has just passed): the bound ``rescan_period``.

Prints a table; writes benchmarks/results/django-beat-latest.json.

    .venv/bin/python benchmarks/bench_django_beat.py --quick
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(ROOT / "tests" / "django")]

PG = os.environ.get("SB_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test")
REDIS = os.environ.get("SB_TEST_REDIS", "redis://127.0.0.1:6379")
DB_NAME = f"sb_bench_dropin_{os.getpid()}"
SIDES = {
    "django-celery-beat": "django_celery_beat.schedulers:DatabaseScheduler",
    "drop-in": "celery_singlebeat.contrib.django.DatabaseScheduler",
}
REPLICAS = 3
WINDOW_S = 8.0
#: saves of the probe per side
EDITS = 5
LABEL = "of django-celery-beat"
US = 1_000_000


def admin_connection() -> Any:
    import psycopg

    return psycopg.connect(PG.replace("postgresql+psycopg", "postgresql"), autocommit=True)


def setup_django() -> None:
    os.environ.update(
        SB_DJANGO_DB="postgres",
        SB_DJANGO_NAME=DB_NAME,
        SB_DJANGO_BROKER=REDIS,
        DJANGO_SETTINGS_MODULE="sbproject.settings",
    )
    with admin_connection() as conn:
        conn.execute(f'CREATE DATABASE "{DB_NAME}"')
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0)


def drop_database() -> None:
    from django.db import connections

    connections.close_all()
    with admin_connection() as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{DB_NAME}" WITH (FORCE)')


def seed(size: int, queue: str) -> None:
    from django.db import connection
    from django_celery_beat.models import IntervalSchedule, PeriodicTask, PeriodicTasks

    # not QuerySet.delete(): django-celery-beat's pre_delete signal bumps
    # PeriodicTasks once per row (100,000 statements)
    with connection.cursor() as cursor:
        cursor.execute(f"TRUNCATE {PeriodicTask._meta.db_table}")
    far, _ = IntervalSchedule.objects.get_or_create(every=6, period="hours")
    second, _ = IntervalSchedule.objects.get_or_create(every=1, period="seconds")
    PeriodicTask.objects.bulk_create(
        (
            PeriodicTask(name=f"far-{i}", task="sbproject.probe", interval=far)
            for i in range(size - 1)
        ),
        batch_size=5000,
    )
    PeriodicTask.objects.create(
        name="probe", task="sbproject.probe", interval=second, queue=queue, kwargs='{"v": 0}'
    )
    PeriodicTasks.update_changed()


def run_side(side: str, size: int, workdir: Path) -> dict[str, Any]:
    from beats import Beat, RedisReader, wait_for
    from django.db import connection
    from django_celery_beat.models import PeriodicTask

    queue = f"bench-dropin-{uuid.uuid4().hex[:8]}"
    seed(size, queue)
    reader = RedisReader(REDIS, queue)
    env = {
        "SB_DJANGO_DB": "postgres",
        "SB_DJANGO_NAME": str(connection.settings_dict["NAME"]),
        "SB_DJANGO_BROKER": REDIS,
    }
    started = time.time()
    beats = [Beat(workdir, f"{side}-{size}-{i}", SIDES[side], env) for i in range(REPLICAS)]
    result: dict[str, Any] = {"side": side, "tasks": size, "replicas": REPLICAS}
    try:
        first = wait_for(lambda: reader.of("probe"), 300, f"{side}'s first probe")
        result["startup_s"] = round(min(s.received for s in first) - started, 2)
        time.sleep(2.0)  # past the start-up's catch-up
        count0 = len(reader.of("probe"))
        time.sleep(WINDOW_S)
        probes = reader.of("probe")[count0:]
        result["sends_per_run"] = round(len(probes) / WINDOW_S, 2)
        if side == "drop-in":
            slots = [s.at_us for s in probes]
            result["duplicates_per_slot"] = round(
                (len(slots) - len(set(slots))) / max(1, len(set(slots))), 2
            )
        else:
            result["duplicates_per_slot"] = round(max(0.0, len(probes) / WINDOW_S - 1), 2)
        latencies, applied = [], []
        for edit in range(1, EDITS + 1):
            # saves at varied offsets within the probe's second
            time.sleep(0.5 + 0.37 * edit % 1.0)
            row = PeriodicTask.objects.get(name="probe")
            row.kwargs = json.dumps({"v": edit})
            saved = time.time()
            row.save()
            needle = f"'v': {edit}"
            seen = wait_for(
                lambda n=needle: [s for s in reader.of("probe") if n in s.kwargs],
                120,
                f"{side} edit {edit}",
            )
            latencies.append(min(s.received for s in seen) - saved)
            if side == "drop-in":
                applied.append(max(applied_after(beat, saved) for beat in beats) - saved)
        result["pickup_s"] = [round(x, 2) for x in latencies]
        result["pickup_median_s"] = round(statistics.median(latencies), 2)
        result["pickup_max_s"] = round(max(latencies), 2)
        if applied:
            # the change in effect in every replica (its log line), the send
            # then waits for the probe's next whole-second slot
            result["applied_s"] = [round(x, 2) for x in applied]
            result["applied_median_s"] = round(statistics.median(applied), 2)
            result["applied_max_s"] = round(max(applied), 2)
    finally:
        for beat in beats:
            beat.stop()
        reader.close()
    return result


def applied_after(beat: Any, saved: float) -> float:
    """When ``beat`` logged that it follows a changed entry of
    django-celery-beat, first after ``saved`` (its log's clock: this host's)."""
    import re
    from datetime import datetime

    pattern = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}): INFO")
    for _ in range(100):
        for line in beat.log().splitlines():
            if "1 changed" not in line or LABEL not in line:
                continue
            match = pattern.match(line)
            if match is None:
                continue
            at = datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
            if at >= saved - 0.001:
                return at
        time.sleep(0.1)
    return math.nan


def rescan_cost(size: int) -> dict[str, Any]:
    """The drop-in source in process over ``size`` rows."""
    from django_celery_beat.models import CrontabSchedule, PeriodicTask, PeriodicTasks

    from celery_singlebeat.contrib.django.periodic_tasks import PeriodicTaskSource

    clock = [0.0]
    source = PeriodicTaskSource(now=lambda: clock[0])
    _, cursor = source.load()
    t0 = time.perf_counter()
    changes, cursor = source.changes(cursor)
    first_s = time.perf_counter() - t0

    def ticks(count: int) -> tuple[float, float, dict[str, int]]:
        nonlocal cursor
        wall, cpu, reads = [], [], []
        for _ in range(count):
            clock[0] += 1.0
            t0, c0 = time.perf_counter(), time.process_time()
            _, cursor = source.changes(cursor)
            wall.append((time.perf_counter() - t0) * 1000)
            cpu.append((time.process_time() - c0) * 1000)
            reads.append(dict(source.reads))
        return statistics.median(wall), statistics.median(cpu), reads[len(reads) // 2]

    idle_ms, idle_cpu_ms, idle_reads = ticks(10)
    PeriodicTasks.update_changed()
    bumped = []
    for _ in range(3):
        PeriodicTasks.update_changed()
        bumped.append(ticks(1))
    bumped_ms = statistics.median(b[0] for b in bumped)
    bumped_reads = bumped[0][2]
    # one save, as the admin's change form does: the tick that sees it
    row = PeriodicTask.objects.get(name="probe")
    row.kwargs = json.dumps({"v": 99})
    row.save()
    saved_ms, _, saved_reads = ticks(1)
    # 1,000 distinct crontabs among the tasks: the schedule tables' cost
    crons = CrontabSchedule.objects.bulk_create(
        CrontabSchedule(minute=str(i % 60), hour=str(i % 24), day_of_month=str(1 + i % 28))
        for i in range(1000)
    )
    for i, cron in enumerate(crons):
        PeriodicTask.objects.filter(name=f"far-{i}").update(interval=None, crontab=cron)
    PeriodicTasks.update_changed()
    ticks(2)
    PeriodicTasks.update_changed()
    cron_ms, _, cron_reads = ticks(1)
    # a bare update() of another length at the worst position: the chunk the
    # rolling comparison has just passed
    ticks(1)
    behind = (
        PeriodicTask.objects.filter(id__lt=max(source._window_from, 1)).order_by("-id").first()
        or PeriodicTask.objects.order_by("-id").first()
    )
    assert behind is not None
    PeriodicTask.objects.filter(pk=behind.pk).update(kwargs='{"bare": 12345}')
    seen = 0
    while seen < 2000:
        clock[0] += 1.0
        seen += 1
        changes, cursor = source.changes(cursor)
        if any(c.name == behind.name for c in changes):
            break
    return {
        "tasks": size,
        "first_read_s": round(first_s, 2),
        "idle_tick_ms": round(idle_ms, 1),
        "idle_tick_cpu_ms": round(idle_cpu_ms, 1),
        "idle_reads": idle_reads,
        "bumped_tick_ms": round(bumped_ms, 1),
        "bumped_reads": bumped_reads,
        "saved_tick_ms": round(saved_ms, 1),
        "saved_reads": saved_reads,
        "crontabs_1000_bumped_tick_ms": round(cron_ms, 1),
        "crontabs_1000_reads": cron_reads,
        "update_seen_after_ticks_of_1s": seen,
        "rescan_period_s": source.rescan_period,
        "backstop_period_s": source.backstop_period,
    }


def render(results: dict[str, Any]) -> str:
    lines = [
        f"{'tasks':>8} {'scheduler':<20} {'replicas':>8} {'start-up s':>10} "
        f"{'sends/run':>9} {'dup/slot':>8} {'save->send median/max':>21} "
        f"{'save->in effect median/max':>26}",
    ]
    for row in results["sides"]:
        lines.append(
            f"{row['tasks']:>8,} {row['side']:<20} {row['replicas']:>8} {row['startup_s']:>10} "
            f"{row['sends_per_run']:>9} {row['duplicates_per_slot']:>8} "
            f"{row['pickup_median_s']:>10}/{row['pickup_max_s']:<10} "
            f"{row.get('applied_median_s', '-'):>13}/{row.get('applied_max_s', '-'):<12}"
        )
    cost = results["rescan"]
    lines += [
        "",
        f"drop-in source at {cost['tasks']:,} tasks, in process: first read "
        f"{cost['first_read_s']} s",
        f"  idle tick: {cost['idle_tick_ms']} ms ({cost['idle_tick_cpu_ms']} ms CPU), "
        f"{cost['idle_reads']}",
        f"  tick after a bump, nothing changed: {cost['bumped_tick_ms']} ms, "
        f"{cost['bumped_reads']}",
        f"  tick after one save(): {cost['saved_tick_ms']} ms, {cost['saved_reads']}",
        f"  tick after a bump, 1,000 crontabs: {cost['crontabs_1000_bumped_tick_ms']} ms, "
        f"{cost['crontabs_1000_reads']}",
        f"  a bare update() at the worst position seen after "
        f"{cost['update_seen_after_ticks_of_1s']} ticks of 1 s (bound "
        f"{cost['rescan_period_s']:g} s; backstop {cost['backstop_period_s']:g} s)",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="10,000 tasks only")
    parser.add_argument("--json", type=Path, default=HERE / "results" / "django-beat-latest.json")
    args = parser.parse_args(argv)
    sizes = [10_000] if args.quick else [10_000, 100_000]
    setup_django()
    from bench_scheduler import machine

    commit = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    results: dict[str, Any] = {
        "commit": commit or "?",
        "machine": machine(),
        "sizes": sizes,
        "window_s": WINDOW_S,
        "sides": [],
    }
    try:
        with tempfile.TemporaryDirectory(prefix="bench-dropin-") as workdir:
            for size in sizes:
                for side in SIDES:
                    row = run_side(side, size, Path(workdir))
                    print(row, flush=True)
                    results["sides"].append(row)
            results["rescan"] = rescan_cost(sizes[-1])
    finally:
        drop_database()
    print(render(results))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(results, indent=2, default=str) + "\n")
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
