"""Every log line that reports a decision about a slot carries its fields as
record attributes (docs/operations.md, "Log records"): the real scheduler loop
and SingletonTask on the in-memory store, read back with caplog.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import test_scheduler
import test_singleton
from celery import Celery
from test_publishing import PipelinedProducer
from test_scheduler import (
    NO_SWEEP,
    SECOND,
    FlakyBroker,
    Harness,
    UnreachableBroker,
    _iso,
    _published_then_unconfirmed,
    every,
    monotonic_shift,
    tick_stalled_past_lease,
)
from test_singleton import SLOT_US, eager_exceptions, make_hold, slot_apply, wait_until

from celery_singlebeat.engine import sending as sending_module
from celery_singlebeat.engine.sharing import FALLBACK_DELAY_US
from celery_singlebeat.observe import decisions
from celery_singlebeat.observe.decisions import FIELDS
from celery_singlebeat.singleton.runtime import runtime_for
from celery_singlebeat.store.base import Lease, SlotKey
from celery_singlebeat.testing import MemoryStore
from celery_singlebeat.timeline.clock import US
from celery_singlebeat.timeline.slots import slot_task_id

# the neighbouring suites' fixtures, found here by pytest under these names
harness_for = test_scheduler.harness_for
app = test_singleton.app
store = test_singleton.store

DOCS = Path(__file__).resolve().parents[2] / "docs" / "operations.md"


def fields(record: logging.LogRecord) -> dict[str, Any]:
    """The decision fields a record carries (and nothing else)."""
    return {name: record.__dict__[name] for name in FIELDS if name in record.__dict__}


def decided(caplog: pytest.LogCaptureFixture, decision: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if getattr(r, "decision", None) == decision]


def slot(
    decision: str, replica: str, entry: str, slot_us: int, fence: int | None = None
) -> dict[str, Any]:
    """What a record about one slot must carry."""
    expected = {
        "decision": decision,
        "replica": replica,
        "entry": entry,
        "slot": _iso(slot_us),
        "slot_us": slot_us,
        "task_id": slot_task_id(entry, slot_us),
    }
    if fence is not None:
        expected["fence"] = fence
    return expected


def batch(decision: str, replica: str, count: int, entry: str, slot_us: int) -> dict[str, Any]:
    """What a record about ``count`` slots must carry: no per-slot field."""
    return {
        "decision": decision,
        "replica": replica,
        "count": count,
        "entry": entry,
        "slot": _iso(slot_us),
        "slot_us": slot_us,
    }


def test_no_field_is_an_attribute_a_log_record_has_of_its_own() -> None:
    own = set(logging.makeLogRecord({}).__dict__) | {"message", "asctime"}
    assert set(FIELDS) & own == set()
    words = [v for k, v in vars(decisions).items() if k.isupper() and isinstance(v, str)]
    assert len(words) == len(set(words)) and all(re.fullmatch(r"[a-z_]+", w) for w in words)


# -- the scheduler ------------------------------------------------------------


def test_a_won_slot_and_a_lost_one_at_debug(
    harness_for: Callable[..., Harness], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="celery_singlebeat")
    harness = harness_for({"job": every(1)})
    t0 = harness.t0_us
    a, b = harness.replica(), harness.replica()
    a.tick()
    b.tick()
    harness.clock.advance(SECOND)
    a.tick()
    b.tick()  # the same slot: a won it ...
    # ... and b lost it, at the slot if it is the entry's first replica, after
    # the fallback delay otherwise (b sees a live: their random ids decide)
    harness.clock.advance(timedelta(microseconds=FALLBACK_DELAY_US))
    b.tick()
    [won] = decided(caplog, decisions.WON)
    assert (won.name, won.levelno) == ("celery_singlebeat.scheduler", logging.INFO)
    assert fields(won) == slot("won", a.settings.replica_id, "job", t0 + US, fence=1)
    assert f"job@{_iso(t0 + US)}" in won.getMessage()
    [lost] = decided(caplog, decisions.LOST)
    assert lost.levelno == logging.DEBUG
    # the fence of another replica's claim is not known to the loser
    assert fields(lost) == slot("lost", b.settings.replica_id, "job", t0 + US)


def test_with_info_off_the_per_slot_line_costs_nothing(
    harness_for: Callable[..., Harness],
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    formatted: list[int] = []
    real = sending_module.slot_text
    monkeypatch.setattr(sending_module, "slot_text", lambda us: formatted.append(us) or real(us))
    harness = harness_for({f"job-{i}": every(1) for i in range(3)})
    replica = harness.replica()
    caplog.set_level(logging.WARNING, logger="celery_singlebeat")
    replica.tick()
    harness.clock.advance(SECOND)
    replica.tick()
    assert len(harness.drain()) == 3 and formatted == []
    caplog.set_level(logging.INFO, logger="celery_singlebeat")
    harness.clock.advance(SECOND)
    replica.tick()
    assert len(harness.drain()) == 3 and len(formatted) == 3
    assert len(decided(caplog, decisions.WON)) == 3


def test_a_takeover_carries_fence_2_on_the_claim_and_on_the_send(
    harness_for: Callable[..., Harness], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="celery_singlebeat")
    harness = harness_for({"job": every(60)})
    db = harness.store
    db.prepare(create=True)
    db.register(["job"])
    t0 = harness.t0_us
    db.claim("dead-replica", [SlotKey("job", t0)], US)  # died holding it
    harness.clock.advance(2 * SECOND)
    taker = harness.replica()
    taker.tick()
    [message] = harness.drain()
    assert (message.entry, message.at_us) == ("job", t0)
    me = taker.settings.replica_id
    [claim] = decided(caplog, decisions.TAKING_OVER)
    assert claim.levelno == logging.WARNING
    assert fields(claim) == slot("taking_over", me, "job", t0, fence=2)
    [sent] = decided(caplog, decisions.TOOK_OVER)
    assert fields(sent) == slot("took_over", me, "job", t0, fence=2)
    assert "took over slot job@" in sent.getMessage() and not decided(caplog, decisions.WON)


def test_a_failed_publish_then_its_slot_taken_back(
    harness_for: Callable[..., Harness],
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    caplog.set_level(logging.INFO, logger="celery_singlebeat")
    harness = harness_for({"job": every(1)})
    t0 = harness.t0_us
    FlakyBroker.down = True
    replica = harness.replica(Producer=FlakyBroker)
    me = replica.settings.replica_id
    replica.tick()
    harness.clock.advance(SECOND)
    replica.tick()  # claimed, the publish fails, the claim is released
    FlakyBroker.down = False
    [failed] = decided(caplog, decisions.PUBLISH_FAILED)
    assert failed.levelno == logging.ERROR and failed.exc_info is not None
    assert fields(failed) == slot("publish_failed", me, "job", t0 + US, fence=1)
    assert not decided(caplog, decisions.UNTRIED)  # nothing else was in the batch

    shift = monotonic_shift(harness)
    shift[0] += replica.settings.lease.total_seconds()  # its next sweep is due
    replica.tick()
    assert [m.at_us for m in harness.drain()] == [t0 + US]
    [back] = decided(caplog, decisions.TAKING_BACK)
    assert back.levelno == logging.INFO
    assert fields(back) == slot("taking_back", me, "job", t0 + US, fence=2)
    [won] = decided(caplog, decisions.WON)
    assert fields(won) == slot("won", me, "job", t0 + US, fence=2)


def test_the_rest_of_a_batch_released_untried_is_one_record(
    harness_for: Callable[..., Harness], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="celery_singlebeat")
    harness = harness_for({f"job-{i}": every(1) for i in range(4)})
    t0 = harness.t0_us
    UnreachableBroker.attempts = 0
    replica = harness.replica(Producer=UnreachableBroker)
    me = replica.settings.replica_id
    replica.tick()
    harness.clock.advance(SECOND)
    replica.tick()
    [failed] = decided(caplog, decisions.PUBLISH_FAILED)
    assert fields(failed) == slot("publish_failed", me, "job-0", t0 + US, fence=1)
    [untried] = decided(caplog, decisions.UNTRIED)
    assert fields(untried) == batch("untried", me, 3, "job-1", t0 + US)


def test_a_pipelined_group_whose_flush_failed_is_one_record(
    harness_for: Callable[..., Harness],
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    caplog.set_level(logging.INFO, logger="celery_singlebeat")
    monkeypatch.setattr(PipelinedProducer, "fail_flush", True)
    monkeypatch.setattr(PipelinedProducer, "flushes", [])
    harness = harness_for({f"job-{i}": every(1) for i in range(3)})
    t0 = harness.t0_us
    replica = harness.replica(Producer=PipelinedProducer)
    replica.tick()
    harness.clock.advance(SECOND)
    replica.tick()
    assert harness.drain() == []
    [uncertain] = decided(caplog, decisions.UNCERTAIN)
    assert uncertain.levelno == logging.ERROR and uncertain.exc_info is not None
    assert fields(uncertain) == batch("uncertain", replica.settings.replica_id, 3, "job-0", t0 + US)
    assert not decided(caplog, decisions.WON)


def test_slots_whose_lease_ran_out_before_publishing(
    harness_for: Callable[..., Harness],
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    caplog.set_level(logging.INFO, logger="celery_singlebeat")
    harness = harness_for({"a": every(1), "b": every(1)})
    t0 = harness.t0_us
    replica = harness.replica()
    replica.tick()
    harness.clock.advance(SECOND)
    tick_stalled_past_lease(replica, harness)  # a slow receiver
    assert harness.drain() == []
    [expired] = decided(caplog, decisions.EXPIRED)
    assert expired.levelno == logging.WARNING
    assert fields(expired) == batch("expired", replica.settings.replica_id, 2, "a", t0 + US)


def test_a_repeat_taken_over_before_the_confirm(
    harness_for: Callable[..., Harness], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="celery_singlebeat")
    harness = harness_for({"a": every(1), "b": every(1)})
    db, first, pending = _published_then_unconfirmed(harness)
    lease = first.settings.lease
    with db.outage():
        for _ in range(4):
            harness.clock.advance(lease / 4 + SECOND)
            first.tick()
    second = harness.replica()
    second.tick()  # the lease has run out: it takes both over
    first.tick()  # its confirm finds them gone
    repeats = decided(caplog, decisions.TAKEN_BEFORE_CONFIRM)
    assert [r.levelno for r in repeats] == [logging.WARNING] * 2
    me = first.settings.replica_id
    assert [fields(r) for r in repeats] == [
        slot("taken_before_confirm", me, key.entry, key.slot_us, fence=1) for key in pending
    ]
    them = second.settings.replica_id
    assert [fields(r) for r in decided(caplog, decisions.TOOK_OVER)] == [
        slot("took_over", them, key.entry, key.slot_us, fence=2) for key in pending
    ]


def test_a_slot_of_an_entry_the_replica_lacks(
    harness_for: Callable[..., Harness], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="celery_singlebeat")
    harness = harness_for({"job": every(60)})
    db = harness.store
    db.prepare(create=True)
    db.register(["old"])
    t0 = harness.t0_us
    db.claim("dead-replica", [SlotKey("old", t0)], US)
    harness.clock.advance(2 * SECOND)
    newer = harness.replica()
    newer.tick()
    me = newer.settings.replica_id
    [held] = decided(caplog, decisions.UNKNOWN_ENTRY)
    assert fields(held) == batch("unknown_entry", me, 1, "old", t0)
    [claim] = decided(caplog, decisions.TAKING_OVER)
    assert fields(claim) == slot("taking_over", me, "old", t0, fence=2)
    assert not decided(caplog, decisions.TOOK_OVER)  # never sent


def test_missed_slots_skipped_by_the_policy(
    harness_for: Callable[..., Harness], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="celery_singlebeat")
    harness = harness_for({"job": every(1)}, **NO_SWEEP)
    t0 = harness.t0_us
    replica = harness.replica()
    replica.tick()
    harness.clock.advance(SECOND)
    replica.tick()
    harness.clock.advance(20 * SECOND)  # a stall: t0+2..t0+15 are past the 5 s grace
    replica.tick()
    [skipped] = decided(caplog, decisions.SKIPPED)
    assert fields(skipped) == {
        **batch("skipped", replica.settings.replica_id, 14, "job", t0 + 2 * US),
        "last_slot": _iso(t0 + 15 * US),
        "last_slot_us": t0 + 15 * US,
    }
    assert f"14 missed slot(s) {_iso(t0 + 2 * US)}..{_iso(t0 + 15 * US)}" in skipped.getMessage()


def test_slots_refused_as_early_after_a_clock_step(
    harness_for: Callable[..., Harness], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="celery_singlebeat")
    harness = harness_for({"job": every(1)}, **NO_SWEEP)
    local = harness.steppable()
    t0 = harness.t0_us
    replica = harness.replica()
    replica.tick()
    harness.clock.advance(2 * SECOND)
    local.step_us = 3 * US  # t0+2 is due and won; t0+3..t0+5 are early
    replica.tick()
    [early] = decided(caplog, decisions.EARLY)
    assert early.levelno == logging.WARNING
    assert fields(early) == batch("early", replica.settings.replica_id, 3, "job", t0 + 3 * US)


def test_an_unrelated_line_carries_no_decision(
    harness_for: Callable[..., Harness], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="celery_singlebeat")
    harness = harness_for({"job": every(1)})
    harness.replica().tick()
    [start] = [r for r in caplog.records if "coordinating 1 entries" in r.getMessage()]
    assert fields(start) == {} and start.name == "celery_singlebeat.scheduler"


# -- SingletonTask ----------------------------------------------------------------


def test_a_slot_run_started_then_its_repeat_dropped(
    app: Celery,
    store: MemoryStore,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="celery_singlebeat")
    hold = make_hold(app)
    first = slot_apply(hold)
    second = slot_apply(hold)
    assert (first.state, second.state) == ("SUCCESS", "IGNORED")
    owner = runtime_for(app).owner
    [started] = decided(caplog, decisions.RUN_STARTED)
    assert started.name == "celery_singlebeat.singleton" and started.levelno == logging.DEBUG
    token = first.result["token"]
    assert fields(started) == {
        **slot("run_started", owner, "every-minute", SLOT_US, fence=token),
        "key": "proj.hold",
    }
    [dropped] = decided(caplog, decisions.REPEAT_DROPPED)
    assert dropped.levelno == logging.INFO
    assert fields(dropped) == {
        **slot("repeat_dropped", owner, "every-minute", SLOT_US),
        "key": "proj.hold",
    }


@pytest.mark.parametrize(
    "policy",
    [
        "skip",
        pytest.param("retry", marks=eager_exceptions),
        pytest.param("raise", marks=eager_exceptions),
    ],
)
def test_a_busy_key_skipped_retried_or_raised(
    app: Celery,
    store: MemoryStore,
    caplog: pytest.LogCaptureFixture,
    policy: str,
) -> None:
    caplog.set_level(logging.INFO, logger="celery_singlebeat")
    hold = make_hold(app, singleton_busy=policy, max_retries=0)
    store.acquire_lease("proj.hold", "host:1:abc", 60_000_000)
    result = slot_apply(hold)
    assert result.state == ("SUCCESS" if policy == "skip" else "FAILURE")
    decision = {"skip": "busy_skipped", "retry": "busy_retry", "raise": "busy_raised"}[policy]
    [busy] = decided(caplog, decision)
    assert fields(busy) == {
        **slot(decision, runtime_for(app).owner, "every-minute", SLOT_US),
        "key": "proj.hold",
    }


def test_a_lost_lease_outside_a_slot(
    app: Celery,
    store: MemoryStore,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="celery_singlebeat")
    seen: dict[str, Any] = {}

    def stolen(task: Any) -> None:
        seen["token"] = task.singleton.token
        with store.state.lock:
            store.state.leases["proj.hold"].expires_us = 0
        assert isinstance(store.acquire_lease("proj.hold", "thief", 60_000_000), Lease)
        wait_until(lambda: task.singleton.lost, timeout=3)

    hold = make_hold(app, singleton_ttl=1)
    # the execution's id: the result's (Celery 5.2's eager request inside the
    # body has none, while the heartbeat thread logs the id it was started with)
    result = hold.apply(args=(stolen,))
    result.get()
    [lost] = decided(caplog, decisions.LEASE_LOST)
    assert lost.levelno == logging.WARNING
    # not a slot's run: no entry or slot, the token as the fence
    assert fields(lost) == {
        "decision": "lease_lost",
        "replica": runtime_for(app).owner,
        "task_id": result.id,
        "fence": seen["token"],
        "key": "proj.hold",
    }
