"""SingletonTask in real ``celery worker`` processes on PostgreSQL: pools, busy
policies as result states, ``self.retry()``, acks_late redelivery after a
SIGKILL, time limits and the start-up settings check.

Each execution appends a start and an end line to a record file
(``singletonapp.record``); overlapping and counts are judged from it, result
states from the Redis result backend, and lease expiry from the lease row in
the database. Waits are on conditions with deadlines, never bare sleeps.
"""

from __future__ import annotations

import json
import os
import re
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from celery.result import AsyncResult
from harness import (
    US,
    BeatProcess,
    Db,
    Execution,
    Rig,
    Sender,
    executions,
    group_env,
    kill_group,
    lease_row,
    overlaps,
    pid_gone,
    read_records,
    run_rows,
    wait_for,
    wait_ready,
)
from sqlalchemy.engine import make_url

from celery_singlebeat import SingletonBusy
from celery_singlebeat.timeline.slots import slot_header, slot_task_id

#: singleton_ttl of the worker app's tasks (SB_TTL)
TTL = 3.0
#: scheduling slack on a loaded 2-core machine: polls, process start, a round trip
SLACK = 1.0


@dataclass
class Setup:
    """One test's workers share: environment, a sending client, the record file."""

    rig: Rig
    env: dict[str, str]
    sender: Sender
    queue: str
    record: Path
    db: Db

    def worker(self, name: str, **options: Any) -> BeatProcess:
        worker = self.rig.start_worker(self.env, name, **options)
        wait_ready(worker)
        return worker

    def send(self, task: str, *args: Any, **kwargs: Any) -> AsyncResult:
        task_id = self.sender.send(self.queue, task, *args, kwargs=kwargs)
        return self.sender.app.AsyncResult(task_id)

    def records(self) -> list[dict[str, Any]]:
        return read_records(self.record)

    def events(self, task_id: str, event: str) -> list[dict[str, Any]]:
        return [r for r in self.records() if r["task_id"] == task_id and r["event"] == event]

    def first(self, task_id: str, event: str, timeout: float) -> dict[str, Any]:
        """The first ``event`` record of ``task_id``, waited for."""
        found = wait_for(
            lambda: self.events(task_id, event), timeout, f"{event} of {task_id}", interval=0.02
        )
        return found[0]

    def raw_meta(self, result: AsyncResult) -> dict[str, Any]:
        """The result as the backend stores it (JSON), before the client decodes it."""
        backend = self.sender.app.backend
        return json.loads(backend.get(backend.get_key_for_task(result.id)))

    def done(self, result: AsyncResult, timeout: float) -> AsyncResult:
        """Wait until the result is ready (SUCCESS or FAILURE)."""
        wait_for(result.ready, timeout, f"result of {result.id}", interval=0.05)
        return result


def _setup(rig: Rig, broker: str, backend: str, pg_url: str, prefix: str) -> Iterator[Setup]:
    sender = Sender(broker, backend=backend)
    queue = sender.queue()
    record = rig.workdir / "record.jsonl"
    env = group_env(
        broker=broker,
        db_url=pg_url,
        prefix=prefix,
        queue=queue,
        SB_TTL=str(TTL),
        SB_RECORD=str(record),
        SB_BACKEND=backend,
    )
    try:
        yield Setup(rig, env, sender, queue, record, rig.db(pg_url, prefix))
    finally:
        rig.group.stop_all()
        sender.close()


@pytest.fixture
def setup(rig: Rig, pg_url: str, redis_url: str, table_prefix: str) -> Iterator[Setup]:
    """Broker and result backend on Redis, leases in PostgreSQL."""
    yield from _setup(rig, redis_url, redis_url, pg_url, table_prefix)


@pytest.fixture
def amqp_setup(
    rig: Rig, pg_url: str, redis_url: str, amqp_url: str, table_prefix: str
) -> Iterator[Setup]:
    """Broker on RabbitMQ (a dead consumer's unacked message comes back at
    once), result backend on Redis, leases in PostgreSQL."""
    yield from _setup(rig, amqp_url, redis_url, pg_url, table_prefix)


def _no_overlap(runs: list[Execution]) -> None:
    problems = overlaps(runs)
    assert not problems, "\n".join(problems)


# -- 1. pools -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pool", "concurrency", "workers"),
    [("prefork", 3, 1), ("threads", 4, 1), ("solo", 1, 2)],
    ids=["prefork-c3", "threads-c4", "solo-x2"],
)
def test_no_overlap_in_every_pool(setup: Setup, pool: str, concurrency: int, workers: int) -> None:
    """Bursts of concurrent ``hold`` calls: in each burst one runs and the rest
    are skipped (SUCCESS, None), and no two executions ever overlap. A solo
    worker runs one task at a time, so two of them contend."""
    for i in range(workers):
        setup.worker(f"w{i}", pool=pool, concurrency=concurrency)
    burst, hold_s = 4, 0.6
    ran: list[str] = []
    skipped = 0
    for b in range(2):
        results = [setup.send("singletonapp.hold", hold_s, f"b{b}-{i}") for i in range(burst)]
        for r in results:
            setup.done(r, 20)
        assert all(r.state == "SUCCESS" for r in results), [r.state for r in results]
        values = [r.result for r in results]
        ran_now = [v for v in values if v is not None]
        assert ran_now, f"burst {b}: nothing ran"
        ran += ran_now
        skipped += values.count(None)
    runs = executions(setup.records())
    assert sorted(e.tag for e in runs) == sorted(ran)
    assert len(runs) >= 2
    assert skipped >= 1, "no call was ever skipped: the calls did not contend"
    assert skipped + len(runs) == 2 * burst
    _no_overlap(runs)


# -- 2. busy policies as result states --------------------------------------------


def test_busy_policies_result_states(setup: Setup) -> None:
    """While a holder runs: skip -> SUCCESS with None (and an INFO line); raise
    -> FAILURE with SingletonBusy; retry -> RETRY, then SUCCESS once the holder
    ended, without overlapping it; retry with max_retries used up -> FAILURE
    with SingletonBusy."""
    worker = setup.worker("w", pool="threads", concurrency=8)
    hold_s = 2.5
    holders = {
        "skip": setup.send("singletonapp.hold", hold_s, "holder-skip"),
        "raise": setup.send("singletonapp.hold_raise", hold_s, "holder-raise"),
        "retry": setup.send("singletonapp.hold_retry", hold_s, "holder-retry"),
        "few": setup.send("singletonapp.hold_retry_few", hold_s, key="few", tag="holder-few"),
    }
    for r in holders.values():
        setup.first(r.id, "start", 20)
    skip = setup.send("singletonapp.hold", 0, "skip")
    raised = setup.send("singletonapp.hold_raise", 0, "raise")
    retry = setup.send("singletonapp.hold_retry", 0, "retry")
    few = setup.send("singletonapp.hold_retry_few", 0, key="few", tag="few")

    # retry: RETRY while the holder still runs
    wait_for(lambda: retry.state == "RETRY", hold_s, "the busy retry's RETRY state", interval=0.02)
    assert not setup.events(holders["retry"].id, "end"), "holder ended before RETRY was seen"

    setup.done(skip, 10)
    assert (skip.state, skip.result) == ("SUCCESS", None)
    assert not setup.events(skip.id, "start"), "the skipped call ran"
    assert f"singletonapp.hold[{skip.id}]: singleton key 'singletonapp.hold' is held by" in (
        worker.log()
    )

    for failed, key in ((raised, "singletonapp.hold_raise"), (few, "few")):
        setup.done(failed, 10)
        assert failed.state == "FAILURE"
        meta = setup.raw_meta(failed)["result"]
        assert meta["exc_type"] == "SingletonBusy", meta
        assert meta["exc_module"] == "celery_singlebeat.exceptions", meta
        # the client gets the library's exception back, not a stand-in
        assert isinstance(failed.result, SingletonBusy), repr(failed.result)
        assert failed.result.key == key
        assert not setup.events(failed.id, "start")
    assert few.result.until and few.result.holder

    setup.done(retry, hold_s + TTL + 10)
    assert (retry.state, retry.result) == ("SUCCESS", "retry")
    for r in holders.values():
        setup.done(r, 10)
    runs = executions(setup.records(), key="singletonapp.hold_retry")
    assert [e.tag for e in runs] == ["holder-retry", "retry"]
    _no_overlap(runs)


# -- 3. self.retry() -----------------------------------------------------------


def test_self_retry_releases_the_lease(setup: Setup) -> None:
    """``self.retry()`` releases the lease at the end of the attempt: between
    the attempts the key is free (another call on it runs in between), and
    the retry acquires it again with a new, larger token.

    (The countdown is 2 s rather than 0.2 s so that the call in between
    surely runs inside the gap on a loaded machine.)"""
    setup.worker("w", pool="prefork", concurrency=2)
    result = setup.send("singletonapp.retry_once", 2.0, key="r", tag="retrying")
    first = setup.first(result.id, "retrying", 20)
    probe = setup.send("singletonapp.hold", 0, key="r", tag="between")
    setup.done(probe, 10)
    assert probe.result == "between", "the key stayed held after self.retry()"
    setup.done(result, 20)
    assert (result.state, result.result) == ("SUCCESS", "retrying")

    starts = setup.events(result.id, "start")
    assert [s["retries"] for s in starts] == [0, 1]
    second = starts[1]
    between = setup.first(probe.id, "start", 0)
    assert first["token"] < between["token"] < second["token"]
    assert first["at"] < between["at"] < second["at"]
    # the retrying attempt records no end: the runs that ended did not overlap
    _no_overlap([e for e in executions(setup.records(), key="r") if e.end is not None])
    row = lease_row(setup.db, "r")
    assert row is not None and row.token == second["token"] and row.expires_us == 0


# -- 4. acks_late and a SIGKILLed worker -----------------------------------------


def test_acks_late_redelivery_waits_for_the_ttl(amqp_setup: Setup) -> None:
    """An acks_late task whose worker is SIGKILLed mid-run comes back (RabbitMQ
    requeues a dead consumer's unacked message at once) to the other worker,
    which runs it only once the dead holder's lease has expired: not before
    the lease row's end, within the TTL after the kill. One execution completes."""
    s = amqp_setup
    workers = [s.worker(f"w{i}", pool="prefork", concurrency=1) for i in range(2)]
    result = s.send("singletonapp.hold_late", 2.0, key="late", tag="late")
    start = s.first(result.id, "start", 20)
    pgids = {w.pid: w for w in workers}
    victim = pgids[os.getpgid(start["pid"])]
    survivor = next(w for w in workers if w is not victim)
    kill_group(victim)
    killed = time.time()
    row = lease_row(s.db, "late")
    assert row is not None and row.token == start["token"]
    expires = row.expires_us / US

    s.done(result, TTL + 20)
    assert (result.state, result.result) == ("SUCCESS", "late"), survivor.log()[-3000:]
    starts = s.events(result.id, "start")
    ends = s.events(result.id, "end")
    assert len(starts) == 2 and len(ends) == 1, s.records()
    again = starts[1]
    assert os.getpgid(again["pid"]) == survivor.pid and again["token"] > start["token"]
    assert again["retries"] >= 1, "the redelivery found the key free at once"
    # not before the dead holder's lease ran out, and within the TTL of the kill
    assert again["at"] >= expires, (again["at"], expires)
    assert expires >= killed + TTL / 2, "the dead holder's lease did not outlive the kill"
    assert again["at"] <= killed + TTL + SLACK
    # the killed execution never ended; the lease and the times above judge it
    _no_overlap([e for e in executions(s.records(), key="late") if e.end is not None])


# -- 5. time limits --------------------------------------------------------------


def test_sigkilled_pool_child_holds_the_key_until_its_lease_ends(setup: Setup) -> None:
    """A pool child SIGKILLed mid-run (the OOM killer, say) runs no cleanup and
    stops renewing: the key stays held until its lease ends (a call right
    after the kill is skipped) and is free then (a retrying call runs no
    earlier than the lease row's end, and within the TTL of the kill)."""
    setup.worker("w", pool="prefork", concurrency=2)
    victim = setup.send("singletonapp.hold", 30, key="killed", tag="victim")
    start = setup.first(victim.id, "start", 20)
    os.kill(start["pid"], signal.SIGKILL)
    wait_for(lambda: pid_gone(start["pid"]), 5, "the child to die", 0.02)
    killed = time.time()
    row = lease_row(setup.db, "killed")
    assert row is not None and row.token == start["token"]
    expires = row.expires_us / US
    assert expires >= killed + TTL / 2, "the lease was released or not renewed"

    early = setup.send("singletonapp.hold", 0, key="killed", tag="early")
    later = setup.send("singletonapp.hold_retry", 0, key="killed", tag="later")
    setup.done(early, 10)
    assert time.time() < expires, "too slow to tell: the early call ended after the lease's end"
    assert (early.state, early.result) == ("SUCCESS", None), "the key was free right after the kill"
    setup.done(later, TTL + 10)
    assert later.result == "later"
    ran = setup.first(later.id, "start", 0)
    assert ran["at"] >= expires
    assert ran["at"] <= killed + TTL + SLACK
    assert ran["token"] > start["token"]
    setup.done(victim, 10)
    assert victim.state == "FAILURE"  # WorkerLostError
    assert not setup.events(victim.id, "end")


def test_hard_time_limit_frees_the_key(setup: Setup) -> None:
    """Over its hard time limit a pool child gets SIGTERM, and SIGKILL 0.1 s
    later (billiard's ``_trywaitkill``). Billiard's SIGTERM handler raises
    SystemExit in the body, so SingletonTask's cleanup normally releases the
    lease before the SIGKILL lands (the key is free at once); a cleanup slower
    than 0.1 s is cut off and the lease runs out instead. Either way the key
    is free again within the TTL of the kill, no earlier than the lease row
    says, and the killed execution never ends."""
    worker = setup.worker("w", pool="prefork", concurrency=2)
    limited = setup.send("singletonapp.hard_limited", 30, key="hard", tag="limited")
    start = setup.first(limited.id, "start", 20)
    wait_for(lambda: pid_gone(start["pid"]), 1.5 + 10, "the pool to kill the child", 0.02)
    killed = time.time()
    later = setup.send("singletonapp.hold_retry", 0, key="hard", tag="later")
    row = lease_row(setup.db, "hard")
    assert row is not None and row.token == start["token"]
    expires = row.expires_us / US  # 0: released by the SIGTERM's cleanup

    setup.done(later, TTL + 10)
    assert later.result == "later"
    ran = setup.first(later.id, "start", 0)
    assert ran["at"] >= expires
    assert ran["at"] <= killed + TTL + SLACK
    assert "Hard time limit (1.5s) exceeded for singletonapp.hard_limited" in worker.log()
    setup.done(limited, 10)
    assert limited.state == "FAILURE"
    assert type(limited.result).__name__ == "TimeLimitExceeded", repr(limited.result)
    assert not setup.events(limited.id, "end")


def test_soft_time_limit_releases_the_key_at_once(setup: Setup) -> None:
    """SoftTimeLimitExceeded raised in the body ends the attempt like any error:
    the lease is released at once, so the next call runs right away, long
    before the holder's 30 s TTL."""
    setup.worker("w", pool="prefork", concurrency=2)
    limited = setup.send("singletonapp.soft_limited", 30, key="soft", tag="limited")
    soft = setup.first(limited.id, "soft", 20)
    setup.done(limited, 10)
    assert limited.state == "FAILURE"
    assert type(limited.result).__name__ == "SoftTimeLimitExceeded"
    after = setup.send("singletonapp.hold", 0, key="soft", tag="after")
    setup.done(after, 10)
    assert after.result == "after", "the key stayed held after the soft time limit"
    ran = setup.first(after.id, "start", 0)
    assert ran["at"] - soft["at"] < 5.0  # the holder's TTL is 30 s
    row = lease_row(setup.db, "soft")
    assert row is not None and row.expires_us == 0 and row.token == ran["token"]


# -- 6. start-up settings check ------------------------------------------------------


@pytest.mark.parametrize(
    ("extra_env", "setting"),
    [
        ({"SB_LEASE_SETTING": "0"}, "singlebeat_lease"),
        ({"SB_URL": "postgresql+psycopg://u:s3cr3t@host:notaport/db"}, "singlebeat_url"),
    ],
    ids=["lease-0", "url-unparsable"],
)
def test_bad_setting_fails_the_worker_start(
    setup: Setup, extra_env: dict[str, str], setting: str
) -> None:
    """A worker of an app with SingletonTasks and a bad singlebeat setting
    exits at start, with a message naming the setting (and not showing the
    URL's password), instead of starting and failing every task."""
    worker = setup.rig.start_worker({**setup.env, **extra_env}, "bad", pool="solo")
    wait_for(lambda: worker.proc.poll() is not None, 30, "the worker to exit", interval=0.05)
    log = worker.log()
    assert worker.proc.returncode != 0
    assert setting in log, log[-3000:]
    assert "s3cr3t" not in log
    assert " ready." not in log


# -- the database unreachable when a task starts -----------------------------------

#: SingletonTask's retry delay when the database cannot decide (docs/singleton.md,
#: "What the caller sees": 5 s for a message without a slot)
UNAVAILABLE_DELAY = 5.0
#: the retry is a message with an ETA: the worker runs it at the ETA, give or take
#: its broker round trip and a machine shared with other test runs
RETRY_SLACK = 3.0
WARNING_LINE = re.compile(
    r"^\[(?P<ts>[\d-]+ [\d:]+,\d{3}): WARNING/[^\]]+\] singlebeat: singletonapp\.hold\["
    r"(?P<id>[0-9a-f-]{36})\]: cannot reach the singleton database .*; retrying in "
    r"(?P<delay>[\d.]+)s$",
    re.M,
)


@pytest.mark.slow
@pytest.mark.postgres
@pytest.mark.redis
def test_unreachable_database_at_the_start_retries_then_runs_once(
    setup: Setup, pg_url: str
) -> None:
    """The database refuses (the proxy is cut) when a task starts: the worker logs
    the WARNING, nothing runs, the task is retried after 5 s; the database is
    back by then, so the retry runs the body once and the task succeeds."""
    pg = make_url(pg_url)
    proxy = setup.rig.proxy((pg.host or "127.0.0.1", pg.port or 5432))
    proxied = pg.set(host="127.0.0.1", port=proxy.port).render_as_string(hide_password=False)
    worker = setup.rig.start_worker({**setup.env, "SB_URL": proxied}, "w-proxied")
    wait_ready(worker)
    # a first task opens the store (and creates the tables) while the path is up
    warm = setup.done(setup.send("singletonapp.hold", 0.0, "warm", key="outage"), 60)
    assert warm.state == "SUCCESS", warm.state

    proxy.cut()
    result = setup.send("singletonapp.hold", 0.1, "after", key="outage")
    warned = wait_for(
        lambda: [m for m in WARNING_LINE.finditer(worker.log()) if m["id"] == result.id],
        30,
        "the WARNING of the unreachable start",
        interval=0.05,
    )
    assert not setup.events(result.id, "start"), "ran without the database"
    proxy.restore()
    assert setup.done(result, UNAVAILABLE_DELAY + 30).state == "SUCCESS", worker.log()[-4000:]

    assert len(warned) == 1 and float(warned[0]["delay"]) == UNAVAILABLE_DELAY, warned
    # log timestamps are this host's local time, milliseconds
    warned_at = datetime.strptime(warned[0]["ts"], "%Y-%m-%d %H:%M:%S,%f").timestamp()
    starts = setup.events(result.id, "start")
    assert len(starts) == 1, starts  # ran once, on the retry
    assert starts[0]["retries"] == 1, starts
    waited = starts[0]["at"] - warned_at
    # the ETA is set after the line is logged: not before the delay (1 ms for the
    # log's rounding), and not much after it
    assert UNAVAILABLE_DELAY - 0.001 <= waited <= UNAVAILABLE_DELAY + RETRY_SLACK, waited
    assert setup.events(result.id, "end"), setup.records()
    print(f"retry ran {waited:.2f}s after the WARNING")


# -- the broker unreachable when a busy start retries --------------------------------

#: Celery's line for a message rejected without requeueing (log_policy_reject)
REJECTED_LINE = re.compile(r"Task \S+\[(?P<id>[0-9a-f-]{36})\] reject requeue=False")
#: SingletonTask's WARNING when the broker did not take a retry (task.py, retry)
UNPUBLISHED_LINE = re.compile(
    r"singlebeat: \S+\[(?P<id>[0-9a-f-]{36})\]: the broker did not take the retry"
)


@pytest.mark.slow
@pytest.mark.postgres
@pytest.mark.redis
def test_a_busy_slots_retry_outlives_a_broker_outage(setup: Setup, redis_url: str) -> None:
    """guarantees.md, *Broker unreachable*: a slot whose key is busy retries;
    with the broker cut off at that moment, Celery's ``retry`` cannot publish
    the retry and raises ``Reject(requeue=False)``. The message was acked when
    the worker took it, and the slot's run row was abandoned for the retry:
    the slot would never run (the chaos run saw a worker log this once). The
    worker publishes the retry again until the broker is back, and the slot
    runs once, after its holder.

    Deterministic: the contender's start waits at a gate (its key function)
    while the holder runs; the broker is cut, then the gate opened; the
    holder is let go only once the worker has met the failed publish."""
    address = urlsplit(redis_url)
    proxy = setup.rig.proxy((address.hostname or "127.0.0.1", address.port or 6379))
    broker = address._replace(netloc=f"127.0.0.1:{proxy.port}").geturl()
    worker = setup.rig.start_worker({**setup.env, "SB_BROKER": broker}, "w-proxied")
    wait_ready(worker)
    enter, leave = setup.rig.workdir / "enter", setup.rig.workdir / "leave"
    # the entry named after the test's queue: slot task ids are derived from
    # the slot, and the result backend outlives the test
    key, entry, first_us = "gated", f"gated-{setup.queue}", 1_800_000_000 * US
    results = {}
    for tag, slot_us, gate in (
        ("holder", first_us, {"leave": str(leave)}),
        ("contender", first_us + US, {"enter": str(enter)}),
    ):
        task_id = setup.sender.send(
            setup.queue,
            "singletonapp.gated_retry",
            tag,
            kwargs={"key": key, **gate},
            task_id=slot_task_id(entry, slot_us),
            headers={"singlebeat_slot": slot_header(entry, slot_us)},
        )
        results[tag] = setup.sender.app.AsyncResult(task_id)
    holder, contender = results["holder"], results["contender"]
    setup.first(holder.id, "start", 30)
    waiting = Path(f"{enter}.waiting")
    wait_for(waiting.exists, 30, "the contender at its gate", interval=0.02)

    proxy.cut()
    enter.touch()  # the contender finds the key busy, and retries
    log = worker.log

    def met() -> list[str]:
        text = log()
        return [
            m["id"]
            for pattern in (UNPUBLISHED_LINE, REJECTED_LINE)
            for m in pattern.finditer(text)
            if m["id"] == contender.id
        ]

    wait_for(met, 30, "the contender's retry to meet the broker outage", interval=0.05)
    rejected = [m for m in REJECTED_LINE.finditer(log()) if m["id"] == contender.id]
    assert not rejected, f"the retry's message was dropped:\n{log()[-4000:]}"
    proxy.restore()
    leave.touch()

    assert setup.done(holder, 30).result == "holder", log()[-4000:]
    assert setup.done(contender, 90).state == "SUCCESS", log()[-4000:]
    assert contender.result == "contender"
    runs = executions(setup.records(), key=key)
    assert [e.tag for e in runs] == ["holder", "contender"], runs
    _no_overlap(runs)
    assert not [m for m in REJECTED_LINE.finditer(log()) if m["id"] == contender.id]
    assert [m for m in UNPUBLISHED_LINE.finditer(log()) if m["id"] == contender.id]
    # it ran on a retry, once the holder had let the key go
    assert [s["retries"] >= 1 for s in setup.events(contender.id, "start")] == [True]
    rows = run_rows(setup.db)
    assert rows[(entry, first_us + US)].outcome == "success", rows
    assert rows[(entry, first_us)].outcome == "success", rows
