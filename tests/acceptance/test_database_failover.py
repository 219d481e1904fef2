"""A database failover under 3 real beat replicas and a real SingletonTask
worker: the short form of ``make bench-failover`` (issue 13).

The topology is the benchmark's (``benchmarks/failover.py``): a PostgreSQL 15
primary with a streaming standby of its own whose WAL link lags
:data:`LAG_S`, a movable address every process connects to, 3 beat replicas
of 20 entries every second and a prefork worker executing them, their rows in
that database, Redis as the broker. One failover is made as soon as the worker
has executed every entry of a fresh tick, so that the tick's claims, confirms
and run rows (all within a few hundred milliseconds) are in the tail the
promoted standby never received.

Judged from outside, as the benchmark judges: every slot due reached the
broker once (none twice, none lost, each copy with the slot's task id) and
was executed once. Then each slot whose run row the failover lost is
delivered again, as a broker redelivers: the worker must drop every one,
which it can only do if it wrote those rows back. Both sides must also have
said, at ERROR, that the database lost what they wrote.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from harness import (
    DROPPED_LINE,
    ROOT,
    Received,
    Sender,
    executions,
    log_ids,
    read_records,
    wait_for,
)

sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_failover import TASK, Config, Run

from celery_singlebeat.timeline.slots import slot_header, slot_task_id

#: the standby's WAL link delay: everything committed this long before the cut is lost
LAG_S = 0.5
#: every replica sending and the worker executing before the failover
WARMUP_S = 6.0
#: a header of the test's own redeliveries, so the judge does not count them as sends
REPEAT_HEADER = "test_redelivery"
REDIS_DB = 11
ENTRIES = 20


class ShortRun(Run):
    """bench_failover's run with one failover at a chosen instant, then a
    redelivery of each slot whose run row the failover lost."""

    def __init__(self, config: Config, sender: Sender) -> None:
        super().__init__("async", config)
        self.sender = sender
        self.repeated: list[tuple[str, int, str]] = []
        self.dropped: list[str] = []

    def failovers(self) -> None:
        self._sleep(WARMUP_S)
        # the next tick, executed for every entry: then at once the cut
        seen = max(self._executed_slots(), key=lambda slot: slot[1])[1]
        wait_for(
            lambda: self._tick_done(seen),
            10,
            "a fresh tick executed for every entry",
            interval=0.02,
        )
        record = self.pair.failover()
        self.say(f"failover: standby {record.behind_ms:.0f} ms behind")
        wait_for(
            lambda: self._recovered(record.moved_at + 2.0),
            60,
            "every entry in the broker again",
            interval=0.2,
        )
        # Run rows start before the body's start record and finish after its
        # end: an execution that started within the lag before the cut had its
        # whole row in the tail the standby never received.
        earliest, latest = record.cut_at - LAG_S + 0.05, record.cut_at - 0.01
        lost = [
            e
            for e in executions(read_records(self.record), task=TASK)
            if e.slot is not None and e.end is not None and earliest < e.start < latest
        ]
        for e in lost:
            entry, slot_us = e.slot  # type: ignore[misc]
            task_id = self.sender.send(
                self.queue,
                TASK,
                int(e.tag),
                task_id=slot_task_id(entry, slot_us),
                headers={"singlebeat_slot": slot_header(entry, slot_us), REPEAT_HEADER: "1"},
            )
            self.repeated.append((entry, slot_us, task_id))
        ids = {task_id for *_, task_id in self.repeated}
        assert self.worker is not None
        worker = self.worker
        wait_for(
            lambda: ids <= set(log_ids([worker], DROPPED_LINE)) or self._ran_again(ids),
            30,
            "the worker to drop every redelivery",
            interval=0.2,
        )
        self.dropped = [i for i in log_ids([worker], DROPPED_LINE) if i in ids]
        self._sleep(2.0)

    def _tick_done(self, after_us: int) -> bool:
        self._alive()
        done: dict[int, int] = {}
        for e in executions(read_records(self.record), task=TASK):
            if e.slot is not None and e.slot[1] > after_us and e.end is not None:
                done[e.slot[1]] = done.get(e.slot[1], 0) + 1
        return any(count >= ENTRIES for count in done.values())

    def _ran_again(self, ids: set[str]) -> bool:
        runs = [e.task_id for e in executions(read_records(self.record), task=TASK)]
        return any(runs.count(i) > 1 for i in ids)

    def sent_by_beat(self, messages: list[Received]) -> tuple[list[Received], int]:
        assert self.reader is not None
        ours = [REPEAT_HEADER in json.loads(text)["headers"] for text in self.reader.raw]
        beat, retried = super().sent_by_beat(messages)
        # the test's redeliveries went through the same exchange: not the replicas'
        kept = {id(m) for m, mine in zip(messages, ours) if not mine}
        return [m for m in beat if id(m) in kept], retried


@pytest.mark.slow
@pytest.mark.postgres
@pytest.mark.redis
def test_failover_to_a_lagging_standby_doubles_nothing_and_redeliveries_are_dropped(
    pg_url: str, redis_url: str, tmp_path: Path
) -> None:
    config = Config(
        database="postgresql",
        modes=["async"],
        failovers=1,
        seed=1,
        lag_ms=LAG_S * 1000,
        sync_lag_ms=0.0,
        entries=ENTRIES,
        replicas=3,
        concurrency=2,
        redis_url=f"{redis_url}/{REDIS_DB}",
        keep=False,
    )
    sender = Sender(config.redis_url)
    run = ShortRun(config, sender)
    logs: dict[str, str] = {}
    close = run.close

    def keep_logs() -> None:
        for proc in [*run.beats, *([run.worker] if run.worker else [])]:
            logs[proc.name] = proc.log()
        close()

    run.close = keep_logs  # type: ignore[method-assign]
    try:
        report = run.run()
    finally:
        sender.close()
    worker_log = logs.get("worker", "")
    beat_logs = [text for name, text in logs.items() if name.startswith("beat-")]
    detail = f"{report}\nrepeated {run.repeated}\ndropped {run.dropped}\n" + "\n".join(
        f"===== {n}\n{t[-4000:]}" for n, t in logs.items()
    )
    (failover,) = report.failovers
    print(
        f"failover: standby {failover.behind_bytes} bytes / {failover.behind_ms} ms behind, "
        f"{report.slots_due} slots due, {len(run.repeated)} redelivered, "
        f"{len(run.dropped)} dropped, longest gap {report.longest_gap_s}s"
    )
    # the rig did lose a tail: the standby was behind when the primary died
    assert failover.behind_bytes > 0, detail
    assert report.slots_due >= ENTRIES * 10, detail
    assert (report.lost, report.sent_twice, report.executed_twice) == (0, 0, 0), detail
    assert report.not_executed == 0 and report.same_task_ids, detail
    # the redeliveries of slots whose run rows were lost: all dropped, none ran again
    assert run.repeated, detail
    assert sorted(run.dropped) == sorted(i for *_, i in run.repeated), detail
    assert "the database lost" in worker_log and "run rows worker" in worker_log, detail
    assert any("the database lost" in text for text in beat_logs), detail
