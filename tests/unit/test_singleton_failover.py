"""SingletonTask after a failover that lost run rows (singleton/writeback.py).

``MemoryStore.lose_writes`` does what a promoted standby that lagged does: the
rows written after an instant are gone, and the connection breaks once. Two
apps on one store stand for two worker processes (each has its own runtime,
journal and heartbeat watch; the store's interruption counter is shared,
as every process meets the same failover).
"""

from __future__ import annotations

import logging
import time
from typing import Any

import pytest
from celery import Celery
from test_singleton import SLOT_US, make_hold, slot_apply

from celery_singlebeat.exceptions import ConnectionReplaced
from celery_singlebeat.singleton import runtime as runtime_module
from celery_singlebeat.singleton import writeback
from celery_singlebeat.singleton.runtime import runtime_for, set_store
from celery_singlebeat.singleton.writeback import RunJournal, through_reconnect
from celery_singlebeat.store.base import Run, SlotKey
from celery_singlebeat.testing import MemoryStore


def worker_app(store: MemoryStore, **conf: Any) -> Celery:
    app = Celery(f"t{id(object())}", broker="memory://")
    app.conf.singlebeat_url = "sqlite:////nonexistent-dir/never-opened.sqlite"
    app.conf.update(conf)
    set_store(app, store)
    return app


def connected(app: Celery) -> Any:
    """The process has used its store before the failover: it meets the
    broken connection (a process whose first connection is to the promoted
    standby has nothing to notice, docs/guarantees.md)."""
    hold = make_hold(app)
    assert hold.apply().state == "SUCCESS"
    return hold


@pytest.fixture
def store() -> MemoryStore:
    store = MemoryStore()
    store.prepare(create=True)
    return store


@pytest.fixture(autouse=True)
def quick(monkeypatch: pytest.MonkeyPatch) -> None:
    # the same logic on a shorter beat: ping 0.1 s, hold 0.6 s
    monkeypatch.setattr(runtime_module, "PING_S", 0.1)
    monkeypatch.setattr(writeback, "HOLD_S", 0.6)


def test_a_finished_run_the_failover_lost_is_written_back_and_its_repeat_dropped(
    store: MemoryStore, caplog: pytest.LogCaptureFixture
) -> None:
    app = worker_app(store)
    runs: list[int] = []
    hold = make_hold(app)
    before = store.ping()
    assert slot_apply(hold, lambda t: runs.append(1)).state == "SUCCESS"
    assert store.lose_writes(before) == 1
    assert SlotKey("every-minute", SLOT_US) not in store.run_rows()

    with caplog.at_level(logging.ERROR, "celery_singlebeat.singleton"):
        repeat = slot_apply(hold, lambda t: runs.append(2))
    assert repeat.state == "IGNORED" and runs == [1]
    row = store.run_rows()[SlotKey("every-minute", SLOT_US)]
    assert (row["state"], row["outcome"], row["repeats"]) == (1, "success", 1)
    [record] = [r for r in caplog.records if getattr(r, "decision", None) == "lost_writes"]
    assert "lost 1 of the run rows" in record.getMessage()
    assert (record.count, record.entry, record.slot_us) == (1, "every-minute", SLOT_US)


def test_without_the_write_back_the_repeat_runs_again(store: MemoryStore) -> None:
    """What the write-back prevents (and what this test file would miss)."""
    app = worker_app(store, singlebeat_failover_window=0)
    runs: list[int] = []
    hold = make_hold(app)
    before = store.ping()
    assert slot_apply(hold, lambda t: runs.append(1)).state == "SUCCESS"
    store.lose_writes(before)
    assert slot_apply(hold, lambda t: runs.append(2)).state == "SUCCESS"
    assert runs == [1, 2]


def test_a_repeat_in_another_process_waits_for_the_first_ones_write_back(
    store: MemoryStore,
) -> None:
    first, second = worker_app(store), worker_app(store)
    runs: list[str] = []
    second_hold = connected(second)
    before = store.ping()
    assert slot_apply(make_hold(first), lambda t: runs.append("first")).state == "SUCCESS"
    store.lose_writes(before)
    # the second process meets the broken connection first and holds the old
    # slot; the first one's heartbeat ping meets it meanwhile and writes back
    started = time.monotonic()
    repeat = slot_apply(second_hold, lambda t: runs.append("second"))
    waited = time.monotonic() - started
    assert repeat.state == "IGNORED" and runs == ["first"]
    assert waited >= 0.5, waited
    row = store.run_rows()[SlotKey("every-minute", SLOT_US)]
    assert (row["owner"], row["outcome"]) == (runtime_for(first).owner, "success")


def test_a_slot_due_after_the_reconnect_is_not_held(store: MemoryStore) -> None:
    app = worker_app(store)
    hold = make_hold(app)
    before = store.ping()
    assert slot_apply(hold).state == "SUCCESS"
    store.lose_writes(before)
    assert slot_apply(hold).state == "IGNORED"  # met the reconnect, held
    later = store.ping() + 60_000_000
    started = time.monotonic()
    assert slot_apply(hold, slot_us=later).state == "SUCCESS"
    assert time.monotonic() - started < 0.5


def test_a_running_execution_keeps_its_row_through_the_failover(store: MemoryStore) -> None:
    """A run still going when the failover took its row: written back as
    running (expiry renewed), so a repeat finds it running, and it finishes."""
    first, second = worker_app(store), worker_app(store)
    outcomes: list[str] = []

    def body(task: Any) -> None:
        store.lose_writes(before)
        # the repeat meets the broken connection and waits for our write-back,
        # which our heartbeat ping does while this body runs
        outcomes.append(slot_apply(second_hold).state)

    second_hold = connected(second)
    before = store.ping()
    assert slot_apply(make_hold(first), body).state == "SUCCESS"
    assert outcomes == ["IGNORED"]
    row = store.run_rows()[SlotKey("every-minute", SLOT_US)]
    assert (row["state"], row["outcome"], row["repeats"]) == (1, "success", 1)


def test_the_journal_keeps_the_window_before_its_last_write() -> None:
    journal = RunJournal(10.0)
    runs = [Run("e", slot, f"r{slot}") for slot in range(3)]
    journal.started(runs[0], "w", "t0", 100, 5, at=0.0)
    journal.started(runs[1], "w", "t1", 200, 5, at=8.0)
    journal.finished(runs[1], "success", 250, at=9.0)
    journal.started(runs[2], "w", "t2", 300, 5, at=15.0)
    # 15 - 10: the first write is outside the window, r1's finish inside
    records = journal.recent(1_000)
    assert [(r.run.run_id, r.outcome, r.finished_us) for r in records] == [
        ("r1", "success", 250),
        ("r2", None, None),
    ]
    # a running row's expiry counts from now; a finished one's stays
    assert [r.expires_us for r in records] == [205, 1_005]
    assert journal.active(20.0) and not journal.active(25.5)
    journal.forget(runs[2])
    assert [r.run.run_id for r in journal.recent(1_000)] == ["r1"]
    # a finish of a run another start replaced is not this journal's
    journal.finished(Run("e", 1, "other"), "failure", 260, at=16.0)
    assert journal.recent(1_000)[0].outcome == "success"


def test_bookkeeping_goes_again_at_once_after_a_reconnect() -> None:
    """Renewals, ends and guard() are sent again on the new connection: only a
    slot's start waits for the write-back (it is what a lost row could fool)."""
    calls: list[int] = []

    def once_replaced() -> str:
        calls.append(1)
        if len(calls) == 1:
            raise ConnectionReplaced("renew lease: the connection to the database broke")
        return "answer"

    assert through_reconnect(once_replaced) == "answer" and len(calls) == 2

    def always_replaced() -> str:
        raise ConnectionReplaced("flapping")

    with pytest.raises(ConnectionReplaced):  # twice in a row: an outage for the caller
        through_reconnect(always_replaced)
