"""The real scheduler loop with a pod's wall clock stepped *back*, and replicas
whose crontab differs (docs/guarantees.md, "Clocks" and "Replicas with
different schedules").

Each replica runs as ``celery beat`` runs it: it ticks, sleeps as long as the
tick asked, ticks again. Time is simulated: the database's clock is a
:class:`FakeClock`, the scheduler's monotonic clock follows it, and a replica's
wall clock is the database's plus a step the test sets.
"""

from __future__ import annotations

import logging
import random
import time
from collections import Counter
from collections.abc import Callable
from datetime import datetime, timedelta, timezone

import pytest
from celery.schedules import crontab
from test_scheduler import TASK, Harness, every, harness_for  # noqa: F401 - fixture

from celery_singlebeat.engine import Environment
from celery_singlebeat.engine.feed import READ_EVERY_S
from celery_singlebeat.testing import FakeClock, MemoryScheduler
from celery_singlebeat.timeline.clock import US

LEASE = 15.0


@pytest.fixture
def simulated() -> Callable[[Harness], None]:
    """The harness's replicas' monotonic clock follows its fake clock; their
    jitter is seeded."""

    def install(harness: Harness) -> None:
        clock = harness.clock
        harness.simulated = Environment(
            monotonic=lambda: clock() / US, time=time.time, random=random.Random(0)
        )

    return install


def run_loop(clock: FakeClock, replicas: list[MemoryScheduler], until_us: int) -> None:
    """Tick each replica when it asked to be woken, until ``until_us``."""
    wake = {id(r): clock() for r in replicas}
    while clock() < until_us:
        for replica in replicas:
            if wake[id(replica)] <= clock():
                wake[id(replica)] = clock() + int(replica.tick() * US)
        nxt = min(min(wake.values()), until_us)
        clock.advance(timedelta(microseconds=max(nxt - clock(), 1)))


def test_a_lone_replica_stepped_back_sends_every_slot_once_by_its_next_feed_read(
    harness_for: Callable[..., Harness],  # noqa: F811
    simulated: Callable[[Harness], None],
) -> None:
    # the feed read (every 0.95 s) is a round trip that corrects the clock, well
    # within the 5 s grace, so every slot the step hid is still on time
    harness = harness_for({"job": every(1)}, singlebeat_lease=LEASE)
    local = harness.steppable()
    simulated(harness)
    t0 = harness.t0_us
    replica = harness.replica()
    # half-way between two sweeps (every 5 s from the first tick at t0)
    run_loop(harness.clock, [replica], t0 + 11 * US + US // 2)
    local.step_us = -60 * US
    # the step is in the replica's estimate until a round trip corrects it
    assert harness.clock() - replica.engine.store.clock.now_us() > 50 * US
    run_loop(harness.clock, [replica], t0 + 40 * US)
    sent = harness.drain()
    counts = Counter(m.at_us for m in sent)
    assert max(counts.values()) == 1
    assert sorted(counts) == [t0 + k * US for k in range(1, 40)]
    assert replica.stats["skipped"] == 0
    # and the replica corrected its clock within a feed read of the step
    assert abs(replica.engine.store.clock.now_us() - harness.clock()) < US // 10
    claimed = {row.slot_us: row.claimed_us for row in harness.store.slot_rows()}
    worst = max(claimed[at] - at for at in counts)
    assert worst <= READ_EVERY_S * US + US // 10, worst / US


def test_a_lone_replica_stepped_back_past_the_grace_applies_the_missed_run_policy(
    harness_for: Callable[..., Harness],  # noqa: F811
    simulated: Callable[[Harness], None],
    caplog: pytest.LogCaptureFixture,
) -> None:
    # a grace of 0.2 s, shorter than the 0.95 s between two feed reads (the
    # round trips that correct the clock while idle), so slots the step hid
    # can be older than the grace when it ends: coalesce drops those (an
    # on-time slot follows)
    caplog.set_level(logging.WARNING, logger="celery_singlebeat")
    # slots every 0.25 s: ticks come between feed reads, with the stepped clock
    period = US // 4
    harness = harness_for({"job": every(period / US)}, singlebeat_missed_grace=0.2)
    local = harness.steppable()
    simulated(harness)
    t0 = harness.t0_us
    replica = harness.replica()
    run_loop(harness.clock, [replica], t0 + 16 * US)
    # just after a feed read: the next one, 0.95 s on, is what corrects the clock
    reads = replica.engine.feed.reads
    while replica.engine.feed.reads == reads:
        run_loop(harness.clock, [replica], harness.clock() + 1000)
    local.step_us = -600 * US
    run_loop(harness.clock, [replica], t0 + 30 * US)
    counts = Counter(m.at_us for m in harness.drain())
    assert max(counts.values()) == 1
    grid = [t0 + k * period for k in range(1, 30 * US // period)]
    missing = [at for at in grid if at not in counts]
    assert missing, "nothing was older than the grace: the test tests nothing"
    # exactly the missing ones were reported, in one WARNING, as the policy's
    assert replica.stats["skipped"] == len(missing)
    assert missing == list(range(missing[0], missing[-1] + 1, period))
    [line] = [r.getMessage() for r in caplog.records if "missed slot(s)" in r.getMessage()]
    assert f"{len(missing)} missed slot(s)" in line and "coalesce" in line


def test_replicas_with_different_crontabs_for_one_entry_run_the_union_once(
    harness_for: Callable[..., Harness],  # noqa: F811
    simulated: Callable[[Harness], None],
) -> None:
    start = datetime(2026, 3, 2, 9, 0, 30, tzinfo=timezone.utc)
    harness = harness_for({"report": {"task": TASK, "schedule": crontab(minute="*/2")}})
    harness.clock = FakeClock(start)
    harness.store = type(harness.store)(now_us=harness.clock)
    simulated(harness)
    old = harness.replica()
    new_app_schedule = {"report": {"task": TASK, "schedule": crontab(minute="*/3")}}
    harness.app.conf.beat_schedule = new_app_schedule
    new = harness.replica()
    run_loop(harness.clock, [old, new], harness.clock() + 30 * 60 * US)
    minutes = Counter(
        datetime.fromtimestamp(m.at_us / US, timezone.utc).minute for m in harness.drain()
    )
    assert max(minutes.values()) == 1
    assert sorted(minutes) == [m for m in range(1, 31) if m % 2 == 0 or m % 3 == 0]
