"""Load: 3 replicas, 10,000 entries (1-minute crontabs and intervals), 5 minutes.

Three real ``celery beat`` replicas with ``SingleBeatScheduler`` on PostgreSQL
(a database of the run's own, so that ``pg_stat_database`` counts this run
alone) and a Redis broker. Half the entries are ``crontab()`` (every minute, so
thousands fall due in the same second), the rest intervals of 5, 10, 15, 30
and 60 s. Over the window the harness

* drains the queue continuously and judges the messages against the slots it
  computes itself (interval anchors from the entries table, crontab instants =
  every whole minute): due, messages, distinct, duplicates, missed, sent but not
  due, dispatch delay (publish instant minus slot);
* counts the database's transactions (``pg_stat_database``) against the
  statements each replica says it sent, and samples, every second, the CPU
  time of the PostgreSQL backends serving the database (``/proc``), of the
  whole PostgreSQL server, and of each beat replica.

Usage: ``python benchmarks/bench_load.py [--quick] [--duration S] [--entries N]
[--json PATH]``. Redis DB 13 by default (``--redis-db N``). Exits 1 unless every
due slot was sent exactly once and nothing else was sent.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bench_scale import _owners, _peak_rss_mb, wait_registered  # noqa: E402
from bench_scheduler import (  # noqa: E402
    PG_URL,
    Config,
    Plan,
    Replica,
    Scenario,
    _delays,
    _sleep_until,
    describe_machine,
    finish,
    machine,
    running,
    table,
)

US = 1_000_000
MINUTE_US = 60 * US
#: singlebeat_missed_grace's default: a slot planned later than this is "missed"
GRACE_MS = 5000.0
#: celery beat's log lines that say something went wrong (the replicas run at -l warning)
_WARNING = re.compile(r": (WARNING|ERROR|CRITICAL)/")
CLOCK_TICK = os.sysconf("SC_CLK_TCK")
PERIODS = (5.0, 10.0, 15.0, 30.0, 60.0)


@dataclass(frozen=True)
class LoadPlan:
    """One run's shape; ``--quick`` keeps every figure, on a smaller load."""

    quick: bool
    entries: int
    crontabs: int  # of the entries, crontab() every minute; the rest intervals
    window: float  # measured seconds; 60 or more holds at least one whole minute
    settle: float  # after registration: the replicas learn of each other
    tail: float  # after every due slot arrived: a late repeat would still show
    periods: tuple[float, ...] = PERIODS
    replicas: int = 3

    @classmethod
    def make(cls, quick: bool, entries: int | None, duration: float | None) -> LoadPlan:
        if quick:
            n, window, settle, tail = entries or 2000, duration or 60.0, 6.0, 2.0
        else:
            # tail: a lease (15 s) and a sweep (5 s), for a takeover's repeat
            n, window, settle, tail = entries or 10_000, duration or 300.0, 10.0, 20.0
        return cls(quick, n, n // 2, window, settle, tail)


# -- the run's own database -------------------------------------------------------


@contextlib.contextmanager
def own_database() -> Iterator[tuple[str, str]]:
    """A fresh database on the PostgreSQL server of ``PG_URL``, dropped afterwards:
    its statistics count this run's statements and no one else's."""
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    name = f"singlebeat_load_{uuid.uuid4().hex[:8]}"
    admin = create_engine(PG_URL, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
        try:
            url = make_url(PG_URL).set(database=name)
            yield name, url.render_as_string(hide_password=False)
        finally:
            with admin.connect() as conn:
                conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    finally:
        admin.dispose()


# -- what is due -------------------------------------------------------------------

_INTERVAL = re.compile(r"every([0-9.]+)s-\d+$")


def due_slots(anchors: dict[str, int], start_us: int, end_us: int) -> set[tuple[str, int]]:
    """Every slot in [start, end) of benchapp's named entries, computed from the
    schedules alone: an interval's ``anchor + k * period`` (k >= 1), a
    ``crontab()``'s every whole minute."""
    minutes = range(-(-start_us // MINUTE_US) * MINUTE_US, end_us, MINUTE_US)
    due: set[tuple[str, int]] = set()
    for name, anchor in anchors.items():
        if name.startswith("cron-"):
            due.update((name, at) for at in minutes)
            continue
        match = _INTERVAL.match(name)
        if match is None:
            raise ValueError(f"entry {name!r}: not one of benchapp's load entries")
        period = round(float(match.group(1)) * US)
        first = max(1, -(-(start_us - anchor) // period))
        due.update((name, at) for at in range(anchor + first * period, end_us, period))
    return due


# -- the queue ---------------------------------------------------------------------


@dataclass
class Drain:
    """Empties the queue every 0.2 s, keeping each message's slot and publish instant.

    The queue never grows to a burst's size in Redis, and nothing is lost
    between reads: LRANGE and DEL run in one transaction."""

    broker: Any
    queue: str
    #: (entry, slot µs, publish µs) of every message, in arrival order
    seen: list[tuple[str, int, int]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def once(self) -> int:
        pipe = self.broker.pipeline(transaction=True)
        pipe.lrange(self.queue, 0, -1)
        pipe.delete(self.queue)
        items = pipe.execute()[0]
        for item in items:
            headers = json.loads(item)["headers"]
            slot = headers["singlebeat_slot"]
            self.seen.append((slot["entry"], int(slot["at_us"]), int(headers["bench_sent_us"])))
        return len(items)

    def start(self) -> None:
        def loop() -> None:
            while not self._stop.wait(0.2):
                self.once()

        self._thread = threading.Thread(target=loop, name="drain", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.once()  # what came in after the last read


# -- CPU and database statistics ----------------------------------------------------


def _proc_stat(pid: int) -> list[str] | None:
    """The fields of /proc/<pid>/stat after the command name (field 3 first)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rpartition(")")[2].split()
    except OSError:
        return None


def cpu_seconds(pid: int, children: bool = False) -> float | None:
    """User + system CPU of a process (plus its reaped children's, if asked)."""
    fields = _proc_stat(pid)
    if fields is None:
        return None
    ticks = int(fields[11]) + int(fields[12])  # utime, stime
    if children:
        ticks += int(fields[13]) + int(fields[14])  # cutime, cstime
    return ticks / CLOCK_TICK


def server_cpu_seconds(postmaster: int) -> float | None:
    """CPU of a PostgreSQL server so far: the postmaster with its reaped children
    (every backend that exited), plus each live child. A backend that exits
    moves its time from the second term to the first, so the sum only grows,
    and its difference over a window counts every process of the server."""
    total = cpu_seconds(postmaster, children=True)
    if total is None:
        return None
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            fields = _proc_stat(int(entry.name))
            if fields is not None and int(fields[1]) == postmaster:
                total += (int(fields[11]) + int(fields[12])) / CLOCK_TICK
    return total


@dataclass
class Backend:
    label: str  # the session's application_name, or its backend type
    start: float  # CPU seconds when the window started (0 for one born in it)
    last: float


class DatabaseSampler:
    """Samples the database's backends every second from a connection to another
    database of the same server, so that its own queries count in neither the
    database's transactions nor its backends' CPU.

    A backend's CPU is read from /proc (the server runs on this host); one that
    exits between two samples loses at most its last second. Backends persist in
    the replicas' connection pools, so nearly all live through the window."""

    STATS = ("xact_commit", "xact_rollback", "tup_inserted", "tup_updated", "tup_deleted")

    def __init__(self, database: str) -> None:
        from sqlalchemy import create_engine

        self.database = database
        self.engine = create_engine(PG_URL, isolation_level="AUTOCOMMIT", pool_size=1)
        self.backends: dict[int, Backend] = {}
        self.in_window = False
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="db-sampler", daemon=True)
        self.postmaster = self._postmaster()

    def _postmaster(self) -> int | None:
        from sqlalchemy import text

        with self.engine.connect() as conn:
            pid = int(conn.execute(text("SELECT pg_backend_pid()")).scalar_one())
        fields = _proc_stat(pid)
        return int(fields[1]) if fields is not None else None

    def start(self) -> None:
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(1.0):
            self.sample()

    def sample(self) -> None:
        from sqlalchemy import text

        with self.engine.connect() as conn:
            rows = conn.execute(
                text(
                    "SELECT pid, application_name, backend_type FROM pg_stat_activity "
                    "WHERE datname = :db"
                ),
                {"db": self.database},
            ).all()
        with self._lock:
            for pid, name, kind in rows:
                cpu = cpu_seconds(int(pid))
                if cpu is None:
                    continue
                backend = self.backends.get(pid)
                if backend is None:
                    start = 0.0 if self.in_window else cpu
                    self.backends[pid] = Backend(name or kind, start, cpu)
                else:
                    backend.last = cpu

    def counters(self) -> dict[str, int]:
        from sqlalchemy import text

        with self.engine.connect() as conn:
            row = conn.execute(
                text(f"SELECT {', '.join(self.STATS)} FROM pg_stat_database WHERE datname = :db"),
                {"db": self.database},
            ).one()
        return {k: int(v) for k, v in zip(self.STATS, row)}

    def mark(self, starting: bool) -> dict[str, Any]:
        """The window's start or end: counters, server CPU, and the backends' CPU
        counted from here (start) or frozen here (end)."""
        self.sample()
        with self._lock:
            if starting:
                for backend in self.backends.values():
                    backend.start = backend.last
                self.in_window = True
            else:
                self.in_window = False
                self._stop.set()
            backends = {pid: b.last - b.start for pid, b in self.backends.items()}
            labels = {pid: b.label for pid, b in self.backends.items()}
        server = server_cpu_seconds(self.postmaster) if self.postmaster else None
        return {"counters": self.counters(), "server_cpu_s": server, "backends": (backends, labels)}

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        self.engine.dispose()


def statements_at(replica: Replica, wall: float) -> int:
    """The statements the replica reported (benchapp's BENCH-STATS) by ``wall``."""
    count = 0
    for line in list(replica.lines):
        if line.startswith("BENCH-STATS "):
            _, at_us, sent = line.split()
            if int(at_us) > wall * US:
                break
            count = int(sent)
    return count


# -- the run -----------------------------------------------------------------------


def _beats(scenario: Scenario) -> list[float | None]:
    return [cpu_seconds(r.process.pid) for r in scenario.running]


def measure(config: Config, plan: LoadPlan) -> dict[str, Any]:
    extra = {
        "BENCH_CRONTABS": str(plan.crontabs),
        "BENCH_PERIODS": ",".join(f"{p:g}" for p in plan.periods),
        "BENCH_STATS": "1",
    }
    with own_database() as (database, url):
        scenario = Scenario(
            "singlebeat", plan.replicas, plan.entries, 1.0, config, extra_env=extra, db_url=url
        )
        drain = Drain(config.broker, scenario.queue)
        sampler = DatabaseSampler(database)
        try:
            with running([scenario], stamp=True):
                scenario.wait_ready(timeout=120)
                drain.start()
                sampler.start()
                anchors = wait_registered(scenario)
                _sleep_until(time.time() + plan.settle)
                window = _window(scenario, sampler, drain, anchors, plan)
                rss = [_peak_rss_mb(r.process.pid) for r in scenario.running]
            drain.stop()
            # who sent the window's slots, by the slot instant
            owners = _owners(scenario, (window["start"], window["end"]), "slot_us")
            return _report(scenario, plan, window, drain, owners, rss)
        finally:
            sampler.close()
            scenario.cleanup()


def _window(
    scenario: Scenario,
    sampler: DatabaseSampler,
    drain: Drain,
    anchors: dict[str, int],
    plan: LoadPlan,
) -> dict[str, Any]:
    """Measure the window, then wait for its last slots (and a late repeat)."""
    start = time.time()
    at_start = sampler.mark(starting=True)
    beats_start = _beats(scenario)
    load_start = os.getloadavg()[0]
    _sleep_until(start + plan.window)
    end = time.time()
    at_end = sampler.mark(starting=False)
    beats_end = _beats(scenario)
    load_end = os.getloadavg()[0]
    start_us, end_us = round(start * US), round(end * US)
    due = due_slots(anchors, start_us, end_us)
    # the last slots of the window leave after it: wait until every one came
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not due <= {(e, a) for e, a, _ in drain.seen}:
        time.sleep(0.5)
    time.sleep(plan.tail)
    for replica in scenario.running:
        if replica.process.poll() is not None:
            raise RuntimeError(f"a replica exited during the run:\n{replica.output()}")
    return {
        "start": start,
        "end": end,
        "start_us": start_us,
        "end_us": end_us,
        "due": due,
        "db": (at_start, at_end),
        "beats": (beats_start, beats_end),
        "load": (load_start, load_end),
        "statements": [statements_at(r, end) - statements_at(r, start) for r in scenario.running],
    }


def _report(
    scenario: Scenario,
    plan: LoadPlan,
    window: dict[str, Any],
    drain: Drain,
    owners: dict[str, int],
    rss: list[float | None],
) -> dict[str, Any]:
    seconds = window["end"] - window["start"]
    slots = _judge(window, drain)
    replicas = _replicas(scenario, window, owners, rss, seconds)
    return {
        "window_s": round(seconds, 1),
        "load_average_1m": [round(x, 2) for x in window["load"]],
        "slots": slots,
        "database": _database(window, sum(r["statements"] for r in replicas), seconds),
        "replicas": replicas,
    }


def _judge(window: dict[str, Any], drain: Drain) -> dict[str, Any]:
    """The messages of the window's slots against the slots that were due."""
    due: set[tuple[str, int]] = window["due"]
    start_us, end_us = window["start_us"], window["end_us"]
    sent = [(e, a, s) for e, a, s in drain.seen if start_us <= a < end_us]
    counts = Counter((e, a) for e, a, _ in sent)
    first: dict[tuple[str, int], int] = {}
    for e, a, s in sent:
        first[(e, a)] = min(s, first.get((e, a), s))
    crontab = sum(1 for e, _ in due if e.startswith("cron-"))
    delays = sorted(((s - a) / 1000, e, a) for (e, a), s in first.items())
    return {
        "due": len(due),
        "due_crontab": crontab,
        "due_interval": len(due) - crontab,
        "messages": len(sent),
        "distinct": len(counts),
        "duplicates": len(sent) - len(counts),
        "missed": len(due - counts.keys()),
        "not_due": len(counts.keys() - due),
        "bursts": _bursts(due, first),
        "sent_after_grace": sum(1 for ms, _, _ in delays if ms > GRACE_MS),
        "latest": [
            {"entry": e, "slot": _iso(a), "delay_ms": round(ms, 1)} for ms, e, a in delays[-5:]
        ],
        # a slot sent twice anywhere in the run, window or not
        "duplicates_whole_run": sum(
            n - 1 for n in Counter((e, a) for e, a, _ in drain.seen).values()
        ),
        **(_delays([(s - a) / 1000 for (_, a), s in first.items()], 99) if first else {}),
    }


def _bursts(due: set[tuple[str, int]], first: dict[tuple[str, int], int]) -> list[dict[str, Any]]:
    """The instants with 1,000 slots or more due at once: the delays' tail is there."""
    sizes = Counter(a for _, a in due)
    last: dict[int, int] = {}
    kinds: dict[int, set[str]] = {}
    for (e, a), s in first.items():
        if sizes[a] >= 1000:
            last[a] = max(last.get(a, s), s)
            kinds.setdefault(a, set()).add(e.split("-")[0])
    return [
        {
            "slot": _iso(a),
            "due": sizes[a],
            "kinds": sorted(kinds.get(a, ())),
            "last_sent_after_ms": round((last[a] - a) / 1000, 1) if a in last else None,
        }
        for a in sorted(sizes)
        if sizes[a] >= 1000
    ]


def _iso(at_us: int) -> str:
    return time.strftime("%H:%M:%S", time.gmtime(at_us // US)) + f".{at_us % US // 1000:03d}Z"


def _database(window: dict[str, Any], statements: int, seconds: float) -> dict[str, Any]:
    at_start, at_end = window["db"]
    delta = {k: at_end["counters"][k] - at_start["counters"][k] for k in at_start["counters"]}
    transactions = delta["xact_commit"] + delta["xact_rollback"]
    cpu: Counter[str] = Counter()
    for pid, used in at_end["backends"][0].items():
        cpu[at_end["backends"][1][pid]] += used
    backends_s = sum(cpu.values())
    server = None
    if at_start["server_cpu_s"] is not None and at_end["server_cpu_s"] is not None:
        server = round(at_end["server_cpu_s"] - at_start["server_cpu_s"], 2)
    return {
        "transactions": transactions,
        "rollbacks": delta["xact_rollback"],
        "transactions_per_s": round(transactions / seconds, 1),
        "statements": statements,
        "transactions_per_statement": round(transactions / statements, 3) if statements else None,
        "tuples": {k[4:]: v for k, v in delta.items() if k.startswith("tup_")},
        "backend_cpu_s": round(backends_s, 2),
        "backend_cpu_pct": round(100 * backends_s / seconds, 1),
        "backend_cpu_s_by_session": {k: round(v, 2) for k, v in sorted(cpu.items())},
        "server_cpu_s": server,
        "server_cpu_pct": round(100 * server / seconds, 1) if server is not None else None,
    }


def _replicas(
    scenario: Scenario,
    window: dict[str, Any],
    owners: dict[str, int],
    rss: list[float | None],
    seconds: float,
) -> list[dict[str, Any]]:
    total = sum(owners.values()) or 1
    beats_start, beats_end = window["beats"]
    rows = []
    for i, replica in enumerate(scenario.running):
        # the replica id is host:pid:random
        sent = sum(
            n for owner, n in owners.items() if owner.split(":")[1] == str(replica.process.pid)
        )
        cpu = None
        if beats_start[i] is not None and beats_end[i] is not None:
            cpu = round(beats_end[i] - beats_start[i], 2)
        statements = window["statements"][i]
        rows.append(
            {
                "replica": i,
                "statements": statements,
                "statements_per_s": round(statements / seconds, 2),
                "slots_sent": sent,
                "share": round(sent / total, 3),
                "cpu_s": cpu,
                "cpu_pct": round(100 * cpu / seconds, 1) if cpu is not None else None,
                "peak_rss_mb": rss[i],
                # whole run: a skipped slot, a takeover, a lease that ran out...
                "log_warnings": [
                    line
                    for line in replica.lines
                    # BENCH-READY: benchapp's print, through beat's stdout redirect
                    if _WARNING.search(line) and "BENCH-" not in line
                ],
            }
        )
    return rows


# -- output ------------------------------------------------------------------------


def every_slot_once(slots: dict[str, Any]) -> bool:
    return bool(
        slots["due"] > 0
        and slots["duplicates"] == 0
        and slots["missed"] == 0
        and slots["not_due"] == 0
        and slots["distinct"] == slots["due"]
    )


def render(results: dict[str, Any]) -> str:
    plan, run = results["plan"], results["load"]
    s, db = run["slots"], run["database"]
    intervals = plan["entries"] - plan["crontabs"]
    periods = "/".join(f"{p:g}" for p in plan["periods"])
    out = [
        "celery-singlebeat load run"
        + (" (--quick: fewer entries, one minute)" if plan["quick"] else ""),
        *describe_machine(results["machine"], f"broker Redis DB {results['redis_db']}"),
        f"load average (1 min) at the window's start {run['load_average_1m'][0]}, "
        f"at its end {run['load_average_1m'][1]}",
        "",
        table(
            f"Load: {plan['replicas']} replicas, {plan['entries']} entries ({plan['crontabs']} "
            f"crontab() every minute, {intervals} intervals of {periods} s), "
            f"{run['window_s']:g} s window, PostgreSQL, real celery beat",
            (
                "due",
                "crontab / interval",
                "messages",
                "distinct",
                "duplicates",
                "missed",
                "not due",
                "delay ms median / p99 / max",
            ),
            [
                (
                    s["due"],
                    f"{s['due_crontab']} / {s['due_interval']}",
                    s["messages"],
                    s["distinct"],
                    s["duplicates"],
                    s["missed"],
                    s["not_due"],
                    " / ".join(
                        f"{s[k]:g}" if k in s else "-"
                        for k in ("delay_ms_median", "delay_ms_p99", "delay_ms_max")
                    ),
                )
            ],
        ),
        "every due slot sent exactly once, nothing else sent: "
        + ("yes" if every_slot_once(s) else "NO")
        + f"; {s['sent_after_grace']} slots sent more than {GRACE_MS / 1000:g} s after "
        "their instant",
        _burst_line(s["bursts"]),
        "latest: "
        + ", ".join(f"{x['entry']}@{x['slot']} {x['delay_ms']:g} ms" for x in s["latest"][::-1]),
        "",
        _database_table(db),
        "",
        _replica_table(run["replicas"]),
        "replicas' log lines at WARNING or above: "
        + str(sum(len(r["log_warnings"]) for r in run["replicas"])),
        *(line for r in run["replicas"] for line in r["log_warnings"][:3]),
    ]
    return "\n".join(out)


def _burst_line(bursts: list[dict[str, Any]]) -> str:
    """The largest bursts: when, of which entries, how long until the last was sent."""
    largest = max((b["due"] for b in bursts), default=0)
    each = ", ".join(
        f"{b['slot']} {'crontabs' if b['kinds'] == ['cron'] else 'intervals'} "
        f"{b['last_sent_after_ms']:g} ms"
        for b in bursts
        if b["due"] == largest
    )
    return f"largest bursts, {largest} slots at one instant, last sent after: {each}"


def _pct(seconds: float | None, pct: float | None) -> str:
    return "unavailable" if seconds is None else f"{seconds:g} s ({pct:g} %)"


def _database_table(db: dict[str, Any]) -> str:
    tuples = db["tuples"]
    sessions = ", ".join(f"{k} {v:g}" for k, v in db["backend_cpu_s_by_session"].items())
    return "\n".join(
        [
            table(
                "Database (pg_stat_database of the run's own database; CPU from /proc, "
                "% of one core)",
                (
                    "transactions",
                    "per s",
                    "statements sent",
                    "transactions / statement",
                    "tuples ins / upd / del",
                    "backends' CPU",
                    "server's CPU",
                ),
                [
                    (
                        db["transactions"],
                        db["transactions_per_s"],
                        db["statements"],
                        db["transactions_per_statement"],
                        f"{tuples['inserted']} / {tuples['updated']} / {tuples['deleted']}",
                        _pct(db["backend_cpu_s"], db["backend_cpu_pct"]),
                        _pct(db["server_cpu_s"], db["server_cpu_pct"]),
                    )
                ],
            ),
            f"backends' CPU s by session: {sessions}",
        ]
    )


def _replica_table(replicas: list[dict[str, Any]]) -> str:
    return table(
        "Replicas (statements: counted by each beat process; slots: the slots table's owner)",
        ("replica", "statements", "per s", "slots sent", "share", "CPU", "peak RSS MB"),
        [
            (
                f"bench-replica-{r['replica']}",
                r["statements"],
                r["statements_per_s"],
                r["slots_sent"],
                f"{r['share']:.1%}",
                _pct(r["cpu_s"], r["cpu_pct"]),
                r["peak_rss_mb"],
            )
            for r in replicas
        ],
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2,000 entries, 60 s (~90 s in all)")
    parser.add_argument("--duration", type=float, default=None, help="window, s (300)")
    parser.add_argument("--entries", type=int, default=None, help="entries (10,000)")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--redis-db", type=int, default=13)
    args = parser.parse_args(argv)
    plan = LoadPlan.make(args.quick, args.entries, args.duration)
    # bench_scheduler's Config: the broker on --redis-db (the Plan is not used here)
    config = Config(Plan.make(args.quick), args.redis_db)
    started = time.monotonic()
    results: dict[str, Any] = {
        "machine": machine(),
        "plan": plan.__dict__,
        "redis_db": args.redis_db,
    }
    results["load"] = measure(config, plan)
    results["every_slot_once"] = every_slot_once(results["load"]["slots"])
    name = "load-latest-quick.json" if args.quick else "load-latest.json"
    finish(results, started, render, args.json or HERE / "results" / name)
    return 0 if results["every_slot_once"] else 1


if __name__ == "__main__":
    sys.exit(main())
