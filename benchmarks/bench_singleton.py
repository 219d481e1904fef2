"""SingletonTask's overhead per execution, against an empty plain task.

Three measurements (see benchmarks/README.md), each on PostgreSQL, MariaDB and
SQLite, the plain task measured in the same run as the baseline:

8. in-process: ``task.apply()`` (Celery's tracer, then SingletonTask.__call__)
   of an empty task, plain, SingletonTask, and SingletonTask with the
   scheduler's slot header, interleaved; median and 95th percentile;
9. end to end: a real ``celery worker -P solo`` on a Redis broker executes
   batches of each kind; wall time per execution from the worker's own marks;
10. SQL round trips per store operation (``SqlStore.round_trips``), per
    execution and per heartbeat, and the latency of a trivial statement.

Usage: ``python benchmarks/bench_singleton.py [--quick] [--only 8,9,10] [--json PATH]``
(``--executions N``, ``--batch N``: fewer executions, for the smoke test). Redis DB 9
by default (``--redis-db N``), like bench_scheduler.py.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bench_scheduler import (  # noqa: E402
    CELERY,
    MYSQL_URL,
    PG_URL,
    ROOT,
    Config,
    Plan,
    Replica,
    _delete_keys,
    _drop_tables,
    describe_machine,
    finish,
    machine,
    table,
)
from statements import Statements  # noqa: E402

#: the issue's target: added time per execution on PostgreSQL.
TARGET_MS = 5.0

#: what an execution is, in every table.
KINDS = ("plain", "singleton", "slot")
KIND_NAMES = {
    "plain": "plain task",
    "singleton": "SingletonTask",
    "slot": "SingletonTask, slot header",
}
#: the tasks of benchapp.py the worker runs (9).
WORKER_TASKS = {
    "plain": "benchapp.empty",
    "singleton": "benchapp.singleton_empty",
    "slot": "benchapp.singleton_empty",
}
ENTRY = "bench-singleton-entry"
#: first slot instant of the slot executions (each execution has a slot of its own).
SLOT_BASE_US = 1_800_000_000_000_000


@dataclass(frozen=True)
class SingletonPlan:
    quick: bool
    executions: int  # (8) timed executions per kind and database
    warmup: int  # (8, 9) untimed executions per kind first
    batch: int  # (9) messages per kind and round
    rounds: int  # (9) rounds, kinds in a rotating order

    @classmethod
    def make(cls, quick: bool) -> SingletonPlan:
        if quick:
            return cls(True, executions=150, warmup=10, batch=50, rounds=4)
        return cls(False, executions=2000, warmup=50, batch=300, rounds=10)


def _databases(tmp: str) -> list[tuple[str, str]]:
    return [
        ("PostgreSQL", PG_URL),
        ("MariaDB", MYSQL_URL),
        ("SQLite", f"sqlite:///{tmp}/bench-singleton.sqlite"),
    ]


#: (8) SingletonTask on the in-memory store of the tests: its own Python cost,
#: without a database.
MEMORY = "no database (MemoryStore)"


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 3)


def _p95(values: Sequence[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * 0.95))]


def _slot_headers(slot_us: int) -> dict[str, Any]:
    from celery_singlebeat.timeline.slots import SLOT_HEADER, slot_header

    return {SLOT_HEADER: slot_header(ENTRY, slot_us)}


# -- 8 and 10: in-process ------------------------------------------------------


@contextmanager
def _bench_app(url: str) -> Iterator[Any]:
    """A Celery app with the three tasks, its singleton tables under a fresh prefix."""
    from celery import Celery

    from celery_singlebeat import SingletonTask
    from celery_singlebeat.singleton.runtime import set_store
    from celery_singlebeat.testing import MemoryStore

    prefix = f"benchsg{uuid.uuid4().hex[:8]}_"
    app = Celery(f"bench-singleton-{prefix}", broker="memory://")
    memory = url == MEMORY
    app.conf.update(
        singlebeat_url="sqlite:////nonexistent/never-opened.sqlite" if memory else url,
        singlebeat_table_prefix=prefix,
    )
    if memory:
        store = MemoryStore()
        store.prepare(create=True)
        set_store(app, store)

    def empty() -> None:
        return None

    def slot_seen(self: Any) -> Any:
        return list(self.singleton.slot) if self.singleton.slot else None

    def sleep(seconds: float) -> None:
        time.sleep(seconds)

    app.task(name="bench.plain", shared=False)(empty)
    app.task(name="bench.singleton", base=SingletonTask, singleton_ttl=60, shared=False)(empty)
    app.task(name="bench.slot_seen", base=SingletonTask, singleton_ttl=60, bind=True, shared=False)(
        slot_seen
    )
    # the shortest TTL: the heartbeat renews every 1/3 s
    app.task(name="bench.sleepy", base=SingletonTask, singleton_ttl=1, shared=False)(sleep)
    try:
        yield app
    finally:
        from celery_singlebeat.singleton.runtime import forget

        forget(app)
        if not memory:
            _drop_tables(url, prefix)


def _quiet(statements: Statements, timeout: float = 10.0) -> None:
    """Wait until the heartbeat thread has no deferred work (the first execution
    of a process hands it the prune of old rows): its statements would count."""
    from celery_singlebeat.singleton.heartbeat import heartbeat

    deadline = time.monotonic() + timeout
    while heartbeat()._pending and time.monotonic() < deadline:
        time.sleep(0.01)
    before = statements.sent()
    time.sleep(0.05)
    if statements.sent() != before:
        raise RuntimeError("statements sent while the benchmark was idle")


def measure_inprocess(plan: SingletonPlan) -> list[dict[str, Any]]:
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-singleton-") as tmp:
        for label, url in [*_databases(tmp), (MEMORY, MEMORY)]:
            try:
                rows.append(_inprocess(label, url, plan))
            except Exception as exc:  # a database that is down gets a row saying so
                rows.append({"database": label, "error": repr(exc)})
    return rows


def _inprocess(label: str, url: str, plan: SingletonPlan) -> dict[str, Any]:
    from celery_singlebeat.singleton.runtime import runtime_for
    from celery_singlebeat.timeline.slots import slot_task_id

    with _bench_app(url) as app:
        tasks = {"plain": app.tasks["bench.plain"], "singleton": app.tasks["bench.singleton"]}
        next_slot = [SLOT_BASE_US]

        def execute(kind: str) -> Any:
            if kind == "slot":
                slot_us = next_slot[0]
                next_slot[0] += 1_000_000
                return tasks["singleton"].apply(
                    task_id=slot_task_id(ENTRY, slot_us), headers=_slot_headers(slot_us)
                )
            return tasks[kind].apply()

        # The header reaches the request through apply() as through a worker:
        # the execution knows its slot.
        seen = app.tasks["bench.slot_seen"].apply(headers=_slot_headers(SLOT_BASE_US - 1)).get()
        if seen != [ENTRY, SLOT_BASE_US - 1]:
            raise RuntimeError(f"the slot header did not reach the request: {seen!r}")
        store: Any = runtime_for(app).store()  # SqlStore or MemoryStore: both count
        statements = Statements(store)
        try:
            return _measured(label, url, plan, app, execute, statements)
        finally:
            statements.close()


def _measured(
    label: str,
    url: str,
    plan: SingletonPlan,
    app: Any,
    execute: Callable[[str], Any],
    statements: Statements,
) -> dict[str, Any]:
    store = statements.store
    for _ in range(plan.warmup):
        for kind in KINDS:
            execute(kind)
    _quiet(statements)

    times: dict[str, list[float]] = {kind: [] for kind in KINDS}
    trips = dict.fromkeys(KINDS, 0)
    failed = 0
    clock = time.perf_counter
    for i in range(plan.executions):
        # rotate the order: no kind always runs right after another
        for kind in KINDS[i % 3 :] + KINDS[: i % 3]:
            before = statements.sent()
            started = clock()
            result = execute(kind)
            times[kind].append(clock() - started)
            trips[kind] += statements.sent() - before
            failed += result.state != "SUCCESS"
    if failed:
        raise RuntimeError(f"{failed} executions did not succeed")
    runs = _finished_runs(url, app.conf.singlebeat_table_prefix, store)
    expected_runs = plan.warmup + plan.executions + 1
    if runs != expected_runs:
        raise RuntimeError(f"{runs} finished run rows, expected {expected_runs}")

    row: dict[str, Any] = {"database": label, "executions": plan.executions}
    base = times["plain"]
    for kind in KINDS:
        row[kind] = {
            "median_ms": _ms(statistics.median(times[kind])),
            "p95_ms": _ms(_p95(times[kind])),
            "round_trips": trips[kind] / plan.executions,
        }
        if kind != "plain":
            row[kind]["added_median_ms"] = _ms(
                statistics.median(times[kind]) - statistics.median(base)
            )
            row[kind]["added_p95_ms"] = _ms(_p95(times[kind]) - _p95(base))
    row["slot_header_reaches_request"] = True
    row["finished_run_rows"] = runs
    if url != MEMORY:
        row["operations"] = _operations(statements)
        row["heartbeat"] = _heartbeat(app, statements, row["slot"]["round_trips"])
    # the write-back's pings while the process remembered runs, for the record
    row["writeback_pings"] = statements.pings
    return row


def _finished_runs(url: str, prefix: str, store: Any = None) -> int:
    from sqlalchemy import create_engine, text

    if url == MEMORY:
        return sum(row["state"] == 1 for row in store.run_rows().values())

    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            return int(
                conn.execute(text(f"SELECT count(*) FROM {prefix}runs WHERE state = 1")).scalar()
                or 0
            )
    finally:
        engine.dispose()


def _operations(statements: Statements, repeat: int = 50) -> dict[str, Any]:
    """Statements of each store operation an execution makes, called directly, and
    the median latency of each (``ping``: a trivial read, the floor per statement)."""
    from celery_singlebeat.store.base import Lease, Run

    ttl_us = 60_000_000
    key = f"bench-ops-{uuid.uuid4().hex[:8]}"
    counts: dict[str, set[int]] = {}
    latency: dict[str, list[float]] = {}

    store = statements.store

    def measure(name: str, work: Callable[[], Any]) -> Any:
        before = statements.sent()
        started = time.perf_counter()
        result = work()
        latency.setdefault(name, []).append(time.perf_counter() - started)
        counts.setdefault(name, set()).add(statements.sent() - before)
        return result

    for i in range(repeat):
        measure("ping", store.ping)
        # a plain message: the key only
        lease = measure("acquire_lease", partial(store.acquire_lease, key, "bench", ttl_us))
        assert isinstance(lease, Lease), lease
        measure("renew_lease", partial(store.renew_lease, lease, ttl_us))
        measure("release_lease", partial(store.release_lease, lease))
        # a scheduler slot: the run row and the key, started and ended together
        run = Run(f"{ENTRY}-ops", SLOT_BASE_US + i, uuid.uuid4().hex)
        begin, lease = measure(
            "begin_slot", partial(store.begin_slot, run, key, "bench", "task", ttl_us)
        )
        assert isinstance(lease, Lease), (begin, lease)
        measure("renew_run", partial(store.renew_run, run, ttl_us))
        measure("end_slot", partial(store.end_slot, run, "success", lease))
    out: dict[str, Any] = {}
    for name, found in counts.items():
        if len(found) != 1:
            raise RuntimeError(f"{name}: a varying number of statements {sorted(found)}")
        out[name] = {"round_trips": found.pop(), "median_ms": _ms(statistics.median(latency[name]))}
    return out


def _heartbeat(app: Any, statements: Statements, slot_trips: float) -> dict[str, Any]:
    """One slot execution that outlives three heartbeat intervals' worth of a 1 s
    TTL (renewals at 1/3 and 2/3 s): its statements beyond a slot execution's,
    per renewal, are what one heartbeat costs."""
    store = statements.store
    renewals = [0]
    renew = store.renew_lease

    def counted(*args: Any, **kwargs: Any) -> Any:
        renewals[0] += 1
        return renew(*args, **kwargs)

    slot_us = SLOT_BASE_US - 2
    store.renew_lease = counted
    try:
        before = statements.sent()
        result = app.tasks["bench.sleepy"].apply((0.8,), headers=_slot_headers(slot_us))
        trips = statements.sent() - before
    finally:
        del store.renew_lease
    if result.state != "SUCCESS" or not renewals[0]:
        raise RuntimeError(f"heartbeat probe: state {result.state}, {renewals[0]} renewals")
    return {
        "renewals": renewals[0],
        "round_trips": trips,
        "per_heartbeat_slot": round((trips - slot_trips) / renewals[0], 2),
    }


# -- 9: end to end -------------------------------------------------------------


def measure_worker(config: Config, plan: SingletonPlan) -> list[dict[str, Any]]:
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-singleton-") as tmp:
        for label, url in _databases(tmp):
            try:
                rows.append(_worker(config, plan, label, url, tmp))
            except Exception as exc:
                rows.append({"database": label, "error": repr(exc)})
    return rows


_MARK = re.compile(r"BENCH-MARK (\S+) ([0-9.]+) (-?\d+)")


def _worker(
    config: Config, plan: SingletonPlan, label: str, url: str, workdir: str
) -> dict[str, Any]:
    from celery import Celery

    from celery_singlebeat.engine.publishing import PublishGroup
    from celery_singlebeat.timeline.slots import slot_task_id

    tag = uuid.uuid4().hex[:8]
    queue = f"bench-singleton-{tag}"
    prefix = f"benchsw{tag}_"
    sender = Celery("bench-singleton-sender", broker=config.broker_url)
    sender.conf.task_default_queue = queue
    # The worker is started once everything is queued: publishing speed and the
    # worker's start-up are outside the timed batches, which the worker itself
    # brackets with marks.
    order: list[str] = []
    slot_us = SLOT_BASE_US
    sent = 0
    with sender.producer_or_acquire() as producer:
        group: PublishGroup[int] = PublishGroup(producer)

        def send(name: str, args: tuple[Any, ...] = (), **options: Any) -> None:
            nonlocal sent
            sender.send_task(name, args, producer=producer, **options)
            group.added(sent)
            sent += 1
            if group.full:
                group.flush()

        def execution(kind: str) -> None:
            nonlocal slot_us
            if kind == "slot":
                send(
                    WORKER_TASKS[kind],
                    task_id=slot_task_id(ENTRY, slot_us),
                    headers=_slot_headers(slot_us),
                )
                slot_us += 1_000_000
            else:
                send(WORKER_TASKS[kind])

        try:
            for _ in range(plan.warmup):
                for kind in KINDS:
                    execution(kind)
            for r in range(plan.rounds):
                for kind in KINDS[r % 3 :] + KINDS[: r % 3]:
                    order.append(f"{r}:{kind}")
                    send("benchapp.mark", (f"{r}:{kind}:start",))
                    for _ in range(plan.batch):
                        execution(kind)
                    send("benchapp.mark", (f"{r}:{kind}:end",))
            send("benchapp.mark", ("done",))
            group.flush()
        finally:
            group.close()
    sender.close()
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(HERE), str(ROOT), os.environ.get("PYTHONPATH", "")]),
        "BENCH_BROKER": config.broker_url,
        "BENCH_QUEUE": queue,
        "BENCH_DB_URL": url,
        "BENCH_PREFIX": prefix,
        "BENCH_SINGLETON_TTL": "60",
    }
    argv = [CELERY, "-A", "benchapp", "worker", "-P", "solo", "-l", "warning", "-Q", queue]
    argv += ["-n", f"{queue}@%h", "--without-gossip", "--without-mingle", "--without-heartbeat"]
    worker = Replica.start(argv, env, workdir)
    try:
        marks = _wait_for_marks(worker, sent * 0.1 + 60)
    finally:
        worker.stop()
        config.broker.delete(queue)
        _delete_keys(config.broker, f"_kombu.binding*{queue}*")
    try:
        runs = _finished_runs(url, prefix)
    finally:
        _drop_tables(url, prefix)
    expected_runs = plan.warmup + plan.batch * plan.rounds
    if runs != expected_runs:
        raise RuntimeError(f"{runs} finished run rows, expected {expected_runs}")

    seconds = dict.fromkeys(KINDS, 0.0)
    trips = dict.fromkeys(KINDS, 0)
    # ms per execution of each kind, per round: a round's kinds ran seconds apart,
    # so their difference is the least touched by the machine's changing load
    rounds: list[dict[str, float]] = [{} for _ in range(plan.rounds)]
    for name in order:
        r, kind = name.split(":")
        (t0, rt0), (t1, rt1) = marks[f"{name}:start"], marks[f"{name}:end"]
        seconds[kind] += t1 - t0
        trips[kind] += rt1 - rt0
        rounds[int(r)][kind] = _ms((t1 - t0) / plan.batch)
    executions = plan.batch * plan.rounds
    row: dict[str, Any] = {"database": label, "executions": executions, "rounds_ms": rounds}
    for kind in KINDS:
        per = seconds[kind] / executions
        row[kind] = {
            "seconds": round(seconds[kind], 3),
            "per_s": round(executions / seconds[kind], 1),
            "ms_per_execution": _ms(per),
            "ms_median_of_rounds": round(statistics.median(x[kind] for x in rounds), 3),
            "round_trips": trips[kind] / executions,
        }
        if kind != "plain":
            row[kind]["added_ms"] = round(
                statistics.median(x[kind] - x["plain"] for x in rounds), 3
            )
            row[kind]["added_ms_overall"] = _ms(per - seconds["plain"] / executions)
    row["finished_run_rows"] = runs
    return row


def _wait_for_marks(worker: Replica, timeout: float) -> dict[str, tuple[float, int]]:
    deadline = time.monotonic() + timeout
    while True:
        marks = {}
        for line in list(worker.lines):
            found = _MARK.search(line)
            if found:
                marks[found[1]] = (float(found[2]), int(found[3]))
        if "done" in marks:
            return marks
        if worker.process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"the worker did not finish the batches:\n{worker.output()}")
        time.sleep(0.05)


# -- output ----------------------------------------------------------------------


def _kind_rows(
    measured: list[dict[str, Any]],
    cells: Callable[[dict[str, Any], dict[str, Any]], tuple[Any, ...]],
) -> list[tuple[Any, ...]]:
    """A row per database and kind of task (``cells`` of the database's row and
    the kind's figures), or one saying why a database has none."""
    rows: list[tuple[Any, ...]] = []
    for r in measured:
        if "error" in r:
            rows.append((r["database"], "unavailable", "", "", "", "", r["error"][:40]))
            continue
        rows.extend((r["database"], KIND_NAMES[kind], *cells(r, r[kind])) for kind in KINDS)
    return rows


def render(results: dict[str, Any]) -> str:
    m = results["machine"]
    plan = results["plan"]
    out = [
        "celery-singlebeat SingletonTask benchmark"
        + (" (--quick: fewer executions, rough figures)" if plan["quick"] else ""),
        *describe_machine(m, f"broker Redis DB {results['redis_db']}"),
        "",
    ]
    rows: list[tuple[Any, ...]]
    if "inprocess" in results:
        rows = _kind_rows(
            results["inprocess"],
            lambda r, k: (
                k["median_ms"],
                k["p95_ms"],
                k.get("added_median_ms", ""),
                k.get("added_p95_ms", ""),
                f"{k['round_trips']:g}" if r["database"] != MEMORY else "",
            ),
        )
        out.append(
            table(
                f"8. Per execution in-process: task.apply() of an empty task (Celery's tracer, "
                f"eager), {plan['executions']} executions per kind, interleaved",
                (
                    "database",
                    "task",
                    "median ms",
                    "p95 ms",
                    "added median ms",
                    "added p95 ms",
                    "round trips",
                ),
                rows,
            )
        )
        out.append("")
    if "worker" in results:
        rows = _kind_rows(
            results["worker"],
            lambda r, k: (
                k["per_s"],
                k["ms_median_of_rounds"],
                k.get("added_ms", ""),
                k.get("added_ms_overall", ""),
                f"{k['round_trips']:g}",
            ),
        )
        out.append(
            table(
                f"9. End to end: one celery worker -P solo, Redis broker, "
                f"{plan['rounds']} rounds x {plan['batch']} queued messages per kind, "
                "timed by the worker",
                (
                    "database",
                    "task",
                    "executions/s",
                    "ms per execution",
                    "added ms",
                    "added ms, overall",
                    "round trips",
                ),
                rows,
            )
        )
        out.append(
            "(ms per execution and added ms: median over the rounds, each round's kinds "
            "compared with each other; executions/s and overall: all rounds together)"
        )
        out.append("")
    if "inprocess" in results:
        rows = []
        for r in results["inprocess"]:
            if "error" in r or r["database"] == MEMORY:
                continue
            ops = r["operations"]
            rows.append(
                (
                    r["database"],
                    ops["acquire_lease"]["round_trips"],
                    ops["release_lease"]["round_trips"],
                    ops["begin_slot"]["round_trips"],
                    ops["end_slot"]["round_trips"],
                    ops["renew_lease"]["round_trips"],
                    f"{r['heartbeat']['per_heartbeat_slot']:g}",
                    f"{r['singleton']['round_trips']:g} / {r['slot']['round_trips']:g}",
                    ops["ping"]["median_ms"],
                )
            )
        out.append(
            table(
                "10. SQL round trips (SqlStore.round_trips) per operation, per execution and per "
                "heartbeat (every TTL/3)",
                (
                    "database",
                    "acquire",
                    "release",
                    "begin slot",
                    "end slot",
                    "heartbeat",
                    "heartbeat, slot",
                    "per execution / slot",
                    "trivial statement ms",
                ),
                rows,
            )
        )
        out.append("")
    verdict = results.get("postgresql_within_target")
    if verdict is not None:
        out.append(
            f"PostgreSQL: SingletonTask adds <= {TARGET_MS:g} ms per execution "
            f"(worst of the figures above, slot header included): "
            + ("yes" if verdict else "NO")
            + f" ({results['postgresql_added_ms_worst']:g} ms)"
        )
    return "\n".join(out)


def _verdict(results: dict[str, Any]) -> None:
    added: list[float] = []
    for section, field in (("inprocess", "added_median_ms"), ("worker", "added_ms")):
        for row in results.get(section, []):
            if row["database"] == "PostgreSQL" and "error" not in row:
                added += [row[kind][field] for kind in ("singleton", "slot")]
    if added:
        results["postgresql_added_ms_worst"] = max(added)
        results["postgresql_within_target"] = max(added) <= TARGET_MS


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer executions (~30 s in all)")
    parser.add_argument("--only", default="8,9,10", help="measurements to run, e.g. 8,10")
    parser.add_argument("--json", type=Path, default=None, help="where to write the results")
    parser.add_argument("--redis-db", type=int, default=9, help="the broker's Redis DB")
    parser.add_argument("--executions", type=int, help="(8) timed executions per kind")
    parser.add_argument("--batch", type=int, help="(9) messages per kind and round")
    args = parser.parse_args(argv)
    only = {int(x) for x in args.only.split(",") if x.strip()}
    plan = SingletonPlan.make(args.quick)
    if args.executions:
        plan = replace(plan, executions=args.executions)
    if args.batch:
        plan = replace(plan, batch=args.batch)
    config = Config(Plan.make(args.quick), args.redis_db)
    started = time.monotonic()
    results: dict[str, Any] = {
        "machine": machine(),
        "plan": plan.__dict__,
        "redis_db": args.redis_db,
        "target_added_ms": TARGET_MS,
    }
    if only & {8, 10}:
        results["inprocess"] = measure_inprocess(plan)
    if 9 in only:
        results["worker"] = measure_worker(config, plan)
    _verdict(results)
    name = "singleton-latest-quick.json" if args.quick else "singleton-latest.json"
    finish(results, started, render, args.json or HERE / "results" / name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
