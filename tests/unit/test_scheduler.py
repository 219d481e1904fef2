"""The real ``SingleBeatScheduler`` loop, on an in-memory store whose clock the test moves.

Schedulers publish through kombu's in-memory broker (``memory://``, shared by
every connection in the process); each test declares its own queue and reads
back the messages that really left the scheduler.
"""

from __future__ import annotations

import json
import logging
import random
import signal
import socket
import time
import tracemalloc
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from celery import Celery
from celery.schedules import crontab
from kombu.exceptions import OperationalError as KombuOperationalError
from kombu.messaging import Producer
from kombu.simple import SimpleQueue

from celery_singlebeat import ConfigurationError, SingleBeatScheduler, signals
from celery_singlebeat.engine import Environment
from celery_singlebeat.engine.sharing import first_replicas
from celery_singlebeat.exceptions import StoreUnavailable
from celery_singlebeat.store.base import Claim, SlotKey
from celery_singlebeat.testing import FakeClock, MemoryScheduler, MemoryStore
from celery_singlebeat.timeline.clock import US, DatabaseClock, datetime_to_us, us_to_datetime
from celery_singlebeat.timeline.slots import SLOT_HEADER, slot_task_id

TASK = "sbtest.probe"
SECOND = timedelta(seconds=1)


@dataclass
class Sent:
    """One message read back from the broker."""

    entry: str
    at_us: int
    task_id: str
    headers: dict[str, Any]
    properties: dict[str, Any]


class SteppableClock(DatabaseClock):
    """A replica's estimate of the database clock, over a local wall clock that
    is the database's plus ``step_us``: set it to step the pod's clock. As on a
    real pod, the estimate is wrong by the step until the next round trip."""

    def __init__(self, source: Callable[[], int]) -> None:
        super().__init__()
        self._source = source
        self.step_us = 0

    def local_us(self) -> int:
        return self._source() + self.step_us


@dataclass
class Harness:
    """A Celery app on the memory broker, a fake clock and the store replicas share."""

    app: Celery
    queue: SimpleQueue
    clock: FakeClock = field(default_factory=FakeClock)
    store: MemoryStore = field(init=False)
    #: how far the replicas' monotonic clock runs ahead of the real one (seconds)
    shift: list[float] = field(default_factory=lambda: [0.0])
    #: the replicas' clocks instead, when a test simulates time (test_clock_steps)
    simulated: Environment | None = None

    def __post_init__(self) -> None:
        self.store = MemoryStore(now_us=self.clock)

    @property
    def env(self) -> Environment:
        """The replicas' clocks: the real monotonic clock plus ``shift``."""
        if self.simulated is not None:
            return self.simulated
        shift = self.shift
        return Environment(
            monotonic=lambda: time.monotonic() + shift[0], time=time.time, random=random.Random()
        )

    @property
    def t0_us(self) -> int:
        return datetime_to_us(self.clock.now())

    def replica(self, **kwargs: Any) -> MemoryScheduler:
        kwargs.setdefault("env", self.env)
        return MemoryScheduler(self.app, store=self.store, **kwargs)

    def steppable(self) -> SteppableClock:
        """A fresh store whose replicas' local clock can step (before any replica)."""
        local = SteppableClock(self.clock)
        self.store = MemoryStore(now_us=self.clock, clock=local)
        return local

    def drain(self) -> list[Sent]:
        """Every message published since the last drain, in order."""
        out: list[Sent] = []
        while True:
            try:
                message = self.queue.get(block=False)  # type: ignore[no-untyped-call]
            except self.queue.Empty:
                return out
            slot = message.headers[SLOT_HEADER]
            out.append(
                Sent(
                    slot["entry"],
                    slot["at_us"],
                    message.headers["id"],
                    message.headers,
                    message.properties,
                )
            )


def make_app(queue: str, schedule: dict[str, Any], **conf: Any) -> Celery:
    app = Celery("sbtest", broker="memory://", set_as_current=False)
    app.conf.update(
        task_default_queue=queue,
        # no celery.backend_cleanup entry: the schedule is exactly the test's
        result_expires=None,
        timezone="UTC",
        beat_max_loop_interval=1,
        beat_schedule=schedule,
        **conf,
    )

    @app.task(name=TASK, shared=False)  # type: ignore[untyped-decorator]
    def probe(*args: Any) -> None:
        """Never run: the tests only read what was published."""

    return app


def every(seconds: float, **options: Any) -> dict[str, Any]:
    entry: dict[str, Any] = {"task": TASK, "schedule": timedelta(seconds=seconds)}
    if options:
        entry["options"] = options
    return entry


@pytest.fixture
def harness_for() -> Iterator[Callable[..., Harness]]:
    """Build a Harness for a schedule and settings; its queue is closed afterwards."""
    opened: list[tuple[Any, SimpleQueue]] = []

    def build(schedule: dict[str, Any], **conf: Any) -> Harness:
        queue_name = f"sb-{uuid.uuid4().hex[:10]}"
        app = make_app(queue_name, schedule, **conf)
        conn = app.connection_for_read()
        # declared before any tick: the memory broker drops unroutable messages
        queue = conn.SimpleQueue(queue_name, no_ack=True)
        opened.append((conn, queue))
        return Harness(app, queue)

    yield build
    for conn, queue in opened:
        queue.close()  # type: ignore[no-untyped-call]
        conn.release()


def monotonic_shift(harness: Harness) -> list[float]:
    """The shift by which the harness's replicas' monotonic clock runs ahead
    of the real one (their sweeps and publish deadlines), for the test to move."""
    return harness.shift


def tick_stalled_past_lease(replica: MemoryScheduler, harness: Harness) -> None:
    """One tick whose ``slot_claimed`` receivers take longer than the lease (a
    slow receiver): the replica must not publish what it claimed."""
    shift = monotonic_shift(harness)

    def stall(**_: Any) -> None:
        shift[0] += replica.settings.lease.total_seconds()

    signals.slot_claimed.connect(stall)
    try:
        replica.tick()
    finally:
        signals.slot_claimed.disconnect(stall)


class BrokenProducer(Producer):  # type: ignore[misc]
    """A producer whose broker refuses every message."""

    def publish(self, *args: Any, **kwargs: Any) -> None:
        raise RuntimeError("broker refused the message")


# -- coordination -------------------------------------------------------------


def test_two_replicas_sharing_a_store_never_send_the_same_slot(
    harness_for: Callable[..., Harness],
) -> None:
    harness = harness_for({"fast": every(1), "slow": every(3), "odd": every(1.5)})
    t0 = harness.t0_us
    # fixed ids: each is the first replica of some entries (rendezvous hashing
    # of the ids; random ids give one replica all three a quarter of the time)
    replicas = [harness.replica(replica_id=f"r{i}") for i in range(2)]
    assert set(first_replicas(["fast", "slow", "odd"], ("r0", "r1")).values()) == {"r0", "r1"}
    order = random.Random(7)
    for _ in range(80):
        # both see the same due slots; the order decides who proposes first
        for replica in order.sample(replicas, 2):
            replica.tick()
        end = harness.t0_us
        harness.clock.advance(SECOND / 4)

    sent = harness.drain()
    counts = Counter((m.entry, m.at_us) for m in sent)
    assert max(counts.values()) == 1
    expected = {
        (name, t0 + k * period)
        for name, period in (("fast", US), ("slow", 3 * US), ("odd", 3 * US // 2))
        for k in range(1, 100)
        if t0 + k * period <= end
    }
    assert set(counts) == expected
    assert [r.stats["sent"] > 0 for r in replicas] == [True, True]
    assert sum(r.stats["sent"] for r in replicas) == len(sent)
    assert sum(r.stats["lost"] for r in replicas) == len(sent)
    assert {row.state for row in harness.store.slot_rows()} == {1}


def test_messages_carry_the_slot_task_id_and_header_and_no_singlebeat_option(
    harness_for: Callable[..., Harness],
) -> None:
    options = {
        "priority": 5,
        "headers": {"x-tenant": "acme"},
        "singlebeat_missed_policy": "all",
        "singlebeat_missed_grace": 2,
        "singlebeat_missed_max": 3,
    }
    harness = harness_for(
        {"report": {"task": TASK, "schedule": 10 * SECOND, "args": (7,), "options": options}}
    )
    t0 = harness.t0_us
    replica = harness.replica()
    replica.tick()
    harness.clock.advance(10 * SECOND)
    replica.tick()

    [message] = harness.drain()
    slot_us = t0 + 10 * US
    assert message.task_id == slot_task_id("report", slot_us)
    assert message.headers[SLOT_HEADER] == {
        "entry": "report",
        "at": us_to_datetime(slot_us).isoformat(),
        "at_us": slot_us,
    }
    assert message.headers["x-tenant"] == "acme"
    assert message.properties["priority"] == 5  # other options do reach apply_async
    # an option passed on to apply_async would land in the message properties
    everything = json.dumps([message.headers, message.properties], default=str)
    assert "singlebeat_missed" not in everything


def test_a_failed_publish_is_released_and_another_replica_sends_it(
    harness_for: Callable[..., Harness], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="celery_singlebeat")
    harness = harness_for({"job": every(1)})
    t0 = harness.t0_us
    broken = harness.replica(Producer=BrokenProducer)
    broken.tick()
    harness.clock.advance(SECOND)
    broken.tick()
    assert harness.drain() == []
    assert broken.stats["claimed"] == 1 and broken.stats["sent"] == 0
    assert any(
        r.levelno == logging.ERROR and "publishing slot job@" in r.getMessage()
        for r in caplog.records
    )
    [row] = harness.store.slot_rows()
    assert (row.state, row.lease_until_us) == (0, 0)  # released: abandoned at once

    healthy = harness.replica()
    healthy.tick()  # its first sweep takes the released claim over
    [message] = harness.drain()
    assert (message.entry, message.at_us) == ("job", t0 + US)
    assert message.task_id == slot_task_id("job", t0 + US)
    assert healthy.stats["taken_over"] == 1
    [row] = harness.store.slot_rows()
    assert (row.state, row.fence, row.owner) == (1, 2, healthy.settings.replica_id)

    broken.tick()
    assert harness.drain() == []


def test_a_slot_of_an_entry_this_replica_lacks_is_handed_back_for_later(
    harness_for: Callable[..., Harness], caplog: pytest.LogCaptureFixture
) -> None:
    # A replica died holding a slot of "old"; the replicas still running (a newer
    # deployment) have no such entry. They must neither send it nor bounce it
    # between sweeps; a replica that has the entry sends it later.
    caplog.set_level(logging.INFO, logger="celery_singlebeat")
    harness = harness_for({"job": every(60)})
    store = harness.store
    store.prepare(create=True)
    store.register(["old"])
    t0 = harness.t0_us
    slot = t0  # due now: a claim refuses slots ahead of the clock
    [dead] = store.claim("dead-replica", [SlotKey("old", slot)], US)
    harness.clock.advance(2 * SECOND)

    newer = harness.replica()
    newer.tick()
    assert harness.drain() == []
    assert newer.stats["taken_over"] == 1
    [row] = store.slot_rows()
    retention_us = newer.settings.retention_us
    assert row.state == 0 and row.lease_until_us == t0 + 2 * US + retention_us
    warnings = [r for r in caplog.records if "not in its beat_schedule" in r.getMessage()]
    assert len(warnings) == 1 and "'old'" in warnings[0].getMessage()

    for _ in range(5):  # later sweeps leave it alone until the retry time
        harness.clock.advance(timedelta(seconds=10))
        newer.tick()
    assert newer.stats["taken_over"] == 1
    assert harness.drain() == []

    harness.clock.set(us_to_datetime(row.lease_until_us + US))
    older_app = make_app(harness.app.conf.task_default_queue, {"old": every(3600)})
    older = MemoryScheduler(older_app, store=store)
    older.tick()
    [message] = harness.drain()
    assert (message.entry, message.at_us, message.task_id) == (
        "old",
        slot,
        slot_task_id("old", slot),
    )
    assert dead.fence == 1 and older.stats["taken_over"] == 1


@pytest.mark.parametrize("reason", ["broker error", "publish deadline"])
def test_a_slot_of_an_unknown_entry_is_held_back_after_a_failed_batch_too(
    harness_for: Callable[..., Harness], monkeypatch: pytest.MonkeyPatch, reason: str
) -> None:
    # A sweep takes over job@t0 and old@t0 (in that order); publishing job fails
    # (broker unreachable) or runs past the publish deadline. The slot of "old",
    # which this replica does not have, is held back for singlebeat_retention
    # like any slot of an unknown entry, not released for the next sweep.
    harness = harness_for({"job": every(60)})
    store = harness.store
    store.prepare(create=True)
    store.register(["job", "old"])
    t0 = harness.t0_us
    store.claim("dead-replica", [SlotKey("job", t0), SlotKey("old", t0)], US)
    harness.clock.advance(2 * SECOND)

    if reason == "broker error":
        UnreachableBroker.attempts = 0
        replica = harness.replica(Producer=UnreachableBroker)
        replica.tick()
    else:
        replica = harness.replica()
        tick_stalled_past_lease(replica, harness)  # a slow receiver
    assert harness.drain() == []
    rows = {row.entry: row for row in store.slot_rows()}
    assert (rows["job"].state, rows["job"].lease_until_us) == (0, 0)
    now = t0 + 2 * US
    assert (rows["old"].state, rows["old"].lease_until_us) == (
        0,
        now + replica.settings.retention_us,
    )


class LosingClaimAnswers(MemoryStore):
    """A store whose next claim is applied but whose answer is lost."""

    lose_next_claim = False

    def claim(self, owner: str, slots: Sequence[SlotKey], lease_us: int) -> list[Claim]:
        won = super().claim(owner, slots, lease_us)
        if self.lose_next_claim:
            self.lose_next_claim = False
            raise StoreUnavailable("claim failed: connection lost before the answer")
        return won


@pytest.fixture
def claimed_signals() -> Iterator[list[dict[str, Any]]]:
    """What slot_claimed and slot_published said, in order."""
    seen: list[dict[str, Any]] = []

    def record(signal: Any = None, **details: Any) -> None:
        seen.append(details)

    signals.slot_claimed.connect(record)
    signals.slot_published.connect(record)
    yield seen
    signals.slot_claimed.disconnect(record)
    signals.slot_published.disconnect(record)


def publish_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if ": sent " in r.getMessage()]


def test_winning_back_its_own_claim_after_a_lost_answer_is_not_a_takeover(
    harness_for: Callable[..., Harness],
    caplog: pytest.LogCaptureFixture,
    claimed_signals: list[dict[str, Any]],
) -> None:
    caplog.set_level(logging.INFO, logger="celery_singlebeat")
    harness = harness_for({"job": every(1)})
    store = harness.store = LosingClaimAnswers(now_us=harness.clock)
    t0 = harness.t0_us
    replica = harness.replica()
    replica.tick()
    harness.clock.advance(SECOND)
    store.lose_next_claim = True
    replica.tick()  # the claim is applied, its answer lost: an outage
    assert replica.stats["outages"] == 1
    replica.tick()  # the retry wins the replica's own claim again
    [message] = harness.drain()
    assert message.at_us == t0 + US
    [row] = store.slot_rows()
    assert (row.state, row.fence) == (1, 2)
    [line] = publish_lines(caplog)
    assert " won slot job@" in line
    assert [(d["fence"], d["taken_over"]) for d in claimed_signals] == [(2, False)] * 2
    assert replica.stats["taken_over"] == 0


class FailingConfirm(MemoryStore):
    """A store whose next confirm fails before it reaches the "database" (an
    outage that begins between a publish and its confirm), then recovers.
    Records the claims, sweeps and confirms it is asked for, in order."""

    fail_next_confirm = False

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.calls: list[tuple[str, list[SlotKey]]] = []

    def claim(self, owner: str, slots: Sequence[SlotKey], lease_us: int) -> list[Claim]:
        won = super().claim(owner, slots, lease_us)
        self.calls.append(("claim", [c.key for c in won]))
        return won

    def take_over(
        self, owner: str, lease_us: int, limit: int, seen: int | None = None
    ) -> list[Claim]:
        taken = super().take_over(owner, lease_us, limit, seen)
        self.calls.append(("take_over", [c.key for c in taken]))
        return taken

    def confirm(self, owner: str, claims: Sequence[Claim]) -> list[Claim]:
        self.calls.append(("confirm", [c.key for c in claims]))
        if self.fail_next_confirm:
            self.fail_next_confirm = False
            raise StoreUnavailable("confirm failed: connection lost before the answer")
        return super().confirm(owner, claims)


def _published_then_unconfirmed(
    harness: Harness,
) -> tuple[FailingConfirm, MemoryScheduler, list[SlotKey]]:
    """A replica that published a@t0+1 s and b@t0+1 s (drained from the
    broker here) and whose confirm of them failed."""
    store = harness.store = FailingConfirm(now_us=harness.clock)
    t0 = harness.t0_us
    replica = harness.replica()
    replica.tick()
    harness.clock.advance(SECOND)
    store.fail_next_confirm = True
    assert 0.25 <= replica.tick() <= 0.5  # an outage: the first retry within 0.5 s
    assert replica.stats["outages"] == 1
    pending = [SlotKey("a", t0 + US), SlotKey("b", t0 + US)]
    assert [SlotKey(m.entry, m.at_us) for m in harness.drain()] == pending
    assert [(r.state, r.fence) for r in store.slot_rows()] == [(0, 1), (0, 1)]
    return store, replica, pending


def test_claims_published_before_a_failed_confirm_are_confirmed_first_thing(
    harness_for: Callable[..., Harness],
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # guarantees.md, "Claims in flight when it started": kept in memory and
    # confirmed before anything else once the database answers; the outage was
    # shorter than the lease, so nothing is published twice.
    caplog.set_level(logging.INFO, logger="celery_singlebeat")
    harness = harness_for({"a": every(1), "b": every(1)})
    store, replica, pending = _published_then_unconfirmed(harness)
    next_us = pending[0].slot_us + US

    shift = monotonic_shift(harness)
    shift[0] += replica.settings.lease.total_seconds() / 3  # its next sweep is due
    harness.clock.advance(SECOND)  # and the next slots
    store.calls.clear()
    replica.tick()
    due = [SlotKey("a", next_us), SlotKey("b", next_us)]
    assert store.calls == [
        ("confirm", pending),  # first thing: before the sweep and the new claims
        # (the sweep's heartbeat then counts no claimed row: no takeover to try)
        ("claim", due),
        ("confirm", due),
    ]
    assert [SlotKey(m.entry, m.at_us) for m in harness.drain()] == due
    assert [(r.state, r.fence) for r in store.slot_rows()] == [(1, 1)] * 4
    assert replica.stats["outages"] == 1
    assert sum("database reachable again" in r.getMessage() for r in caplog.records) == 1
    assert not [r for r in caplog.records if "was taken over before" in r.getMessage()]


def test_an_outage_longer_than_the_lease_after_a_publish_repeats_it_once(
    harness_for: Callable[..., Harness], caplog: pytest.LogCaptureFixture
) -> None:
    # The same cut, but the database stays away for longer than the lease:
    # another replica's sweep takes the claims over and publishes them again
    # with the same task ids (the documented repeat); the first replica's
    # confirm, first thing when it is back, finds them gone and says so.
    caplog.set_level(logging.INFO, logger="celery_singlebeat")
    harness = harness_for({"a": every(1), "b": every(1)})
    store, first, pending = _published_then_unconfirmed(harness)
    lease = first.settings.lease
    with store.outage():
        for _ in range(4):
            harness.clock.advance(lease / 4 + SECOND)
            first.tick()
    assert harness.drain() == []

    second = harness.replica()
    second.tick()  # its first tick sweeps: the lease has run out
    first.tick()
    sent = harness.drain()
    copies = Counter(SlotKey(m.entry, m.at_us) for m in sent)
    # one more copy of each (the helper drained the first), nothing else twice
    assert [key for key in copies if key in pending] == pending
    assert max(copies.values()) == 1
    for key in pending:
        ids = {m.task_id for m in sent if SlotKey(m.entry, m.at_us) == key}
        assert ids == {slot_task_id(key.entry, key.slot_us)}
    rows = {SlotKey(r.entry, r.slot_us): r for r in store.slot_rows()}
    for key in pending:
        assert (rows[key].state, rows[key].fence, rows[key].owner) == (
            1,
            2,
            second.settings.replica_id,
        )
    assert second.stats["taken_over"] == 2
    warnings = [
        r.getMessage()
        for r in caplog.records
        if r.levelno == logging.WARNING and "was taken over before replica" in r.getMessage()
    ]
    assert warnings == [
        f"singlebeat: slot {key.entry}@{_iso(key.slot_us)} was taken over before replica "
        f"{first.settings.replica_id} confirmed its publish; it is published again with "
        f"the same task id {slot_task_id(key.entry, key.slot_us)}"
        for key in pending
    ]


@pytest.mark.parametrize("taker", ["itself", "another replica"])
def test_a_released_slot_is_taken_over_only_by_another_replica(
    harness_for: Callable[..., Harness],
    caplog: pytest.LogCaptureFixture,
    claimed_signals: list[dict[str, Any]],
    monkeypatch: pytest.MonkeyPatch,
    taker: str,
) -> None:
    caplog.set_level(logging.INFO, logger="celery_singlebeat")
    harness = harness_for({"job": every(1)})
    t0 = harness.t0_us
    FlakyBroker.down = True
    replica = harness.replica(Producer=FlakyBroker)
    replica.tick()
    harness.clock.advance(SECOND)
    replica.tick()  # claimed, the publish fails, the claim is released
    FlakyBroker.down = False
    claimed_signals.clear()
    if taker == "itself":
        shift = monotonic_shift(harness)
        shift[0] += replica.settings.lease.total_seconds()  # its next sweep is due
        replica.tick()
        sweeper = replica
    else:
        sweeper = harness.replica()
        sweeper.tick()
    [message] = harness.drain()
    assert message.at_us == t0 + US
    [row] = harness.store.slot_rows()
    assert (row.state, row.fence, row.owner) == (1, 2, sweeper.settings.replica_id)
    took_over = taker != "itself"
    assert [d["taken_over"] for d in claimed_signals] == [took_over] * 2
    assert sweeper.stats["taken_over"] == int(took_over)
    [line] = publish_lines(caplog)
    assert (" took over slot job@" in line) == took_over
    warnings = [r for r in caplog.records if "took over slot job@" in r.getMessage()]
    assert bool(warnings) == took_over
    assert any("took back slot job@" in r.getMessage() for r in caplog.records) != took_over


class StoppedWhileClaiming(MemoryStore):
    """A store that sends this process SIGTERM ``times`` times right after a
    claim is applied: a stop that lands inside a tick, before the publish."""

    times = 0

    def claim(self, owner: str, slots: Sequence[SlotKey], lease_us: int) -> list[Claim]:
        won = super().claim(owner, slots, lease_us)
        for _ in range(self.times):
            signal.raise_signal(signal.SIGTERM)
        return won


@pytest.fixture
def beat_sigterm() -> Iterator[list[str]]:
    """SIGTERM handled as ``celery beat`` handles it (its handler raises
    SystemExit wherever the main thread is); yields the handler's calls."""
    calls: list[str] = []

    def _sync(signum: int, frame: object) -> None:
        calls.append("stop")
        raise SystemExit()

    previous = signal.signal(signal.SIGTERM, _sync)
    yield calls
    signal.signal(signal.SIGTERM, previous)


@pytest.mark.parametrize("times", [1, 2])
def test_a_sigterm_inside_a_tick_waits_until_its_claims_are_published_and_confirmed(
    harness_for: Callable[..., Harness], beat_sigterm: list[str], times: int
) -> None:
    """Raised mid-tick, the SystemExit would leave the claim unpublished until a
    takeover after the lease (or, after the publish, unconfirmed: a repeat).
    One stop request waits for the tick; a second one stops at once."""
    harness = harness_for({"job": every(1)})
    store = harness.store = StoppedWhileClaiming(now_us=harness.clock)
    t0 = harness.t0_us
    replica = harness.replica()
    replica.tick()
    handler = signal.getsignal(signal.SIGTERM)
    harness.clock.advance(SECOND)
    store.times = times
    with pytest.raises(SystemExit):
        replica.tick()
    assert beat_sigterm == ["stop"]
    assert signal.getsignal(signal.SIGTERM) is handler  # put back as it was
    [row] = store.slot_rows()
    assert row.slot_us == t0 + US
    if times == 1:
        [message] = harness.drain()
        assert message.at_us == t0 + US
        assert row.state == 1  # published and confirmed before the stop
    else:
        assert harness.drain() == []
        assert row.state == 0  # asked twice: stopped inside the tick, as before


class FlakyBroker(Producer):  # type: ignore[misc]
    """A producer whose broker is unreachable while ``down`` is set."""

    down = False

    def publish(self, *args: Any, **kwargs: Any) -> Any:
        if type(self).down:
            raise KombuOperationalError("[Errno 111] Connection refused")
        return super().publish(*args, **kwargs)


class UnreachableBroker(Producer):  # type: ignore[misc]
    """A producer whose broker cannot be reached after refusing the first
    ``refusals`` messages (a bad message, not the connection); counts attempts."""

    attempts = 0
    refusals = 0

    def publish(self, *args: Any, **kwargs: Any) -> None:
        type(self).attempts += 1
        if type(self).attempts <= self.refusals:
            raise RuntimeError("broker refused the message")
        raise KombuOperationalError("[Errno 111] Connection refused")


def test_an_unreachable_broker_costs_one_attempt_per_batch_not_one_per_slot(
    harness_for: Callable[..., Harness], caplog: pytest.LogCaptureFixture
) -> None:
    # Each failed publish waits out kombu's retries; trying every slot of a big
    # batch against a dead broker would stall the beat loop for minutes.
    caplog.set_level(logging.INFO, logger="celery_singlebeat")
    harness = harness_for({f"job-{i}": every(1) for i in range(4)})
    UnreachableBroker.attempts = 0
    replica = harness.replica(Producer=UnreachableBroker)
    replica.tick()
    harness.clock.advance(SECOND)
    replica.tick()
    assert replica.stats["claimed"] == 4 and replica.stats["sent"] == 0
    assert UnreachableBroker.attempts == 1
    assert all(row.state == 0 and row.lease_until_us == 0 for row in harness.store.slot_rows())
    assert any("broker unreachable; released 3" in r.getMessage() for r in caplog.records)
    # once the broker is back, a replica that reaches it sends all four
    healthy = harness.replica()
    healthy.tick()
    assert sorted(m.entry for m in harness.drain()) == [f"job-{i}" for i in range(4)]


def _closed_port() -> int:
    """A local TCP port nothing listens on: connecting to it is refused at once."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_a_first_publish_to_an_unreachable_broker_fails_like_any_other(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Celery's Scheduler.producer first waits for the broker in
    # ensure_connection(), up to broker_connection_max_retries (100) with a
    # back-off growing to 30 s: found in a real beat whose first publish came
    # during a broker outage (tests/acceptance/test_outages.py), its loop stalled
    # for the whole outage, claims unpublished, and the missed-run policy then
    # dropped the slots it had not proposed. One retry here, so that the old
    # behaviour fails fast: it logged Celery's "beat: Connection error" and
    # raised out of tick().
    caplog.set_level(logging.INFO)
    app = make_app(f"sb-{uuid.uuid4().hex[:10]}", {"job": every(1)})
    app.conf.broker_url = f"redis://127.0.0.1:{_closed_port()}/0"
    app.conf.broker_connection_max_retries = 1
    clock = FakeClock()
    store = MemoryStore(now_us=clock)
    replica = MemoryScheduler(app, store=store)
    replica.tick()
    clock.advance(SECOND)
    replica.tick()  # claims job@t0+1 s; its first publish finds no broker
    assert replica.stats["claimed"] == 1 and replica.stats["sent"] == 0
    assert not [r for r in caplog.records if "beat: Connection error" in r.getMessage()]
    assert any(
        r.levelno == logging.ERROR and "publishing slot job@" in r.getMessage()
        for r in caplog.records
    )
    [row] = store.slot_rows()
    assert (row.state, row.lease_until_us) == (0, 0)  # released for a sweep to send


class RefusingThenUnreachable(UnreachableBroker):
    """The broker refuses the first message, then cannot be reached at all."""

    refusals = 1


def test_the_broker_error_line_counts_only_the_slots_released_untried(
    harness_for: Callable[..., Harness], caplog: pytest.LogCaptureFixture
) -> None:
    # job-0 fails on its own (a bad message), job-1 finds the broker gone, and
    # only job-2 and job-3 are released without being tried.
    caplog.set_level(logging.INFO, logger="celery_singlebeat")
    harness = harness_for({f"job-{i}": every(1) for i in range(4)})
    RefusingThenUnreachable.attempts = 0
    replica = harness.replica(Producer=RefusingThenUnreachable)
    replica.tick()
    harness.clock.advance(SECOND)
    replica.tick()
    assert RefusingThenUnreachable.attempts == 2
    [line] = [r.getMessage() for r in caplog.records if "broker unreachable" in r.getMessage()]
    assert "released 2 claimed slots without trying them" in line
    assert all(row.state == 0 and row.lease_until_us == 0 for row in harness.store.slot_rows())


def test_a_sweep_takes_over_at_most_the_takeover_batch_oldest_first(
    harness_for: Callable[..., Harness], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Seven abandoned claims of two entries; with singlebeat_takeover_batch 3
    # each sweep publishes the three oldest left, in slot order, then waits for
    # its next sweep: the catch-up after a long broker outage comes in steps.
    harness = harness_for({"a": every(60), "b": every(60)}, singlebeat_takeover_batch=3)
    store = harness.store
    store.prepare(create=True)
    store.register(["a", "b"])
    t0 = harness.t0_us
    keys = [SlotKey("a", t0 - k * US) for k in range(4)] + [
        SlotKey("b", t0 - k * US) for k in range(3)
    ]
    store.claim("dead-replica", keys, US)
    harness.clock.advance(2 * SECOND)
    oldest_first = sorted(keys, key=lambda k: (k.slot_us, k.entry))

    shift = monotonic_shift(harness)
    replica = harness.replica()
    assert replica.settings.takeover_batch == 3
    sweeps = []
    for _ in range(4):
        replica.tick()
        replica.tick()  # no sweep due: nothing more is taken over
        sweeps.append([SlotKey(m.entry, m.at_us) for m in harness.drain()])
        shift[0] += replica.settings.lease.total_seconds() / 3  # the next sweep is due
    assert sweeps == [oldest_first[:3], oldest_first[3:6], oldest_first[6:], []]
    assert replica.stats["taken_over"] == 7
    assert {(row.state, row.fence) for row in store.slot_rows()} == {(1, 2)}


# -- clock steps --------------------------------------------------------------

#: a sweep or a prune round trip would correct a stepped clock before the claim
#: does: with these, neither comes round again while a test runs (100 s, 60 s).
NO_SWEEP = {"singlebeat_lease": 300, "singlebeat_retention": 3600}


@pytest.mark.parametrize("stall", [0, 20])
def test_a_lone_replica_whose_clock_steps_forward_loses_no_slot(
    harness_for: Callable[..., Harness], caplog: pytest.LogCaptureFixture, stall: int
) -> None:
    # Its clock jumps 100 periods ahead: its plan sees t0+2..t0+95 as missed
    # (coalesce proposes none of them, an on-time slot follows) and proposes
    # t0+96..t0+101, which the store refuses as early. Every slot must still be
    # sent once the database's clock reaches it; the missed-run policy applies
    # only to slots missed on that clock (here when the replica then stalls).
    caplog.set_level(logging.INFO, logger="celery_singlebeat")
    harness = harness_for({"job": every(1)}, **NO_SWEEP)
    local = harness.steppable()
    t0 = harness.t0_us
    replica = harness.replica()
    replica.tick()
    harness.clock.advance(SECOND)
    replica.tick()
    assert [m.at_us for m in harness.drain()] == [t0 + US]

    local.step_us = 100 * US
    replica.tick()
    assert harness.drain() == []
    assert replica.stats["skipped"] == 0  # that plan judged with the stepped clock

    harness.clock.advance(stall * SECOND)  # a replica stalled that long, then ticks
    replica.tick()
    for _ in range(110):
        harness.clock.advance(SECOND)
        replica.tick()
    sent = [(m.at_us - t0) // US for m in harness.drain()]
    missed = list(range(2, stall - 4)) if stall else []  # older than the 5 s grace
    assert sent == [s for s in range(2, stall + 112) if s not in missed]
    assert replica.stats["skipped"] == len(missed)
    skips = [r.getMessage() for r in caplog.records if "missed slot(s)" in r.getMessage()]
    if stall:
        [line] = skips
        assert f"{len(missed)} missed slot(s) {_iso(t0 + 2 * US)}..{_iso(t0 + 15 * US)}" in line
    else:
        assert skips == []


def test_a_slot_won_in_a_tick_that_was_refused_as_early_is_not_proposed_again(
    harness_for: Callable[..., Harness], caplog: pytest.LogCaptureFixture
) -> None:
    # A small step: t0+2 is due and won, t0+3..t0+5 are refused as early. The
    # entry is planned again from t0+2, without proposing t0+2 a second time.
    caplog.set_level(logging.DEBUG, logger="celery_singlebeat")
    harness = harness_for({"job": every(1)}, **NO_SWEEP)
    local = harness.steppable()
    t0 = harness.t0_us
    replica = harness.replica()
    replica.tick()
    harness.clock.advance(SECOND)
    replica.tick()
    harness.clock.advance(SECOND)
    local.step_us = 3 * US
    replica.tick()
    assert [(m.at_us - t0) // US for m in harness.drain()] == [1, 2]
    for _ in range(6):
        harness.clock.advance(SECOND)
        replica.tick()
    assert [(m.at_us - t0) // US for m in harness.drain()] == list(range(3, 9))
    assert not [r for r in caplog.records if "lost slot job@" + _iso(t0 + 2 * US) in r.message]
    assert replica.stats["claimed"] == 8


def test_the_early_refusal_warning_counts_slots_and_needs_a_clock_ahead(
    harness_for: Callable[..., Harness], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="celery_singlebeat")
    harness = harness_for({"a": every(1), "b": every(1)}, **NO_SWEEP)
    local = harness.steppable()
    t0 = harness.t0_us
    replica = harness.replica()
    replica.tick()

    def early_lines(level: int) -> list[str]:
        return [
            r.getMessage()
            for r in caplog.records
            if r.levelno == level and "before they were due" in r.getMessage()
        ]

    # No step: another replica, its estimate 200 ms ahead (within the tolerance),
    # won a@t0+1 early; ours is 100 ms ahead: we lose it, and after the claim's
    # round trip it is still a few ms in the future. Not a clock step: DEBUG.
    harness.clock.advance(timedelta(milliseconds=800))
    harness.store.claim("replica-b", [SlotKey("a", t0 + US)], 10 * US)
    harness.clock.advance(timedelta(milliseconds=100))
    local.step_us = 100_000
    replica.tick()
    assert early_lines(logging.WARNING) == []
    assert any("did not win 1 slot(s) not yet due" in r.getMessage() for r in caplog.records)
    assert [m.entry for m in harness.drain()] == ["b"]
    harness.clock.advance(timedelta(milliseconds=100))
    replica.tick()  # proposed again when due: lost, and counted once
    assert replica.stats["lost"] == 1 and harness.drain() == []

    # A 10 s step: 2 entries x 6 slots refused as early, one WARNING counting slots.
    local.step_us += 10 * US
    replica.tick()
    [line] = early_lines(logging.WARNING)
    assert "proposed 12 slot(s)" in line and "ran 10.000s ahead" in line
    assert replica.stats["lost"] == 1


def _iso(at_us: int) -> str:
    return us_to_datetime(at_us).isoformat(timespec="milliseconds").replace("+00:00", "Z")


# -- outages ------------------------------------------------------------------


def test_an_outage_sends_nothing_logs_once_backs_off_and_applies_the_missed_policy(
    harness_for: Callable[..., Harness], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="celery_singlebeat")
    harness = harness_for(
        {
            "coalesced": every(10, singlebeat_missed_policy="coalesce"),
            "skipped": every(10, singlebeat_missed_policy="skip"),
            "replayed": every(10, singlebeat_missed_policy="all"),
        },
        singlebeat_missed_grace=1,
    )
    t0 = harness.t0_us
    replica = harness.replica()
    replica.tick()
    harness.clock.advance(10 * SECOND)
    replica.tick()
    assert sorted(m.entry for m in harness.drain()) == ["coalesced", "replayed", "skipped"]

    def errors() -> int:
        return sum(
            r.levelno == logging.ERROR and "unreachable" in r.getMessage() for r in caplog.records
        )

    def recoveries() -> int:
        return sum("database reachable again" in r.getMessage() for r in caplog.records)

    harness.store.available = False
    delays = []
    for _ in range(7):
        harness.clock.advance(13 * SECOND)
        delays.append(replica.tick())
    # doubling from 0.5 s up to the 1.5 s cap, each drawn between half the
    # step and the step, so replicas cut off together do not retry in lockstep
    steps = [0.5, 1.0, 1.5, 1.5, 1.5, 1.5, 1.5]
    assert all(step / 2 <= d <= step for d, step in zip(delays, steps)), delays
    assert len(set(delays)) > 1, delays
    assert harness.drain() == []
    assert errors() == 1 and recoveries() == 0
    assert replica.stats["outages"] == 1

    # back at t0 + 105.5 s: slots t0+20 .. t0+100 fell due meanwhile, all of them missed
    harness.clock.advance(timedelta(seconds=4.5))
    harness.store.available = True
    replica.tick()
    assert recoveries() == 1
    by_entry: dict[str, list[int]] = {}
    for message in harness.drain():
        by_entry.setdefault(message.entry, []).append((message.at_us - t0) // US)
    assert sorted(by_entry["coalesced"]) == [100]
    assert "skipped" not in by_entry
    assert sorted(by_entry["replayed"]) == list(range(20, 101, 10))
    assert replica.stats["skipped"] == 8 + 9

    replica.tick()
    assert recoveries() == 1 and errors() == 1

    # a second outage is a new outage: one more ERROR, and the backoff starts again
    # (a slot must be due: a replica with nothing to do does not talk to the store)
    harness.store.available = False
    harness.clock.advance(10 * SECOND)
    assert 0.25 <= replica.tick() <= 0.5
    assert 0.5 <= replica.tick() <= 1.0
    assert harness.drain() == []
    assert errors() == 2 and replica.stats["outages"] == 2


def test_a_replica_back_from_a_cut_longer_than_the_retention_writes_its_rows_again(
    harness_for: Callable[..., Harness],
) -> None:
    """Its replica row and catalog, pruned by the others while it was away, are
    written again on its first tick back: run-now and pause of its entries are
    refused while no live replica's catalog lists them."""
    harness = harness_for({"job": every(1)})
    replica = harness.replica()
    replica.tick()
    rid = replica.settings.replica_id
    assert set(harness.store.catalog_of(rid)) == {"job"}
    assert rid in harness.store.replica_rows()

    harness.store.available = False
    harness.clock.advance(10 * SECOND)
    replica.tick()
    harness.store.available = True
    # the others' prune, with a retention shorter than the cut
    assert harness.store.prune_fleet(5 * US) == 2  # its row and its one catalog row
    assert harness.store.catalog_of(rid) == {} and rid not in harness.store.replica_rows()

    harness.clock.advance(SECOND)
    replica.tick()
    assert set(harness.store.catalog_of(rid)) == {"job"}
    assert harness.store.replica_rows()[rid]["seen_us"] == harness.clock()  # now


# -- construction ----------------------------------------------------------------


@pytest.mark.parametrize("lazy", [True, False])
def test_construction_never_touches_the_store(
    harness_for: Callable[..., Harness], lazy: bool, tmp_path: Path
) -> None:
    harness = harness_for({"job": every(1)})
    replica = harness.replica(lazy=lazy)
    assert harness.store.round_trips == 0

    # the real scheduler builds no SQL store either: the SQLite file never appears
    database = tmp_path / "never" / "created.sqlite"
    harness.app.conf.singlebeat_url = f"sqlite:///{database}"
    SingleBeatScheduler(harness.app, lazy=lazy).close()
    assert not database.parent.exists()

    if not lazy:
        replica.tick()
        assert harness.store.round_trips > 0


@pytest.mark.parametrize("lazy", [True, False])
@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"singlebeat_missed_policy": "sometimes"}, "singlebeat_missed_policy='sometimes'"),
        ({"singlebeat_missed_max": 0}, "singlebeat_missed_max=0"),
        ({"singlebeat_missed_grace": "soon"}, "singlebeat_missed_grace='soon'"),
        ({"singlebeat_missed_polcy": "skip"}, "singlebeat_missed_polcy"),
    ],
)
def test_a_bad_entry_option_fails_at_construction_naming_the_entry(
    options: dict[str, Any], named: str, lazy: bool
) -> None:
    app = make_app("unused", {"nightly-report": every(60, **options), "ok": every(1)})
    store = MemoryStore()
    with pytest.raises(ConfigurationError) as failure:
        MemoryScheduler(app, store=store, lazy=lazy)
    message = str(failure.value)
    assert "beat_schedule['nightly-report']" in message
    assert named in message
    assert store.round_trips == 0


# -- cost -------------------------------------------------------------------------


def test_tracking_a_crontab_entry_keeps_a_few_kib_not_a_list_of_its_minutes(
    harness_for: Callable[..., Harness],
) -> None:
    # The load run (benchmarks/bench_load.py) found each replica at 383 MB with
    # 5,000 crontab() entries: every tracked crontab kept its day's 1,440
    # matching minutes as a list of ints, 48 KiB per entry; then an array of
    # them, 6.6 KiB, about what Celery's own crontab object costs. Entries with
    # the same crontab now share one parsed copy: what the scheduler keeps per
    # entry is its own bookkeeping, a few hundred bytes.
    entries = 300
    harness = harness_for(
        {f"cron-{i}": {"task": TASK, "schedule": crontab()} for i in range(entries)}
    )
    replica = harness.replica()
    tracemalloc.start()
    try:
        before = tracemalloc.take_snapshot()
        replica.tick()  # the first tick registers and tracks every entry
        after = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    assert len(replica.engine.tracked) == entries
    kept = sum(
        stat.size_diff
        for stat in after.compare_to(before, "filename")
        if "celery_singlebeat" in stat.traceback[0].filename
    )
    assert kept / entries < 1024, f"{kept / entries / 1024:.1f} KiB per crontab entry"
    sequences = {id(t.sequence.fields) for t in replica.engine.tracked.values()}  # type: ignore[attr-defined]
    assert len(sequences) == 1
