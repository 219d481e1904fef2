#!/usr/bin/env python3
"""The same failures applied to real ``celery beat`` processes of each scheduler.

Schedulers: celery-singlebeat (PostgreSQL), celery-redbeat, django-celery-beat
(``DatabaseScheduler``, PostgreSQL) and, where it applies, Celery's default
``PersistentScheduler`` as the reference. Every scenario starts replicas of
each scheduler (``benchapp.py``: 3 interval entries every 1 s) that publish to
a Redis queue of their own; the queue is drained every 50 ms and each message
stamped with its arrival, on this host's clock. Scenarios (benchmarks/README.md
says how each is judged):

* ``normal``: 3 replicas each, nothing goes wrong;
* ``kill``: the replica that sent the latest run is SIGKILLed; like every
  process that exits, it is restarted after a back-off (kubelet-like: 10 s,
  doubling per exit of that replica);
* ``pause``: that replica is SIGSTOPped for longer than singlebeat's lease and
  redbeat's lock, then SIGCONTed;
* ``outage``: the shared store (a PostgreSQL cluster and a Redis server of the
  run's own) stopped for 30 s and started again;
* ``clock``: the sending replica's clock 90 s ahead (libfaketime preloaded into
  the beat process), then a replica with a correct clock takes over;
* ``broker``: the broker (a Redis server of the run's own) stopped for 5 s.

Usage: ``python benchmarks/compare_failures.py [--quick] [--only kill,pause] [--json PATH]``.
Redis DB 14 (broker) and 15 (redbeat) of the shared Redis by default.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import chaos  # noqa: E402  (also puts the acceptance harness on sys.path)
import sqlalchemy as sa  # noqa: E402
from bench_scheduler import (  # noqa: E402
    NAMES,
    PG_URL,
    Config,
    Plan,
    Replica,
    Scenario,
    describe_machine,
    machine,
    table,
    write_results,
)
from harness import Db, RedisQueueReader  # noqa: E402

US = 1_000_000
ENTRIES = 3
EVERY = 1.0
#: redbeat_lock_timeout: redbeat's own default rule (5 x beat_max_loop_interval)
#: for the 1 s loop every benchapp scheduler runs with
LOCK_TIMEOUT = 5.0
#: singlebeat's defaults, which the runs keep
LEASE = 15.0
GRACE = 5.0
#: the longest wait between singlebeat's attempts to reach a database that is down
OUTAGE_RETRY_S = 10.0
SKEW = "+90s"
#: a message that arrives this long before its instant was sent early
EARLY_S = 0.25
#: the blur at each end of a lasting fault (s)
EDGE_S = 1.0
#: how long singlebeat's takeovers can take after the window (lease + sweep + slack)
LATE_S = LEASE + LEASE / 3 + 5

#: replicas of each scheduler: several where the scheduler coordinates them,
#: one where its documentation says to run one (a second would duplicate)
FLEET = {"singlebeat": 3, "redbeat": 3, "django": 1, "default": 1}
LINEUPS: dict[str, dict[str, int]] = {
    "normal": {"singlebeat": 3, "redbeat": 3, "django": 3, "default": 3},
    "kill": FLEET,
    "pause": FLEET,
    "outage": {"singlebeat": 3, "redbeat": 3, "redbeat-retry": 3, "django": 1},
    # replica 0 runs 90 s ahead; the clock action says who takes over from it
    "clock": {"singlebeat": 2, "redbeat": 2, "django": 2, "default": 1},
    "broker": FLEET,
}
#: variants of a scheduler: (kind, environment)
VARIANTS = {"redbeat-retry": ("redbeat", {"BENCH_REDBEAT_RETRY_PERIOD": "60"})}
LABELS = {**NAMES, "redbeat-retry": "celery-redbeat, retry_period 60 s"}
#: scenarios of one wave run at the same time (they share no fault target);
#: two waves keep the number of processes starting at once moderate
WAVES = [["normal", "kill", "pause", "broker"], ["outage", "clock"]]
SCENARIOS = [name for wave in WAVES for name in wave]

#: the one argument of a probe message: its entry's number, or -1 for ``cron-0``
ARG = re.compile(r"-?\d+")
CRASH_LINE = re.compile(r"beat raised exception <class '(?:[\w.]+\.)?(\w+)'>")
ERROR_LINE = re.compile(r"^(?:[\w.]+\.)?(\w+(?:Error|Exception))\b")
LOG_PREFIX = re.compile(r"^\[[^\]]*\]\s*")
SEVERE = re.compile(r": (?:ERROR|CRITICAL)/")


@dataclass(frozen=True)
class Timing:
    """Durations of one run (seconds); ``--quick`` shortens them, never drops a row."""

    quick: bool
    settle: float
    normal: float
    before: float
    kill_after: float
    pause: float
    pause_after: float
    outage: float
    outage_after: float
    broker_down: float
    broker_after: float
    skewed: float
    clock_after: float
    #: the first restart of a replica that exited; doubles with each exit
    restart_after: float

    @classmethod
    def make(cls, quick: bool, restart_after: float | None) -> Timing:
        if quick:
            return cls(
                True, settle=2, normal=5, before=3, kill_after=12, pause=LEASE + 2,
                pause_after=8, outage=15, outage_after=20, broker_down=3, broker_after=10,
                skewed=15, clock_after=95, restart_after=restart_after or 3,
            )  # fmt: skip
        return cls(
            False, settle=3, normal=30, before=10, kill_after=25, pause=LEASE + 5,
            pause_after=20, outage=30, outage_after=35, broker_down=5, broker_after=20,
            skewed=65, clock_after=130, restart_after=restart_after or 10,
        )  # fmt: skip


def sleep_until(wall: float) -> None:
    while (left := wall - time.time()) > 0:
        time.sleep(min(left, 0.2))


def parallel(calls: Iterable[Callable[[], object]]) -> None:
    """Run ``calls`` at the same moment (one thread each) and wait for all."""
    threads = [threading.Thread(target=call) for call in calls]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def say(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


# -- what reached the broker ------------------------------------------------------


@dataclass(frozen=True)
class Message:
    entry: str
    #: when the drain took it off the queue (this host's clock, wall seconds)
    arrived: float
    #: ``bench_sent_us``: the publishing process's clock (90 s off under libfaketime)
    sent: float
    pid: int
    #: singlebeat's slot instant (µs); the other schedulers' messages name no instant
    slot_us: int | None


def entry_of(argsrepr: str) -> str:
    """The entry a message ran, from its arguments: ``(0,)`` or, from the
    schedulers that keep args as JSON (redbeat, django-celery-beat), ``[0]``."""
    m = ARG.search(argsrepr)
    if m is None:
        return "?"
    return "cron-0" if m[0] == "-1" else f"probe-{m[0]}"


class Arrivals(RedisQueueReader):  # type: ignore[misc]
    """The harness's queue reader (LRANGE + DEL in one transaction every 50 ms),
    keeping each message's headers with the moment it arrived: the other
    schedulers' messages carry no slot header, and a replica under libfaketime
    stamps its own wrong clock, so arrival is the one clock they all share."""

    #: every 20 ms rather than the harness's 50: arrival times are the measure here
    poll = 0.02

    def __init__(self, url: str, queue: str) -> None:
        super().__init__(url, queue)
        self.got: list[tuple[dict[str, Any], float]] = []

    def _collect(self) -> None:
        batch = self._take()
        now = time.time()
        with self._lock:
            self.got.extend((headers, now) for headers, _ in batch)

    def received(self) -> list[Message]:
        with self._lock:
            got = list(self.got)
        out = []
        for headers, arrived in got:
            slot = headers.get("singlebeat_slot")
            out.append(
                Message(
                    entry_of(headers.get("argsrepr", "")),
                    arrived,
                    headers.get("bench_sent_us", 0) / US,
                    int(headers.get("bench_sent_pid", 0)),
                    int(slot["at_us"]) if slot else None,
                )
            )
        return out

    def halt(self) -> None:
        """Stop draining and take what is left (errors while a broker was down
        are expected: the reader retries every 50 ms and counts them)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        with contextlib.suppress(Exception):
            self._collect()

    def close(self) -> None:
        with contextlib.suppress(Exception):
            super().close()


# -- replicas, restarted like a Deployment's containers --------------------------


@dataclass
class Exit:
    at: float
    code: int
    reason: str
    #: SIGKILLed by the run (the kill scenario), not a crash
    by_run: bool
    #: the process's last lines of output
    tail: list[str]


class Pod:
    """One replica of a run: its current process and what happened to it."""

    def __init__(self, run: Run, index: int) -> None:
        self.run = run
        self.index = index
        self.env: dict[str, str] = {}
        self.replica: Replica | None = None
        self.stopping = False
        self.killed_by_run = False
        self.exits: list[Exit] = []
        self.restart_at: float | None = None
        self.restarts = 0
        #: every process this replica has been, in order
        self.incarnations: list[Replica] = []

    def start(self) -> None:
        self.stopping = False
        self.replica = self.run.bench.start_replica(self.index, env=self.env)
        self.incarnations.append(self.replica)

    @property
    def pid(self) -> int | None:
        return self.replica.process.pid if self.replica else None

    def signal(self, sig: int) -> None:
        if self.replica is not None and self.replica.process.poll() is None:
            self.replica.process.send_signal(sig)

    def kill(self) -> None:
        self.killed_by_run = True
        self.signal(signal.SIGKILL)

    def terminate(self) -> None:
        """SIGTERM, as a deploy does; not restarted afterwards."""
        self.stopping = True
        self.signal(signal.SIGCONT)  # a stopped process cannot act on SIGTERM
        self.signal(signal.SIGTERM)

    def join(self, timeout: float = 15.0) -> None:
        if self.replica is None:
            return
        try:
            self.replica.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.replica.process.kill()
            self.replica.process.wait(5)

    def stop(self) -> None:
        self.terminate()
        self.join()


def exit_reason(replica: Replica, code: int) -> str:
    """The exception a beat process died of, from its last output lines."""
    if code == -signal.SIGKILL:
        return "SIGKILL"
    replica.eof.wait(5)  # its last words may still be in the pipe
    tail = replica.lines[-300:]
    for line in reversed(tail):
        if m := CRASH_LINE.search(line):
            return m[1]
    # Celery's beat logs a traceback written to stderr line by line, in pieces
    for line in reversed(tail):
        if m := ERROR_LINE.match(LOG_PREFIX.sub("", line).strip()):
            return m[1]
    return "no error logged"


class Supervisor:
    """Starts a replica again once its process has exited (crashed or killed),
    as the kubelet restarts a Deployment's container: after ``first`` seconds,
    doubling with each exit of that replica. Replicas the run stopped itself
    (``Pod.terminate``) stay stopped."""

    def __init__(self, pods: Sequence[Pod], first: float) -> None:
        self.pods = pods
        self.first = first
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="supervisor")

    def start(self) -> Supervisor:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def _loop(self) -> None:
        while not self._stop.wait(0.1):
            for pod in self.pods:
                self._check(pod, time.time())

    def _check(self, pod: Pod, now: float) -> None:
        if pod.stopping or pod.replica is None:
            return
        code = pod.replica.process.poll()
        if code is None:
            return
        if pod.restart_at is None:  # a new exit
            reason = exit_reason(pod.replica, code)
            tail = pod.replica.lines[-8:]
            pod.exits.append(Exit(now, code, reason, pod.killed_by_run, tail))
            pod.killed_by_run = False
            pod.restart_at = now + self.first * 2 ** (len(pod.exits) - 1)
        elif now >= pod.restart_at:
            pod.restart_at = None
            pod.restarts += 1
            pod.start()


class Run:
    """One scheduler's replicas in one scenario, with the queue they publish to."""

    def __init__(
        self,
        scenario: str,
        kind: str,
        replicas: int,
        config: Config,
        env: dict[str, str],
        broker_url: str,
        db_url: str,
    ) -> None:
        self.scenario = scenario
        self.kind = kind
        self.db_url = db_url
        self.bench = Scenario(kind, replicas, ENTRIES, EVERY, config, extra_env=env)
        self.pods = [Pod(self, i) for i in range(replicas)]
        #: pods started once the first ones send (a standby that must not lead)
        self.standbys: list[int] = []
        #: pods the scenario starts itself later
        self.deferred: list[int] = []
        self.reader = Arrivals(broker_url, self.bench.queue)
        self.notes: list[str] = []
        #: the scheduler, or a variant of it (LABELS)
        self.label = kind

    def messages(self) -> list[Message]:
        return self.reader.received()

    def sender(self) -> Pod:
        """The replica that sent the latest message (redbeat's leader)."""
        by_pid = {pod.pid: pod for pod in self.pods}
        for message in sorted(self.messages(), key=lambda m: -m.arrived):
            if message.pid in by_pid:
                return by_pid[message.pid]
        return self.pods[0]

    def anchors(self) -> dict[str, int]:
        db = Db(self.db_url, self.bench.prefix)
        try:
            anchors: dict[str, int] = db.anchors()
            return anchors
        finally:
            db.engine.dispose()

    def cleanup(self) -> None:
        self.reader.close()
        with contextlib.suppress(Exception):
            self.bench.cleanup()


# -- the shared stores: private servers for the faults, Django's databases ----------


class DjangoDatabases:
    """django-celery-beat's databases on one PostgreSQL server, one per scenario:
    migrated once into a template, cloned with ``CREATE DATABASE … TEMPLATE``,
    every one dropped at the end."""

    def __init__(self, server_url: str, tag: str) -> None:
        self.server = sa.engine.make_url(server_url)
        self.admin = sa.create_engine(
            self.server, isolation_level="AUTOCOMMIT", poolclass=sa.pool.NullPool
        )
        self.template = f"cmp{tag}_djcb"
        self.created: list[str] = []
        # scenarios of a wave ask for their databases at the same time
        self._lock = threading.Lock()

    def url(self, name: str) -> str:
        return self.server.set(database=name).render_as_string(hide_password=False)

    def _execute(self, statement: str) -> None:
        with self.admin.connect() as conn:
            conn.execute(sa.text(statement))

    def _create(self, name: str, template: str | None = None) -> str:
        self._execute(f'CREATE DATABASE "{name}"' + (f' TEMPLATE "{template}"' if template else ""))
        self.created.append(name)
        return self.url(name)

    def clone(self, name: str) -> str:
        """A migrated database of its own for one scenario's django-celery-beat."""
        with self._lock:
            if self.template not in self.created:
                self._migrate()
            return self._create(f"{self.template}_{name}", self.template)

    def _migrate(self) -> None:
        """The template: an empty database with django-celery-beat's tables."""
        url = self._create(self.template)
        migrate = subprocess.run(
            [sys.executable, "-m", "django", "migrate", "--no-input", "--verbosity", "0"],
            env={
                **os.environ,
                "PYTHONPATH": str(HERE),
                "DJANGO_SETTINGS_MODULE": "compare_django_settings",
                "BENCH_DJANGO_DB": url,
            },
            capture_output=True,
            text=True,
            timeout=120,
        )
        if migrate.returncode:
            raise RuntimeError(f"django-celery-beat migrations failed:\n{migrate.stderr}")

    def drop(self) -> None:
        for name in reversed(self.created):
            with contextlib.suppress(sa.exc.DBAPIError):
                self._execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        self.admin.dispose()


class Context:
    """What the scenarios share: timing, the shared Redis, the private servers
    the faults stop, and Django's databases."""

    def __init__(self, timing: Timing, redis_db: int, selected: Sequence[str]) -> None:
        self.timing = timing
        self.config = Config(Plan.make(timing.quick), redis_db)
        self.tag = uuid.uuid4().hex[:8]
        self.workdir = Path(tempfile.mkdtemp(prefix="compare-"))
        self.faketime = chaos.libfaketime()
        self.pg: chaos.Postgres | None = None
        self.store: chaos.Redis | None = None
        self.broker: chaos.Redis | None = None
        self.django = DjangoDatabases(PG_URL, self.tag)
        self.django_private: DjangoDatabases | None = None
        if "clock" in selected and self.faketime is None:
            raise RuntimeError("libfaketime is not installed (apt-get install faketime)")
        if "outage" in selected:
            # Stopping a server is only ever done to servers of this run's own.
            self.pg = chaos.Postgres()
            self.pg.start()
            self.django_private = DjangoDatabases(self.pg.url, self.tag)
            self.store = chaos.Redis(self.workdir / "store")
            self.store.start()
        if "broker" in selected:
            self.broker = chaos.Redis(self.workdir / "broker")
            self.broker.start()

    def runs_for(self, scenario: str) -> list[Run]:
        runs = []
        for label, replicas in LINEUPS[scenario].items():
            kind, variant = VARIANTS.get(label, (label, {}))
            broker = self.config.broker_url
            db_url = PG_URL
            env = {"BENCH_REDBEAT_LOCK_TIMEOUT": f"{LOCK_TIMEOUT:g}", **variant}
            if scenario == "outage":
                assert self.pg is not None and self.store is not None
                db_url = self.pg.url
                env["BENCH_DB_URL"] = db_url
                env["BENCH_REDBEAT_URL"] = self.store.url
            if scenario == "broker":
                assert self.broker is not None
                broker = self.broker.url
                env["BENCH_BROKER"] = broker
            if scenario == "clock":
                env["BENCH_CRON"] = "1"
            if kind == "django":
                databases = self.django_private if scenario == "outage" else self.django
                assert databases is not None
                env["BENCH_DJANGO_DB"] = databases.clone(scenario)
            run = Run(scenario, kind, replicas, self.config, env, broker, db_url)
            run.label = label
            if scenario == "clock":
                assert self.faketime is not None
                run.pods[0].env = {"LD_PRELOAD": self.faketime, "FAKETIME": SKEW}
                if kind == "redbeat":
                    run.standbys = [1]  # the skewed replica must be the one holding the lock
                elif kind == "django":
                    run.deferred = [1]  # started when the skewed one has gone
            runs.append(run)
        return runs

    def close(self) -> None:
        self.django.drop()
        if self.django_private is not None:
            self.django_private.drop()
        for redis in (self.store, self.broker):
            if redis is not None:
                redis.stop()
        if self.pg is not None:
            self.pg.close(keep=False)
        with contextlib.suppress(OSError):
            for path in sorted(self.workdir.rglob("*"), reverse=True):
                path.rmdir() if path.is_dir() else path.unlink()
            self.workdir.rmdir()


# -- the scenarios ---------------------------------------------------------------------


@dataclass
class Window:
    """The counted stretch of one scenario, and its fault (wall seconds)."""

    start: float
    end: float
    fault: tuple[float, float] | None = None
    what: str = ""
    #: singlebeat slots the missed-run policy may drop (a store outage)
    excused: tuple[float, float] | None = None


Action = Callable[[Context, list[Run], float], Window]


def act_normal(ctx: Context, runs: list[Run], w0: float) -> Window:
    end = w0 + ctx.timing.normal
    sleep_until(end)
    return Window(w0, end)


def between_ticks(runs: list[Run], wall: float) -> float:
    """The first moment from ``wall`` on that falls half-way between two of
    singlebeat's slots: its replicas are asleep then, as they are nearly all
    the time. (The few milliseconds of a tick between a publish and its
    confirm, where a kill leaves a repeat, are the chaos run's to hit.)"""
    for run in runs:
        if run.kind == "singlebeat" and (anchors := run.anchors()):
            anchor = min(anchors.values()) / US
            return wall + (anchor + EVERY / 2 - wall) % EVERY
    return wall


def act_kill(ctx: Context, runs: list[Run], w0: float) -> Window:
    t = ctx.timing
    sleep_until(between_ticks(runs, w0 + t.before))
    at = time.time()
    for run in runs:
        pod = run.sender()
        pod.kill()
        run.notes.append(f"SIGKILLed r{pod.index}, the replica that sent the latest run")
    say(f"kill: SIGKILLed the sending replica of each scheduler; restart in {t.restart_after:g} s")
    end = at + t.kill_after
    sleep_until(end)
    return Window(w0, end, (at, at), "SIGKILL")


def act_pause(ctx: Context, runs: list[Run], w0: float) -> Window:
    t = ctx.timing
    sleep_until(between_ticks(runs, w0 + t.before))
    pods = [run.sender() for run in runs]
    at = time.time()
    for run, pod in zip(runs, pods):
        pod.signal(signal.SIGSTOP)
        run.notes.append(f"SIGSTOPped r{pod.index}, the replica that sent the latest run")
    say(f"pause: SIGSTOPped the sending replica of each scheduler for {t.pause:g} s")
    sleep_until(at + t.pause)
    back = time.time()
    for pod in pods:
        pod.signal(signal.SIGCONT)
    end = back + t.pause_after
    sleep_until(end)
    return Window(w0, end, (at, back), "SIGSTOP, SIGCONT")


def act_outage(ctx: Context, runs: list[Run], w0: float) -> Window:
    t = ctx.timing
    pg, store = ctx.pg, ctx.store
    assert pg is not None and store is not None
    sleep_until(w0 + t.before)
    at = time.time()
    say(f"outage: PostgreSQL and Redis (the stores) stopped for {t.outage:g} s")
    parallel([pg.stop, store.stop])
    sleep_until(at + t.outage)
    parallel([pg.resume, store.start])
    back = time.time()
    end = back + t.outage_after
    sleep_until(end)
    # singlebeat's missed-run policy may drop slots from a second before (a tick
    # in flight) to the grace before its first claim after the outage, which its
    # backoff (at most OUTAGE_RETRY_S) puts that long after the store is back
    excused = (at - 1, back + OUTAGE_RETRY_S - GRACE + 0.5)
    return Window(w0, end, (at, back), "store stopped", excused=excused)


def act_broker(ctx: Context, runs: list[Run], w0: float) -> Window:
    t = ctx.timing
    broker = ctx.broker
    assert broker is not None
    sleep_until(w0 + t.before)
    at = time.time()
    say(f"broker: Redis broker stopped for {t.broker_down:g} s")
    broker.stop()
    sleep_until(at + t.broker_down)
    broker.start()
    back = time.time()
    end = back + t.broker_after
    sleep_until(end)
    return Window(w0, end, (at, back), "broker stopped")


def act_clock(ctx: Context, runs: list[Run], w0: float) -> Window:
    """Replica 0 (90 s ahead) sends; then it is stopped, as a deploy stops it,
    and a replica with a correct clock carries on: singlebeat's and redbeat's
    other replica, a new django-celery-beat replica, and for Celery's default
    the same replica started again with its clock corrected (it keeps its
    schedule file)."""
    t = ctx.timing
    sleep_until(w0 + t.skewed)
    at = time.time()
    say("clock: the replica 90 s ahead stops; one with a correct clock carries on")

    def hand_over(run: Run) -> None:
        skewed = run.pods[0]
        skewed.stop()
        if run.kind == "django":
            run.pods[1].start()
            run.notes.append("r0 (+90 s) stopped; r1 (correct clock) started")
        elif run.kind == "default":
            skewed.env = {}
            skewed.start()
            run.notes.append("r0 (+90 s) stopped; started again with a correct clock")
        else:
            run.notes.append("r0 (+90 s) stopped; r1 (correct clock) carries on")

    parallel([lambda run=run: hand_over(run) for run in runs])  # type: ignore[misc]
    end = at + t.clock_after
    sleep_until(end)
    return Window(w0, end, (at, at), "handover")


ACTIONS: dict[str, Action] = {
    "normal": act_normal,
    "kill": act_kill,
    "pause": act_pause,
    "outage": act_outage,
    "clock": act_clock,
    "broker": act_broker,
}


def describe_scenario(name: str, timing: dict[str, Any]) -> str:
    return {
        "normal": "normal running",
        "kill": "sender SIGKILLed",
        "pause": f"sender paused {timing['pause']:g} s",
        "outage": f"store down {timing['outage']:g} s",
        "clock": "clock 90 s ahead",
        "broker": f"broker down {timing['broker_down']:g} s",
    }[name]


def run_scenario(ctx: Context, name: str) -> list[dict[str, Any]]:
    runs = ctx.runs_for(name)
    pods = [pod for run in runs for pod in run.pods]
    supervisor = Supervisor(pods, ctx.timing.restart_after)
    try:
        for run in runs:
            run.reader.start()
            for pod in run.pods:
                if pod.index not in run.standbys + run.deferred:
                    pod.start()
        wait_sending(runs, name)
        for run in runs:
            for index in run.standbys:
                run.pods[index].start()
        wait_sending(runs, name)
        supervisor.start()
        w0 = time.time() + ctx.timing.settle
        say(f"{name}: every replica started; counting from {ctx.timing.settle:g} s on")
        window = ACTIONS[name](ctx, runs, w0)
        # a whole number of periods: as many runs due for every scheduler
        window.end = w0 + math.ceil((window.end - w0) / EVERY) * EVERY
        sleep_until(window.end)
        wait_late(runs, window)
    finally:
        supervisor.stop()
        for pod in pods:
            pod.terminate()
        for pod in pods:
            pod.join()
        for run in runs:
            run.reader.halt()
    try:
        return [judge(run, window) for run in runs]
    finally:
        for run in runs:
            run.cleanup()


def wait_sending(runs: list[Run], name: str, timeout: float = 120.0) -> None:
    """Every started replica says it is up, and every scheduler has sent a run."""
    deadline = time.monotonic() + timeout
    while True:
        waiting = []
        for run in runs:
            for pod in run.pods:
                if pod.replica is None:
                    continue
                if pod.replica.process.poll() is not None:
                    raise RuntimeError(
                        f"{name}: {run.kind} r{pod.index} exited at start:\n{pod.replica.output()}"
                    )
                if not pod.replica.ready.is_set():
                    waiting.append(f"{run.kind} r{pod.index}")
            if not run.messages():
                waiting.append(f"{run.kind}'s first message")
        if not waiting:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"{name}: still waiting for {', '.join(waiting)}")
        time.sleep(0.1)


def wait_late(runs: list[Run], window: Window) -> None:
    """Give singlebeat's takeovers (a lease and a sweep after a claim was left
    unpublished) their time: wait until every slot of the window has arrived,
    except those the missed-run policy may drop, for at most LATE_S."""
    deadline = time.monotonic() + LATE_S
    for run in runs:
        if run.kind != "singlebeat":
            continue
        wanted = {s for s in due_slots(run.anchors(), window) if not excused(s[1], window)}
        while time.monotonic() < deadline:
            if wanted <= {(m.entry, m.slot_us) for m in run.messages()}:
                break
            time.sleep(0.2)


# -- judging ---------------------------------------------------------------------------


def due_slots(anchors: dict[str, int], window: Window) -> set[tuple[str, int]]:
    """singlebeat's interval slots (anchor + k x period) inside the window."""
    period = int(EVERY * US)
    start, end = int(window.start * US), int(window.end * US)
    out = set()
    for entry, anchor in anchors.items():
        if not entry.startswith("probe-"):
            continue
        k = max(1, -(-(start - anchor) // period))
        while (slot := anchor + k * period) < end:
            out.add((entry, slot))
            k += 1
    return out


def excused(slot_us: int, window: Window) -> bool:
    return window.excused is not None and (
        window.excused[0] * US <= slot_us <= window.excused[1] * US
    )


def slot_counts(messages: list[Message], anchors: dict[str, int], window: Window) -> dict[str, int]:
    """singlebeat names each run (its slot): a repeat of a slot is a duplicate."""
    due = due_slots(anchors, window)
    copies = Counter((m.entry, m.slot_us) for m in messages if (m.entry, m.slot_us) in due)
    return {
        "runs_due": len(due),
        "messages": sum(copies.values()),
        "distinct_runs": len(copies),
        "missed_by_policy": sum(1 for s in due - set(copies) if excused(s[1], window)),
    }


def bin_counts(messages: list[Message], window: Window) -> dict[str, int]:
    """The others name no run: each period of the window, per entry, is one run
    due; one message or more in it is that run, every further one a duplicate.

    The periods of an entry start where its sends are not: a scheduler that
    sends on the boundary would have its jitter (the drain's 50 ms, a tick's
    few ms) read as a period with two runs next to one with none."""
    bins = round((window.end - window.start) / EVERY)
    sends: dict[str, list[float]] = defaultdict(list)
    for m in messages:
        sends[m.entry].append(m.arrived)
    messages_in = distinct = 0
    for entry in (f"probe-{i}" for i in range(ENTRIES)):
        # moved back by up to a period, never forward: the replicas ran before
        # the window, and stopped right after it
        start = window.start - boundary_offset(sends[entry], window)
        counts = Counter(int((t - start) // EVERY) for t in sends[entry])
        inside = {k: n for k, n in counts.items() if 0 <= k < bins}
        messages_in += sum(inside.values())
        distinct += len(inside)
    return {
        "runs_due": bins * ENTRIES,
        "messages": messages_in,
        "distinct_runs": distinct,
        "missed_by_policy": 0,
    }


def boundary_offset(sends: list[float], window: Window, margin: float = 0.2) -> float:
    """The offset (0 to one period) at which period boundaries come closest to
    as few of these sends as possible (within ``margin`` s, weighted by how close)."""
    inside = [t for t in sends if window.start - EVERY <= t <= window.end + EVERY]

    def cost(offset: float) -> float:
        total = 0.0
        for t in inside:
            phase = (t - window.start + offset) % EVERY
            total += max(0.0, margin - min(phase, EVERY - phase))
        return total

    return min((k * EVERY / 50 for k in range(50)), key=cost)


def longest_gap(messages: list[Message], window: Window) -> float:
    """Per entry, the longest wait between consecutive arrivals in the window
    (its ends included); the longest of the entries."""
    arrivals: dict[str, list[float]] = defaultdict(list)
    for m in messages:
        if window.start <= m.arrived <= window.end:
            arrivals[m.entry].append(m.arrived)
    worst = 0.0
    for entry in (f"probe-{i}" for i in range(ENTRIES)):
        points = [window.start, *sorted(arrivals[entry]), window.end]
        worst = max(worst, *(b - a for a, b in zip(points, points[1:])))
    return round(worst, 1)


def early(kind: str, messages: list[Message], window: Window) -> dict[str, Any] | None:
    """Runs that arrived more than EARLY_S before their instant. singlebeat's
    messages name it; the others' do not, except the crontab entry's: the
    process that sent it believed it was a whole minute (``bench_sent_us``, on
    its clock), so that minute is the instant it meant."""
    if kind == "singlebeat":
        checked = [(m.slot_us / US, m) for m in messages if m.slot_us is not None]
    else:
        checked = [(round(m.sent / 60) * 60.0, m) for m in messages if m.entry == "cron-0"]
    checked = [(at, m) for at, m in checked if window.start <= m.arrived <= window.end]
    if kind != "singlebeat" and not checked:
        return None
    ahead = [at - m.arrived for at, m in checked if at - m.arrived > EARLY_S]
    return {"checked": len(checked), "early": len(ahead), "most_s": round(max(ahead, default=0), 1)}


def judge(run: Run, window: Window) -> dict[str, Any]:
    messages = run.messages()
    probes = [m for m in messages if m.entry.startswith("probe-")]
    if run.kind == "singlebeat":
        counts = slot_counts(probes, run.anchors(), window)
    else:
        counts = bin_counts(probes, window)
    row: dict[str, Any] = {
        "scenario": run.scenario,
        "scheduler": run.label,
        "replicas": len(run.pods),
        "window_s": round(window.end - window.start, 1),
        **counts,
        "duplicates": counts["messages"] - counts["distinct_runs"],
        "missed": counts["runs_due"] - counts["distinct_runs"],
        "longest_gap_s": longest_gap(probes, window),
        "early": early(run.kind, messages, window),
    }
    if window.fault is not None:
        f0, f1 = window.fault
        row["fault"] = window.what
        row["fault_s"] = round(f1 - f0, 1)
        instant = f1 - f0 < 2
        # A fault's edges are blurred by a second: a server takes a moment to
        # stop, and is accepting already when its start returns.
        inside = [m for m in probes if f0 + EDGE_S < m.arrived < f1 - EDGE_S]
        if not instant:
            row["sent_during_fault"] = len(inside)
        # After an instant fault (a kill, a handover): the first run after it.
        # After a lasting one that stopped sending: the first run after it ended.
        end = f1 if instant else f1 - EDGE_S
        after = [m.arrived - f1 for m in probes if m.arrived > end]
        stopped = instant or not inside
        row["resumed_after_s"] = round(max(0.0, min(after)), 1) if stopped and after else None
    # exit times relative to the fault's start (the window's when there is none)
    t0 = window.fault[0] if window.fault else window.start
    row["exits"] = [
        {"replica": pod.index, **asdict(e), "at_s": round(e.at - t0, 1)}
        for pod in run.pods
        for e in pod.exits
    ]
    row["restarts"] = sum(pod.restarts for pod in run.pods)
    row["arrivals"] = arrivals(run, messages, window)
    # what an operator would see: log lines at ERROR and above, tracebacks
    lines = [line for pod in run.pods for r in pod.incarnations for line in r.lines]
    row["error_lines"] = sum(1 for line in lines if SEVERE.search(line))
    row["tracebacks"] = sum(1 for line in lines if "Traceback (most recent call last)" in line)
    row["notes"] = run.notes
    row["process"] = describe(row)
    return row


def arrivals(run: Run, messages: list[Message], window: Window) -> dict[str, list[str]]:
    """Per entry, each message's arrival (s from the window's start) and the
    replica that sent it (``r<index>.<incarnation>``), for a reader to check."""
    who = {
        replica.process.pid: f"r{pod.index}.{n}"
        for pod in run.pods
        for n, replica in enumerate(pod.incarnations, 1)
    }
    out: dict[str, list[str]] = defaultdict(list)
    for m in sorted(messages, key=lambda m: m.arrived):
        out[m.entry].append(f"{m.arrived - window.start:.3f} {who.get(m.pid, m.pid)}")
    return dict(out)


def describe(row: dict[str, Any]) -> str:
    """What the processes did, in a few words."""
    crashed = [e for e in row["exits"] if not e["by_run"]]
    killed = len(row["exits"]) - len(crashed)
    crashes = Counter(f"exit {e['code']} ({e['reason']})" for e in crashed)
    parts = []
    if crashes:
        first = min(e["at_s"] for e in crashed)
        parts.append(
            ", ".join(f"{what} x{n}" if n > 1 else what for what, n in crashes.items())
            + f", first at t{first:+g} s; {row['restarts'] - killed} restart(s)"
        )
    else:
        parts.append("none crashed")
    if killed:
        parts.append("the killed one restarted" if row["restarts"] else "the killed one down")
    resumed = row.get("resumed_after_s")
    if resumed is not None:
        after = "it" if row["fault_s"] < 2 else "it ended"
        parts.append(f"next run {resumed:g} s after {after}")
    elif row.get("sent_during_fault"):
        parts.append("kept sending")
    return "; ".join(parts)


# -- output ------------------------------------------------------------------------------


def settings(timing: Timing) -> dict[str, Any]:
    return {
        "entries": f"{ENTRIES} interval entries every {EVERY:g} s (clock: and a crontab, "
        "every minute)",
        "beat_max_loop_interval_s": 1,
        "singlebeat": f"PostgreSQL, lease {LEASE:g} s, missed-run policy coalesce, grace "
        f"{GRACE:g} s (the defaults)",
        "redbeat_lock_timeout_s": LOCK_TIMEOUT,
        "redbeat_lock_timeout_with_celery_defaults_s": 5 * 300,
        "django_celery_beat": "DatabaseScheduler, PostgreSQL (Django, psycopg 3)",
        "restart_back_off_s": f"{timing.restart_after:g}, doubling per exit of a replica",
        "timing": asdict(timing),
    }


def cell_early(early: dict[str, Any] | None) -> str:
    if early is None:
        return ""
    text = f"{early['early']}/{early['checked']}"
    return text + (f" (by {early['most_s']:g} s)" if early["early"] else "")


def render(results: dict[str, Any]) -> str:
    t = results["timing"]
    m = results["machine"]
    title = "celery-singlebeat compared: the same failures, real celery beat processes" + (
        " (--quick: short windows)" if t["quick"] else ""
    )
    rows = [
        (
            describe_scenario(r["scenario"], t),
            f"{LABELS[r['scheduler']]} x{r['replicas']}",
            r["runs_due"],
            r["messages"],
            r["duplicates"],
            f"{r['missed']} ({r['missed_by_policy']} by policy)"
            if r["missed_by_policy"]
            else r["missed"],
            r["longest_gap_s"],
            r.get("sent_during_fault", ""),
            cell_early(r["early"]),
            r["process"],
        )
        for r in results["rows"]
    ]
    out = [
        title,
        *describe_machine(m, f"broker Redis DB {results['redis_db']}"),
        f"settings: {ENTRIES} entries every {EVERY:g} s, beat_max_loop_interval 1 s; singlebeat "
        f"lease {LEASE:g} s, coalesce, grace {GRACE:g} s; redbeat_lock_timeout "
        f"{LOCK_TIMEOUT:g} s (5 x the loop: with Celery's default 300 s loop, 1500 s); exits "
        f"restarted after {t['restart_after']:g} s, doubling; pause {t['pause']:g} s; store "
        f"down {t['outage']:g} s; broker down {t['broker_down']:g} s; clock {SKEW}",
        "",
        table(
            "runs due: entries x periods of the window; singlebeat's runs are its slots, the "
            "others' one per entry and period; gap in s; early: sent > 0.25 s before the "
            "instant / checked",
            (
                "scenario",
                "scheduler",
                "runs due",
                "messages",
                "duplicates",
                "missed",
                "longest gap",
                "during fault",
                "early",
                "what the processes did",
            ),
            rows,
        ),
    ]
    for error in results.get("errors", []):
        out.append(f"ERROR {error}")
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="short windows")
    parser.add_argument("--only", default=",".join(SCENARIOS), help="e.g. normal,kill")
    parser.add_argument("--json", type=Path, default=None, help="where to write the results")
    parser.add_argument("--redis-db", type=int, default=14, help="broker DB; redbeat the next")
    parser.add_argument(
        "--restart-after", type=float, default=None, help="first restart back-off, s (10; 3 quick)"
    )
    args = parser.parse_args(argv)
    only = [name.strip() for name in args.only.split(",") if name.strip()]
    unknown = set(only) - set(SCENARIOS)
    if unknown:
        parser.error(f"unknown scenario(s) {', '.join(sorted(unknown))}; known: {SCENARIOS}")
    timing = Timing.make(args.quick, args.restart_after)
    started = time.monotonic()
    results: dict[str, Any] = {
        "machine": machine(),
        "timing": asdict(timing),
        "settings": settings(timing),
        "redis_db": args.redis_db,
        "rows": [],
        "errors": [],
    }
    ctx = Context(timing, args.redis_db, only)
    try:
        if ctx.pg is not None:
            results["private_servers"] = {"postgresql": ctx.pg.version}
        found: dict[str, list[dict[str, Any]]] = {}

        def one(name: str) -> None:
            try:
                found[name] = run_scenario(ctx, name)
            except Exception as exc:
                traceback.print_exc()
                results["errors"].append(f"{name}: {type(exc).__name__}: {exc}")

        for wave in WAVES:
            names = [name for name in wave if name in only]
            parallel([lambda name=name: one(name) for name in names])  # type: ignore[misc]
        for name in SCENARIOS:
            results["rows"].extend(found.get(name, []))
    finally:
        ctx.close()
    results["elapsed_s"] = round(time.monotonic() - started, 1)
    print()
    print(render(results))
    print(f"\n(run took {results['elapsed_s']:g} s)")
    name = "compare-quick.json" if args.quick else "compare-latest.json"
    write_results(results, args.json or HERE / "results" / name)
    return 1 if results["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
