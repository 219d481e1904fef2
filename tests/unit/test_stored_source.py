"""Stored entries followed by replicas ticking on simulated time (no services).

Three MemorySchedulers share a MemoryStore; the test edits its stored entries
through ``Schedules(store=...)`` between ticks, as another process would, and
checks what reached the broker:

* every slot once;
* a change is in effect within a second of its commit: no slot after
  commit + 1 s under a replaced definition, nothing of a disabled or deleted
  entry after its commit + 1 s, and the disabled span is not caught up;
* the feed read costs one statement per 0.9 s while nothing changes, and the
  catalog is not written for stored entries;
* a stored entry clashing with a beat_schedule entry is refused at run time
  (the static one stays) and logged.
"""

from __future__ import annotations

import logging
import random
from collections import Counter
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from test_scheduler import TASK, Harness, every, harness_for  # noqa: F401 - fixture

from celery_singlebeat import Schedules, signals
from celery_singlebeat.clock import US, datetime_to_us
from celery_singlebeat.engine import Environment
from celery_singlebeat.engine.feed import READ_EVERY_S

EFFECT_US = US


def simulate(harness: Harness, seed: int) -> None:
    clock = harness.clock
    harness.simulated = Environment(
        monotonic=lambda: clock() / US, time=lambda: clock() / US, random=random.Random(seed)
    )


class Run:
    def __init__(self, harness: Harness, replicas: int) -> None:
        self.harness = harness
        self.replicas = [harness.replica(replica_id=f"r{i}") for i in range(replicas)]
        self.wake = {r.settings.replica_id: harness.clock() for r in self.replicas}
        self.published: list[tuple[str, int, str]] = []
        signals.slot_published.connect(self._on_published, weak=False)

    def close(self) -> None:
        signals.slot_published.disconnect(self._on_published)

    def _on_published(self, sender: Any = None, **details: Any) -> None:
        if sender in self.replicas:
            self.published.append(
                (details["entry"], datetime_to_us(details["slot"]), repr(details.get("kwargs")))
            )

    def run_until(self, until_us: int) -> None:
        clock = self.harness.clock
        while clock() < until_us:
            for replica in self.replicas:
                rid = replica.settings.replica_id
                if self.wake[rid] <= clock():
                    self.wake[rid] = clock() + int(replica.tick() * US)
            nxt = min(min(self.wake.values()), until_us)
            clock.advance(timedelta(microseconds=max(nxt - clock(), 1)))


def _us(instant: Any) -> int:
    return int(instant.timestamp() * US)


@pytest.mark.parametrize("seed", [1, 2])
def test_stored_entries_edited_while_three_replicas_tick(
    harness_for: Callable[..., Harness],  # noqa: F811
    seed: int,
) -> None:
    harness = harness_for({"static": every(2)})
    simulate(harness, seed)
    schedules = Schedules(store=harness.store, by="test")
    run = Run(harness, replicas=3)
    try:
        t0 = harness.clock()
        a1 = schedules.upsert("a", TASK, timedelta(seconds=1), kwargs={"v": 1})
        b = schedules.upsert("b", TASK, timedelta(seconds=1))
        c = schedules.upsert("c", TASK, timedelta(seconds=2))
        run.run_until(t0 + 5 * US)
        a2 = schedules.update("a", kwargs={"v": 2})
        off = schedules.disable("b")
        run.run_until(harness.clock() + 4 * US + random.Random(seed).randrange(US))
        on = schedules.enable("b")
        schedules.delete("c")
        deleted_us = harness.store.schedule_log("c")[0].at_us
        run.run_until(harness.clock() + 5 * US)
    finally:
        run.close()
    counts = Counter((e, at) for e, at, _ in run.published)
    assert counts and max(counts.values()) == 1, "a slot was sent twice"
    a_sent = [(at, kw) for e, at, kw in run.published if e == "a"]
    assert [at for at, kw in a_sent if "'v': 1" in kw and at > _us(a2.updated) + EFFECT_US] == []
    assert [at for at, kw in a_sent if "'v': 2" in kw], "the edit never took effect"
    b_sent = [at for e, at, _ in run.published if e == "b"]
    assert not [at for at in b_sent if _us(off.updated) + EFFECT_US < at <= _us(on.updated)]
    assert [at for at in b_sent if at > _us(on.updated)], "not sent again once enabled"
    c_sent = [at for e, at, _ in run.published if e == "c"]
    assert c_sent and not [at for at in c_sent if at > deleted_us + EFFECT_US]
    # every instant of "a" v2 from a second after the edit on: sent, once
    expected = {
        at for at in range(_us(a2.updated) + EFFECT_US, harness.clock() - US, US)
    }
    anchor = harness.store.register(["a"])["a"].anchor_us
    grid = {anchor + ((at - anchor) // US + 1) * US for at in expected}
    missing = {at for at in grid if at < harness.clock() - US} - {at for at, _ in a_sent}
    assert not missing, f"instants of 'a' never sent: {sorted(missing)[:3]}"
    assert b.revision and c.revision and a1.revision


def test_idle_costs_one_feed_read_per_period_and_no_catalog_write(
    harness_for: Callable[..., Harness],  # noqa: F811
) -> None:
    harness = harness_for({})
    simulate(harness, 1)
    schedules = Schedules(store=harness.store)
    schedules.upsert("hourly", TASK, timedelta(hours=1))
    replica = harness.replica(replica_id="solo")
    run_wake = harness.clock()
    catalog_writes = []
    original = harness.store.publish_catalog

    def counting(replica_id: str, entries: Any) -> None:
        catalog_writes.append([e.name for e in entries])
        original(replica_id, entries)

    harness.store.publish_catalog = counting  # type: ignore[method-assign]
    start = harness.clock()
    reads_before = replica.engine.feed.reads
    while harness.clock() < start + 60 * US:
        if run_wake <= harness.clock():
            run_wake = harness.clock() + int(replica.tick() * US)
        harness.clock.advance(timedelta(microseconds=max(run_wake - harness.clock(), 1)))
    reads = replica.engine.feed.reads - reads_before
    assert 60 / (READ_EVERY_S + 0.1) <= reads <= 60 / READ_EVERY_S + 2, reads
    assert "hourly" in replica.entries
    assert all("hourly" not in names for names in catalog_writes), catalog_writes


def test_a_stored_entry_may_not_take_a_beat_schedule_name(
    harness_for: Callable[..., Harness],  # noqa: F811
    caplog: pytest.LogCaptureFixture,
) -> None:
    harness = harness_for({"clash": every(2)})
    replica = harness.replica(replica_id="solo")
    replica.tick()
    # written around the API's check, as another release or a hand-written row might
    Schedules(store=harness.store).upsert("clash", TASK, timedelta(seconds=1))
    with caplog.at_level(logging.ERROR, logger="celery_singlebeat"):
        harness.clock.advance(timedelta(seconds=1))
        replica.tick()
    assert replica.entries["clash"].source == "beat_schedule"
    assert "already defines" in caplog.text
