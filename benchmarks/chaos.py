#!/usr/bin/env python3
"""Chaos run: a real topology on this machine, faults on a seeded random schedule.

Topology (every process real, started here):

* 5 ``celery beat`` replicas of ``tests/acceptance/beatapp.py``: 5 interval
  entries every 1 s (``probe-0..4``), 3 crontab entries (``cron-0`` every
  minute, ``cron-1`` every 2 minutes, ``cron-2`` at minutes ``*/7`` of
  Asia/Kolkata) and ``roll-0`` (every 2 s in schedule version 1, every 1 s in
  version 2); replicas 3 and 4 run under libfaketime, 90 s ahead and 90 s
  behind (``LD_PRELOAD`` into the real beat process);
* 2 ``celery worker`` processes (prefork, 2 children each) of
  ``tests/acceptance/singletonapp.py``: every entry sends
  ``singletonapp.slot_probe``, a SingletonTask (one key per entry) that appends
  each execution, with its slot, to a record file;
* PostgreSQL of this run's own (``initdb`` in temporary folders, so it can
  really be restarted and failed over): a primary with a streaming standby
  whose link lags ``--lag`` seconds (``benchmarks/failover.py``; ``--failover
  async``, the default, asynchronous streaming; ``sync``, a synchronous
  standby; ``off``, one cluster and no standby), reached by every beat and
  worker through a TCP proxy that can cut it off and that a failover moves to
  the promoted standby; the harness reads the primary's tables directly;
* a Redis server of this run's own (AOF on, ``appendfsync always``) as the
  broker, really stopped and started again; ``--broker rabbitmq`` uses the
  RabbitMQ on 127.0.0.1:5672 behind a TCP proxy instead (its restart is then
  simulated: every connection cut, new ones refused, for a few seconds).

Faults, one at a time in each of two lanes that run side by side (so faults
of different lanes overlap), in a random order and at random gaps drawn from
``--seed``; every kind runs at least once, then more are drawn until
``--duration`` is used up; a third lane edits stored entries meanwhile
(below):

* replicas lane: SIGKILL of a replica, then a restart; a pause (SIGSTOP) of a
  replica for longer than the claim lease, then SIGCONT, taken at a random
  moment, right after the replica claimed a slot, or right after it published
  one (before its confirm); a rolling restart of all 5 replicas to the other
  ``beat_schedule`` version of ``roll-0``;
* infrastructure lane: a PostgreSQL restart (``pg_ctl restart -m fast`` of
  the primary), a PostgreSQL outage of ``--outage`` seconds (the proxy refuses
  and cuts every connection), a PostgreSQL failover (the primary's node dies
  with whatever its standby had not received yet, the standby is promoted,
  the address moves to it, and a fresh standby of the new primary is made for
  the next one), a broker restart.

The editor lane (``chaos_edits.py``) edits stored entries through
``Schedules`` and the replicas' database proxy all through the faults, every
1 to 3 s: four entries get a new interval or crontab, new arguments, are
disabled and enabled, deleted and added again; single runs (``once-K``) and
entries limited to N runs (``max-K``) are added; and the failover fault
silences the standby's link, makes one edit and cuts 1.5 s later (the
replicas have read it, the promoted standby lacks it). Each write carries a version in its kwargs
(the worker records it with each execution) and in its ``why`` (the history
keeps it): the history of the database the run ended on says which writes
committed, and which a failover lost.

Judged from outside, once every process has stopped: the slots due come from
the database (each entry's anchor + k * period; crontab instants in the
crontab's zone), executions from the workers' record file, sends from the slot
rows and the replicas' logs. A slot executed more than once, or an expected
slot never executed outside a full database outage, fails the run; for slots
that fell due while the database was away the report says what the missed-run
policy (coalesce) did. For each failover the report gives how far behind the
standby was, how long the address was away, the slots published twice around
it (the documented bound: a slot whose sender died with the primary, or whose
write-back came too late, may go out twice with the same task id) and the
lost writes the replicas and workers found and wrote back. For the stored
entries it counts slots sent under a definition replaced more than 1 s before
the slot's instant (0 allowed), slots of each version executed twice or lost
outside outages (0 allowed), and whether each limited entry ran exactly as
many times as asked (the missed-run policy's share of an outage aside).

Usage::

    python benchmarks/chaos.py --duration 600 --seed 1      # the long form, ~12 min
    python benchmarks/chaos.py --duration 75 --seed 7 --lease 5   # what make test runs
    python benchmarks/chaos.py --failover sync      # a synchronous standby

Exit status 0 when nothing executed twice, nothing was lost, and nothing of a
stored entry went out under an outdated definition or more (or fewer) times
than asked.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import platform
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
ACCEPTANCE = ROOT / "tests" / "acceptance"
# this checkout's package and the acceptance harness, whatever the venv has installed
sys.path[:0] = [str(ROOT), str(ACCEPTANCE), str(ROOT / "tests")]

import sqlalchemy as sa  # noqa: E402
from chaos_edits import Editor, EditsReport, is_stored  # noqa: E402
from chaos_edits import judge as judge_edits  # noqa: E402
from failover import MODES as FAILOVER_MODES  # noqa: E402
from failover import FailoverPair  # noqa: E402
from harness import (  # noqa: E402
    DROPPED_LINE,
    LOST_RUNS_LINE,
    LOST_SLOTS_LINE,
    SENT_LINE,
    BeatGroup,
    BeatProcess,
    Db,
    Execution,
    Postgres,
    TcpProxy,
    executions,
    free_port,
    imported_from,
    read_records,
    run_rows,
    wait_for,
    wait_ready,
)

import celery_singlebeat  # noqa: E402
from celery_singlebeat.store.base import EARLY_TOLERANCE_US  # noqa: E402
from celery_singlebeat.store.sql.executor import RECONNECT_WINDOW_S  # noqa: E402
from celery_singlebeat.testing.explore.judge import (  # noqa: E402
    GRACE_US,
    OUTAGE_EDGE_US,
    DbWindow,
    db_windows,
    judge_static,
)
from celery_singlebeat.timeline.slots import slot_task_id  # noqa: E402

US = 1_000_000
TASK = "singletonapp.slot_probe"
PROBES = 5
# GRACE_US (the missed-run grace every replica runs with, SB_GRACE) and
# OUTAGE_EDGE_US: the one judge's (testing/explore/judge.py)
#: crontab entries of beatapp (SB_CRON=1): minute step and zone
CRONS = {"cron-0": (1, "UTC"), "cron-1": (2, "UTC"), "cron-2": (7, "Asia/Kolkata")}
ROLL = "roll-0"
ROLL_PERIOD_US = {"1": 2 * US, "2": US}
#: replicas whose clocks are wrong (libfaketime FAKETIME values), by index
SKEWS = {3: "+90s", 4: "-90s"}
#: the Redis transport's visibility timeout in the workers (SB_VISIBILITY)
VISIBILITY = 20.0
#: what Celery logs when its consumer meets an error it does not handle. At a
#: broker restart kombu's Redis transport (5.7.0) now and then raises one while
#: the consumer reconnects (an AttributeError: 'NoneType' object has no
#: attribute 'hostname', from a connection already released: the shape of
#: celery/kombu#582) and the worker exits with status 1.
UNRECOVERABLE = "CRITICAL/MainProcess] Unrecoverable error: "
#: a worker that exits so is started again this much later: the kubelet's first
#: back-off for a container that exits
WORKER_BACKOFF = 10.0
PACKAGE_FRAME = f'File "{Path(celery_singlebeat.__file__).parent}{os.sep}'
#: a worker that lost its broker connection puts back what it held
RESTORING_LINE = re.compile(r"Restoring (?P<n>\d+) unacknowledged message")
#: a replica proposes its version's slots once this long after it logged that
#: it connected (the log is polled every 0.2 s; its first tick follows at once)
ROLL_SETTLE_US = US
#: and has claimed a slot this long after its instant at the latest when it is
#: not the entry's first replica (sharing.FALLBACK_DELAY_US, 250 ms, a wake-up
#: jitter and a round trip), so it must still run then
ROLL_CLAIM_US = US
#: the bound on a claim abandoned before its publish: taken over once the lease
#: has run out, by the next sweep (every lease/3) of any replica; this much more
#: for the first claim's own lag (up to the fallback delay) and the publish
TAKEOVER_SLACK_US = US
OFFSET_LINE = re.compile(r"database clock offset (?P<ms>[+-][\d.]+) ms")
#: a publish as a replica logs it, with the log line's time (the replica's clock)
SENT_AT = re.compile(
    r"^\[(?P<ts>[\d-]+ [\d:]+,\d{3}): INFO/MainProcess\] " + SENT_LINE.pattern, re.M
)
STOPPING_LINE = re.compile(r"SB-STOPPING (?P<entry>\S+) (?P<task_id>[0-9a-f-]{36})")
#: a replica's hold after a broken connection, as it logs it (the INFO line when
#: nothing was lost, the ERROR line when something was): its start on the
#: replica's clock and how long its fallback proposals wait
HOLD_AT = re.compile(
    r"^\[(?P<ts>[\d-]+ [\d:]+,\d{3}): \w+/MainProcess\] singlebeat: (?:replica \S+ "
    r"reconnected to the database; its fallback proposals and sweeps wait|the database "
    r"lost .*?fallback proposals and sweeps wait) (?P<s>[\d.]+)s",
    re.M,
)
#: a replica's outage as it logs it: the ERROR when a statement could not reach
#: the database (after the store's reconnect window); the replica sends nothing
#: from then until it reconnects (its next HOLD_AT line), which its backoff may
#: put up to 10 s after the database is back
UNREACHABLE_AT = re.compile(
    r"^\[(?P<ts>[\d-]+ [\d:]+,\d{3}): ERROR/MainProcess\] singlebeat: database \S+ "
    r"unreachable \(",
    re.M,
)
#: a slot is counted against a failover when its instant is this close to it:
#: the replicas' failover window (singlebeat_failover_window, 10 s) before the
#: cut, until the write-back hold after the address moved has passed
FAILOVER_BEFORE_US = 10 * US
FAILOVER_AFTER_US = 10 * US
#: seconds from the editor's edit to a failover's cut (see pg_failover): the
#: replicas read a commit within about a second (the feed, every 0.95 s)
EDIT_BEFORE_CUT = 1.5


def now_us() -> int:
    """This host's clock; the database runs here, so it is the database's clock."""
    return int(time.time() * US)


def iso_ms(text: str) -> int:
    """Milliseconds since the epoch of an instant as the scheduler logs it."""
    when = datetime.fromisoformat(text.replace("Z", "+00:00"))
    return round(when.timestamp() * 1000)


def port_open(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def libfaketime() -> str | None:
    found = sorted(glob.glob("/usr/lib/*/faketime/libfaketime.so.1"))
    return found[0] if found else None


# -- services of this run's own ------------------------------------------------


class Redis:
    """A Redis server of this run's own: a broker that can really be restarted.
    AOF with ``appendfsync always``: a restart keeps what was queued; never
    rewritten, so the AOF is the log of every write the broker took."""

    def __init__(self, workdir: Path) -> None:
        self.dir = workdir / "redis"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server is not installed")
        self.binary = binary

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [
                self.binary, "--port", str(self.port), "--bind", "127.0.0.1",
                "--dir", str(self.dir), "--appendonly", "yes", "--appendfsync", "always",
                "--save", "", "--logfile", str(self.dir / "redis.log"),
                "--auto-aof-rewrite-percentage", "0",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            stdin=subprocess.DEVNULL,
        )  # fmt: skip
        wait_for(lambda: port_open(self.port), 30, "redis-server to listen")

    def stop(self) -> None:
        """SIGTERM: Redis finishes its AOF and exits, as a restart would."""
        if self.proc is None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
        self.proc = None

    def version(self) -> str:
        done = subprocess.run([self.binary, "--version"], capture_output=True, text=True)
        return done.stdout.strip()

    def writes(self) -> Iterable[list[bytes]]:
        """Every write command the broker applied, in order (the AOF's
        incremental files, as the manifest lists them)."""
        folder = self.dir / "appendonlydir"
        manifest = folder / "appendonly.aof.manifest"
        if not manifest.exists():
            return
        for line in manifest.read_text().splitlines():
            fields = line.split()
            if "type" in fields and fields[fields.index("type") + 1] == "i":
                yield from resp_commands((folder / fields[1]).read_bytes())

    def popped_unregistered(self, queue: str, task_ids: set[str]) -> set[str]:
        """Of ``task_ids``, those whose message was pushed to ``queue``, then
        popped by a consumer (the AOF logs a BRPOP as RPOP) and never written
        to kombu's ``unacked`` hash: taken from Redis and lost before any worker
        registered it, which kombu's Redis transport cannot recover."""
        name = queue.encode()
        pending: list[bytes] = []  # the list, oldest (next to pop) last
        popped: set[str] = set()
        registered: set[str] = set()
        wanted = {t.encode(): t for t in task_ids}

        def ids(message: bytes) -> list[str]:
            return [t for raw, t in wanted.items() if raw in message]

        for command in self.writes():
            op = command[0].upper()
            if op == b"LPUSH" and command[1] == name:
                pending[:0] = reversed(command[2:])
            elif op == b"RPUSH" and command[1] == name:
                pending.extend(command[2:])  # a restored message goes back in front
            elif op == b"RPOP" and command[1] == name and pending:
                popped.update(ids(pending.pop()))
            elif op == b"HSET" and command[1] == b"unacked":
                registered.update(ids(b"".join(command[2:])))
        return popped - registered


def resp_commands(data: bytes) -> Iterable[list[bytes]]:
    """The commands of an AOF file (RESP arrays of bulk strings)."""
    at = 0
    while at < len(data):
        if data[at : at + 1] != b"*":  # an annotation line (#...)
            at = data.index(b"\n", at) + 1
            continue
        end = data.index(b"\r\n", at)
        count, at = int(data[at + 1 : end]), end + 2
        command = []
        for _ in range(count):
            end = data.index(b"\r\n", at)
            size, at = int(data[at + 1 : end]), end + 2
            command.append(data[at : at + size])
            at += size + 2
        yield command


def celery_gave_up(log: str) -> str | None:
    """The error of a worker's log that ends in Celery's own "Unrecoverable
    error" raised outside celery_singlebeat (no frame of the package in its
    traceback); None for any other exit, which stays a failure of the run.
    Its traceback ends at the next log record: what the pool's children log
    after it (a task that failed on the same broker restart, through the
    package's frames) is not part of the main process's error."""
    at = log.rfind(UNRECOVERABLE)
    if at < 0:
        return None
    first, *rest = log[at + len(UNRECOVERABLE) :].splitlines()
    traceback = []
    for line in rest:
        if line.startswith("["):
            break
        traceback.append(line)
    if any(PACKAGE_FRAME in line for line in traceback):
        return None
    return first


# -- the run's record ----------------------------------------------------------------


@dataclass
class Fault:
    """One injected fault, on the database's clock (this host's)."""

    kind: str
    target: str
    detail: str
    start_us: int
    end_us: int = 0
    #: the database was unreachable for everyone from start_us to restored_us
    db_down: bool = False
    restored_us: int = 0
    #: a pause: the incarnation, and the slot it stopped on (entry, task id)
    proc: str = ""
    slot: tuple[str, str] | None = None
    mode: str = ""


@dataclass
class Life:
    """One beat process of the run: its schedule version and when it could send.

    The version decides which ``roll-0`` instants it proposes, so the judge can
    tell, for each instant only one version has, whether a replica with that
    version was running (then it must execute), may have been (at a start or
    a stop: either is right), or was not (then it must not execute)."""

    version: str
    spawned_us: int
    connected_us: int = 0
    #: when it was stopped, killed, or (for the last ones) the run ended
    ended_us: int = 0


@dataclass
class Replica:
    index: int
    stop_on: str
    skew: str | None
    version: str = "1"
    proc: BeatProcess | None = None
    incarnations: list[BeatProcess] = field(default_factory=list)

    @property
    def name(self) -> str:
        return f"r{self.index}"


@dataclass
class Config:
    duration: float = 600.0
    seed: int = 1
    lease: float = 15.0
    outage: float = 30.0
    replicas: int = 5
    workers: int = 2
    broker: str = "redis"
    #: ``async``, ``sync`` (the standby's replication) or ``off`` (no standby,
    #: no failover fault)
    failover: str = "async"
    #: the standby's link delays the primary's WAL stream by this much (async)
    lag: float = 0.3
    #: singlebeat_failover_window of every beat and worker (None: the
    #: package's default; 0: nothing written back, to see what that prevents)
    failover_window: float | None = None
    workdir: Path | None = None
    keep: bool = False
    quiet: bool = False


@dataclass
class Delay:
    entry: str
    slot_us: int
    dispatch_s: float
    executed_s: float | None
    fence: int
    sender: str
    cause: str
    in_outage: bool = False


@dataclass
class Report:
    config: dict[str, Any]
    machine: dict[str, str]
    started: str
    wall_s: float
    window_s: float
    faults: list[dict[str, Any]]
    due: int = 0
    due_required: int = 0
    optional_due: int = 0
    optional_executed: int = 0
    sent: int = 0
    published: int = 0
    published_twice: int = 0
    #: per failover: how far behind its standby was, how long the address was
    #: away, and the slots published and executed twice around it
    failovers: list[dict[str, Any]] = field(default_factory=list)
    #: slot rows (replicas) and run rows (workers) a failover lost and the
    #: replicas and workers found missing and wrote again
    rewritten_slots: int = 0
    rewritten_runs: int = 0
    dropped_by_worker: int = 0
    held_at_broker_loss: int = 0
    taken_over: int = 0
    executed: int = 0
    executed_twice: int = 0
    lost: int = 0
    lost_never_sent: int = 0
    #: slots sent and confirmed, then lost by the broker: the Redis log shows
    #: the message popped by a consumer and never registered as unacknowledged
    broker_losses: list[str] = field(default_factory=list)
    unexpected: int = 0
    #: claimed, published or executed more than 250 ms before the slot's instant
    early: int = 0
    #: slots a paused replica sent under a claim whose lease had run out
    late_sends: int = 0
    #: lease + lease/3 (+ TAKEOVER_SLACK_US): the latest a slot may leave when no
    #: fault of the database or the broker was in force (a claim abandoned by a
    #: killed or paused replica is taken over by the next sweep after its lease)
    bound_s: float = 0.0
    #: slots sent later than that, with no database or broker fault to explain it
    over_bound: int = 0
    #: taken-over slots held to that bound (no such fault near them), and the
    #: latest of their dispatches
    held_takeovers: int = 0
    worst_takeover_s: float = 0.0
    #: roll-0 instants only its every-1-s version has that had to run (a replica
    #: with that version was running), and those at a start or stop of one
    roll_required: int = 0
    policy_windows: list[dict[str, Any]] = field(default_factory=list)
    #: outside database outages
    worst_dispatch_s: float = 0.0
    #: including slots the missed-run policy sent after an outage
    worst_dispatch_any_s: float = 0.0
    p50_dispatch_s: float = 0.0
    p99_dispatch_s: float = 0.0
    worst_execution_s: float = 0.0
    worst: list[dict[str, Any]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    clock_offsets: dict[str, str] = field(default_factory=dict)
    code_under_test: list[str] = field(default_factory=list)
    #: the stored entries the editor lane edited during the faults (chaos_edits)
    edits: EditsReport = field(default_factory=EditsReport)
    text: str = ""

    @property
    def ok(self) -> bool:
        return not (
            self.executed_twice
            or self.lost
            or self.unexpected
            or self.early
            or self.late_sends
            or self.over_bound
            or not self.edits.ok
        )


# -- expected slots -----------------------------------------------------------------


def interval(anchor_us: int, period_us: int, upto_us: int) -> list[int]:
    count = max(0, (upto_us - anchor_us) // period_us)
    return [anchor_us + k * period_us for k in range(1, count + 1)]


def cron_instants(step: int, zone: str, after_us: int, upto_us: int) -> list[int]:
    """Whole minutes in (after, upto] whose minute, on the zone's wall clock, is
    a multiple of ``step`` (what ``crontab(minute="*/step")`` matches)."""
    tz = ZoneInfo(zone)
    out = []
    minute = (after_us // (60 * US) + 1) * 60
    while minute * US <= upto_us:
        wall = datetime.fromtimestamp(minute, tz)
        if wall.minute % step == 0:
            out.append(minute * US)
        minute += 60
    return out


# -- the run ----------------------------------------------------------------------


def logged_at(pattern: re.Pattern[str], text: str) -> Iterator[tuple[int, re.Match[str]]]:
    """Each match of ``pattern`` (a log line with its ``ts``) in one beat
    process's log, with its instant on the database's clock: the log's clock
    is the process's own (90 s off under libfaketime), corrected with the
    database clock offset it logged when it connected."""
    offset = OFFSET_LINE.search(text)
    offset_us = float(offset["ms"]) * 1000 if offset else 0.0
    for m in pattern.finditer(text):
        local = datetime.strptime(m["ts"], "%Y-%m-%d %H:%M:%S,%f").timestamp()
        yield int(local * US + offset_us), m


class Chaos:
    def __init__(self, config: Config) -> None:
        self.config = config
        self.lease_us = int(config.lease * US)
        self.rng_replicas = random.Random(f"{config.seed}-replicas")
        self.rng_infra = random.Random(f"{config.seed}-infra")
        self.own_workdir = config.workdir is None
        self.workdir = Path(config.workdir or tempfile.mkdtemp(prefix="chaos-"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.group = BeatGroup(self.workdir)
        self.record = self.workdir / "record.jsonl"
        self.prefix = f"chaos{uuid.uuid4().hex[:8]}_"
        self.queue = f"chaos-{uuid.uuid4().hex[:12]}"
        self.faults: list[Fault] = []
        self.lock = threading.Lock()
        self.abort = threading.Event()
        self.errors: list[str] = []
        self.replicas: list[Replica] = []
        self.workers: list[BeatProcess] = []
        #: every worker process of the run, those that exited and were replaced too
        self.worker_runs: list[BeatProcess] = []
        self.worker_restarts: list[threading.Thread] = []
        self.version = "1"
        self.pg: Postgres | None = None
        self.pg_mode = ""
        #: the primary, its standby and the movable address (Config.failover)
        self.pair: FailoverPair | None = None
        #: each failover fault and what FailoverPair.failover measured
        self.failed_over: list[tuple[Fault, Any]] = []
        self.redis: Redis | None = None
        self.amqp_url = ""
        self.db_proxy: TcpProxy | None = None
        self.broker_proxy: TcpProxy | None = None
        self.db: Db | None = None
        self.started_us = 0
        self.t0 = time.monotonic()
        self.faketime = libfaketime()
        self.machine: dict[str, str] = {}
        #: a resumed replica that sent a slot it had lost (its pause was longer than the lease)
        self.late_sends: list[str] = []
        #: incarnations that a fault killed or stopped
        self.replacing: set[str] = set()
        #: every beat process of the run, by name
        self.lives: dict[str, Life] = {}
        #: each beat process's holds after a broken connection (read_holds)
        self.holds: dict[str, list[tuple[int, int]]] = {}
        #: each beat process's own outages (read_outages)
        self.outages: dict[str, list[tuple[int, int | None]]] = {}
        #: slot rows written back after a failover (slot_rows)
        self.written_back: set[tuple[str, int]] = set()
        #: the editor lane (chaos_edits), through the replicas' database proxy
        self.editor: Editor | None = None

    # -- output ---------------------------------------------------------------

    def say(self, message: str) -> None:
        if not self.config.quiet:
            print(f"[{time.monotonic() - self.t0:7.1f}s] {message}", flush=True)

    # -- set-up ---------------------------------------------------------------

    def setup(self) -> None:
        if self.faketime is None:
            raise RuntimeError("libfaketime is not installed (apt-get install faketime)")
        if self.config.failover not in (*FAILOVER_MODES, "off"):
            raise ValueError(f"failover must be one of {FAILOVER_MODES} or 'off'")
        try:
            if self.config.failover != "off":
                self.pair = FailoverPair(self.config.failover, self.config.lag)
                self.pair.start()
                self.pg = self.pair.primary
                db_url = self.pair.primary_url
                self.pg_mode = (
                    "real: pg_ctl restart -m fast of the primary (its standby reconnects)"
                )
            else:
                self.pg = Postgres()
                self.pg.start()
                db_url = self.pg.url
                self.pg_mode = "real: pg_ctl restart -m fast of this run's own cluster"
            assert self.pg is not None
            target = ("127.0.0.1", self.pg.port)
        except (RuntimeError, OSError) as exc:
            # No PostgreSQL binaries (or no postgres user): the shared server, and
            # a restart simulated by the proxy (every connection reset, ~1 s refused).
            self.say(f"no private PostgreSQL cluster ({exc}); using SB_TEST_PG")
            if self.pair is not None:
                self.pair.close()
            elif self.pg is not None:
                self.pg.close(keep=False)
            self.pg = self.pair = None
            db_url = os.environ.get(
                "SB_TEST_PG", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
            )
            parsed = sa.engine.make_url(db_url)
            target = (parsed.host or "127.0.0.1", parsed.port or 5432)
            self.pg_mode = "simulated: proxy resets every connection and refuses new ones for 1 s"
        # With a standby, the pair's movable address is the proxy every client
        # goes through: an outage cuts it, a failover moves it.
        self.db_proxy = self.pair.address if self.pair is not None else TcpProxy(target)
        assert self.db_proxy is not None
        proxied = (
            sa.engine.make_url(db_url)
            .set(host="127.0.0.1", port=self.db_proxy.port)
            .render_as_string(hide_password=False)
        )
        self.db = Db(db_url, self.prefix)
        if self.config.broker == "redis":
            self.redis = Redis(self.workdir)
            self.redis.start()
            broker = self.redis.url
        else:
            amqp = os.environ.get("SB_TEST_AMQP", "amqp://guest:guest@127.0.0.1:5672//")
            self.amqp_url = amqp
            parsed = sa.engine.make_url(amqp.replace("amqp://", "postgresql://", 1))
            self.broker_proxy = TcpProxy((parsed.host or "127.0.0.1", parsed.port or 5672))
            broker = amqp.replace(
                f"@{parsed.host}:{parsed.port}", f"@127.0.0.1:{self.broker_proxy.port}", 1
            )
        self.machine = machine_info(self)
        # Subprocesses import this checkout's celery_singlebeat, whatever the venv has.
        pythonpath = os.pathsep.join(
            p for p in (str(ACCEPTANCE), str(ROOT), os.environ.get("PYTHONPATH", "")) if p
        )
        common = {
            "PYTHONPATH": pythonpath,
            "SB_BROKER": broker,
            "SB_URL": proxied,
            "SB_PREFIX": self.prefix,
            "SB_QUEUE": self.queue,
        }
        if self.config.failover_window is not None:
            common["SB_FAILOVER_WINDOW"] = f"{self.config.failover_window:g}"
        self.worker_env = {**common, "SB_RECORD": str(self.record), "SB_TTL": "5"}
        if self.redis is not None:
            # what a worker held unacknowledged when a broker restart cut its
            # connection comes back after this, not kombu's default hour
            self.worker_env["SB_VISIBILITY"] = f"{VISIBILITY:g}"
        self.beat_env = {
            **common,
            "SB_ENTRIES": str(PROBES),
            "SB_EVERY": "1",
            "SB_LEASE": f"{self.config.lease:g}",
            "SB_LOOP": "1",
            "SB_POLICY": "coalesce",
            "SB_GRACE": f"{GRACE_US / US:g}",
            "SB_TASK": TASK,
            "SB_CRON": "1",
            "SB_STOP_ARM": "usr2",
        }
        standby = (
            f" with a {self.pair.mode} standby (link {self.pair.lag:g}s behind)"
            if self.pair is not None
            else ""
        )
        self.say(
            f"workdir {self.workdir}; PostgreSQL {'private' if self.pg else 'shared'}"
            f"{standby} via proxy :{self.db_proxy.port}; broker {broker}"
        )
        for i in range(self.config.workers):
            self.workers.append(
                self.group.start_worker(
                    self.worker_env, f"worker-{i}", app="singletonapp", concurrency=2
                )
            )
        self.worker_runs.extend(self.workers)
        wait_ready(*self.workers, timeout=90)
        self._where(broker)
        self.started_us = now_us()
        for i in range(self.config.replicas):
            replica = Replica(i, ("claimed", "published")[i % 2], SKEWS.get(i))
            self.replicas.append(replica)
            self.start_replica(replica)
        for replica in self.replicas:
            self.wait_connected(replica, 90)
        self.say("every replica connected")
        self.editor = Editor(proxied, self.prefix, self.config.seed, now_us)
        self.editor.open()

    def _where(self, broker: str) -> None:
        """Ask a worker which celery_singlebeat it imported (recorded in SB_RECORD)."""
        from celery import Celery

        app = Celery("chaos-sender", broker=broker)
        app.conf.broker_connection_retry_on_startup = True
        try:
            app.send_task(
                "singletonapp.where", queue=self.queue, exchange=self.queue, routing_key=self.queue
            )
        finally:
            app.close()

    def start_replica(self, replica: Replica) -> BeatProcess:
        env = {**self.beat_env, "SB_ROLL": replica.version, "SB_STOP_ON": replica.stop_on}
        if replica.skew:
            env.update(LD_PRELOAD=str(self.faketime), FAKETIME=replica.skew)
        proc = self.group.start_beat(env, f"{replica.name}.{len(replica.incarnations) + 1}")
        self.lives[proc.name] = Life(replica.version, now_us())
        replica.proc = proc
        replica.incarnations.append(proc)
        return proc

    def wait_connected(self, replica: Replica, timeout: float) -> bool:
        proc = replica.proc
        assert proc is not None
        try:
            wait_for(
                lambda: "connected to" in proc.log() or not proc.alive(),
                timeout,
                f"{proc.name} to connect",
                interval=0.2,
            )
        except AssertionError:
            return False
        if not proc.alive():
            raise RuntimeError(f"{proc.name} exited:\n{proc.log()[-3000:]}")
        self.lives[proc.name].connected_us = now_us()
        return True

    def end_life(self, proc: BeatProcess) -> None:
        """``proc`` is about to be stopped or killed: it proposes nothing more."""
        self.lives[proc.name].ended_us = now_us()

    # -- faults -----------------------------------------------------------------

    def _fault(self, kind: str, target: str, detail: str = "", **kw: Any) -> Fault:
        fault = Fault(kind, target, detail, now_us(), **kw)
        with self.lock:
            self.faults.append(fault)
        return fault

    def _sleep(self, seconds: float) -> None:
        if self.abort.wait(max(0.0, seconds)):
            raise RuntimeError("aborted")

    def restart_worker(self, worker: BeatProcess, reason: str) -> None:
        """A worker that Celery itself gave up on is started again, as its pod's
        container would be, and the report lists it with the faults: what it
        held unacknowledged comes back after the visibility timeout, and
        SingletonTask drops a repeat of anything it finished."""
        index = self.workers.index(worker)
        base = f"worker-{index}"
        fault = self._fault(
            "worker exit",
            base,
            f"{worker.name} exited by itself (status {worker.proc.returncode}), Celery's "
            f"'Unrecoverable error: {reason[:120]}'; started again {WORKER_BACKOFF:g}s later",
        )
        self.say(f"{worker.name} exited by itself: Unrecoverable error: {reason[:120]}")
        self.replacing.add(worker.name)
        runs = sum(1 for w in self.worker_runs if w.name.split(".")[0] == base)

        def start_again() -> None:
            if self.abort.wait(WORKER_BACKOFF):
                return
            new = self.group.start_worker(
                self.worker_env, f"{base}.{runs + 1}", app="singletonapp", concurrency=2
            )
            with self.lock:
                self.workers[index] = new
                self.worker_runs.append(new)
            try:
                wait_ready(new, timeout=90)
            except AssertionError as exc:
                self.errors.append(f"{new.name} did not start again: {exc}")
                self.abort.set()
            fault.end_us = now_us()

        thread = threading.Thread(target=start_again, name=f"restart-{base}", daemon=True)
        self.worker_restarts.append(thread)
        thread.start()

    def kill(self, rng: random.Random) -> None:
        replica = rng.choice(self.replicas)
        down = rng.uniform(1.0, 5.0)
        assert replica.proc is not None
        fault = self._fault("kill", replica.name, f"SIGKILL, restarted {down:.1f}s later")
        self.say(f"fault: SIGKILL {replica.proc.name}")
        self.replacing.add(replica.proc.name)
        self.end_life(replica.proc)
        replica.proc.kill()
        self._sleep(down)
        self.start_replica(replica)
        self.wait_connected(replica, self.config.outage + 60)
        fault.end_us = now_us()

    def pause(self, rng: random.Random, mode: str | None = None) -> None:
        """SIGSTOP for longer than the lease, then SIGCONT. ``mode``: ``claimed``
        or ``published``: the replica stops itself right after it next claims
        (publishes) a slot (beatapp's SB_STOP_ON, armed by SIGUSR2); ``anywhere``:
        a SIGSTOP at a random moment."""
        mode = mode or rng.choice(["anywhere", "claimed", "published"])
        hold = self.config.lease + rng.uniform(1.0, 4.0)
        pool = [r for r in self.replicas if mode == "anywhere" or r.stop_on == mode]
        replica = rng.choice(pool)
        proc = replica.proc
        assert proc is not None
        fault = self._fault("pause", replica.name)
        fault.proc = proc.name
        if mode == "anywhere":
            proc.signal(signal.SIGSTOP)
            how = "SIGSTOP at a random moment"
        else:
            before = len(STOPPING_LINE.findall(proc.log()))
            proc.signal(signal.SIGUSR2)
            how = f"stopped itself right after it {mode} a slot"
            # it wins nothing while the database is away: wait that out too
            patience = self.config.outage + 15
            try:
                wait_for(lambda: proc.state() == "T", patience, "the armed replica to stop", 0.02)
            except AssertionError:
                proc.signal(signal.SIGUSR1)  # disarm; it may have stopped meanwhile
                time.sleep(0.3)
                if proc.state() != "T":
                    proc.signal(signal.SIGSTOP)
                    how = f"won nothing in {patience:g} s (armed: {mode}); SIGSTOP instead"
            stops = STOPPING_LINE.findall(proc.log())
            if len(stops) > before:
                fault.slot = stops[-1]
                fault.mode = mode
        stopped = time.monotonic()
        fault.start_us = now_us()
        self.say(f"fault: pause {proc.name} ({how}) for {hold:.1f}s")
        self._sleep(stopped + hold - time.monotonic())
        proc.signal(signal.SIGCONT)
        fault.end_us = now_us()
        fault.detail = f"{how}; SIGCONT after {hold:.1f}s (lease {self.config.lease:g}s)"

    def pause_claimed(self, rng: random.Random) -> None:
        self.pause(rng, "claimed")

    def pause_published(self, rng: random.Random) -> None:
        self.pause(rng, "published")

    def rolling(self, rng: random.Random) -> None:
        old, new = self.version, "2" if self.version == "1" else "1"
        order = list(self.replicas)
        rng.shuffle(order)
        fault = self._fault(
            "rolling restart",
            "all",
            f"{ROLL} v{old} -> v{new} (every {ROLL_PERIOD_US[old] / US:g}s -> "
            f"{ROLL_PERIOD_US[new] / US:g}s), order {' '.join(r.name for r in order)}",
        )
        self.say(f"fault: rolling restart to v{new}")
        for replica in order:
            assert replica.proc is not None
            self.replacing.add(replica.proc.name)
            self.end_life(replica.proc)
            replica.proc.stop(15)
            replica.version = new
            self.start_replica(replica)
            self.wait_connected(replica, self.config.outage + 60)
        self.version = new
        fault.end_us = now_us()

    def pg_restart(self, rng: random.Random) -> None:
        assert self.db_proxy is not None
        fault = self._fault("postgres restart", "database", self.pg_mode, db_down=True)
        self.say("fault: PostgreSQL restart")
        if self.pg is not None:
            self.pg.restart()
        else:
            self.db_proxy.cut()
            self._sleep(1.0)
            self.db_proxy.restore()
        fault.restored_us = fault.end_us = now_us()

    def pg_outage(self, rng: random.Random) -> None:
        assert self.db_proxy is not None
        fault = self._fault(
            "postgres outage",
            "database",
            f"{self.config.outage:g}s: the proxy resets every connection and refuses new ones",
            db_down=True,
        )
        self.say(f"fault: PostgreSQL outage of {self.config.outage:g}s")
        self.db_proxy.cut()
        try:
            self._sleep(self.config.outage)
        finally:
            self.db_proxy.restore()
        fault.restored_us = fault.end_us = now_us()

    def pg_failover(self, rng: random.Random) -> None:
        """The primary's node dies, its standby is promoted, the address moves
        (FailoverPair.failover); then a fresh standby of the new primary streams,
        so that the next failover has one."""
        pair = self.pair
        assert pair is not None
        fault = self._fault("postgres failover", "database", "", db_down=True)
        self.say(f"fault: PostgreSQL failover ({pair.mode} standby)")
        # an edit whose commit the standby may not have yet: which version won
        # is read from the new primary's history at the end (chaos_edits)
        edit = None
        if self.editor is not None:
            if pair.mode == "async" and pair.link is not None:
                # The standby falls behind (its link goes silent), as it does
                # for up to 5 s after a restart of the primary: the edit below
                # commits on the primary alone, and the replicas have read it
                # by the cut. (A synchronous standby would hold the commit.)
                pair.link.blackhole()
            edit = self.editor.edit_now("right before a failover's cut")
            self._sleep(EDIT_BEFORE_CUT)
        record = pair.failover()
        if self.editor is not None:
            self.editor.after_failover()
        fault.restored_us = int(record.moved_at * US)
        self.failed_over.append((fault, record))
        # the harness reads the new primary; the old one's data is gone
        old, self.pg = self.db, pair.primary
        self.db = Db(pair.primary_url, self.prefix)
        if old is not None:
            old.engine.dispose()
        fault.detail = (
            f"{pair.mode} standby {record.behind_bytes} bytes / {record.behind_ms:g} ms "
            f"behind; primary stopped -m immediate, standby promoted (timeline "
            f"{record.timeline}), address moved after {record.unavailable_s:.2f}s"
        )
        if edit is not None:
            fault.detail += (
                f"; edit v{edit.v} of {edit.name} "
                + (f"failed ({edit.error[:60]})" if edit.error else "returned")
                + f" {(record.cut_at * US - edit.done_us) / 1000:.0f} ms before the cut"
            )
        pair.add_standby()
        fault.end_us = now_us()

    def broker_restart(self, rng: random.Random) -> None:
        down = rng.uniform(1.0, 4.0)
        if self.redis is not None:
            fault = self._fault(
                "broker restart", "redis", f"SIGTERM, started again {down:.1f}s later"
            )
            self.say("fault: broker restart")
            self.redis.stop()
            self._sleep(down)
            self.redis.start()
        else:
            assert self.broker_proxy is not None
            fault = self._fault(
                "broker restart",
                "rabbitmq",
                f"simulated: every connection reset, new ones refused for {down:.1f}s",
            )
            self.broker_proxy.cut()
            self._sleep(down)
            self.broker_proxy.restore()
        fault.end_us = now_us()

    # -- the schedule -------------------------------------------------------------

    def _estimate(self, kind: str) -> float:
        lease, outage = self.config.lease, self.config.outage
        return {
            "kill": 10.0,
            "pause": lease + 8.0,
            "pause_claimed": lease + 10.0,
            "pause_published": lease + 10.0,
            "rolling": 40.0,
            "pg_restart": 5.0,
            "pg_outage": outage + 12.0,
            "pg_failover": 15.0,
            "broker_restart": 8.0,
        }[kind]

    def lane(
        self, rng: random.Random, first: list[str], weights: dict[str, float], end: float
    ) -> None:
        """Every kind of ``first`` once (shuffled), then kinds drawn by weight
        while time allows."""
        first = list(first)
        rng.shuffle(first)
        try:
            while not self.abort.is_set():
                gap = rng.uniform(2.0, 6.0) if first else rng.uniform(4.0, 25.0)
                if first:
                    kind = first.pop(0)
                else:
                    kind = rng.choices(list(weights), list(weights.values()))[0]
                    if time.monotonic() + gap + self._estimate(kind) > end:
                        return
                self._sleep(gap)
                getattr(self, kind)(rng)
        except Exception as exc:
            if not self.abort.is_set():
                self.errors.append(f"{type(exc).__name__}: {exc}")
                self.abort.set()

    def edit_lane(self, end: float) -> None:
        """The third lane: stored entries edited until ``end`` (chaos_edits)."""
        assert self.editor is not None
        try:
            self.editor.run(end, self.abort)
        except Exception as exc:
            if not self.abort.is_set():
                self.errors.append(f"editor: {type(exc).__name__}: {exc}")
                self.abort.set()

    def run_faults(self) -> None:
        end = time.monotonic() + self.config.duration
        infra = ["pg_restart", "pg_outage", "broker_restart"]
        weights = {"pg_restart": 2.0, "broker_restart": 2.0, "pg_outage": 0.6}
        if self.pair is not None:
            infra.append("pg_failover")
            weights["pg_failover"] = 1.5
        lanes = [
            threading.Thread(
                target=self.lane,
                args=(
                    self.rng_replicas,
                    ["kill", "pause_claimed", "pause_published", "rolling"],
                    {"kill": 3.0, "pause": 3.0, "rolling": 1.0},
                    end,
                ),
                name="lane-replicas",
            ),
            threading.Thread(
                target=self.lane,
                args=(self.rng_infra, infra, weights, end),
                name="lane-infra",
            ),
            threading.Thread(target=self.edit_lane, args=(end,), name="lane-editor"),
        ]
        for lane in lanes:
            lane.start()
        while any(lane.is_alive() for lane in lanes):
            for lane in lanes:
                lane.join(0.5)
            dead = [r.proc for r in self.replicas if r.proc is not None and not r.proc.alive()]
            dead += [w for w in self.workers if not w.alive()]
            # a replica killed or stopped by a fault did not exit by itself
            dead = [d for d in dead if d.name not in self.replacing]
            for worker in [d for d in dead if d in self.workers]:
                reason = celery_gave_up(worker.log())
                if reason is not None and not self.abort.is_set():
                    self.restart_worker(worker, reason)
                    dead.remove(worker)
            if dead and not self.abort.is_set():
                # the work folder is gone after the run: say why here
                self.errors.extend(
                    f"process exited by itself: {d.name} (exit status {d.proc.returncode}); "
                    "its log ends:\n" + "\n".join(d.log().splitlines()[-40:])
                    for d in dead
                )
                self.abort.set()
        if self.errors:
            raise RuntimeError("; ".join(self.errors))

    # -- reading the outcome ---------------------------------------------------------

    def slot_rows(self) -> dict[tuple[str, int], tuple[int, str, int, int, int | None]]:
        """(entry, slot) -> (state, owner, fence, claimed_us, sent_us), read directly.

        Also notes the rows a replica wrote back after a failover lost them
        (``written_back``): the write-back stamps both times with its own
        moment and leaves no lease, which no claim and confirm do."""
        assert self.db is not None
        s = self.db.tables.slots
        query = sa.select(s.c.entry, s.c.slot_us, s.c.state, s.c.owner, s.c.fence, s.c.claimed_us)
        with self.db.engine.connect() as conn:
            rows = conn.execute(query.add_columns(s.c.sent_us, s.c.lease_until_us)).all()
        self.written_back = {
            (r[0], int(r[1])) for r in rows if r[7] == 0 and r[6] is not None and r[6] == r[5]
        }
        return {
            (r[0], int(r[1])): (int(r[2]), r[3], int(r[4]), int(r[5]), r[6] and int(r[6]))
            for r in rows
        }

    def executions(self) -> dict[tuple[str, int], list[float]]:
        """Slot -> the start of each of its executions, counted once to completion.

        A start whose worker process died before it finished (no ``end``, and
        no record of that process after it: SIGKILLed, or exited after a
        broker restart) followed by another start of the slot (the fleet sent
        it again once its run's ttl and grace lapsed, docs/guarantees.md) is
        one execution with that later one, at the first start's instant (the
        slot's delay is its first start). A start without an end whose process
        went on recording (alive, yet started again: a real duplicate), and
        two finished runs, count twice."""
        records = read_records(self.record)
        last_record: dict[int, float] = {}
        for rec in records:
            last_record[rec["pid"]] = max(last_record.get(rec["pid"], 0.0), rec["at"])
        runs: dict[tuple[str, int], list[Execution]] = defaultdict(list)
        for ex in executions(records):
            if ex.task == TASK and ex.slot is not None:
                runs[ex.slot].append(ex)
        out: dict[tuple[str, int], list[float]] = defaultdict(list)
        for slot, started in runs.items():
            counted: list[float] = []
            died_before = False  # the execution counted last died mid-run
            for ex in started:  # in start order
                if not died_before:
                    counted.append(ex.start)
                died_before = ex.end is None and last_record[ex.pid] <= ex.start
            out[slot] = counted
        return out

    def expected(self, upto_us: int) -> tuple[set[tuple[str, int]], set[tuple[str, int]]]:
        """(required, optional) slots up to ``upto_us``.

        ``roll-0``'s instants that only its every-1-s version has are required
        while a replica with that version was connected and running (not
        paused, stopped or killed) from a moment before the instant until it
        must have claimed it (held after a broken connection, a replica
        proposes its fallbacks when the hold ends: then until just after
        that): the union of both versions' schedules runs.
        Optional where such a replica started or stopped around the instant
        (it may or may not have proposed it). Where none ran, the instant is
        no slot at all, and executing it is counted as unexpected."""
        assert self.db is not None
        anchors = self.db.anchors()
        required: set[tuple[str, int]] = set()
        optional: set[tuple[str, int]] = set()
        for name, anchor in anchors.items():
            if name.startswith("probe-"):
                required.update((name, s) for s in interval(anchor, US, upto_us))
            elif name in CRONS:
                step, zone = CRONS[name]
                required.update((name, s) for s in cron_instants(step, zone, anchor, upto_us))
            elif name == ROLL:
                every_2 = set(interval(anchor, ROLL_PERIOD_US["1"], upto_us))
                required.update((name, s) for s in every_2)
                for s in interval(anchor, ROLL_PERIOD_US["2"], upto_us):
                    if s in every_2:
                        continue
                    if self.version_ran("2", s - ROLL_SETTLE_US, s + ROLL_CLAIM_US, upto_us):
                        required.add((name, s))
                    elif self.version_may_have_run("2", s, upto_us):
                        optional.add((name, s))
        return required, optional

    @staticmethod
    def read_holds(beat_logs: list[tuple[BeatProcess, str]]) -> dict[str, list[tuple[int, int]]]:
        """Each beat process's holds after a broken connection, (start, end)
        on the database's clock (:func:`logged_at`)."""
        holds: dict[str, list[tuple[int, int]]] = {}
        for proc, text in beat_logs:
            for at_us, m in logged_at(HOLD_AT, text):
                holds.setdefault(proc.name, []).append((at_us, at_us + int(float(m["s"]) * US)))
        return holds

    @staticmethod
    def read_outages(
        beat_logs: list[tuple[BeatProcess, str]],
    ) -> dict[str, list[tuple[int, int | None]]]:
        """Each beat process's own outages, (start, reconnect or None) on the
        database's clock: from the store's reconnect window before its
        "unreachable" ERROR to its next reconnect (:data:`HOLD_AT`). A process
        retrying with backoff sends nothing, though the database may be back
        for everyone else, a process that started meanwhile included."""
        outages: dict[str, list[tuple[int, int | None]]] = {}
        for proc, text in beat_logs:
            back = [at_us for at_us, _ in logged_at(HOLD_AT, text)]
            for at_us, _ in logged_at(UNREACHABLE_AT, text):
                reconnect = next((b for b in back if b > at_us), None)
                start = at_us - int(RECONNECT_WINDOW_S * US)
                outages.setdefault(proc.name, []).append((start, reconnect))
        return outages

    def claimed_by(
        self, name: str, slot_us: int, end_us: int, own_outages: bool = False
    ) -> int | None:
        """When process ``name`` must still run to have claimed ``slot_us``
        as a fallback: ``end_us``, or just after a hold that kept its fallback
        proposals back over the slot (they go out when it ends). With
        ``own_outages``: retrying after a database outage at the slot
        (:meth:`read_outages`), it proposes the slot once it reconnects, then
        as a fallback after the hold that follows; None if it came back too
        late for the slot to be on time then (the missed-run policy's) or
        never."""
        for down, back in self.outages.get(name, ()) if own_outages else ():
            if down <= end_us and (back is None or back > slot_us - ROLL_SETTLE_US):
                if back is None or back - slot_us > GRACE_US - OUTAGE_EDGE_US:
                    return None
                end_us = max(end_us, back + ROLL_CLAIM_US)
        for start, end in self.holds.get(name, ()):
            if start <= end_us and end > slot_us:
                end_us = max(end_us, end + ROLL_CLAIM_US)
        return end_us

    def version_ran(
        self, version: str, start_us: int, end_us: int, upto_us: int, own_outages: bool = False
    ) -> bool:
        """A beat process of ``version`` was connected and running (not paused,
        not yet stopped) throughout ``[start_us, end_us]``, or past the end of
        a hold over that time; with ``own_outages``, also past the end of an
        outage of its own and of the hold after it (:meth:`claimed_by`)."""
        for name, life in self.lives.items():
            if life.version != version or not life.connected_us:
                continue
            needed_us = self.claimed_by(name, start_us + ROLL_SETTLE_US, end_us, own_outages)
            if needed_us is None:
                continue
            if life.connected_us > start_us or (life.ended_us or upto_us) < needed_us:
                continue
            paused = any(
                f.kind == "pause"
                and f.proc == name
                and f.start_us <= needed_us
                and (f.end_us or upto_us) >= start_us
                for f in self.faults
            )
            if not paused:
                return True
        return False

    def version_may_have_run(self, version: str, slot_us: int, upto_us: int) -> bool:
        """A beat process of ``version`` may have proposed ``slot_us``: it was
        alive at the instant or started within the grace after it (a replica
        that starts plans what is due since the latest slot claimed, and a slot
        within the grace is still on time); a second of margin each side."""
        return any(
            life.version == version
            and life.spawned_us <= slot_us + GRACE_US + US
            and (life.ended_us or upto_us) + US >= slot_us
            for life in self.lives.values()
        )

    def db_windows(
        self, rows: dict[tuple[str, int], tuple[int, str, int, int, int | None]]
    ) -> list[DbWindow]:
        # a write-back's row is stamped with the moment of the write-back, not
        # of a claim: it says nothing of when claiming resumed
        claims = [(r[3], s[0], r[2]) for s, r in rows.items() if s not in self.written_back]
        outages = [
            (
                f"{fault.kind} at t+{(fault.start_us - self.started_us) / US:.1f}s",
                fault.start_us,
                fault.restored_us,
            )
            for fault in self.faults
            if fault.db_down and fault.restored_us
        ]
        # the one judge's windows (celery_singlebeat.testing.explore.judge)
        return db_windows(outages, claims, GRACE_US)

    def lost_in_broker(self, sent: list[tuple[str, int]]) -> set[tuple[str, int]]:
        """Of slots sent and confirmed but never executed, those the broker lost
        after taking them: with Redis, kombu's transport pops a message from the
        queue (BRPOP) before the worker records it as unacknowledged, so a
        connection cut in between (a broker restart) loses it for good. Judged
        from the broker's own write log; with RabbitMQ, none are excused."""
        if self.redis is None or not sent:
            return set()
        by_id = {slot_task_id(e, at): (e, at) for e, at in sent}
        return {by_id[t] for t in self.redis.popped_unregistered(self.queue, set(by_id))}

    def missing(self, upto_us: int) -> int:
        """Required slots up to ``upto_us`` not executed yet (outage windows aside)."""
        required, _ = self.expected(upto_us)
        windows = self.db_windows(self.slot_rows())
        done = self.executions()
        return sum(
            1
            for slot in required
            if slot not in done and not any(w.contains(slot) for w in windows)
        )

    # -- the whole run ----------------------------------------------------------------

    def run(self) -> Report:
        started = datetime.now(timezone.utc)
        wall0 = time.monotonic()
        try:
            self.setup()
            self.run_faults()
            self.say("faults done; letting the last ones settle")
            time.sleep(3.0)
            upto_us = now_us() - US
            try:
                wait_for(
                    lambda: self.missing(upto_us) == 0,
                    self.config.lease + 45,
                    "every expected slot to execute",
                    interval=1.0,
                )
            except AssertionError as exc:
                self.say(str(exc))
            self.say("stopping")
            for replica in self.replicas:
                if replica.proc is not None:
                    replica.proc.signal(signal.SIGCONT)
                    replica.proc.signal(signal.SIGTERM)
            for replica in self.replicas:
                if replica.proc is not None:
                    replica.proc.stop(15, asked=True)
            time.sleep(1.0)
            for thread in self.worker_restarts:
                thread.join()
            if self.errors:  # a worker that did not start again: the count would be off
                raise RuntimeError("; ".join(self.errors))
            for worker in self.workers:
                worker.stop(20)
            report = self.judge(upto_us, started, time.monotonic() - wall0)
        finally:
            self.abort.set()
            self.close()
        return report

    def close(self) -> None:
        if self.editor is not None:
            self.editor.close()
        try:
            self.group.stop_all()
        finally:
            for proxy in (self.db_proxy, self.broker_proxy):
                if proxy is not None and (self.pair is None or proxy is not self.pair.address):
                    proxy.close()
            if self.redis is not None:
                self.redis.stop()
            if self.amqp_url:
                self._delete_amqp_queue()
            if self.db is not None:
                if self.pg is None:
                    self.db.drop()  # the shared server: leave no tables behind
                else:
                    self.db.engine.dispose()
            if self.pair is not None:
                self.pair.close()  # a standby's data is no use to read later
            elif self.pg is not None:
                self.pg.close(self.config.keep)
            if self.own_workdir and not self.config.keep:
                shutil.rmtree(self.workdir, ignore_errors=True)

    def _delete_amqp_queue(self) -> None:
        """The shared RabbitMQ keeps durable queues: delete this run's."""
        from kombu import Connection, Exchange, Queue

        try:
            with Connection(self.amqp_url) as conn:
                channel = conn.channel()
                Queue(self.queue, Exchange(self.queue), routing_key=self.queue)(channel).delete()
                Exchange(self.queue)(channel).delete()
        except Exception as exc:
            print(f"chaos: deleting RabbitMQ queue {self.queue}: {exc}", file=sys.stderr)

    # -- the verdict ------------------------------------------------------------------

    def judge(self, upto_us: int, started: datetime, wall_s: float) -> Report:
        rows = self.slot_rows()
        beat_logs = [(p, p.log()) for r in self.replicas for p in r.incarnations]
        self.holds = self.read_holds(beat_logs)
        self.outages = self.read_outages(beat_logs)
        required, optional = self.expected(upto_us)
        all_done = self.executions()
        # the stored entries of the editor lane are judged on their own (chaos_edits)
        done = {s: t for s, t in all_done.items() if not is_stored(s[0])}
        windows = self.db_windows(rows)
        names: dict[str, str] = {}
        for replica in self.replicas:
            for proc in replica.incarnations:
                rid = proc.replica_id()
                if rid:
                    names[rid] = proc.name
        worker_logs = [w.log() for w in self.worker_runs]

        self.pause_outcomes(rows, all_done, names, beat_logs, worker_logs)

        def in_window(slot: tuple[str, int]) -> DbWindow | None:
            return next((w for w in windows if w.contains(slot)), None)

        # An instant only version 2 has, outside the outages' windows, whose
        # replicas of that version were all still retrying after an outage
        # (their backoff outlasts it) or held after reconnecting when they
        # stopped: their stop's edge, either is right. Inside a window it
        # stays the missed-run policy's, as before.
        assert self.db is not None
        roll_anchor = self.db.anchors().get(ROLL, 0)

        def every_1s_only(slot: tuple[str, int]) -> bool:
            return slot[0] == ROLL and (slot[1] - roll_anchor) % ROLL_PERIOD_US["1"] != 0

        for slot in sorted(required):
            if not every_1s_only(slot) or in_window(slot):
                continue
            at_us = slot[1]
            if not self.version_ran(
                "2", at_us - ROLL_SETTLE_US, at_us + ROLL_CLAIM_US, upto_us, True
            ):
                required.discard(slot)
                if self.version_may_have_run("2", at_us, upto_us):
                    optional.add(slot)

        report = Report(
            config={k: str(v) for k, v in asdict(self.config).items()},
            machine=self.machine,
            started=started.isoformat(timespec="seconds"),
            wall_s=round(wall_s, 1),
            window_s=round((upto_us - self.started_us) / US, 1),
            faults=[
                {
                    "at_s": round((f.start_us - self.started_us) / US, 1),
                    "kind": f.kind,
                    "target": f.target,
                    "seconds": round(((f.end_us or upto_us) - f.start_us) / US, 1),
                    "detail": f.detail,
                }
                for f in sorted(self.faults, key=lambda f: f.start_us)
            ],
        )
        due = required | {s for s in optional if s in done}
        report.due = len(required)
        report.optional_due = len(optional)
        report.optional_executed = sum(1 for s in optional if s in done)
        # counted from the anchor: the slots are not whole seconds since the epoch
        report.roll_required = sum(1 for s in required if every_1s_only(s))
        counted = {s for s in rows if s[1] <= upto_us}
        report.sent = sum(1 for s in counted if rows[s][0] == 1)
        report.taken_over = sum(1 for s in counted if rows[s][2] > 1)
        # the logs give slot instants to the millisecond
        published: Counter[tuple[str, int]] = Counter()
        for _, text in beat_logs:
            for m in SENT_LINE.finditer(text):
                published[(m["entry"], iso_ms(m["at"]))] += 1
        upto_ms = upto_us // 1000
        report.published = sum(n for s, n in published.items() if s[1] <= upto_ms)
        report.published_twice = sum(1 for s, n in published.items() if s[1] <= upto_ms and n > 1)
        report.dropped_by_worker = sum(len(DROPPED_LINE.findall(text)) for text in worker_logs)
        report.rewritten_slots = sum(
            int(m["n"]) for _, text in beat_logs for m in LOST_SLOTS_LINE.finditer(text)
        )
        report.rewritten_runs = sum(
            int(m["n"]) for text in worker_logs for m in LOST_RUNS_LINE.finditer(text)
        )
        report.held_at_broker_loss = sum(
            int(m["n"]) for text in worker_logs for m in RESTORING_LINE.finditer(text)
        )
        # the one judge's checks (celery_singlebeat.testing.explore.judge); its
        # early check is made below, with the publishes' times as well
        static = judge_static(
            required,
            optional,
            done,
            windows,
            upto_us,
            self.started_us,
            lambda s: rows.get(s, (0,))[0] == 1,
            self.lost_in_broker,
        )
        report.executed = static.executed
        report.executed_twice = static.executed_twice
        report.unexpected = static.unexpected
        report.problems += [p for p in static.problems if not p.startswith("claimed, sent")]
        report.failovers = self.failover_outcomes(published, all_done, upto_us)
        first_sent = self.first_publishes(beat_logs)
        report.due_required = static.due_required
        in_broker = set(static.lost_in_broker)
        lost = static.lost_slots
        report.lost = static.lost
        report.lost_never_sent = static.lost_never_sent
        runs = run_rows(self.db) if self.db is not None else {}
        for s in lost[:20]:
            row = rows.get(s)
            run = runs.get(s)
            report.problems.append(
                f"lost: {s[0]}@{s[1]} (t+{(s[1] - self.started_us) / US:.1f}s) "
                f"slot row {row}, run row {run}"
            )
        for s in sorted(in_broker):
            report.broker_losses.append(
                f"{s[0]}@{s[1]} (t+{(s[1] - self.started_us) / US:.1f}s, task id "
                f"{slot_task_id(s[0], s[1])}): sent and confirmed by {rows[s][1]}; Redis "
                "gave the message to a consumer, no worker registered it"
            )
        for window in windows:
            report.policy_windows.append(self.policy(window, done, first_sent))
        if self.editor is not None:
            report.edits = judge_edits(
                self.editor.attempts,
                self.editor.history(),
                read_records(self.record),
                list(windows),
                [(int(r.cut_at * US), int(r.moved_at * US)) for _, r in self.failed_over],
                upto_us,
                self.started_us,
                lambda s: rows.get(s, (0,))[0] == 1,
                self.lost_in_broker,
                self.fault_near,
                # a reconnect's hold of fallback proposals (sweep + 2 s), a second more
                self.lease_us // 3 + 3 * US,
            )
        # Delays: slot instant -> first publish (the replica's log line, put on
        # the database's clock with that replica's offset), and -> first execution.
        delays: list[Delay] = []
        for slot in sorted(s for s in due if s[1] <= upto_us):
            sent_at = first_sent.get((slot[0], slot[1] // 1000))
            first_run = min(done[slot]) if slot in done else None
            if sent_at is None and first_run is None:
                continue
            # A replica killed right after the broker took a message never logs
            # it: the message was published by its execution at the latest.
            dispatch_s = min(
                (sent_at[0] - slot[1]) / US if sent_at else float("inf"),
                first_run - slot[1] / US if first_run is not None else float("inf"),
            )
            row = rows.get(slot)
            delays.append(
                Delay(
                    slot[0],
                    slot[1],
                    dispatch_s,
                    first_run - slot[1] / US if first_run is not None else None,
                    row[2] if row else 0,
                    sent_at[1] if sent_at else "(not logged)",
                    "",
                    in_window(slot) is not None,
                )
            )
        # Nothing may leave before its instant (250 ms: the claim's tolerance), on
        # any replica's clock: claims read from first-claim rows, publishes and
        # executions on the database's clock.
        tolerance = EARLY_TOLERANCE_US / US
        early = sorted(
            {
                slot
                for slot, row in rows.items()
                if row[2] == 1 and row[3] < slot[1] - EARLY_TOLERANCE_US
            }
            | {(d.entry, d.slot_us) for d in delays if d.dispatch_s < -tolerance}
            | {s for s in all_done if min(all_done[s]) < s[1] / US - tolerance}
        )
        report.early = len(early)
        for s in early[:20]:
            report.problems.append(f"claimed, sent or run early: {s[0]}@{s[1]} row {rows.get(s)}")
        outside = [d for d in delays if not d.in_outage]
        if outside:
            ordered = sorted(d.dispatch_s for d in outside)
            report.worst_dispatch_s = round(ordered[-1], 3)
            report.p50_dispatch_s = round(ordered[len(ordered) // 2], 3)
            report.p99_dispatch_s = round(ordered[int(len(ordered) * 0.99)], 3)
            report.worst_execution_s = round(
                max(d.executed_s for d in outside if d.executed_s is not None), 3
            )
        self.hold_to_bound(report, outside)
        if delays:
            report.worst_dispatch_any_s = round(max(d.dispatch_s for d in delays), 3)
            # one line per cause: the worst slot of each of the worst few faults
            seen: set[str] = set()

            def longest(d: Delay) -> float:
                return max(d.dispatch_s, d.executed_s or 0.0)

            for d in sorted(delays, key=lambda d: -longest(d)):
                d.cause = self.cause(d.slot_us, longest(d), d.fence)
                if d.in_outage:
                    d.cause = "missed during a database outage, sent per policy; " + d.cause
                if d.cause in seen:
                    continue
                seen.add(d.cause)
                report.worst.append(
                    {
                        "entry": d.entry,
                        "slot_t_s": round((d.slot_us - self.started_us) / US, 1),
                        "dispatch_s": round(d.dispatch_s, 3),
                        "executed_s": round(d.executed_s, 3) if d.executed_s is not None else None,
                        "fence": d.fence,
                        "sent_by": d.sender,
                        "cause": d.cause,
                    }
                )
                if len(report.worst) >= 8:
                    break
        for replica in self.replicas:
            if replica.skew and replica.incarnations:
                m = OFFSET_LINE.search(replica.incarnations[0].log())
                report.clock_offsets[f"{replica.name} (FAKETIME {replica.skew})"] = (
                    f"{m['ms']} ms" if m else "?"
                )
        report.code_under_test = sorted(set(imported_from(read_records(self.record))))
        report.problems.extend(self.late_sends)
        report.late_sends = len(self.late_sends)
        report.text = render(report)
        return report

    def failover_outcomes(
        self,
        published: Counter[tuple[str, int]],
        done: dict[tuple[str, int], list[float]],
        upto_us: int,
    ) -> list[dict[str, Any]]:
        """Per failover: the standby's distance behind the primary, how long
        the address was away, and the slots due near it (from the replicas'
        failover window before the cut to the write-back hold after the move)
        published twice and executed twice."""
        out = []
        for fault, record in self.failed_over:
            lo = int(record.cut_at * US) - FAILOVER_BEFORE_US
            hi = int(record.moved_at * US) + FAILOVER_AFTER_US

            def near(slot_us: int, lo: int = lo, hi: int = hi) -> bool:
                return lo <= slot_us <= min(hi, upto_us)

            out.append(
                {
                    "at_s": round((fault.start_us - self.started_us) / US, 1),
                    "mode": self.config.failover,
                    "behind_bytes": record.behind_bytes,
                    "behind_ms": record.behind_ms,
                    "unavailable_s": round(record.unavailable_s, 2),
                    "slots_due_near": sum(1 for s in published if near(s[1] * 1000)),
                    "published_twice": sum(
                        1 for s, n in published.items() if n > 1 and near(s[1] * 1000)
                    ),
                    "executed_twice": sum(1 for s, t in done.items() if len(t) > 1 and near(s[1])),
                }
            )
        return out

    def hold_to_bound(self, report: Report, delays: list[Delay]) -> None:
        """Every slot leaves within ``lease + lease/3`` of its instant unless the
        database or the broker failed meanwhile (an outage's slots are the
        missed-run policy's; a failed publish waits for the broker): a claim
        abandoned by a killed or paused replica is taken over by the next sweep
        after its lease, and a claim whose publish ran out of lease is released
        for that sweep."""
        bound_us = self.lease_us + self.lease_us // 3 + TAKEOVER_SLACK_US
        report.bound_s = bound_us / US
        for d in delays:
            held = not self.infra_fault(d.slot_us - US, d.slot_us + bound_us)
            if held and d.fence > 1:
                report.held_takeovers += 1
                report.worst_takeover_s = max(report.worst_takeover_s, round(d.dispatch_s, 3))
            if d.dispatch_s * US <= bound_us or not held:
                continue
            report.over_bound += 1
            if report.over_bound <= 20:
                report.problems.append(
                    f"sent {d.dispatch_s:.3f}s after its instant, over the "
                    f"{report.bound_s:g}s bound with no database or broker fault: "
                    f"{d.entry}@{d.slot_us} (t+{(d.slot_us - self.started_us) / US:.1f}s, "
                    f"fence {d.fence}, by {d.sender}); "
                    + self.cause(d.slot_us, d.dispatch_s, d.fence)
                )

    def infra_fault(self, lo_us: int, hi_us: int) -> bool:
        """A fault of the database or the broker was in force in ``[lo, hi]``,
        counting on after its end for as long as its effects last: the outage
        backoff (10 s) after a database outage; the store's reconnect window
        (2 s) and a second after a restart, which is no outage; a sweep and a
        second after the broker."""
        for f in self.faults:
            if f.kind == "postgres restart":
                tail = 3 * US
            elif f.db_down:
                tail = 10 * US
            elif f.kind == "broker restart":
                tail = self.lease_us // 3 + US
            else:
                continue
            if f.start_us <= hi_us and (f.end_us or 2**62) + tail >= lo_us:
                return True
        return False

    def first_publishes(
        self, beat_logs: list[tuple[BeatProcess, str]]
    ) -> dict[tuple[str, int], tuple[int, str]]:
        """(entry, slot ms) -> (first publish on the database's clock, incarnation).

        A replica logs each message once the broker has it (:func:`logged_at`)."""
        first: dict[tuple[str, int], tuple[int, str]] = {}
        for proc, text in beat_logs:
            for at_us, m in logged_at(SENT_AT, text):
                key = (m["entry"], iso_ms(m["at"]))
                if key not in first or at_us < first[key][0]:
                    first[key] = (at_us, proc.name)
        return first

    def policy(
        self,
        window: DbWindow,
        done: dict[tuple[str, int], list[float]],
        first_sent: dict[tuple[str, int], tuple[int, str]],
    ) -> dict[str, Any]:
        """What the missed-run policy did with the slots of one outage window."""
        before = on_time = coalesced = other = 0
        missed: dict[str, list[tuple[str, int]]] = defaultdict(list)
        for slot in window.slots:
            recovered = window.recovery(slot[0])
            if recovered is None or recovered - slot[1] > GRACE_US:
                missed[slot[0]].append(slot)
        latest = {max(slots) for slots in missed.values()}
        for slot in window.slots:
            if slot not in done:
                continue
            sent = first_sent.get((slot[0], slot[1] // 1000))
            if sent is not None and sent[0] < window.restored_us:
                before += 1  # claimed before the outage; published before or during it
            elif slot in latest:
                coalesced += 1
            elif not any(slot in slots for slots in missed.values()):
                on_time += 1  # within the grace when its entry was planned again
            else:
                other += 1
        executed = before + on_time + coalesced + other
        recovered = window.recovered_us
        return {
            "fault": window.fault,
            "db_back_after_s": round((window.restored_us - window.start_us) / US - 1, 1),
            "first_claim_after_s": (
                round((recovered - window.restored_us) / US, 1) if recovered else None
            ),
            "slots_due": len(window.slots),
            "executed": executed,
            "claimed_before": before,
            "on_time_at_recovery": on_time,
            "latest_missed": coalesced,
            "entries_missed": len(missed),
            "other_missed": other,
            "not_executed": len(window.slots) - executed,
        }

    def pause_outcomes(
        self,
        rows: dict[tuple[str, int], tuple[int, str, int, int, int | None]],
        done: dict[tuple[str, int], list[float]],
        names: dict[str, str],
        beat_logs: list[tuple[BeatProcess, str]],
        worker_logs: list[str],
    ) -> None:
        """What became of the slot each paused replica stopped on (in its detail)."""
        by_task = {slot_task_id(*slot): slot for slot in rows}
        senders: dict[str, list[str]] = defaultdict(list)
        for proc, text in beat_logs:
            for m in SENT_LINE.finditer(text):
                senders[m["task_id"]].append(proc.name)
        dropped = Counter(m["id"] for text in worker_logs for m in DROPPED_LINE.finditer(text))
        for fault in self.faults:
            if fault.kind != "pause" or fault.slot is None:
                continue
            entry, task_id = fault.slot
            slot = by_task.get(task_id)
            if slot is None:
                fault.detail += f"; its slot ({entry}, task {task_id}) has no row"
                continue
            _, owner, fence, _, _ = rows[slot]
            at = f"{entry}@t+{(slot[1] - self.started_us) / US:.1f}s"
            runs = len(done.get(slot, []))
            by = names.get(owner, owner)
            if fault.mode == "claimed":
                log = next(text for proc, text in beat_logs if proc.name == fault.proc)
                late = self.late_send(log, entry, task_id)
                if by == fault.proc:
                    # nobody swept it before the paused replica resumed: it released
                    # the claim unsent and won it back with a new fence
                    what = (
                        f"nobody took its claim of {at} over before it resumed: it released "
                        f"it unsent and took it back (fence {fence})"
                    )
                else:
                    what = f"its claim of {at} was taken over (fence {fence}) and sent by {by}"
                under = "IT SENT IT UNDER" if late else "nothing sent under"
                fault.detail += f"; {what}; {under} the lapsed claim; executed {runs}x"
                if late:
                    self.late_sends.append(f"{fault.proc} sent {at} after its lease ran out")
            elif by == fault.proc:
                # no sweep came by between the end of its lease and its resumption
                fault.detail += (
                    f"; it had published {at}; nobody took it over before it resumed, and "
                    f"it confirmed its publish (fence {fence}); "
                    f"{len(senders[task_id])} publish(es); executed {runs}x"
                )
            else:
                fault.detail += (
                    f"; it had published {at}: taken over (fence {fence}), published again by "
                    f"{by} ({len(senders[task_id])} publishes); the worker dropped "
                    f"{dropped[task_id]} repeated deliveries; executed {runs}x"
                )

    @staticmethod
    def late_send(log: str, entry: str, task_id: str) -> bool:
        """True when a replica that stopped right after claiming ``task_id`` sent
        it afterwards without winning it again first (a "took back"/"took over"
        line of that task id between the stop and the send)."""
        stop = log.find(f"SB-STOPPING {entry} {task_id}")
        retaken = False
        for line in log[stop:].splitlines()[1:]:
            if " won " in line and " before the connection broke" in line:
                # the recovery after a break won slots again by a claim (a new
                # fence), among them one this replica released unsent
                # (Hold.released_unsent); the line names the first only
                retaken = True
                continue
            if task_id not in line:
                continue
            if " took back slot " in line or " took over slot " in line:
                retaken = True
            elif SENT_LINE.search(line) and not retaken:
                return True
        return False

    def fault_near(self, lo_us: int, hi_us: int) -> bool:
        """Any fault in force in ``[lo, hi]``, counting on after its end as
        :meth:`cause` does: one that can hold a claim back."""
        for f in self.faults:
            tail = 10 * US if f.db_down else self.lease_us // 3 + US
            if f.start_us <= hi_us and (f.end_us or 2**62) + tail >= lo_us:
                return True
        return False

    def cause(self, slot_us: int, delay_s: float, fence: int) -> str:
        """The faults in force between a slot's instant and its send. A fault
        counts on after its end for as long as its effects can last: the
        outage backoff (10 s) after the database is back, a sweep interval and
        a second of start-up after the others."""
        lo, hi = slot_us - US // 2, slot_us + int(delay_s * US)
        hits = []
        for f in self.faults:
            tail = 10 * US if f.db_down else self.lease_us // 3 + US
            if f.start_us <= hi and (f.end_us or 2**62) + tail >= lo:
                hits.append(f)
        where = f"taken over (fence {fence}), " if fence > 1 else ""
        if not hits:
            return where + "no fault: the normal path (tick, CPU)"
        return where + "; ".join(
            f"{f.kind} {f.target} at t+{(f.start_us - self.started_us) / US:.1f}s" for f in hits
        )


# -- the report ------------------------------------------------------------------------


def machine_info(chaos: Chaos) -> dict[str, str]:
    import celery
    import kombu

    model = ""
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    info = {
        "cpus": str(os.cpu_count()),
        "cpu": model,
        "load": " ".join(f"{x:.2f}" for x in os.getloadavg()),
        "python": platform.python_version(),
        "celery": celery.__version__,
        "kombu": kombu.__version__,
        "sqlalchemy": sa.__version__,
        "postgresql": chaos.pg.version if chaos.pg else "shared (SB_TEST_PG)",
        "broker": chaos.redis.version() if chaos.redis else "rabbitmq (SB_TEST_AMQP)",
    }
    return info


def table(headers: list[str], rows: Iterable[Iterable[Any]]) -> str:
    body = [[("" if v is None else str(v)) for v in row] for row in rows]
    widths = [
        max(len(h), *(len(r[i]) for r in body)) if body else len(h) for i, h in enumerate(headers)
    ]
    line = "| " + " | ".join(h.ljust(w) for h, w in zip(headers, widths)) + " |"
    rule = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    out = [line, rule]
    out += ["| " + " | ".join(v.ljust(w) for v, w in zip(r, widths)) + " |" for r in body]
    return "\n".join(out)


def render(r: Report) -> str:
    c = r.config
    lines = [
        f"chaos run: seed {c['seed']}, {c['duration']} s of faults, lease {c['lease']} s, "
        f"broker {c['broker']}, failover {c['failover']}"
        + ("" if c["failover_window"] == "None" else f" (window {c['failover_window']} s)")
        + f"; started {r.started}, {r.wall_s} s wall, "
        f"slots counted over {r.window_s} s",
        "machine: " + ", ".join(f"{k} {v}" for k, v in r.machine.items()),
        "code under test: " + (", ".join(r.code_under_test) or "?"),
        "clocks: " + ", ".join(f"{k}: offset {v}" for k, v in r.clock_offsets.items()),
        "",
        "faults:",
        table(
            ["t (s)", "fault", "target", "lasted (s)", "detail"],
            [(f["at_s"], f["kind"], f["target"], f["seconds"], f["detail"]) for f in r.faults],
        ),
        "",
        table(
            ["", "slots"],
            [
                ("due (outside database outages: must all execute)", r.due_required),
                ("due while the database was away (missed-run policy)", r.due - r.due_required),
                ("sent (slot rows confirmed)", r.sent),
                ("messages published (replicas' logs)", r.published),
                ("slots published twice (same task id)", r.published_twice),
                ("repeated deliveries dropped by workers", r.dropped_by_worker),
                (
                    "messages workers held when the broker went away (delivered again)",
                    r.held_at_broker_loss,
                ),
                ("taken over (fence > 1)", r.taken_over),
                ("executed", r.executed),
                ("executed twice (must be 0)", r.executed_twice),
                ("lost (must be 0)", r.lost),
                (
                    "lost by the broker: popped from Redis, no worker registered it (below)",
                    len(r.broker_losses),
                ),
                ("executed at an instant that is no slot (must be 0)", r.unexpected),
                ("claimed, sent or run > 250 ms before its instant (must be 0)", r.early),
                (
                    f"{ROLL}: instants only its every-1-s version has, while a replica "
                    "with that version ran (must all execute)",
                    r.roll_required,
                ),
                (
                    f"{ROLL}: such instants as a replica with that version started or "
                    "stopped (either is right)",
                    f"{r.optional_executed} of {r.optional_due} executed",
                ),
                (
                    f"sent later than lease + lease/3 + 1 s ({r.bound_s:g} s) with no "
                    "database or broker fault (must be 0)",
                    r.over_bound,
                ),
            ],
        ),
        "",
        "database outages: what the missed-run policy (coalesce, grace 5 s) did with the "
        "slots that fell due while the database was away",
        table(
            [
                "outage",
                "first claim after (s)",
                "slots due",
                "executed",
                "claimed before it",
                "on time at recovery",
                "coalesced: latest missed sent (entries that missed slots)",
                "other missed",
                "not executed",
            ],
            [
                (
                    w["fault"],
                    w["first_claim_after_s"],
                    w["slots_due"],
                    w["executed"],
                    w["claimed_before"],
                    w["on_time_at_recovery"],
                    f"{w['latest_missed']} ({w['entries_missed']})",
                    w["other_missed"],
                    w["not_executed"],
                )
                for w in r.policy_windows
            ],
        ),
        "",
        f"dispatch delay (slot instant -> first publish, or first execution when earlier; "
        f"database clock), outside database "
        f"outages: median {r.p50_dispatch_s} s, p99 {r.p99_dispatch_s} s, worst "
        f"{r.worst_dispatch_s} s; slot -> execution start, worst {r.worst_execution_s} s; "
        f"including slots sent after an outage: worst {r.worst_dispatch_any_s} s; "
        f"{r.held_takeovers} taken over with no database or broker fault near them: "
        f"worst {r.worst_takeover_s} s (bound {r.bound_s:g} s)",
        table(
            ["entry", "slot t (s)", "dispatch (s)", "executed (s)", "fence", "sent by", "cause"],
            [
                (
                    w["entry"],
                    w["slot_t_s"],
                    w["dispatch_s"],
                    w["executed_s"],
                    w["fence"],
                    w["sent_by"],
                    w["cause"],
                )
                for w in r.worst
            ],
        ),
    ]
    if r.failovers:
        lines += [
            "",
            f"database failovers ({r.failovers[0]['mode']} standby, link {c['lag']} s behind): "
            f"slots due from {FAILOVER_BEFORE_US // US} s before the cut to "
            f"{FAILOVER_AFTER_US // US} s after the move; {r.rewritten_slots} slot rows "
            f"and {r.rewritten_runs} run rows found lost and written again",
            table(
                [
                    "t (s)",
                    "standby behind",
                    "address away (s)",
                    "slots near",
                    "published twice",
                    "executed twice (must be 0)",
                ],
                [
                    (
                        f["at_s"],
                        f"{f['behind_bytes']} B / {f['behind_ms']:g} ms",
                        f["unavailable_s"],
                        f["slots_due_near"],
                        f["published_twice"],
                        f["executed_twice"],
                    )
                    for f in r.failovers
                ],
            ),
        ]
    lines += render_edits(r.edits)
    if r.broker_losses:
        lines += [
            "",
            "lost by the broker (kombu's Redis transport pops a message before the worker "
            "records it; a broker restart in between loses it; RabbitMQ acks avoid this):",
            *(f"  {b}" for b in r.broker_losses),
        ]
    if r.problems:
        lines += ["", "problems:", *(f"  {p}" for p in r.problems)]
    lines += ["", "verdict: " + ("OK" if r.ok else "FAILED")]
    return "\n".join(lines)


def render_edits(e: EditsReport) -> list[str]:
    """The editor lane's section of the report (chaos_edits)."""
    actions = ", ".join(f"{k} {v}" for k, v in sorted(e.by_action.items()))
    lines = [
        "",
        f"stored entries edited during the faults (through the replicas' database proxy): "
        f"{e.attempted} edits tried ({actions}); {e.committed} committed (the history of "
        f"the database the run ended on), {e.failed} not committed (raised), "
        f"{e.uncertain_committed} committed though they raised, {e.lost_in_failover} "
        "returned and then lost with a failover",
        *(f"  at a failover: {line}" for line in e.at_failover),
        table(
            ["", "stored slots"],
            [
                ("due (after the 1 s a commit takes, outside database outages)", e.due),
                ("due while the database was away (missed-run policy)", e.in_outage),
                ("executed", e.executed),
                (
                    "sent under a definition replaced more than 1 s before the slot (must be 0)",
                    e.outdated,
                ),
                (
                    "sent for an instant at or before its definition's commit that was no "
                    "slot of the definition in force then (must be 0)",
                    e.premature,
                ),
                (
                    "claimed before an edit, sent after it under the newer definition "
                    "(a retried publish, a takeover; allowed)",
                    e.late_newer,
                ),
                ("executed at an instant its definition does not have (must be 0)", e.not_a_slot),
                ("executed twice (must be 0)", e.executed_twice),
                ("lost (must be 0)", e.lost),
                (
                    "dropped with its version: due just before an edit, a fault held its "
                    "claim past it (below)",
                    e.dropped_with_version,
                ),
                ("lost by the broker (as above)", e.lost_in_broker),
                (
                    "limited entries run another number of times than asked (must be 0)",
                    e.limited_wrong,
                ),
            ],
        ),
    ]
    if e.limited:
        lines.append(
            table(
                [
                    "limited entry",
                    "first run t (s)",
                    "asked",
                    "executed",
                    "in an outage",
                    "verdict",
                ],
                [
                    (
                        x["entry"],
                        x.get("first_at_s"),
                        x["asked"],
                        x["executed"],
                        x["in_outage"],
                        x["verdict"],
                    )
                    for x in e.limited
                ],
            )
        )
    if e.dropped:
        lines += ["dropped with its version:", *(f"  {d}" for d in e.dropped[:20])]
    if e.problems:
        lines += ["stored entries' problems:", *(f"  {p}" for p in e.problems[:40])]
    return lines


def run(config: Config) -> Report:
    """Run the chaos run of ``config``; the entry point of the acceptance test."""
    return Chaos(config).run()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=600.0, help="seconds of faults")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--lease", type=float, default=15.0, help="singlebeat_lease, seconds")
    parser.add_argument("--outage", type=float, default=30.0, help="PostgreSQL outage, seconds")
    parser.add_argument("--broker", choices=["redis", "rabbitmq"], default="redis")
    parser.add_argument(
        "--failover",
        choices=[*FAILOVER_MODES, "off"],
        default="async",
        help="the standby's replication, or off: no standby and no failover fault",
    )
    parser.add_argument("--lag", type=float, default=0.3, help="the standby's link delay, s")
    parser.add_argument(
        "--failover-window",
        type=float,
        default=None,
        help="singlebeat_failover_window of every beat and worker, s (0: no write-back)",
    )
    parser.add_argument("--workdir", type=Path, help="keep logs and the record here")
    parser.add_argument("--keep", action="store_true", help="keep the work folder")
    parser.add_argument("--json", type=Path, help="write the report as JSON here")
    args = parser.parse_args(argv)
    report = run(
        Config(
            duration=args.duration,
            seed=args.seed,
            lease=args.lease,
            outage=args.outage,
            broker=args.broker,
            failover=args.failover,
            lag=args.lag,
            failover_window=args.failover_window,
            workdir=args.workdir,
            keep=args.keep or args.workdir is not None,
        )
    )
    print()
    print(report.text)
    if args.json:
        data = asdict(report)
        data.pop("text")
        args.json.write_text(json.dumps(data, indent=2) + "\n")
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
