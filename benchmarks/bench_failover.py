#!/usr/bin/env python3
"""Database failover: what 3 beat replicas and a SingletonTask worker do when the
database's primary dies and a standby is promoted under a moved address.

Topology, per mode (every process real, started here; ``failover.py`` builds
the database side for PostgreSQL, ``failover_mariadb.py`` for MariaDB,
``--database``):

* a PostgreSQL 15 primary with a streaming standby of its own, the WAL stream
  through a link that delays it (``--lag-ms``, asynchronous mode) or a
  synchronous standby (``--sync-lag-ms``, ``synchronous_commit = on``);
  or (``--database mariadb``) a MariaDB primary with a replica of its own,
  asynchronous (``async``, ``--lag-ms``) or semi-synchronous (``semisync``,
  ``AFTER_SYNC``, ``--sync-lag-ms``), GTID replication through the same
  delaying link;
* a movable address (a TCP proxy) that every process below connects to;
* 3 ``celery beat`` replicas of ``tests/acceptance/beatapp.py``, 50 interval
  entries every second, each sending ``singletonapp.slot_probe`` (one
  SingletonTask key per entry);
* 1 ``celery worker`` (prefork, 2 children) of
  ``tests/acceptance/singletonapp.py`` executing them; its SingletonTask leases
  and run rows live in the same failover database;
* Redis (the shared server, ``--redis-db``) as the broker.

Failovers (``--failovers``, at moments drawn from ``--seed``, each at a random
point within a second): the primary's node dies (``pg_ctl stop -m
immediate``; what was on the lagging link is lost with it), the standby is
promoted, the address moves to it. Once every entry is sent again, a fresh
standby of the new primary is made (``pg_basebackup``; the old primary is not
rejoined) and the run goes on to the next failover.

Judged from outside:

* **sent**: every message read off the real broker. The worker consumes the
  tasks' queue, so a second queue is bound to the same exchange and routing
  key, and the replicas publish through that exchange (``SB_VIA_EXCHANGE``;
  Celery otherwise sends straight to the queue): Redis puts every message into
  both, and a reader takes every message off the second one
  (``harness.RedisQueueReader``);
* **executed**: the record file every execution of the task body appends a
  line to (``SB_RECORD``, a file in the run's folder, not the failover
  database, whose writes are what is lost);
* per slot of every entry (from the entries' anchors) between the replicas'
  start and the end: sent twice, executed twice, lost (never in the broker),
  never executed, and the longest wait between two consecutive slots of an
  entry reaching the broker;
* from the logs: how many sent slots (replicas) and run rows (the worker) the
  database had lost and they wrote again after a failover, and every ERROR line.

Usage::

    python benchmarks/bench_failover.py                    # both modes, 3 failovers each
    python benchmarks/bench_failover.py --mode async --failovers 1 --lag-ms 300 --seed 2
    python benchmarks/bench_failover.py --database mariadb  # async and semisync

Writes ``benchmarks/results/failover-latest.json`` (``failover-mariadb-latest.json``
for MariaDB; ``--json``). Exit status 0 whatever the figures: this measures, the
targets are issue 13's.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
ACCEPTANCE = ROOT / "tests" / "acceptance"
sys.path[:0] = [str(HERE), str(ROOT)]

from failover import MODES, Failover, FailoverPair  # noqa: E402  (puts harness on sys.path)
from failover_mariadb import MODES as MARIADB_MODES  # noqa: E402
from failover_mariadb import MariaDBPair  # noqa: E402
from harness import (  # noqa: E402
    DROPPED_LINE,
    LOST_RUNS_LINE,
    LOST_SLOTS_LINE,
    SENT_LINE,
    BeatGroup,
    BeatProcess,
    Db,
    Received,
    RedisQueueReader,
    executions,
    interval_slots,
    read_records,
    wait_for,
    wait_ready,
)

from celery_singlebeat.timeline.slots import slot_task_id  # noqa: E402

US = 1_000_000
TASK = "singletonapp.slot_probe"
PERIOD_US = US
#: the first failover comes this long after every replica connected, and each
#: next one this long after the previous one's standby was rebuilt (seconds)
WARMUP = (12.0, 18.0)
STEADY = (10.0, 15.0)
#: after a failover, every entry must have reached the broker again with a slot
#: this long after the address moved before the run goes on
RECOVERED_AFTER_S = 2.0
DATABASES: dict[str, tuple[str, ...]] = {"postgresql": MODES, "mariadb": MARIADB_MODES}
#: a Celery log line's time ("[2026-12-03 08:36:50,123: ERROR/MainProcess] ...")
LOG_TIME = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}): (\w+)/", re.M)


@dataclass
class Config:
    database: str
    modes: list[str]
    failovers: int
    seed: int
    lag_ms: float
    sync_lag_ms: float
    entries: int
    replicas: int
    #: the SingletonTask worker's prefork children: each execution commits
    #: several times, and a synchronous standby adds its round trip to each
    #: commit (2 children ran about 24 a second with the 5 ms link, under the
    #: 50 a second the replicas send)
    concurrency: int
    redis_url: str
    keep: bool


@dataclass
class FailoverReport:
    """One failover and the slots it touched (instants relative to its cut)."""

    number: int
    at_s: float
    unavailable_s: float
    behind_ms: float
    behind_bytes: int
    timeline: int
    standby_rebuilt_s: float
    sent_twice: int = 0
    executed_twice: int = 0
    lost: int = 0
    #: the doubled slots' instants, seconds before (-) or after the cut
    doubled_from_s: float | None = None
    doubled_to_s: float | None = None
    longest_gap_s: float = 0.0
    #: sent slots (replicas) and run rows (worker) the database had lost and
    #: that were written again, as logged after this failover
    written_again_by_beats: int = 0
    written_again_by_worker: int = 0
    #: MariaDB: transactions the primary had in its binary log that the
    #: replica had not received / did not apply; the semi-sync state at the cut
    behind_transactions: int | None = None
    lost_transactions: int | None = None
    semisync_status: str | None = None
    semisync_no_tx: int | None = None


@dataclass
class ModeReport:
    database: str
    mode: str
    lag_ms: float
    window_s: float
    slots_due: int
    messages: int
    sent_twice: int
    sent_more: int
    executed: int
    executed_twice: int
    lost: int
    not_executed: int
    longest_gap_s: float
    #: copies of one slot all had the slot's deterministic task id
    same_task_ids: bool
    #: repeated deliveries the worker's SingletonTask dropped (its log)
    dropped_by_worker: int
    #: messages the worker's retries sent again (not counted as sent)
    retried_by_worker: int = 0
    #: publishes of doubled slots as the replicas logged them: "won" / "took over"
    doubled_how: dict[str, int] = field(default_factory=dict)
    #: see FailoverReport; over the whole run
    written_again_by_beats: int = 0
    written_again_by_worker: int = 0
    #: every ERROR line of the replicas' and the worker's logs (the first 20)
    errors: int = 0
    error_lines: list[str] = field(default_factory=list)
    failovers: list[FailoverReport] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


class Run:
    """One mode: the topology, the failovers, the verdict."""

    def __init__(self, mode: str, config: Config) -> None:
        self.mode = mode
        self.config = config
        self.lag = (config.lag_ms if mode == "async" else config.sync_lag_ms) / 1000
        self.rng = random.Random(f"{config.seed}-{mode}")
        self.workdir = Path(tempfile.mkdtemp(prefix=f"bench-failover-{mode}-"))
        self.group = BeatGroup(self.workdir)
        self.record = self.workdir / "record.jsonl"
        self.prefix = f"fo{uuid.uuid4().hex[:8]}_"
        self.queue = f"sbq-{uuid.uuid4().hex}"
        self.mirror = f"{self.queue}-mirror"
        self.pair: FailoverPair | MariaDBPair = (
            MariaDBPair(mode, self.lag)
            if config.database == "mariadb"
            else FailoverPair(mode, self.lag)
        )
        self.reader: RedisQueueReader | None = None
        self.beats: list[BeatProcess] = []
        self.worker: BeatProcess | None = None
        self.rebuilt: list[float] = []
        self.t0 = time.monotonic()
        self.t0_wall = time.time()

    def say(self, message: str) -> None:
        print(f"[{self.mode} {time.monotonic() - self.t0:6.1f}s] {message}", flush=True)

    def _bind_mirror(self) -> None:
        """Bind the reader's queue to the tasks' exchange with their routing key,
        declared as Celery declares its default queue: Redis then puts every
        message published to the tasks' queue into the reader's too."""
        from kombu import Connection, Exchange
        from kombu import Queue as KombuQueue

        with Connection(self.config.redis_url) as conn:
            channel = conn.channel()
            exchange = Exchange(self.queue, type="direct")
            for name in (self.queue, self.mirror):
                KombuQueue(name, exchange, routing_key=self.queue)(channel).declare()

    def setup(self) -> None:
        self.pair.start()
        self.say(
            f"primary :{self.pair.primary.port if self.pair.primary else '?'}, standby "
            f"streaming (lag {self.lag * 1000:g} ms), address :{self.pair.url.rsplit(':', 1)[1]}"
        )
        self._bind_mirror()
        self.reader = RedisQueueReader(self.config.redis_url, self.mirror)
        self.reader.start()
        pythonpath = os.pathsep.join(
            p for p in (str(ACCEPTANCE), str(ROOT), os.environ.get("PYTHONPATH", "")) if p
        )
        common = {
            "PYTHONPATH": pythonpath,
            "SB_BROKER": self.config.redis_url,
            "SB_URL": self.pair.url,
            "SB_PREFIX": self.prefix,
            "SB_QUEUE": self.queue,
        }
        self.worker = self.group.start_worker(
            {**common, "SB_RECORD": str(self.record), "SB_TTL": "5"},
            "worker",
            app="singletonapp",
            concurrency=self.config.concurrency,
        )
        wait_ready(self.worker, timeout=90)
        beat_env = {
            **common,
            "SB_ENTRIES": str(self.config.entries),
            "SB_EVERY": "1",
            "SB_LOOP": "1",
            "SB_TASK": TASK,
            # through the exchange, so that the reader's queue gets a copy
            "SB_VIA_EXCHANGE": "1",
        }
        self.beats = [
            self.group.start_beat(beat_env, f"beat-{i}") for i in range(self.config.replicas)
        ]
        wait_for(
            lambda: all(self._connected(b) for b in self.beats),
            90,
            "every replica to connect",
            interval=0.2,
        )
        self.say(f"{len(self.beats)} replicas and a worker connected")

    @staticmethod
    def _connected(beat: BeatProcess) -> bool:
        if not beat.alive():
            raise RuntimeError(f"{beat.name} exited:\n{beat.log()[-3000:]}")
        return "connected to" in beat.log()

    def _alive(self) -> None:
        for proc in [*self.beats, *([self.worker] if self.worker else [])]:
            if not proc.alive():
                raise RuntimeError(f"{proc.name} exited:\n{proc.log()[-3000:]}")

    def _sleep(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            self._alive()
            time.sleep(min(0.5, max(0.0, deadline - time.monotonic())))

    def _recovered(self, after_s: float) -> bool:
        assert self.reader is not None
        self._alive()
        after_us = after_s * US
        entries = {m.entry for m in self.reader.messages() if m.at_us > after_us}
        return len(entries) >= self.config.entries

    def failovers(self) -> None:
        self._sleep(self.rng.uniform(*WARMUP))
        for _ in range(self.config.failovers):
            # a random point within the second the slots fall due on
            self._sleep(1.0 - time.time() % 1.0 + self.rng.random())
            record = self.pair.failover()
            behind = getattr(record, "behind_transactions", None)
            self.say(
                f"failover {record.number}: unavailable {record.unavailable_s:.3f}s, standby "
                f"{record.behind_ms:.0f} ms / {record.behind_bytes} bytes"
                + ("" if behind is None else f" / {behind} transactions")
                + " behind, "
                + (
                    f"timeline {record.timeline}"
                    if self.config.database == "postgresql"
                    else f"new primary server_id {record.timeline}"
                )
            )
            wait_for(
                lambda r=record: self._recovered(r.moved_at + RECOVERED_AFTER_S),  # type: ignore[misc]
                60,
                "every entry in the broker again",
                interval=0.2,
            )
            started = time.monotonic()
            self.pair.add_standby()
            self.rebuilt.append(time.monotonic() - started)
            self.say(f"new standby streaming after {self.rebuilt[-1]:.1f}s")
            self._sleep(self.rng.uniform(*STEADY))

    def sent_by_beat(self, messages: list[Received]) -> tuple[list[Received], int]:
        """Split what the reader took into the replicas' publishes and the
        worker's: a SingletonTask that finds its key busy (or the database
        away) retries, and Celery's retry sends the same task id again through
        the same exchange, so the reader gets that copy too. A retry's message
        says so in its ``retries`` header; a beat's publish always has 0."""
        assert self.reader is not None
        raw = self.reader.raw
        assert len(raw) == len(messages)
        beat, retried = [], 0
        for text, message in zip(raw, messages):
            if int(json.loads(text)["headers"].get("retries") or 0) == 0:
                beat.append(message)
            else:
                retried += 1
        return beat, retried

    def finish(self, window_from_us: int) -> tuple[int, list[Received]]:
        """Stop sending, let the worker execute what is queued, stop it; return
        the end of the judged window and every message the reader took."""
        assert self.reader is not None and self.worker is not None
        upto_us = int(time.time() * US) - US
        # every slot up to upto_us sent (or it never will be: judged as lost)
        wanted = self._due(window_from_us, upto_us)
        try:
            wait_for(
                lambda: wanted <= {m.slot for m in self.reader.messages()},  # type: ignore[union-attr]
                20,
                "every slot due in the broker",
                interval=0.5,
            )
        except AssertionError as exc:
            self.say(str(exc))
        for beat in self.beats:
            beat.stop(15)
        try:
            # a synchronous replica's round trip in every commit can leave the
            # worker a backlog (MariaDB semi-sync over the 5 ms link: about 30
            # executions a second with 6 children, under the 50 sent): what it
            # has not executed after this long is reported as never executed
            wait_for(
                lambda: wanted <= self._executed_slots(),
                90,
                "the worker to execute every slot due",
                interval=0.5,
            )
        except AssertionError as exc:
            self.say(str(exc))
        # Read before the worker stops: a warm shutdown puts the messages it
        # had prefetched back (kombu's Redis transport restores them through
        # the exchange, so into the reader's queue too), copies no beat sent.
        messages = self.reader.finish()
        self.worker.stop(20)
        return upto_us, messages

    def _due(self, from_us: int, upto_us: int) -> set[tuple[str, int]]:
        anchors = Db(self.pair.primary_url, self.prefix)
        try:
            found = anchors.anchors()
        finally:
            anchors.engine.dispose()
        return {
            (entry, at)
            for entry, anchor in found.items()
            for at in interval_slots(anchor, PERIOD_US, upto_us)
            if at > from_us
        }

    def _executed_slots(self) -> set[tuple[str, int]]:
        return {e.slot for e in executions(read_records(self.record), task=TASK) if e.slot}

    def run(self) -> ModeReport:
        try:
            self.setup()
            window_from_us = int(time.time() * US) + US
            self.failovers()
            self._sleep(3.0)
            upto_us, messages = self.finish(window_from_us)
            return self.judge(window_from_us, upto_us, messages)
        finally:
            self.close()

    def judge(self, from_us: int, upto_us: int, messages: list[Received]) -> ModeReport:
        due = self._due(from_us, upto_us)
        messages, retried = self.sent_by_beat(messages)
        copies = Counter(m.slot for m in messages)
        first: dict[tuple[str, int], float] = {}
        for m in messages:
            first[m.slot] = min(first.get(m.slot, m.received), m.received)
        ran = Counter(
            e.slot for e in executions(read_records(self.record), task=TASK) if e.slot is not None
        )
        twice = {s for s in due if copies[s] > 1}
        ran_twice = {s for s in due if ran[s] > 1}
        lost = {s for s in due if copies[s] == 0}
        gaps = self._gaps(due, first)
        how: Counter[str] = Counter()
        doubled_ids = {slot_task_id(*s) for s in twice}
        for beat in self.beats:
            for m in SENT_LINE.finditer(beat.log()):
                if m["task_id"] in doubled_ids:
                    how[m["how"]] += 1
        logs = {b.name: b.log() for b in [*self.beats, *([self.worker] if self.worker else [])]}
        again = self._written_again(logs)
        errors = [
            f"{name}: {line}"
            for name, text in logs.items()
            for line in text.splitlines()
            if ": ERROR/" in line
        ]
        report = ModeReport(
            database=self.config.database,
            mode=self.mode,
            lag_ms=self.lag * 1000,
            window_s=round((upto_us - from_us) / US, 1),
            slots_due=len(due),
            messages=sum(copies[s] for s in due),
            sent_twice=len(twice),
            sent_more=sum(1 for s in due if copies[s] > 2),
            executed=sum(1 for s in due if ran[s]),
            executed_twice=len(ran_twice),
            lost=len(lost),
            not_executed=sum(1 for s in due if ran[s] == 0),
            longest_gap_s=round(max((g for _, _, g in gaps), default=0.0), 3),
            same_task_ids=all(m.task_id == slot_task_id(m.entry, m.at_us) for m in messages),
            dropped_by_worker=len(DROPPED_LINE.findall(self.worker.log() if self.worker else "")),
            doubled_how=dict(how),
            retried_by_worker=retried,
            written_again_by_beats=sum(n for _, who, n in again if who == "beats"),
            written_again_by_worker=sum(n for _, who, n in again if who == "worker"),
            errors=len(errors),
            error_lines=[line[:400] for line in errors[:20]],
        )
        for s in sorted(lost)[:10]:
            report.problems.append(f"lost: {s[0]}@{s[1]}")
        for s in sorted(s for s in due if copies[s] > 2)[:10]:
            report.problems.append(f"{copies[s]} copies: {s[0]}@{s[1]}")
        cuts = [rec.cut_at for rec in self.pair.failovers]
        for i, (rec, rebuilt) in enumerate(zip(self.pair.failovers, self.rebuilt + [0.0] * 10)):
            one = self._per_failover(rec, rebuilt, twice, ran_twice, lost, gaps)
            until = cuts[i + 1] if i + 1 < len(cuts) else float("inf")
            # the log's times are to the millisecond: a line of this failover's
            # is logged after its cut and before the next one's
            mine = [(who, n) for at, who, n in again if rec.cut_at - 0.01 <= at < until]
            one.written_again_by_beats = sum(n for who, n in mine if who == "beats")
            one.written_again_by_worker = sum(n for who, n in mine if who == "worker")
            report.failovers.append(one)
        return report

    @staticmethod
    def _written_again(logs: dict[str, str]) -> list[tuple[float, str, int]]:
        """(when, "beats" or "worker", how many) for every log line saying that
        the database had lost writes and they were written again."""
        out: list[tuple[float, str, int]] = []
        for text in logs.values():
            for line in text.splitlines():
                for pattern, who in ((LOST_SLOTS_LINE, "beats"), (LOST_RUNS_LINE, "worker")):
                    found = pattern.search(line)
                    stamp = LOG_TIME.match(line)
                    if found and stamp:
                        # Celery logs local time, as time.time() compared with it
                        at = datetime.strptime(stamp[1], "%Y-%m-%d %H:%M:%S,%f").timestamp()
                        out.append((at, who, int(found["n"])))
        return out

    @staticmethod
    def _gaps(
        due: set[tuple[str, int]], first: dict[tuple[str, int], float]
    ) -> list[tuple[str, float, float]]:
        """Per entry, each wait between consecutive due slots reaching the
        broker: (entry, arrival of the later one, seconds). A lost slot makes
        the wait span it."""
        by_entry: dict[str, list[float]] = defaultdict(list)
        for slot in sorted(due):
            if slot in first:
                by_entry[slot[0]].append(first[slot])
        out = []
        for entry, arrivals in by_entry.items():
            arrivals.sort()
            out.extend((entry, b, b - a) for a, b in zip(arrivals, arrivals[1:]))
        return out

    def _per_failover(
        self,
        rec: Failover,
        rebuilt: float,
        twice: set[tuple[str, int]],
        ran_twice: set[tuple[str, int]],
        lost: set[tuple[str, int]],
        gaps: list[tuple[str, float, float]],
    ) -> FailoverReport:
        """The slots within 10 s of this failover's cut (they are 10 s apart at least)."""

        def near(slot: tuple[str, int]) -> bool:
            return abs(slot[1] / US - rec.cut_at) < 10

        doubled = sorted(s[1] / US - rec.cut_at for s in twice if near(s))
        return FailoverReport(
            behind_transactions=getattr(rec, "behind_transactions", None),
            lost_transactions=getattr(rec, "lost_transactions", None),
            semisync_status=getattr(rec, "semisync_status", None),
            semisync_no_tx=getattr(rec, "semisync_no_tx", None),
            number=rec.number,
            at_s=round(rec.cut_at - self.t0_wall, 1),
            unavailable_s=round(rec.unavailable_s, 3),
            behind_ms=rec.behind_ms,
            behind_bytes=rec.behind_bytes,
            timeline=rec.timeline,
            standby_rebuilt_s=round(rebuilt, 1),
            sent_twice=len(doubled),
            executed_twice=sum(1 for s in ran_twice if near(s)),
            lost=sum(1 for s in lost if near(s)),
            doubled_from_s=round(doubled[0], 3) if doubled else None,
            doubled_to_s=round(doubled[-1], 3) if doubled else None,
            longest_gap_s=round(
                max((g for _, at, g in gaps if abs(at - rec.cut_at) < 10), default=0.0), 3
            ),
        )

    def close(self) -> None:
        try:
            self.group.stop_all()
        finally:
            if self.reader is not None:
                self.reader.close()
            self._delete_queues()
            self.pair.close()
            if not self.config.keep:
                shutil.rmtree(self.workdir, ignore_errors=True)
            else:
                print(f"kept {self.workdir}")

    def _delete_queues(self) -> None:
        import redis

        client = redis.Redis.from_url(self.config.redis_url)
        try:
            keys = [self.queue, self.mirror, f"_kombu.binding.{self.queue}"]
            # kombu 5.7 also keeps declared bindings here, and their expiry in a zset
            keys.append(f"_kombu.binding_permanent.{self.queue}")
            client.zrem("_kombu.binding_deadlines", self.queue, self.mirror)
            keys += [f"{q}\x06\x16{step}" for q in (self.queue, self.mirror) for step in (3, 6, 9)]
            client.delete(*keys)
        finally:
            client.close()


# -- output ----------------------------------------------------------------------------


def machine(database: str, version: str, redis_url: str) -> dict[str, Any]:
    """bench_scheduler's machine description, with this rig's own servers."""
    import redis
    from bench_scheduler import machine as common

    client = redis.Redis.from_url(redis_url)
    try:
        redis_server = str(client.info("server")["redis_version"])
    finally:
        client.close()
    commit = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    return {**common(), database: version, "redis_server": redis_server, "commit": commit}


def table(headers: list[str], rows: list[list[Any]]) -> str:
    body = [["" if v is None else str(v) for v in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in body)) for i, h in enumerate(headers)]
    line = "| " + " | ".join(h.ljust(w) for h, w in zip(headers, widths)) + " |"
    rule = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join(
        [
            line,
            rule,
            *("| " + " | ".join(v.ljust(w) for v, w in zip(r, widths)) + " |" for r in body),
        ]
    )


def render(results: dict[str, Any]) -> str:
    m = results["machine"]
    c = results["config"]
    database = c.get("database", "postgresql")
    out = [
        f"celery-singlebeat database failover, {database} (commit {m['commit']}, seed "
        f"{c['seed']}, {c['failovers']} failovers per mode)",
        f"machine: {m['nproc']} CPUs, {m['cpu']}, load {m['load_average_1m_at_start']} at start; "
        f"Python {m['python']}, celery {m['celery']}, kombu {m['kombu']}, "
        f"{m.get(database, '')}, Redis {m['redis_server']}",
        f"{c['replicas']} beat replicas, {c['entries']} entries every 1 s, "
        f"1 SingletonTask worker ({c.get('concurrency', 2)} prefork children)",
        "",
        table(
            [
                "mode", "link lag", "window", "slots due", "sent twice", "executed twice",
                "lost", "not executed", "longest gap", "dropped by worker", "worker retries",
                "written again (beats / worker)", "errors",
            ],
            [
                [
                    r["mode"], f"{r['lag_ms']:g} ms", f"{r['window_s']:g} s", r["slots_due"],
                    r["sent_twice"], r["executed_twice"], r["lost"], r["not_executed"],
                    f"{r['longest_gap_s']:.2f} s", r["dropped_by_worker"],
                    r["retried_by_worker"],
                    f"{r.get('written_again_by_beats', 0)} / {r.get('written_again_by_worker', 0)}",
                    r.get("errors", 0),
                ]
                for r in results["modes"]
            ],
        ),
        "",
        table(
            [
                "mode", "failover", "at", "unavailable", "standby behind", "sent twice",
                "doubled slots (vs cut)", "executed twice", "lost", "gap", "rebuild",
                "written again (beats / worker)",
            ],
            [
                [
                    r["mode"], f["number"], f"{f['at_s']:g} s", f"{f['unavailable_s']:.3f} s",
                    f"{f['behind_ms']:g} ms / {f['behind_bytes']} B"
                    + ("" if f.get("behind_transactions") is None
                       else f" / {f['behind_transactions']} tx"),
                    f["sent_twice"],
                    "" if f["doubled_from_s"] is None
                    else f"{f['doubled_from_s']:+.2f} .. {f['doubled_to_s']:+.2f} s",
                    f["executed_twice"], f["lost"], f"{f['longest_gap_s']:.2f} s",
                    f"{f['standby_rebuilt_s']:g} s",
                    f"{f.get('written_again_by_beats', 0)} / {f.get('written_again_by_worker', 0)}",
                ]
                for r in results["modes"]
                for f in r["failovers"]
            ],
        ),
    ]  # fmt: skip
    for r in results["modes"]:
        if r["doubled_how"]:
            out.append(f"{r['mode']}: publishes of doubled slots logged as {r['doubled_how']}")
        if not r["same_task_ids"]:
            out.append(f"{r['mode']}: a copy had a task id that is not its slot's")
        out.extend(f"{r['mode']}: {p}" for p in r["problems"])
        for f in r["failovers"]:
            if f.get("semisync_status") not in (None, "", "ON") or f.get("semisync_no_tx"):
                out.append(
                    f"{r['mode']}: failover {f['number']}: semi-sync {f['semisync_status']}, "
                    f"{f['semisync_no_tx']} commits without an acknowledgement"
                )
        out.extend(f"{r['mode']}: ERROR {line}" for line in r.get("error_lines", [])[:5])
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--database", choices=list(DATABASES), default="postgresql")
    parser.add_argument(
        "--mode",
        choices=sorted({m for modes in DATABASES.values() for m in modes} | {"both"}),
        default="both",
        help="postgresql: async, sync; mariadb: async, semisync; both: the database's two",
    )
    parser.add_argument("--failovers", type=int, default=3)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--lag-ms", type=float, default=300.0, help="async mode: delay of the replication link"
    )
    parser.add_argument(
        "--sync-lag-ms",
        type=float,
        default=5.0,
        help="sync / semisync mode: delay of the replication link",
    )
    parser.add_argument("--entries", type=int, default=50)
    parser.add_argument("--replicas", type=int, default=3)
    parser.add_argument("--redis-db", type=int, default=8, help="the shared Redis's DB (broker)")
    parser.add_argument(
        "--json",
        type=Path,
        default=None,
        help="default results/failover-latest.json, failover-mariadb-latest.json for MariaDB",
    )
    parser.add_argument("--concurrency", type=int, default=6, help="the worker's prefork children")
    parser.add_argument("--keep", action="store_true", help="keep the run's folders and logs")
    args = parser.parse_args(argv)
    if args.failovers < 1:
        parser.error("--failovers must be 1 or more")
    modes = DATABASES[args.database]
    if args.mode != "both" and args.mode not in modes:
        parser.error(f"--mode for {args.database}: one of {', '.join(modes)} or both")
    if args.json is None:
        name = (
            "failover-latest.json"
            if args.database == "postgresql"
            else "failover-mariadb-latest.json"
        )
        args.json = HERE / "results" / name
    redis_host = os.environ.get("SB_TEST_REDIS", "redis://127.0.0.1:6379/0").rsplit("/", 1)[0]
    config = Config(
        database=args.database,
        modes=list(modes) if args.mode == "both" else [args.mode],
        failovers=args.failovers,
        seed=args.seed,
        lag_ms=args.lag_ms,
        sync_lag_ms=args.sync_lag_ms,
        entries=args.entries,
        replicas=args.replicas,
        concurrency=args.concurrency,
        redis_url=f"{redis_host}/{args.redis_db}",
        keep=args.keep,
    )
    started = datetime.now(timezone.utc)
    reports = []
    version = ""
    for mode in config.modes:
        run = Run(mode, config)
        reports.append(run.run())
        version = run.pair.primary.version if run.pair.primary else version
    results = {
        "started": started.isoformat(timespec="seconds"),
        "machine": machine(config.database, version, config.redis_url),
        "config": asdict(config),
        "modes": [asdict(r) for r in reports],
    }
    print()
    print(render(results))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(results, indent=2) + "\n")
    print(f"results written to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
