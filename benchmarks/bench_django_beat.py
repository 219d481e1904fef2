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
* **change pickup**: from a ``save()`` of the probe's kwargs to its first
  message carrying them.

Then, in process, at the largest size: the drop-in source's cost per tick idle
(statements, rows read by the rolling rescan, ms), after a ``PeriodicTasks``
bump (the narrow projection), and how many 1 s ticks a bare
``QuerySet.update()`` takes to be seen at the worst position (the row the rescan
has just passed): the bound ``rescan_period``.

Prints a table; writes benchmarks/results/django-beat-latest.json.

    .venv/bin/python benchmarks/bench_django_beat.py --quick
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
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
        latencies = []
        for edit in range(1, 4):
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
        result["pickup_s"] = [round(x, 2) for x in latencies]
        result["pickup_median_s"] = round(statistics.median(latencies), 2)
    finally:
        for beat in beats:
            beat.stop()
        reader.close()
    return result


def rescan_cost(size: int) -> dict[str, Any]:
    """The drop-in source in process over ``size`` rows."""
    from django_celery_beat.models import PeriodicTask, PeriodicTasks

    from celery_singlebeat.contrib.django.periodic_tasks import PeriodicTaskSource

    clock = [0.0]
    source = PeriodicTaskSource(now=lambda: clock[0])
    _, cursor = source.load()
    t0 = time.perf_counter()
    changes, cursor = source.changes(cursor)
    first_s = time.perf_counter() - t0
    idle_ms, idle_rows = [], []
    for _ in range(10):
        clock[0] += 1.0
        t0 = time.perf_counter()
        changes, cursor = source.changes(cursor)
        idle_ms.append((time.perf_counter() - t0) * 1000)
        idle_rows.append(source.reads["rows"])
    PeriodicTasks.update_changed()
    clock[0] += 1.0
    t0 = time.perf_counter()
    changes, cursor = source.changes(cursor)
    bumped_ms = (time.perf_counter() - t0) * 1000
    bumped_reads = dict(source.reads)
    # the worst position: the row the rescan has just passed
    behind = PeriodicTask.objects.filter(id__lte=source._scan_after).order_by("-id").first()
    assert behind is not None
    PeriodicTask.objects.filter(pk=behind.pk).update(kwargs='{"bare": 1}')
    ticks = 0
    while True:
        clock[0] += 1.0
        ticks += 1
        changes, cursor = source.changes(cursor)
        if any(c.name == behind.name for c in changes) or ticks > 1000:
            break
    return {
        "tasks": size,
        "first_read_s": round(first_s, 2),
        "idle_tick_ms": round(statistics.median(idle_ms), 1),
        "idle_rows_per_tick": int(statistics.median(idle_rows)),
        "idle_statements_per_tick": 2,
        "bumped_tick_ms": round(bumped_ms, 1),
        "bumped_reads": bumped_reads,
        "update_seen_after_ticks_of_1s": ticks,
        "rescan_period_s": source.rescan_period,
        "rescan_rows_per_s": round(size / source.rescan_period),
    }


def render(results: dict[str, Any]) -> str:
    lines = [
        f"{'tasks':>8} {'scheduler':<20} {'replicas':>8} {'start-up s':>10} "
        f"{'sends/run':>9} {'dup/slot':>8} {'pickup s (median)':>17}",
    ]
    for row in results["sides"]:
        lines.append(
            f"{row['tasks']:>8,} {row['side']:<20} {row['replicas']:>8} {row['startup_s']:>10} "
            f"{row['sends_per_run']:>9} {row['duplicates_per_slot']:>8} "
            f"{row['pickup_median_s']:>17}"
        )
    cost = results["rescan"]
    lines += [
        "",
        f"drop-in source at {cost['tasks']:,} tasks: first read {cost['first_read_s']} s; "
        f"idle tick "
        f"{cost['idle_tick_ms']} ms, {cost['idle_statements_per_tick']} statements, "
        f"{cost['idle_rows_per_tick']:,} rows rescanned ({cost['rescan_rows_per_s']:,} rows/s); "
        f"after a PeriodicTasks bump {cost['bumped_tick_ms']} ms "
        f"({cost['bumped_reads']['statements']} statements, "
        f"{cost['bumped_reads']['rows']:,} rows); "
        f"a bare update() at the worst position seen after {cost['update_seen_after_ticks_of_1s']} "
        f"ticks of 1 s (bound {cost['rescan_period_s']:g} s)",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="10,000 tasks only")
    parser.add_argument("--json", type=Path, default=HERE / "results" / "django-beat-latest.json")
    args = parser.parse_args(argv)
    sizes = [10_000] if args.quick else [10_000, 100_000]
    setup_django()
    results: dict[str, Any] = {"sizes": sizes, "window_s": WINDOW_S, "sides": []}
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
