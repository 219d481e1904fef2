"""Benchmark celery-singlebeat against the baselines, measured in the same run.

Three measurements (see benchmarks/README.md for how to read them):

1. duplicates: real ``celery beat`` replicas (1 and 3) of each scheduler, 5
   entries every second; the messages that reach the Redis broker are counted;
2. SQL round trips per tick at 1, 100 and 1,000 due entries: the scheduler's
   tick driven in-process on a real ``SqlStore`` (PostgreSQL, MariaDB, SQLite);
3. dispatches per second: one real ``celery beat`` with 2,000 entries due every
   second, per scheduler, and a plain ``app.send_task`` loop as the ceiling.

Usage: ``python benchmarks/bench_scheduler.py [--quick] [--only 1,2,3] [--json PATH]``.
Redis DB 9 (broker) and 10 (redbeat) by default; ``--redis-db N`` uses N and N+1.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from importlib import metadata
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
#: the celery_singlebeat the replicas import: this tree's, unless bench_fleet.py
#: points it at another commit's to measure before and after in one run
PACKAGE_ROOT = Path(os.environ.get("BENCH_PACKAGE_ROOT") or ROOT)
CELERY = str(Path(sys.executable).with_name("celery"))

PG_URL = os.environ.get("SB_TEST_PG", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
MYSQL_URL = os.environ.get("SB_TEST_MYSQL", "mysql+pymysql://root@127.0.0.1:3306/test")
REDIS = os.environ.get("SB_TEST_REDIS", "redis://127.0.0.1:6379")

NAMES = {
    "singlebeat": "celery-singlebeat",
    "default": "celery default (PersistentScheduler)",
    "redbeat": "celery-redbeat",
    "django": "django-celery-beat",
    "sendloop": "plain app.send_task loop",
    "batchbeat": "uncoordinated batch sender (no database)",
}

#: the issue's figures for measurement 3 on this kind of machine (dispatches/s).
TARGETS = {
    "singlebeat": ">= 1900, >= 3x redbeat",
    "default": "~400",
    "redbeat": "~540",
    "sendloop": "~2000",
    "batchbeat": "~2200",
}
SINGLEBEAT_TARGET = 1900.0


@dataclass(frozen=True)
class Plan:
    """Durations of one run; ``--quick`` shortens every window, never drops a row."""

    quick: bool
    #: measurement 1: length of the counted window, and the settling time before it.
    dup_window: float
    dup_settle: float
    #: measurement 2: ticks measured per (database, size).
    rt_ticks: int
    #: measurement 3: warm-up after the first message, then the counted window.
    rate_warmup: float
    rate_window: float

    @classmethod
    def make(cls, quick: bool) -> Plan:
        if quick:
            return cls(True, dup_window=2, dup_settle=1.5, rt_ticks=2, rate_warmup=1, rate_window=3)
        return cls(False, dup_window=30, dup_settle=2, rt_ticks=5, rate_warmup=3, rate_window=15)


# -- machine --------------------------------------------------------------------


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "not installed"


def _server_version(url: str, query: str) -> str:
    from sqlalchemy import create_engine, text

    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            return str(conn.execute(text(query)).scalar())
    except Exception as exc:  # a missing service is reported, not fatal
        return f"unavailable ({type(exc).__name__})"
    finally:
        engine.dispose()


def machine() -> dict[str, Any]:
    """What the figures were measured on."""
    cpu = "unknown"
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as info:
        for line in info:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    load = os.getloadavg()
    return {
        "nproc": os.cpu_count(),
        "cpu": cpu,
        "load_average_1m_at_start": round(load[0], 2),
        "python": platform.python_version(),
        "celery": _version("celery"),
        "kombu": _version("kombu"),
        "sqlalchemy": _version("SQLAlchemy"),
        "celery_redbeat": _version("celery-redbeat"),
        "django_celery_beat": _version("django-celery-beat"),
        "django": _version("Django"),
        "redis_py": _version("redis"),
        "psycopg": _version("psycopg"),
        "postgresql_server": _server_version(PG_URL, "SHOW server_version"),
        "mariadb_server": _server_version(MYSQL_URL, "SELECT VERSION()"),
    }


# -- processes -------------------------------------------------------------------


def _drop_tables(url: str, prefix: str) -> None:
    from sqlalchemy import create_engine

    from celery_singlebeat.store.sql.schema import Tables

    engine = create_engine(url)
    try:
        Tables(prefix).metadata.drop_all(engine, checkfirst=True)
    finally:
        engine.dispose()


def _delete_keys(client: Any, pattern: str) -> None:
    keys = list(client.scan_iter(match=pattern, count=1000))
    for start in range(0, len(keys), 500):
        client.delete(*keys[start : start + 500])


@dataclass
class Replica:
    """One ``celery beat`` (or send loop) subprocess; its output is read by a thread."""

    process: subprocess.Popen[str]
    ready: threading.Event = field(default_factory=threading.Event)
    lines: list[str] = field(default_factory=list)
    #: set once the process closed its output: ``lines`` holds all of it
    eof: threading.Event = field(default_factory=threading.Event)

    def _read(self) -> None:
        assert self.process.stdout is not None
        try:
            for line in self.process.stdout:
                if "BENCH-READY" in line:
                    self.ready.set()
                self.lines.append(line.rstrip())
        finally:
            self.eof.set()

    @classmethod
    def start(cls, argv: Sequence[str], env: dict[str, str], cwd: str) -> Replica:
        process = subprocess.Popen(
            argv,
            env=env,
            cwd=cwd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        replica = cls(process)
        threading.Thread(target=replica._read, daemon=True).start()
        return replica

    def output(self) -> str:
        return "\n".join(self.lines[-30:])

    def stop(self, timeout: float = 10.0) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout)


class Scenario:
    """Replicas of one scheduler sharing one broker queue (and database or lock)."""

    def __init__(
        self,
        kind: str,
        replicas: int,
        entries: int,
        every: float,
        config: Config,
        extra_env: dict[str, str] | None = None,
        db_url: str = PG_URL,
    ):
        self.kind = kind
        #: singlebeat's database (bench_load.py gives the run a database of its own)
        self.db_url = db_url
        self.entries = entries
        self.replicas = replicas
        self.config = config
        tag = uuid.uuid4().hex[:8]
        self.queue = f"bench-{kind}-{replicas}x{entries}-{tag}"
        self.prefix = f"bench{tag}_"
        self.redbeat_prefix = f"bench-redbeat-{tag}:"
        self.workdir = tempfile.mkdtemp(prefix=f"bench-{kind}-")
        self.env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(
                [os.environ.get("PYTHONPATH", ""), str(HERE), str(PACKAGE_ROOT)]
            ),
            "BENCH_SCHEDULER": kind,
            "BENCH_BROKER": config.broker_url,
            "BENCH_QUEUE": self.queue,
            "BENCH_ENTRIES": str(entries),
            "BENCH_EVERY": str(every),
            "BENCH_DB_URL": db_url,
            "BENCH_PREFIX": self.prefix,
            "BENCH_REDBEAT_URL": config.redbeat_url,
            "BENCH_REDBEAT_PREFIX": self.redbeat_prefix,
            **(extra_env or {}),
        }
        self.running: list[Replica] = []

    def start(self, stamp: bool) -> None:
        for i in range(self.replicas):
            self.start_replica(i, stamp)

    def start_replica(
        self, index: int, stamp: bool = True, env: dict[str, str] | None = None
    ) -> Replica:
        """Start replica ``index``, with ``env`` on top of the scenario's. Started
        again after it stopped, it keeps its schedule file, as a restarted
        container keeps its pod's volume."""
        env = {**self.env, "BENCH_STAMP": "1" if stamp else "0", **(env or {})}
        # the replica's index names its database sessions (application_name)
        env["BENCH_REPLICA"] = str(index)
        if self.kind in ("sendloop", "batchbeat"):
            seconds = self.config.plan.rate_warmup + self.config.plan.rate_window + 3
            argv = [sys.executable, str(HERE / "benchapp.py"), self.kind, str(seconds)]
        else:
            # -l warning for every scheduler: singlebeat logs each slot it wins at
            # INFO, Celery and redbeat each task they send; none of it is measured.
            argv = [CELERY, "-A", "benchapp", "beat", "-l", "warning"]
            argv += ["-s", os.path.join(self.workdir, f"schedule-{index}")]
        replica = Replica.start(argv, env, self.workdir)
        self.running.append(replica)
        return replica

    def wait_ready(self, timeout: float = 60.0) -> float:
        deadline = time.monotonic() + timeout
        for replica in self.running:
            while not replica.ready.wait(0.1):
                if replica.process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"{self.kind}: a replica did not start:\n{replica.output()}")
        return time.time()

    def stop(self) -> None:
        for replica in self.running:
            replica.process.send_signal(signal.SIGTERM)
        for replica in self.running:
            replica.stop()

    def cleanup(self) -> None:
        self.config.broker.delete(self.queue)
        _delete_keys(self.config.broker, f"_kombu.binding*{self.queue}*")
        _delete_keys(self.config.redbeat, f"{self.redbeat_prefix}*")
        if self.kind == "singlebeat":
            _drop_tables(self.db_url, self.prefix)
        for path in Path(self.workdir).glob("*"):
            path.unlink()
        os.rmdir(self.workdir)


@dataclass
class Config:
    plan: Plan
    redis_db: int

    @property
    def broker_url(self) -> str:
        return f"{REDIS}/{self.redis_db}"

    @property
    def redbeat_url(self) -> str:
        return f"{REDIS}/{self.redis_db + 1}"

    def __post_init__(self) -> None:
        import redis

        self.broker = redis.Redis.from_url(self.broker_url)
        self.redbeat = redis.Redis.from_url(self.redbeat_url)


@contextlib.contextmanager
def running(scenarios: Sequence[Scenario], stamp: bool) -> Iterator[None]:
    try:
        for scenario in scenarios:
            scenario.start(stamp)
        yield
    finally:
        for scenario in scenarios:
            scenario.stop()


# -- 1. duplicates ------------------------------------------------------------------


def measure_duplicates(config: Config) -> list[dict[str, Any]]:
    """5 entries every 1 s, 1 and 3 replicas of each scheduler, all at once.

    The six scenarios share the machine (at 5 messages a second each the load is
    negligible) but nothing else: each has its own queue, tables or lock.
    """
    plan = config.plan
    entries, every = 5, 1.0
    scenarios = [
        Scenario(kind, replicas, entries, every, config)
        for kind in ("singlebeat", "default", "redbeat")
        for replicas in (1, 3)
    ]
    try:
        with running(scenarios, stamp=True):
            ready = max(s.wait_ready() for s in scenarios)
            start = ready + plan.dup_settle
            end = start + plan.dup_window
            # the last slots of the window are sent a few ms after their instant
            _sleep_until(end + 0.5)
            # ...or later on a busy machine: a slot sent late is late, not missed
            # (the delay columns show it), so singlebeat's get a bounded wait.
            due = entries * round((end - start) / every)
            deadline = time.monotonic() + 10
            for scenario in scenarios:
                if scenario.kind != "singlebeat":
                    continue
                while len(_window_slots(scenario, start, end)) < due:
                    if time.monotonic() > deadline:
                        break
                    time.sleep(0.1)
        rows = [_count_duplicates(s, entries, every, start, end) for s in scenarios]
    finally:
        for scenario in scenarios:
            scenario.cleanup()
    return rows


def _sleep_until(wall: float) -> None:
    while (left := wall - time.time()) > 0:
        time.sleep(min(left, 0.5))


def _in_window(headers: dict[str, Any], start_us: int, end_us: int) -> bool:
    """Whether a message counts in the window: singlebeat's by its slot's
    instant, which is exact (a window of N periods holds N instants per entry,
    however late each is sent); the others', which name no slot, by when they
    were sent, which can shift a run across an edge of the window."""
    slot = headers.get("singlebeat_slot")
    at = slot["at_us"] if slot is not None else headers.get("bench_sent_us")
    return at is not None and start_us <= at < end_us


def _window_slots(scenario: Scenario, start: float, end: float) -> set[tuple[str, int]]:
    """The distinct singlebeat slots of the window now in the scenario's queue."""
    start_us, end_us = int(start * 1e6), int(end * 1e6)
    slots = set()
    for item in scenario.config.broker.lrange(scenario.queue, 0, -1):
        headers = json.loads(item)["headers"]
        slot = headers.get("singlebeat_slot")
        if slot is not None and _in_window(headers, start_us, end_us):
            slots.add((slot["entry"], slot["at_us"]))
    return slots


def _count_duplicates(
    scenario: Scenario, entries: int, every: float, start: float, end: float
) -> dict[str, Any]:
    raw = scenario.config.broker.lrange(scenario.queue, 0, -1)
    start_us, end_us = int(start * 1e6), int(end * 1e6)
    per_entry: Counter[str] = Counter()
    slots: dict[str, set[int]] = defaultdict(set)
    delays_ms: list[float] = []
    for item in raw:
        headers = json.loads(item)["headers"]
        sent = headers.get("bench_sent_us")
        if sent is None or not _in_window(headers, start_us, end_us):
            continue
        entry = headers["argsrepr"]
        per_entry[entry] += 1
        slot = headers.get("singlebeat_slot")
        if slot is not None:
            slots[entry].add(slot["at_us"])
            # publish instant minus slot instant; the database runs on this host,
            # so both are on the same clock
            delays_ms.append((sent - slot["at_us"]) / 1000)
    # Any window of N periods holds exactly N instants of an interval entry.
    due_per_entry = round((end - start) / every)
    if scenario.kind == "singlebeat":
        # every message names its slot: a repeat of a slot is a duplicate
        distinct = sum(len(s) for s in slots.values())
    else:
        # no run identity across replicas: at most one message per due instant is
        # a run, every message beyond that is a duplicate
        distinct = sum(min(n, due_per_entry) for n in per_entry.values())
    messages = sum(per_entry.values())
    due = due_per_entry * entries
    return {
        "scheduler": scenario.kind,
        "replicas": scenario.replicas,
        "window_s": round(end - start, 3),
        "slots_due": due,
        "messages": messages,
        "distinct_runs": distinct,
        "duplicates": messages - distinct,
        "missed": max(0, due - distinct),
        **(_delays(delays_ms) if delays_ms else {}),
    }


def _delays(delays_ms: list[float], percentile: int = 95) -> dict[str, float]:
    """Dispatch delay (slot instant to publish): median, a percentile, max."""
    ordered = sorted(delays_ms)
    at = min(len(ordered) - 1, int(len(ordered) * percentile / 100))
    return {
        "delay_ms_median": round(statistics.median(ordered), 1),
        f"delay_ms_p{percentile}": round(ordered[at], 1),
        "delay_ms_max": round(ordered[-1], 1),
    }


# -- 2. SQL round trips per tick -----------------------------------------------------


def measure_round_trips(
    config: Config, sizes: Sequence[int] = (1, 100, 1000)
) -> list[dict[str, Any]]:
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-sqlite-") as tmp:
        databases = [
            ("PostgreSQL", PG_URL),
            ("MariaDB", MYSQL_URL),
            ("SQLite", f"sqlite:///{tmp}/bench.sqlite"),
        ]
        for label, url in databases:
            for size in sizes:
                try:
                    rows.append(_tick_round_trips(label, url, size, config.plan.rt_ticks))
                except Exception as exc:  # a database that is down gets a row saying so
                    rows.append({"database": label, "due_entries": size, "error": repr(exc)})
    return rows


def _tick_round_trips(label: str, url: str, size: int, ticks: int) -> dict[str, Any]:
    from celery import Celery
    from sqlalchemy import event

    from celery_singlebeat import SingleBeatScheduler
    from celery_singlebeat.store.sql import SqlStore

    prefix = f"benchrt{uuid.uuid4().hex[:8]}_"
    period = 0.5
    # memory:// keeps broker I/O out of the figure: this measures the database side.
    app = Celery("bench-round-trips", broker="memory://")
    app.conf.update(
        singlebeat_url=url,
        singlebeat_table_prefix=prefix,
        beat_max_loop_interval=1,
        beat_schedule={
            f"entry-{i:04d}": {"task": "bench.noop", "schedule": timedelta(seconds=period)}
            for i in range(size)
        },
    )
    scheduler = SingleBeatScheduler(app=app)
    try:
        # first tick: connect, create the tables, register, first sweep and prune
        delay = scheduler.tick()
        store = scheduler.engine.store
        assert isinstance(store, SqlStore)
        # With pool_pre_ping (PostgreSQL, MariaDB) every checkout costs one more
        # round trip that SqlStore.round_trips does not see: count them apart.
        checkouts = [0]
        event.listen(
            store.engine, "checkout", lambda *_: checkouts.__setitem__(0, checkouts[0] + 1)
        )
        samples: list[dict[str, float]] = []
        deadline = time.monotonic() + 30
        while len(samples) < ticks and time.monotonic() < deadline:
            time.sleep(delay)
            before = (store.round_trips, checkouts[0], scheduler.stats["claimed"])
            # the feed read (about once a second, whatever is due) is not the
            # cost of sending: counted apart, as the idle cost (bench_scale 7)
            reads = scheduler.engine.feed.reads
            lost = scheduler.stats["lost"]
            # the periodic work (sweep, read of the live replicas, prune) that a
            # tick may also do, every 5 s or a minute: not the cost of a tick
            periodic = scheduler.engine.periodic_marks()
            started = time.perf_counter()
            delay = scheduler.tick()
            elapsed = time.perf_counter() - started
            due = scheduler.stats["claimed"] - before[2] + scheduler.stats["lost"] - lost
            if due == 0:
                continue  # woke up a hair early: nothing was due, nothing was sent
            if periodic != scheduler.engine.periodic_marks():
                continue  # a slow machine reached the next sweep: measure another tick
            samples.append(
                {
                    "due": due,
                    "statements": store.round_trips - before[0] - (
                        scheduler.engine.feed.reads - reads
                    ),
                    "checkouts": checkouts[0] - before[1] - (scheduler.engine.feed.reads - reads),
                    "ms": elapsed * 1000,
                }
            )
        if len(samples) < ticks:
            raise RuntimeError(f"only {len(samples)} ticks with due entries in 30 s")
        pre_ping = bool(getattr(store.engine.pool, "_pre_ping", False))
        return {
            "database": label,
            "due_entries": size,
            "ticks": len(samples),
            "due_per_tick": max(s["due"] for s in samples),
            "statements_per_tick": max(s["statements"] for s in samples),
            "pre_pings_per_tick": max(s["checkouts"] for s in samples) if pre_ping else 0,
            "tick_ms_median": round(statistics.median(s["ms"] for s in samples), 1),
        }
    finally:
        scheduler.close()
        _drop_tables(url, prefix)


# -- 3. dispatches per second ---------------------------------------------------------


def measure_rates(config: Config, entries: int = 2000) -> list[dict[str, Any]]:
    rows = []
    for kind in ("singlebeat", "default", "redbeat", "sendloop", "batchbeat"):
        scenario = Scenario(kind, 1, entries, 1.0, config)
        try:
            rows.append(_rate(scenario, config.plan))
        finally:
            scenario.cleanup()
    return rows


def _rate(scenario: Scenario, plan: Plan) -> dict[str, Any]:
    """Messages reaching the broker per second over a window after warm-up.

    The queue is drained (LLEN + DEL in one transaction) every ``bin_s`` so it
    never grows big; the counts per bin give the steady rate and the rate while
    sending (bins with at least one message), which tells apart "kept up with the
    offered load and idled" from "sends as fast as it can".
    """
    broker = scenario.config.broker
    bin_s = 0.05
    bins: list[tuple[float, int]] = []

    def drain() -> int:
        pipe = broker.pipeline(transaction=True)
        pipe.llen(scenario.queue)
        pipe.delete(scenario.queue)
        return int(pipe.execute()[0])

    with running([scenario], stamp=False):
        scenario.wait_ready()
        deadline = time.monotonic() + 60
        while drain() == 0:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{scenario.kind}: no message in 60 s")
            if scenario.running[0].process.poll() is not None:
                raise RuntimeError(f"{scenario.kind} exited:\n{scenario.running[0].output()}")
            time.sleep(0.01)
        first = time.monotonic()
        window_start = first + plan.rate_warmup
        window_end = window_start + plan.rate_window
        next_bin = window_start
        while next_bin < time.monotonic():
            next_bin += bin_s
        # discard the warm-up
        while time.monotonic() < window_start:
            time.sleep(0.01)
            drain()
        drain()
        counted_from = time.monotonic()
        wall_from = time.time()
        while (now := time.monotonic()) < window_end:
            time.sleep(max(0.0, min(bin_s, window_end - now)))
            bins.append((time.monotonic(), drain()))
        counted_to = bins[-1][0]
        wall_to = time.time()
    total = sum(n for _, n in bins)
    elapsed = counted_to - counted_from
    busy_bins = [n for _, n in bins if n]
    busy_s = len(busy_bins) * (elapsed / max(len(bins), 1))
    return {
        "sender": scenario.kind,
        "entries": scenario.entries if scenario.kind != "sendloop" else None,
        "replicas": scenario.replicas,
        "wall_window": [wall_from, wall_to],
        "window_s": round(elapsed, 2),
        "messages": total,
        "dispatches_per_s": round(total / elapsed, 1),
        "rate_while_sending_per_s": round(total / busy_s, 1) if busy_s else 0.0,
        "busy_fraction": round(len(busy_bins) / max(len(bins), 1), 2),
        "target": TARGETS[scenario.kind],
    }


# -- output ----------------------------------------------------------------------


def table(title: str, header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    cells = [[str(c) for c in header]] + [["" if c is None else str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]

    def line(r: Sequence[str]) -> str:
        return "  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths)))

    rule = "-" * len(line(cells[0]))
    return "\n".join([title, rule, line(cells[0]), rule, *(line(r) for r in cells[1:]), rule])


def describe_machine(m: dict[str, Any], servers_note: str) -> list[str]:
    """The lines every table is preceded by: what :func:`machine` found."""
    return [
        f"machine: {m['nproc']} CPUs, {m['cpu']}, load average {m['load_average_1m_at_start']} "
        f"at start; Python {m['python']}",
        f"versions: celery {m['celery']}, kombu {m['kombu']}, SQLAlchemy {m['sqlalchemy']}, "
        f"celery-redbeat {m['celery_redbeat']}, django-celery-beat "
        f"{m.get('django_celery_beat', '?')} (Django {m.get('django', '?')}), "
        f"redis-py {m['redis_py']}, psycopg {m['psycopg']}",
        f"servers: PostgreSQL {m['postgresql_server']}, MariaDB {m['mariadb_server']}; "
        + servers_note,
    ]


def render(results: dict[str, Any]) -> str:
    m = results["machine"]
    plan = results["plan"]
    out = [
        "celery-singlebeat benchmark"
        + (" (--quick: short windows, rough figures)" if plan["quick"] else ""),
        *describe_machine(m, f"broker Redis DB {results['redis_db']}"),
        "",
    ]
    rows: list[tuple[Any, ...]]
    if "duplicates" in results:
        rows = [
            (
                NAMES[r["scheduler"]],
                r["replicas"],
                r["slots_due"],
                r["messages"],
                r["distinct_runs"],
                r["duplicates"],
                r["missed"],
                (
                    f"{r['delay_ms_median']:g} / {r['delay_ms_p95']:g}"
                    if "delay_ms_median" in r
                    else ""
                ),
            )
            for r in results["duplicates"]
        ]
        out.append(
            table(
                f"1. Duplicates: 5 entries every 1 s, {plan['dup_window']:g} s window, real "
                "celery beat replicas, messages read from the Redis queue",
                (
                    "scheduler",
                    "replicas",
                    "slots due",
                    "messages",
                    "distinct runs",
                    "duplicates",
                    "missed",
                    "delay ms median / p95",
                ),
                rows,
            )
        )
        out.append("")
    if "round_trips" in results:
        rows = []
        for r in results["round_trips"]:
            if "error" in r:
                rows.append(
                    (r["database"], r["due_entries"], "unavailable", "", "", r["error"][:40])
                )
                continue
            rows.append(
                (
                    r["database"],
                    r["due_entries"],
                    r["statements_per_tick"],
                    r["pre_pings_per_tick"],
                    r["tick_ms_median"],
                    r["ticks"],
                )
            )
        out.append(
            table(
                "2. SQL round trips per tick (SingleBeatScheduler.tick in-process, real SqlStore, "
                "memory:// broker)",
                (
                    "database",
                    "due entries",
                    "statements",
                    "pool pre-pings",
                    "tick ms (median)",
                    "ticks",
                ),
                rows,
            )
        )
        out.append("")
    if "rates" in results:
        rows = [
            (
                NAMES[r["sender"]] + (" (PostgreSQL)" if r["sender"] == "singlebeat" else ""),
                r["dispatches_per_s"],
                r["rate_while_sending_per_s"],
                r["busy_fraction"],
                r["messages"],
                r["target"],
            )
            for r in results["rates"]
        ]
        out.append(
            table(
                f"3. Dispatches per second: one replica, 2000 entries due every 1 s, -l warning, "
                f"{plan['rate_window']:g} s window after {plan['rate_warmup']:g} s warm-up",
                ("sender", "dispatches/s", "while sending/s", "busy", "messages", "issue's figure"),
                rows,
            )
        )
        verdict = results.get("singlebeat_meets_target")
        if verdict is not None:
            out.append(
                f"celery-singlebeat one replica >= {SINGLEBEAT_TARGET:g} dispatches/s and "
                ">= 3x celery-redbeat: " + ("yes" if verdict else "NO")
            )
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="short windows (< 60 s in all)")
    parser.add_argument("--only", default="1,2,3", help="measurements to run, e.g. 1,3")
    parser.add_argument("--json", type=Path, default=None, help="where to write the results")
    parser.add_argument(
        "--redis-db", type=int, default=9, help="broker DB; redbeat uses the next one"
    )
    args = parser.parse_args(argv)
    only = {int(x) for x in args.only.split(",") if x.strip()}
    plan = Plan.make(args.quick)
    config = Config(plan, args.redis_db)
    started = time.monotonic()
    results: dict[str, Any] = {
        "machine": machine(),
        "plan": plan.__dict__,
        "redis_db": args.redis_db,
    }
    if 1 in only:
        results["duplicates"] = measure_duplicates(config)
    if 2 in only:
        results["round_trips"] = measure_round_trips(config)
    if 3 in only:
        results["rates"] = measure_rates(config)
        ours = next(r for r in results["rates"] if r["sender"] == "singlebeat")
        redbeat = next(r for r in results["rates"] if r["sender"] == "redbeat")
        results["singlebeat_meets_target"] = (
            ours["dispatches_per_s"] >= SINGLEBEAT_TARGET
            and ours["dispatches_per_s"] >= 3 * redbeat["dispatches_per_s"]
        )
    name = "latest-quick.json" if args.quick else "latest.json"
    finish(results, started, render, args.json or HERE / "results" / name)
    return 0


def finish(
    results: dict[str, Any],
    started: float,
    render: Callable[[dict[str, Any]], str],
    path: Path,
) -> None:
    """End a run begun at monotonic ``started``: note the load average at its end
    and its duration, print its tables, write its results to ``path``."""
    results["load_average_1m_at_end"] = round(os.getloadavg()[0], 2)
    results["elapsed_s"] = round(time.monotonic() - started, 1)
    print(render(results))
    print(
        f"\n(run took {results['elapsed_s']:g} s; load average at end "
        f"{results['load_average_1m_at_end']})"
    )
    write_results(results, path)


def write_results(results: dict[str, Any], path: Path) -> None:
    """Write a run's results as JSON (benchmarks/results/ unless --json says)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=2) + "\n")
    print(f"results written to {path}")


if __name__ == "__main__":
    sys.exit(main())
