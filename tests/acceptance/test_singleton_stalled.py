"""A slot whose worker died mid-run is run again by the fleet (docs/guarantees.md,
"A worker dies mid-run"), with real ``celery beat`` and ``celery worker`` processes.

Beat sends a slow SingletonTask, its worker is SIGKILLed mid-run: the message
was acknowledged when the worker took it (Celery's default), so nothing
delivers it again, and its run row stays running until its ttl lapses. Once
the ttl and the grace (the beat lease) have passed, a beat replica takes the
sent slot over and publishes it again under the same task id; a second worker
retakes the run row and runs it to completion, once.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from harness import (
    Rig,
    Sender,
    executions,
    group_env,
    kill_group,
    read_records,
    run_rows,
    wait_for,
    wait_ready,
)
from test_operating import cli

from celery_singlebeat.timeline.slots import slot_task_id

SLOW = "singletonapp.slow_probe"
RARE = "rare-0"
#: the run's singleton_ttl and the beat lease (the grace after it), seconds
TTL = 2.0
LEASE = 2.0
#: Redis database of these tests (queues are fresh per test anyway)
REDIS_DB = 5


@pytest.fixture
def sender(redis_url: str) -> Iterator[Sender]:
    sender = Sender(f"{redis_url}/{REDIS_DB}")
    try:
        yield sender
    finally:
        sender.close()


@pytest.mark.slow
@pytest.mark.postgres
@pytest.mark.redis
def test_a_slot_whose_worker_died_mid_run_runs_again_to_completion_once(
    rig: Rig, sender: Sender, pg_url: str, table_prefix: str, tmp_path: Path
) -> None:
    record = tmp_path / "record.jsonl"
    env = group_env(
        broker=sender.broker_url,
        db_url=pg_url,
        prefix=table_prefix,
        queue=sender.queue(),
        SB_RECORD=str(record),
        SB_ENTRIES="0",
        SB_RARE="1",  # rare-0, every hour: the slot comes from a run-now
        SB_TASK=SLOW,
        SB_SLOW_SECONDS="3",
        SB_TTL=str(TTL),
        SB_LEASE=str(LEASE),
    )
    db = rig.db(pg_url, table_prefix)
    first = rig.start_worker(env, "first", concurrency=1)
    wait_ready(first)
    beats = [rig.start_beat(env, f"beat-{i}") for i in range(2)]
    wait_for(
        lambda: all("connected to" in b.log() for b in beats), 45, "the replicas", interval=0.2
    )
    run = cli(pg_url, table_prefix, "run", RARE)
    slot = (RARE, int(run["slot_us"]))
    task_id = slot_task_id(*slot)
    assert run["task_id"] == task_id

    def runs() -> list[object]:
        return [e for e in executions(read_records(record), task=SLOW) if e.task_id == task_id]

    victim = wait_for(lambda: runs(), 20, "the slot to start", interval=0.05)[0]
    kill_group(first)  # mid-run: it sleeps 3 s
    killed_at = time.time()
    second = rig.start_worker(env, "second", concurrency=1)
    wait_ready(second)

    def outputs() -> str:
        return "\n".join(f"===== {p.name}\n{p.log()[-4000:]}" for p in [*beats, first, second])

    try:
        done = wait_for(
            lambda: next((e for e in runs() if e.end is not None), None),
            TTL + LEASE + 20,
            "the slot to run again to completion",
            interval=0.1,
        )
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{runs()}\n{outputs()}") from None
    row = run_rows(db)[slot]
    assert row.state == 1 and row.outcome == "success", row
    assert row.attempts == 2, row
    # not before the run's ttl (renewed every ttl/3 until the kill) and the grace
    assert done.start > killed_at + TTL * 2 / 3 + LEASE - 0.1, (done.start - killed_at, outputs())
    taken = [b for b in beats if f"took over slot {RARE}@" in b.log()]
    assert len(taken) == 1, outputs()
    for beat in beats:
        beat.stop()
    slot_row = db.rows()[slot]
    assert slot_row.state == 1 and slot_row.fence == 2, slot_row  # run-now 1, sent again 2
    # at least once started, once to completion, under the one task id
    starts = runs()
    assert [e.pid for e in starts] == [victim.pid, done.pid], starts
    assert [e.end is not None for e in starts] == [False, True], starts
    assert done.lost is False
    print(
        f"killed {killed_at - victim.start:.2f}s into the run; run again "
        f"{done.start - killed_at:.2f}s after the kill (ttl {TTL:g}s + grace {LEASE:g}s)"
    )
