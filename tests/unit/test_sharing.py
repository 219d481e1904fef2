"""Work sharing: each live replica proposes its share of the entries first.

The database still decides every slot; these tests check that the work is
split among replicas that keep up, and that a replica that stops is covered by
the others after the fallback delay, with every slot sent once.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from datetime import timedelta

import pytest
from test_scheduler import SECOND, Harness, every, harness_for  # noqa: F401

from celery_singlebeat.sharing import (
    FALLBACK_DELAY_US,
    entry_hash,
    first_replicas,
    live_replicas,
)
from celery_singlebeat.testing import MemoryScheduler

FALLBACK = timedelta(microseconds=FALLBACK_DELAY_US)


def test_the_split_is_the_same_on_every_replica_and_even() -> None:
    names = [f"entry-{i}" for i in range(3000)]
    assert entry_hash("report") == entry_hash("report")  # not Python's salted hash()
    live = live_replicas(["b", "c", "a", "c"], "a")
    assert live == ("a", "b", "c")
    first = first_replicas(names, live)
    assert set(first) == set(names)
    assert first == first_replicas(reversed(names), live)  # order of the schedule is moot
    assert Counter(first.values()) == {"a": 1000, "b": 1000, "c": 1000}
    # small schedules too: shares differ by one entry at most
    assert sorted(Counter(first_replicas(names[:5], live).values()).values()) == [1, 2, 2]
    assert set(first_replicas(names[:10], ("a",)).values()) == {"a"}


def _start(harness: Harness, replicas: list[MemoryScheduler]) -> None:
    """Give each replica its own id and run its first tick; the clock then stands
    FALLBACK after an (unclaimed) slot instant, where every round leaves it."""
    for i, replica in enumerate(replicas):
        replica.settings = replace(replica.settings, replica_id=f"r{i}")
    for replica in replicas:
        replica.tick()
    harness.clock.advance(FALLBACK)


def _round(harness: Harness, replicas: list[MemoryScheduler]) -> None:
    """One second: every replica ticks at the slot, then after the fallback delay."""
    harness.clock.advance(SECOND - FALLBACK)
    for replica in replicas:
        replica._next_sweep = 0  # refresh the live replicas now, not in 5 real seconds
        replica.tick()
    harness.clock.advance(FALLBACK)
    for replica in replicas:
        replica.tick()


def _sharing(harness: Harness, count: int) -> list[MemoryScheduler]:
    """``count`` replicas that have each won a slot, so that all see one another.

    Until a replica has won a slot the others do not know it: the rounds rotate
    who ticks first, so that each wins the entries it believes are its own."""
    replicas = [harness.replica() for _ in range(count)]
    _start(harness, replicas)
    for k in range(count):
        _round(harness, replicas[k:] + replicas[:k])
    harness.drain()
    return replicas


def _senders(harness: Harness) -> Counter[str]:
    return Counter(row.owner for row in harness.store.slot_rows() if row.state == 1)


def test_replicas_that_keep_up_split_the_slots_and_send_each_once(
    harness_for: Callable[..., Harness],  # noqa: F811
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="celery_singlebeat")
    n = 60
    harness = harness_for({f"job-{i:02d}": every(1) for i in range(n)})
    replicas = _sharing(harness, 3)
    before = _senders(harness)
    for _ in range(3):
        _round(harness, replicas)
    sent = harness.drain()
    assert len(sent) == 3 * n and len({(m.entry, m.at_us) for m in sent}) == 3 * n
    after = _senders(harness)
    shares = {r: after[r] - before[r] for r in ("r0", "r1", "r2")}
    live = ("r0", "r1", "r2")
    first = first_replicas([f"job-{i:02d}" for i in range(n)], live)
    expected = {r: 3 * sum(1 for v in first.values() if v == r) for r in live}
    assert shares == expected
    assert all(v > 0 for v in shares.values())
    assert any("sees 3 live replica(s)" in r.getMessage() for r in caplog.records)


def test_the_share_of_a_replica_that_stops_is_sent_after_the_fallback_delay(
    harness_for: Callable[..., Harness],  # noqa: F811
) -> None:
    n = 30
    harness = harness_for({f"job-{i:02d}": every(1) for i in range(n)})
    replicas = _sharing(harness, 3)
    # r2 stops (killed): at the slot the others send only their own share ...
    alive = replicas[:2]
    harness.clock.advance(SECOND - FALLBACK)
    slot_us = harness.t0_us
    for replica in alive:
        replica.tick()
    first = harness.drain()
    live = ("r0", "r1", "r2")
    split = first_replicas([f"job-{i:02d}" for i in range(n)], live)
    r2_entries = {name for name, replica in split.items() if replica == "r2"}
    assert r2_entries and {m.entry for m in first}.isdisjoint(r2_entries)
    assert all(m.at_us == slot_us for m in first)
    # ... and r2's share once the fallback delay has passed: nothing is lost
    harness.clock.advance(FALLBACK)
    for replica in alive:
        replica.tick()
    late = harness.drain()
    assert {m.entry for m in late} == r2_entries
    assert len(first) + len(late) == n
    assert all(m.at_us == slot_us for m in late)
    # Once r2's rows age out of the live window, r0 and r1 split everything.
    for _ in range(12):
        _round(harness, alive)
    harness.drain()
    assert all(r._live == ("r0", "r1") for r in alive)
    harness.clock.advance(SECOND - FALLBACK)
    for replica in alive:
        replica.tick()
    assert len(harness.drain()) == n  # at the slot, nothing left for the fallback
