"""SingletonTask in real ``celery worker`` processes (Redis broker), judged from
outside: every execution appends its start and end (wall clock of this host,
fencing token, slot) to a record file, the workers' logs say what was skipped
or dropped, and the database's lease and run rows are read directly.

* one execution at a time per key, on every database, with racing workers;
* a SIGKILLed holder blocks the key until its TTL runs out, not longer;
* a run longer than its TTL keeps its lease (heartbeat);
* a slot delivered twice runs once (same worker, or two workers racing);
* three ``celery beat`` replicas and a worker: each slot executed once;
* run and key rows older than ``singlebeat_run_retention`` pruned by a worker,
  newer ones kept, and a repeat of a slot dropped only while its row is kept.
"""

from __future__ import annotations

import re
import time
from collections import Counter
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa
from harness import (
    DONE_LINE,
    DROPPED_LINE,
    ROOT,
    SKIPPED_LINE,
    US,
    BeatProcess,
    Db,
    Execution,
    Rig,
    Sender,
    executions,
    group_env,
    imported_from,
    interval_slots,
    kill_group,
    lease_row,
    log_ids,
    overlaps,
    read_records,
    run_rows,
    wait_for,
    wait_ready,
)

from celery_singlebeat.singleton.runtime import PRUNE_TURN_US
from celery_singlebeat.timeline.slots import slot_header, slot_task_id

HOLD = "singletonapp.hold"
PROBE = "beatapp.probe"
#: Redis database of these tests (queues are fresh per test anyway)
REDIS_DB = 5


@pytest.fixture
def sender(redis_url: str) -> Iterator[Sender]:
    sender = Sender(f"{redis_url}/{REDIS_DB}")
    try:
        yield sender
    finally:
        sender.close()


def _env(
    sender: Sender, db_url: str, prefix: str, record: Path, queue: str, **extra: str
) -> dict[str, str]:
    return group_env(
        broker=sender.broker_url,
        db_url=db_url,
        prefix=prefix,
        queue=queue,
        SB_RECORD=str(record),
        **extra,
    )


def _start_workers(
    rig: Rig, envs: dict[str, dict[str, str]], **options: object
) -> list[BeatProcess]:
    """Start one worker per (name, env) and wait until every one consumes."""
    workers = [rig.start_worker(env, name, **options) for name, env in envs.items()]
    wait_ready(*workers)
    return workers


def _logs(workers: list[BeatProcess]) -> str:
    return "\n".join(f"===== {w.name}\n{w.log()[-5000:]}" for w in workers)


def _dead(workers: list[BeatProcess]) -> list[str]:
    return [w.name for w in workers if not w.alive()]


def _done(workers: list[BeatProcess], task_id: str, times: int = 1) -> bool:
    return log_ids(workers, DONE_LINE).count(task_id) >= times


def _wait_done(
    workers: list[BeatProcess], task_id: str, timeout: float = 20, times: int = 1
) -> None:
    wait_for(
        lambda: _done(workers, task_id, times) or _dead(workers),
        timeout,
        f"task {task_id} to finish",
    )
    assert not _dead(workers), _logs(workers)


def _executions(record: Path, task: str = HOLD) -> list[Execution]:
    return executions(read_records(record), task=task)


def _send_slot(
    sender: Sender, queue: str, entry: str, slot_us: int, name: str, *args: object
) -> str:
    """Publish a task as a scheduler would for this slot: its header and task id."""
    return sender.send(
        queue,
        name,
        *args,
        task_id=slot_task_id(entry, slot_us),
        headers={"singlebeat_slot": slot_header(entry, slot_us)},
    )


# -- 1. one execution at a time, every database ------------------------------------


@pytest.mark.slow
@pytest.mark.redis
def test_concurrent_sends_never_overlap(
    rig: Rig, sender: Sender, db_url: str, table_prefix: str, tmp_path: Path
) -> None:
    """Two prefork workers (2 processes each) take 20 sends of one key in waves of
    5: executions never overlap, tokens grow, and every send either ran or was
    skipped (no send lost, none both)."""
    record = tmp_path / "record.jsonl"
    queue = sender.queue()
    rig.db(db_url, table_prefix)  # drops the tables at teardown
    env = _env(sender, db_url, table_prefix, record, queue, SB_TTL="3")
    workers = _start_workers(rig, {"w1": env, "w2": env}, concurrency=2)

    # The workers run this checkout's package, not another one's.
    _wait_done(workers, sender.send(queue, "singletonapp.where"))
    files = imported_from(read_records(record))
    assert files and all(Path(f).is_relative_to(ROOT) for f in files), (files, ROOT)

    waves, per_wave = 4, 5
    sent: list[str] = []
    for wave in range(waves):
        # Each wave starts on a free key (the previous one is done, lease released),
        # so at least one of its sends must run, and the rest race it.
        ids = [sender.send(queue, HOLD, 0.3, f"w{wave}-{i}") for i in range(per_wave)]
        sent += ids
        wait_for(
            lambda ids=ids: all(_done(workers, i) for i in ids) or _dead(workers),
            30,
            f"wave {wave} to finish",
        )
        assert not _dead(workers), _logs(workers)

    executions = _executions(record)
    executed = [e.task_id for e in executions]
    skipped = log_ids(workers, SKIPPED_LINE)
    detail = f"executions {executions}\n{_logs(workers)}"
    assert not overlaps(executions), "\n".join(overlaps(executions)) + "\n" + detail
    assert all(e.end is not None and e.lost is False for e in executions), detail
    assert len(executed) == len(set(executed)), detail
    assert not set(executed) & set(skipped), detail
    assert sorted(executed + skipped) == sorted(sent), detail
    assert len(executed) >= waves, detail  # one per wave at least: the key was released
    pids = {e.pid for e in executions}
    print(
        f"{db_url.split(':')[0]}: {len(executed)} executed ({len(pids)} processes), "
        f"{len(skipped)} skipped"
    )


# -- 2. a SIGKILLed holder ------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.postgres
@pytest.mark.redis
def test_sigkilled_holder_blocks_the_key_until_its_ttl(
    rig: Rig, sender: Sender, pg_url: str, table_prefix: str, tmp_path: Path
) -> None:
    ttl = 3.0
    record = tmp_path / "record.jsonl"
    qa, qb = sender.queue(), sender.queue()
    db = rig.db(pg_url, table_prefix)
    a, b = _start_workers(
        rig,
        {
            "wa": _env(sender, pg_url, table_prefix, record, qa, SB_TTL=str(ttl)),
            "wb": _env(sender, pg_url, table_prefix, record, qb, SB_TTL=str(ttl)),
        },
        concurrency=1,
    )
    # The victim runs a scheduler slot, so its run row is left running too.
    slot = ("nightly", db.now_us() // US * US)
    slot_id = _send_slot(sender, qa, *slot, HOLD, 60, "victim")
    first = wait_for(lambda: _executions(record), 20, "the long run to start")[0]
    # Killed mid-run: the heartbeat has renewed the lease at least once.
    wait_for(lambda: time.time() > first.start + ttl / 2, ttl, "half a TTL")
    kill_group(a)
    killed_at = time.time()
    lock = lease_row(db, HOLD)
    # A renewal in flight at the kill can only move the end later: a lower bound.
    assert lock is not None and lock.token == first.token, lock
    expires = lock.expires_us / US
    # A copy of the slot (a broker redelivery) while the dead run's row is live: dropped.
    _send_slot(sender, qb, *slot, HOLD, 0.1, "copy")
    _wait_done([b], slot_id)
    assert [(m["id"], m["status"]) for m in DROPPED_LINE.finditer(b.log())] == [
        (slot_id, "running")
    ], _logs([b])

    attempts: list[tuple[float, float, str]] = []  # (sent, done, task id)
    second = None
    deadline = expires + 10
    while second is None:
        assert time.time() < deadline, f"nothing ran after the TTL: {attempts}\n{_logs([b])}"
        sent_at = time.time()
        task_id = sender.send(qb, HOLD, 0.1, f"try-{len(attempts)}")
        _wait_done([b], task_id)
        attempts.append((sent_at, time.time(), task_id))
        second = next((e for e in _executions(record) if e.task_id == task_id), None)
        if second is None:
            time.sleep(0.2)  # pacing between attempts, not a wait for an outcome

    skipped = set(log_ids([b], SKIPPED_LINE))
    detail = f"killed at {killed_at}, lease until {expires}\n{attempts}\n{_logs([a, b])}"
    before = [t for t in attempts if t[2] != second.task_id]
    assert all(t[2] in skipped for t in before), detail
    # The key stayed blocked for a while after the kill (not freed by the death).
    assert len(before) >= 3 and before[-1][0] > killed_at + ttl / 3, detail
    assert first.end is None, "the victim finished?"
    assert second.start >= first.start + ttl, detail
    assert second.start >= expires, detail
    # ...and no longer than the lease's end plus one attempt's round; the lease
    # itself ended within a TTL of the kill (the last renewal came before it).
    assert expires < killed_at + ttl + 0.1, detail
    assert second.start < expires + 2.0, detail
    assert second.token is not None and first.token is not None
    assert second.token > first.token
    assert second.end is not None and second.lost is False, detail

    # Once the dead run's row has expired, a copy of its slot starts it again
    # (the second attempt of the slot; the first never finished).
    _send_slot(sender, qb, *slot, HOLD, 0.1, "retake")
    _wait_done([b], slot_id, times=2)
    retake = [e for e in _executions(record) if e.slot == slot and e.pid != first.pid]
    row = run_rows(db).get(slot)
    assert len(retake) == 1 and retake[0].tag == "retake", f"{retake}\n{_logs([b])}"
    assert row is not None and row.state == 1 and row.outcome == "success", row
    assert row.attempts == 2 and row.repeats == 1, row
    print(
        f"killed {killed_at - first.start:.2f}s into the run; next run "
        f"{second.start - expires:+.2f}s after the lease's end, "
        f"{len(before)} attempts skipped before"
    )


# -- 3. a run longer than its TTL --------------------------------------------------


@pytest.mark.slow
@pytest.mark.postgres
@pytest.mark.redis
def test_run_three_times_its_ttl_keeps_the_lease(
    rig: Rig, sender: Sender, pg_url: str, table_prefix: str, tmp_path: Path
) -> None:
    ttl, length = 1.5, 5.0
    record = tmp_path / "record.jsonl"
    qa, qb = sender.queue(), sender.queue()
    db = rig.db(pg_url, table_prefix)
    a, b = _start_workers(
        rig,
        {
            "wa": _env(sender, pg_url, table_prefix, record, qa, SB_TTL=str(ttl)),
            "wb": _env(sender, pg_url, table_prefix, record, qb, SB_TTL=str(ttl)),
        },
        concurrency=1,
    )
    long_id = sender.send(qa, HOLD, length, "long")
    first = wait_for(lambda: _executions(record), 20, "the long run to start")[0]

    attempts: list[tuple[float, float, str]] = []
    renewed, now_us = None, 0
    while not _done([a], long_id):
        assert time.time() < first.start + length + 20, _logs([a, b])
        if renewed is None and time.time() > first.start + 2 * ttl:
            # the database shows the original token, its end pushed past start + TTL
            renewed = lease_row(db, HOLD)
            now_us = db.now_us()
        sent_at = time.time()
        task_id = sender.send(qb, HOLD, 0.1, f"try-{len(attempts)}")
        _wait_done([b], task_id)
        attempts.append((sent_at, time.time(), task_id))
        time.sleep(0.2)  # pacing between attempts

    executions = _executions(record)
    long_run = next(e for e in executions if e.task_id == long_id)
    skipped = set(log_ids([b], SKIPPED_LINE))
    detail = f"{executions}\n{attempts}\n{_logs([a, b])}"
    assert long_run.end is not None and long_run.end - long_run.start >= 3 * ttl, detail
    assert long_run.lost is False, detail
    assert "lost its singleton key" not in a.log(), detail
    assert renewed is not None and renewed.token == long_run.token, renewed
    assert renewed.expires_us > now_us > (long_run.start + ttl) * US, (renewed, now_us)
    # Every attempt done while the long run ran was skipped, and there were
    # attempts long after its first TTL had passed.
    during = [t for t in attempts if t[1] < long_run.end]
    assert all(t[2] in skipped for t in during), detail
    late = [t for t in during if t[0] > long_run.start + 2 * ttl]
    assert len(late) >= 2, detail
    assert not overlaps(executions), "\n".join(overlaps(executions)) + "\n" + detail
    row = lease_row(db, HOLD)
    assert row is not None and row.token >= long_run.token  # later attempts may run
    print(f"{len(during)} attempts skipped during a {length}s run with ttl {ttl}s")


# -- 4. the same slot delivered twice -------------------------------------------------


@pytest.mark.slow
@pytest.mark.postgres
@pytest.mark.redis
def test_repeated_slot_runs_once_on_one_worker(
    rig: Rig, sender: Sender, pg_url: str, table_prefix: str, tmp_path: Path
) -> None:
    record = tmp_path / "record.jsonl"
    queue = sender.queue()
    db = rig.db(pg_url, table_prefix)
    (worker,) = _start_workers(
        rig, {"w": _env(sender, pg_url, table_prefix, record, queue)}, concurrency=2
    )
    entry, slot_us = "probe-7", db.now_us() // US * US
    task_id = _send_slot(sender, queue, entry, slot_us, PROBE, 7)
    assert _send_slot(sender, queue, entry, slot_us, PROBE, 7) == task_id
    wait_for(lambda: _done([worker], task_id, 2), 20, "both deliveries")
    wait_for(lambda: _executions(record, PROBE), 5, "the execution's record")
    # a third delivery, well after the first finished
    _send_slot(sender, queue, entry, slot_us, PROBE, 7)
    wait_for(lambda: _done([worker], task_id, 3), 20, "the third delivery")

    executions = _executions(record, PROBE)
    dropped = log_ids([worker], DROPPED_LINE)
    row = run_rows(db).get((entry, slot_us))
    detail = f"{executions}\n{row}\n{worker.log()[-5000:]}"
    assert len(executions) == 1 and executions[0].slot == (entry, slot_us), detail
    assert dropped == [task_id, task_id], detail
    assert row is not None and row.state == 1 and row.outcome == "success", detail
    assert row.attempts == 1 and row.repeats == 2 and row.task_id == task_id, detail


@pytest.mark.slow
@pytest.mark.postgres
@pytest.mark.redis
def test_repeated_slot_runs_once_across_racing_workers(
    rig: Rig, sender: Sender, pg_url: str, table_prefix: str, tmp_path: Path
) -> None:
    record = tmp_path / "record.jsonl"
    qa, qb = sender.queue(), sender.queue()
    db = rig.db(pg_url, table_prefix)
    base = db.now_us() // US * US
    # Both copies wait in the broker (one per worker's queue) before either
    # worker starts, so the two race for the slot.
    entry, slot_us = "probe-3", base
    task_id = _send_slot(sender, qa, entry, slot_us, PROBE, 3)
    _send_slot(sender, qb, entry, slot_us, PROBE, 3)
    workers = _start_workers(
        rig,
        {
            "wa": _env(sender, pg_url, table_prefix, record, qa, SB_TTL="3"),
            "wb": _env(sender, pg_url, table_prefix, record, qb, SB_TTL="3"),
        },
        concurrency=1,
    )
    a, b = workers
    wait_for(lambda: _done([a], task_id) and _done([b], task_id), 20, "both deliveries")
    executions = _executions(record, PROBE)
    row = run_rows(db).get((entry, slot_us))
    detail = f"{executions}\n{row}\n{_logs(workers)}"
    assert len(executions) == 1, detail
    assert log_ids(workers, DROPPED_LINE) == [task_id], detail
    assert row is not None and row.state == 1 and row.attempts == 1 and row.repeats == 1, detail

    # A copy delivered to the other worker while the slot is still running is
    # dropped too (the run row is live), not skipped by the busy key.
    entry, slot_us = "hold-slot", base + US
    held_id = _send_slot(sender, qa, entry, slot_us, HOLD, 1.5, "slot")
    wait_for(lambda: [e for e in _executions(record) if e.task_id == held_id], 20, "the run")
    _send_slot(sender, qb, entry, slot_us, HOLD, 1.5, "slot")
    _wait_done([b], held_id)
    running = not _done([a], held_id)
    _wait_done([a], held_id)
    executions = _executions(record)
    row = run_rows(db).get((entry, slot_us))
    detail = f"{executions}\n{row}\n{_logs(workers)}"
    assert running, "the first run ended before the repeat was handled: " + detail
    assert len(executions) == 1 and executions[0].slot == (entry, slot_us), detail
    assert any(
        m["id"] == held_id and m["status"] == "running" for m in DROPPED_LINE.finditer(b.log())
    ), detail
    assert not log_ids(workers, SKIPPED_LINE), detail
    assert row is not None and row.outcome == "success" and row.repeats == 1, detail


# -- 5. three beat replicas and a worker ----------------------------------------------


@pytest.mark.slow
@pytest.mark.postgres
@pytest.mark.redis
def test_beat_replicas_and_worker_execute_each_slot_once(
    rig: Rig, sender: Sender, pg_url: str, table_prefix: str, tmp_path: Path
) -> None:
    duration = 30.0
    record = tmp_path / "record.jsonl"
    queue = sender.queue()
    db = rig.db(pg_url, table_prefix)
    env = _env(
        sender,
        pg_url,
        table_prefix,
        record,
        queue,
        SB_ENTRIES="3",
        SB_EVERY="1",
        SB_LEASE="3",
        SB_TTL="3",
    )
    # One process: the three entries share the key of beatapp.probe (its task
    # name) and are due at the same instants, so concurrent processes would
    # skip each other's slot by design.
    (worker,) = _start_workers(rig, {"worker": env}, concurrency=1)
    beats = [rig.start_beat(env, f"beat-{i}") for i in range(3)]
    wait_for(
        lambda: all("connected to" in b.log() for b in beats), 45, "the replicas", interval=0.2
    )
    anchors = db.anchors()
    assert len(anchors) == 3, anchors
    start_us = db.now_us()

    def running(until_us: int) -> bool:
        dead = [p.name for p in [*beats, worker] if not p.alive()]
        assert not dead, f"died: {dead}\n{rig.group.outputs()}"
        return db.now_us() >= until_us

    wait_for(lambda: running(start_us + int(duration / 3 * US)), duration, "a third", 0.2)
    # A duplicate by hand: an already executed slot published again.
    injected = _executions(record, PROBE)[0]
    assert injected.slot is not None
    entry, slot_us = injected.slot
    dup_id = _send_slot(sender, queue, entry, slot_us, PROBE, int(entry.split("-")[1]))
    assert dup_id == injected.task_id
    wait_for(lambda: running(start_us + int(duration * US)), duration, "the run", 0.2)
    # What must have run is counted from the anchors, not from the rows the
    # replicas wrote: a slot no replica ever claimed is missing here too.
    upto = db.now_us()
    expected = {
        (name, at) for name, anchor in anchors.items() for at in interval_slots(anchor, US, upto)
    }

    def executed() -> set[tuple[str, int] | None]:
        return {e.slot for e in _executions(record, PROBE)}

    try:
        wait_for(lambda: expected <= executed(), 30, "every slot up to now to execute", 0.2)
    except AssertionError as exc:
        missing = sorted(expected - executed())
        raise AssertionError(f"{exc}: never executed {missing}\n{rig.group.outputs()}") from None
    for beat in beats:
        beat.stop()
    # Slots after ``upto`` sent before the stop must execute too, and the duplicate.
    sent = {slot for slot, row in db.rows().items() if row.state == 1}
    try:
        wait_for(
            lambda: sent <= executed() and _done([worker], dup_id, 2),
            30,
            "the worker to execute every sent slot",
            0.2,
        )
    except AssertionError as exc:
        missing = sorted(sent - executed())
        raise AssertionError(f"{exc}: never executed {missing}\n{rig.group.outputs()}") from None

    executions = _executions(record, PROBE)
    copies = Counter(e.slot for e in executions)
    runs = run_rows(db)
    dropped = [m for m in DROPPED_LINE.finditer(worker.log())]
    detail = f"{rig.group.outputs()}"
    assert {s: n for s, n in copies.items() if n != 1} == {}, detail
    # up to ``upto`` exactly the anchors' slots ran; later ones are on the grid too
    assert {s for s in copies if s is not None and s[1] <= upto} == expected, detail
    off_grid = [s for s in copies if s is not None and (s[1] - anchors[s[0]]) % US]
    assert not off_grid, f"executed off the anchor grid: {off_grid}"
    assert set(copies) <= set(db.rows()), "executed a slot no replica claimed"
    assert all(e.end is not None and e.lost is False for e in executions), detail
    for slot in copies:
        assert slot is not None, "a beat-sent probe ran without its slot"
        row = runs[slot]
        assert row.state == 1 and row.outcome == "success" and row.attempts == 1, row
    assert runs[(entry, slot_us)].repeats >= 1, runs[(entry, slot_us)]
    assert dup_id in [m["id"] for m in dropped], detail
    assert sum(r.repeats for r in runs.values()) == len(dropped), detail
    # Only the worker's processes executed; the replicas never loaded the worker app.
    beat_pids = {b.pid for b in beats}
    assert not {e.pid for e in executions} & beat_pids
    assert not any("singletonapp" in b.log() for b in beats), detail
    senders = Counter(name for b in beats for name in [b.name] * len(b.sent_task_ids()))
    print(
        f"{len(sent)} slots sent by {dict(senders)}, each executed once; "
        f"{len(dropped)} repeated deliveries dropped"
    )


# -- 6. the run retention ----------------------------------------------------------

#: singlebeat_run_retention of this test: the setting's minimum
RETENTION_US = 3600 * US
#: a prune line of the worker's log
PRUNED_LINE = re.compile(
    r"INFO/\S+\] singlebeat: pruned (?P<n>\d+) SingletonTask run and key rows older than "
    r"(?P<retention>\S+)"
)


def _age(db: Db, by_us: int, *, runs: list[tuple[str, int]], locks: list[str]) -> None:
    """Move every instant of these run and lock rows ``by_us`` into the past, as if
    everything they record had happened that much earlier on the database's clock
    (what a test cannot wait hours for). A released lock (``expires_us`` 0) stays
    released."""
    r, lk = db.tables.runs, db.tables.locks
    with db.engine.begin() as conn:
        for entry, slot_us in runs:
            done = conn.execute(
                r.update()
                .where((r.c.entry == entry) & (r.c.slot_us == slot_us))
                .values(
                    started_us=r.c.started_us - by_us,
                    expires_us=r.c.expires_us - by_us,
                    finished_us=r.c.finished_us - by_us,
                    last_repeat_us=r.c.last_repeat_us - by_us,
                )
            )
            assert done.rowcount == 1, (entry, slot_us)
        for name in locks:
            done = conn.execute(
                lk.update()
                .where(lk.c.name == name)
                .values(
                    token=lk.c.token - by_us,
                    acquired_us=lk.c.acquired_us - by_us,
                    expires_us=sa.case((lk.c.expires_us > 0, lk.c.expires_us - by_us), else_=0),
                )
            )
            assert done.rowcount == 1, name


def _prune_turn(db: Db) -> int:
    """When the fleet's next turn to prune SingletonTask rows comes (database clock)."""
    meta = db.tables.meta
    with db.engine.connect() as conn:
        query = sa.select(meta.c.value_us).where(meta.c.key == "prune_singletons")
        return int(conn.execute(query).scalar_one())


@pytest.mark.slow
@pytest.mark.postgres
@pytest.mark.redis
def test_a_worker_prunes_rows_past_the_run_retention_and_a_late_repeat_then_runs(
    rig: Rig, sender: Sender, pg_url: str, table_prefix: str, tmp_path: Path
) -> None:
    """A first worker executes four slots and two plain sends, and is SIGKILLed
    in the middle of a fifth slot (its run row left running, its key held).
    The rows are then aged on the database's clock, the retention being an hour:
    one slot, one idle key and the killed run with its key by two hours, the
    others by half an hour; the fleet's pruning turn (which the first worker
    took, an hour ahead) by two hours too. A new worker process offers a prune
    at its first execution: exactly the four rows past the retention go, it
    logs that, and the next turn is an hour away. A repeat of a slot whose row
    was kept is dropped; one of a pruned slot runs again."""
    record = tmp_path / "record.jsonl"
    queue = sender.queue()
    db = rig.db(pg_url, table_prefix)
    env = _env(
        sender,
        pg_url,
        table_prefix,
        record,
        queue,
        SB_TTL="3",
        SB_RUN_RETENTION=str(RETENTION_US // US),
    )
    (first,) = _start_workers(rig, {"first": env}, concurrency=1)
    base = db.now_us() // US * US
    old, recent, fresh = ("probe-1", base), ("probe-2", base), ("probe-3", base)
    for slot in (old, recent):
        _wait_done([first], _send_slot(sender, queue, *slot, PROBE, 1))
    for key in ("idle-old", "idle-recent"):
        _wait_done([first], sender.send(queue, HOLD, 0.05, key, kwargs={"key": key}))
    dead = ("killed", base)
    sender.send(
        queue,
        HOLD,
        60,
        "killed",
        kwargs={"key": "dead-holder"},
        task_id=slot_task_id(*dead),
        headers={"singlebeat_slot": slot_header(*dead)},
    )
    wait_for(lambda: [e for e in _executions(record) if e.slot == dead], 20, "the long run")
    kill_group(first)
    assert not PRUNED_LINE.search(first.log()), "nothing was old: nothing to prune"
    rows = run_rows(db)
    assert set(rows) == {old, recent, dead} and rows[dead].state == 0, rows
    # the first execution of that worker process took the fleet's turn, for an hour
    assert _prune_turn(db) > db.now_us() + RETENTION_US - 60 * US

    two_hours, half_hour = 2 * RETENTION_US, RETENTION_US // 2
    _age(db, two_hours, runs=[old, dead], locks=["idle-old", "dead-holder"])
    _age(db, half_hour, runs=[recent], locks=["idle-recent"])
    meta = db.tables.meta
    with db.engine.begin() as conn:
        conn.execute(
            meta.update()
            .where(meta.c.key == "prune_singletons")
            .values(value_us=meta.c.value_us - two_hours)
        )

    (second,) = _start_workers(rig, {"second": env}, concurrency=1)
    _wait_done([second], _send_slot(sender, queue, *fresh, PROBE, 3))
    pruned = wait_for(
        lambda: PRUNED_LINE.findall(second.log()) or _dead([second]),
        20,
        "the new worker's prune",
    )
    assert not _dead([second]), _logs([second])
    retention = str(timedelta(microseconds=RETENTION_US))
    # the slot and the killed run (2 run rows), the idle key and the dead holder's (2)
    assert pruned == [("4", retention)], _logs([second])
    rows = run_rows(db)
    assert set(rows) == {recent, fresh}, rows
    for key, kept in (("idle-old", False), ("dead-holder", False), ("idle-recent", True)):
        assert (lease_row(db, key) is not None) is kept, key
    assert lease_row(db, PROBE) is not None
    now_us = db.now_us()
    assert now_us + PRUNE_TURN_US - 60 * US < _prune_turn(db) <= now_us + PRUNE_TURN_US

    # A repeat of the slot kept (finished half an hour "ago") is dropped; the
    # pruned slot, delivered again, is new to the workers and runs again.
    recent_id = _send_slot(sender, queue, *recent, PROBE, 2)
    old_id = _send_slot(sender, queue, *old, PROBE, 1)
    _wait_done([second], recent_id)
    _wait_done([second], old_id)
    dropped = [(m["id"], m["status"]) for m in DROPPED_LINE.finditer(second.log())]
    assert dropped == [(recent_id, "finished")], _logs([second])
    runs_of = Counter(e.slot for e in _executions(record, PROBE))
    assert runs_of == {old: 2, recent: 1, fresh: 1}, runs_of
    rows = run_rows(db)
    assert rows[old].state == 1 and rows[old].attempts == 1 and rows[old].repeats == 0, rows
    assert rows[recent].repeats == 1, rows
    assert len(PRUNED_LINE.findall(second.log())) == 1, _logs([second])
