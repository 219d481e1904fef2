"""The operator CLI at scale: ``singlebeat status`` with 100,000 entries.

For PostgreSQL, MariaDB and SQLite in turn, a table prefix of its own is filled
with what a fleet of 3 replicas writes for 100,000 entries: 3 live replica
rows naming one catalog of 100,000 rows (every replica has every entry, so the
three share it: the first replica's publish writes it, the other two find it
there and write nothing; 80 % intervals of 10 s to 1 h, 20 % crontabs), one
sent slot row per entry (its latest slot, sent a few ms late) and 5 pauses.
Then, each the median of 3:

* ``Operator.status()`` in this process: the statements and the next-slot
  computation of every entry (the issue's target: under 2 s);
* ``python -m celery_singlebeat --url URL status --json`` as a subprocess, end
  to end (interpreter start, imports, the read, 100,000 entries as JSON);
* ``status`` (the human table, 50 rows) as a subprocess;
* the baseline, measured in the same run: ``replicas --json`` as a subprocess,
  which reads 3 rows: what a command costs before any entry.

Usage: ``python benchmarks/bench_cli.py [--entries N] [--json PATH]``; the
results go to benchmarks/results/cli-latest.json. The tables are dropped at
the end.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bench_scheduler import (  # noqa: E402
    MYSQL_URL,
    PG_URL,
    _drop_tables,
    finish,
    machine,
    table,
)

#: the issue's target for Operator.status with 100,000 entries and 3 replicas
STATUS_MAX_S = 2.0
RUNS = 3
REPLICAS = 3
PAUSES = 5
US = 1_000_000
INTERVALS_S = (10, 60, 300, 3600)
CRONTABS = (("*/5", "*"), ("0", "*"), ("30", "2"))


def _specs() -> list[tuple[str, str]]:
    """(spec, schedule text) in the catalog's own format (catalog.describe)."""
    from datetime import timedelta, timezone

    from celery.schedules import crontab

    from celery_singlebeat.engine.catalog import describe

    out = []
    for seconds in INTERVALS_S:
        row = describe("x", "t", timedelta(seconds=seconds), timezone.utc)
        out.append((row.spec, row.schedule))
    for minute, hour in CRONTABS:
        row = describe("x", "t", crontab(minute=minute, hour=hour), timezone.utc)
        out.append((row.spec, row.schedule))
    return out


def fill(url: str, prefix: str, entries: int) -> dict[str, Any]:
    """Create the tables and write a fleet's rows; returns what was written."""
    from sqlalchemy.engine import make_url

    from celery_singlebeat.engine.catalog import sequence_of
    from celery_singlebeat.store.base import CatalogEntry
    from celery_singlebeat.store.sql import SqlStore

    started = time.monotonic()
    store = SqlStore(make_url(url), table_prefix=prefix)
    store.prepare(create=True)
    tables = store.tables
    now = store.ping()
    replicas = [f"bench-{i}:{100 + i}:{uuid.uuid4().hex[:6]}" for i in range(REPLICAS)]
    specs = _specs()
    names = [f"entry-{i:06d}" for i in range(entries)]
    # interval anchors spread over a second, so that slots do not all coincide
    anchors = [now - 86_400 * US - (i % 1000) * 1000 for i in range(entries)]
    kinds = [
        specs[i % len(INTERVALS_S)] if i % 5 else specs[len(INTERVALS_S) + i % 3]
        for i in range(entries)
    ]
    sequences = {}
    slots = []
    for name, anchor, (spec, _text) in zip(names, anchors, kinds):
        key = spec if "crontab" in spec else (spec, anchor)
        seq = sequences.get(key) or sequence_of(spec, anchor)
        if "crontab" in spec:
            sequences[key] = seq
        last = seq.latest_at_or_before(now) if seq is not None else None
        if last is not None:
            slots.append((name, last))
    with store.engine.begin() as conn:
        conn.execute(
            tables.replicas.insert(),
            [
                {
                    "id": rid,
                    "host": rid.split(":")[0],
                    "pid": 100 + i,
                    "version": "0.1.0",
                    "started_us": now - 3600 * US,
                    "seen_us": now,
                    "loop_us": now,
                    "offset_us": 0,
                    "tracked": entries,
                    "proposes_first": entries // REPLICAS,
                    "heartbeat_us": 5 * US,
                    "stopped_us": None,
                }
                for i, rid in enumerate(replicas)
            ],
        )
    chunk = 10_000
    for start in range(0, entries, chunk):
        part = range(start, min(start + chunk, entries))
        with store.engine.begin() as conn:
            conn.execute(
                tables.entries.insert(),
                [
                    {
                        "name": names[i],
                        "anchor_us": anchors[i],
                        "last_slot_us": None,
                        "registered_by": replicas[0],
                    }
                    for i in part
                ],
            )
    # The catalog through the replicas' own path: the first replica writes it,
    # the others (same entries) find it there and write nothing
    catalog = [
        CatalogEntry(names[i], f"proj.tasks.task_{i % 50}", kinds[i][1], kinds[i][0])
        for i in range(entries)
    ]
    publish_s = []
    for rid in replicas:
        began = time.monotonic()
        store.publish_catalog(rid, catalog)
        publish_s.append(round(time.monotonic() - began, 3))
    for start in range(0, len(slots), chunk):
        with store.engine.begin() as conn:
            conn.execute(
                tables.slots.insert(),
                [
                    {
                        "entry": name,
                        "slot_us": slot_us,
                        "state": 1,
                        "owner": replicas[j % REPLICAS],
                        "fence": 1,
                        "lease_until_us": slot_us + 15 * US,
                        "claimed_us": slot_us + 1000,
                        "sent_us": slot_us + 3000,
                        "batch": None,
                    }
                    for j, (name, slot_us) in enumerate(slots[start : start + chunk], start)
                ],
            )
    with store.engine.begin() as conn:
        conn.execute(
            tables.pauses.insert(),
            [
                {
                    "entry": names[i * (entries // PAUSES)],
                    "until_us": None,
                    "paused_by": "bench@host",
                    "reason": "benchmark",
                    "at_us": now,
                }
                for i in range(PAUSES)
            ],
        )
    # statistics, as a database in service has them (autovacuum, InnoDB's
    # persistent statistics): the planners choose by them
    names = [t.name for t in tables.metadata.sorted_tables]
    with store.engine.connect() as conn:
        for name in names:
            if store.backend == "postgresql":
                conn.exec_driver_sql(f"ANALYZE {name}")
            elif store.backend in ("mysql", "mariadb"):
                conn.exec_driver_sql(f"ANALYZE TABLE {name}").all()
        if store.backend == "sqlite":
            conn.exec_driver_sql("ANALYZE")
    store.close()
    return {
        "entries": entries,
        "catalog_rows": entries,
        "publish_catalog_s": publish_s,
        "slot_rows": len(slots),
        "pauses": PAUSES,
        "replicas": REPLICAS,
        "fill_s": round(time.monotonic() - started, 1),
    }


def _refresh_replicas(url: str, prefix: str) -> None:
    """Keep the 3 replicas live (the run outlasts their liveness window)."""
    from sqlalchemy import update
    from sqlalchemy.engine import make_url

    from celery_singlebeat.store.sql import SqlStore

    store = SqlStore(make_url(url), table_prefix=prefix)
    try:
        now = store.ping()
        with store.engine.begin() as conn:
            conn.execute(update(store.tables.replicas).values(seen_us=now))
    finally:
        store.close()


def time_status_in_process(url: str, prefix: str, entries: int) -> list[float]:
    from sqlalchemy.engine import make_url

    from celery_singlebeat.store.sql import SqlStore
    from celery_singlebeat.store.sql.operator import Operator

    store = SqlStore(make_url(url), table_prefix=prefix)
    operator = Operator(store)
    try:
        operator.status()  # connect and warm the caches once, as a CLI run's first statement would
        times = []
        for _ in range(RUNS):
            _refresh_replicas(url, prefix)
            began = time.perf_counter()
            status = operator.status()
            times.append(time.perf_counter() - began)
            assert len(status.entries) == entries, len(status.entries)
            assert sum(r.state == "live" for r in status.replicas) == REPLICAS
            assert all(e.replicas == REPLICAS for e in status.entries)
            assert sum(e.pause is not None for e in status.entries) == PAUSES
        return times
    finally:
        store.close()


def time_command(url: str, prefix: str, args: Sequence[str], check: Any) -> list[float]:
    argv = [
        sys.executable,
        "-m",
        "celery_singlebeat",
        "--url",
        url,
        "--table-prefix",
        prefix,
        *args,
    ]
    times = []
    for _ in range(RUNS):
        _refresh_replicas(url, prefix)
        began = time.perf_counter()
        done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
        times.append(time.perf_counter() - began)
        assert done.returncode == 0, done.stderr[-2000:]
        check(done.stdout)
    return times


def measure(kind: str, url: str, entries: int) -> dict[str, Any]:
    prefix = f"bcli{uuid.uuid4().hex[:6]}_"
    print(f"{kind}: filling {entries:,} entries ...", flush=True)
    try:
        written = fill(url, prefix, entries)

        def all_entries(out: str) -> None:
            doc = json.loads(out)
            assert len(doc["entries"]) == entries, len(doc["entries"])

        def bounded(out: str) -> None:
            assert f"50 of {entries:,} entries shown" in out, out[-500:]

        def three(out: str) -> None:
            assert len(json.loads(out)["replicas"]) == REPLICAS

        return {
            **written,
            "status_in_process_s": time_status_in_process(url, prefix, entries),
            "status_json_subprocess_s": time_command(
                url, prefix, ["status", "--json"], all_entries
            ),
            "status_table_subprocess_s": time_command(url, prefix, ["status"], bounded),
            "baseline_replicas_json_subprocess_s": time_command(
                url, prefix, ["replicas", "--json"], three
            ),
        }
    finally:
        _drop_tables(url, prefix)


def render(results: dict[str, Any]) -> str:
    m = results["machine"]
    rows = []
    for kind, r in results["databases"].items():
        med = {
            k: statistics.median(v)
            for k, v in r.items()
            if k.endswith("_s") and isinstance(v, list)
        }
        rows.append(
            [
                kind,
                f"{r['entries']:,}",
                f"{med['status_in_process_s']:.3f}",
                f"{med['status_json_subprocess_s']:.2f}",
                f"{med['status_table_subprocess_s']:.2f}",
                f"{med['baseline_replicas_json_subprocess_s']:.2f}",
                "yes" if med["status_in_process_s"] < STATUS_MAX_S else "NO",
            ]
        )
    return "\n".join(
        [
            f"machine: {m['nproc']} CPUs, {m['cpu']}, load average "
            f"{m['load_average_1m_at_start']} at start; Python {m['python']}",
            "",
            table(
                f"singlebeat status, {REPLICAS} replicas, median of {RUNS} (seconds)",
                [
                    "database",
                    "entries",
                    "Operator.status",
                    "status --json (process)",
                    "status table (process)",
                    "baseline: replicas --json (process)",
                    f"Operator.status < {STATUS_MAX_S:g} s",
                ],
                rows,
            ),
        ]
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entries", type=int, default=100_000)
    parser.add_argument("--only", default="postgresql,mariadb,sqlite")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    started = time.monotonic()
    results: dict[str, Any] = {"machine": machine(), "databases": {}}
    with tempfile.TemporaryDirectory() as tmp:
        urls = {
            "postgresql": PG_URL,
            "mariadb": MYSQL_URL,
            "sqlite": f"sqlite:///{tmp}/bench-cli.sqlite",
        }
        for kind in args.only.split(","):
            results["databases"][kind] = measure(kind, urls[kind], args.entries)
    finish(results, started, render, args.json or HERE / "results" / "cli-latest.json")
    failed = [
        k
        for k, r in results["databases"].items()
        if statistics.median(r["status_in_process_s"]) >= STATUS_MAX_S
    ]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
