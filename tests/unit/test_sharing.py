"""Work sharing: each live replica proposes its share of the entries first.

The database still decides every slot; these tests check that the work is
split among the live replicas (membership.py), that the split stays put when
entries or replicas come and go (rendezvous hashing), and that a replica that
stops is covered by the others: after the fallback delay when it dies, at the
others' next heartbeat when it stops gracefully, with every slot sent once.
"""

from __future__ import annotations

import hashlib
import logging
from collections import Counter
from collections.abc import Callable
from datetime import timedelta

import pytest
from test_scheduler import SECOND, Harness, every, harness_for  # noqa: F401

from celery_singlebeat.engine.sharing import (
    BUCKETS,
    FALLBACK_DELAY_US,
    bucket_of,
    bucket_owners,
    deal,
    entry_buckets,
    entry_hash,
    first_replicas,
    live_replicas,
    weights,
)
from celery_singlebeat.testing import MemoryScheduler
from celery_singlebeat.timeline.membership import LIVE_SLACK_US, live_within_us, replica_live

FALLBACK = timedelta(microseconds=FALLBACK_DELAY_US)
HOUR = timedelta(hours=1)


def test_the_split_is_the_same_on_every_replica_and_balanced() -> None:
    names = [f"entry-{i}" for i in range(3000)]
    assert entry_hash("report") == entry_hash("report")  # not Python's salted hash()
    live = live_replicas(["b", "c", "a", "c"], "a")
    assert live == ("a", "b", "c")
    first = first_replicas(names, live)
    assert set(first) == set(names)
    assert first == first_replicas(reversed(names), live)  # order of the schedule is moot
    assert first == deal(entry_buckets(names), live)
    # binomial: 1,000 each, standard deviation 26; five of them, no room for a bias
    assert all(abs(count - 1000) < 130 for count in Counter(first.values()).values())
    # many entries, many replicas: each share within 5% of 1/k
    many = first_replicas([f"job-{i}" for i in range(100_000)], [f"pod-{i}" for i in range(10)])
    assert all(abs(count - 10_000) < 500 for count in Counter(many.values()).values())
    assert set(first_replicas(names[:10], ("a",)).values()) == {"a"}
    assert first_replicas(names[:10], ()) == {}


def test_the_weights_are_shake_128_words_read_alike_on_every_machine() -> None:
    """The weights are a function of the replica id alone, big-endian whatever
    the host's byte order: a change here would split the work differently on
    two releases (or two architectures) of one fleet."""
    stream = hashlib.shake_128(b"pod-1").digest(BUCKETS * 8)
    words = weights("pod-1")
    assert len(words) == BUCKETS
    for bucket in (0, 1, 777, BUCKETS - 1):
        assert words[bucket] == int.from_bytes(stream[8 * bucket : 8 * bucket + 8], "big")
    assert (
        bucket_of("report")
        == int.from_bytes(hashlib.blake2b(b"report", digest_size=8).digest(), "big") % BUCKETS
    )
    # the owner of a bucket is the live replica of greatest weight for it
    live = ("pod-0", "pod-1", "pod-2")
    owners = bucket_owners(live)
    for bucket in (0, 5, 4242, BUCKETS - 1):
        assert owners[bucket] == max(live, key=lambda r: weights(r)[bucket])


def _moved(before: dict[str, str], after: dict[str, str]) -> set[str]:
    return {name for name in before.keys() & after.keys() if before[name] != after[name]}


def test_an_entry_added_or_removed_moves_no_other_entry() -> None:
    names = [f"entry-{i}" for i in range(1000)]
    live = ("r0", "r1", "r2")
    first = first_replicas(names, live)
    assert not _moved(first, first_replicas([*names, "entry-new"], live))
    assert not _moved(first, first_replicas(names[:500] + names[501:], live))
    assert not _moved(first, first_replicas(names[::2], live))  # half of them gone


def test_a_replica_that_joins_or_leaves_moves_only_its_own_share() -> None:
    names = [f"entry-{i}" for i in range(1000)]
    three = first_replicas(names, ("r0", "r1", "r2"))
    four = first_replicas(names, ("r0", "r1", "r2", "r3"))
    joined = _moved(three, four)
    assert joined == {name for name, replica in four.items() if replica == "r3"}
    assert 150 < len(joined) < 350  # about a quarter: what r3 takes, nothing else
    two = first_replicas(names, ("r0", "r2"))
    left = _moved(three, two)
    assert left == {name for name, replica in three.items() if replica == "r1"}
    assert all(two[name] == three[name] for name in names if three[name] != "r1")


def test_the_rule_of_a_live_replica() -> None:
    """Seen within three of its heartbeats plus 2 s, and not stopped."""
    beat = 5 * SECOND_US
    assert live_within_us(beat) == 3 * beat + LIVE_SLACK_US == 17 * SECOND_US
    now = 10**15
    assert replica_live(now - live_within_us(beat), beat, None, now)
    assert not replica_live(now - live_within_us(beat) - 1, beat, None, now)  # paused, lost
    assert not replica_live(now, beat, now, now)  # stopped gracefully: at once
    assert replica_live(now - 3 * SECOND_US, SECOND_US // 2, None, now)  # its own period
    assert not replica_live(now - 4 * SECOND_US, SECOND_US // 2, None, now)


SECOND_US = 1_000_000


def _start(harness: Harness, replicas: list[MemoryScheduler]) -> None:
    """Run each replica's first tick (each has its own id, r0, r1, ...); the clock then stands
    FALLBACK after an (unclaimed) slot instant, where every round leaves it."""
    for replica in replicas:
        replica.tick()
    harness.clock.advance(FALLBACK)


def _round(harness: Harness, replicas: list[MemoryScheduler]) -> None:
    """One second: every replica ticks at the slot, then after the fallback delay."""
    harness.clock.advance(SECOND - FALLBACK)
    for replica in replicas:
        replica.engine.sweep_now()  # refresh the live replicas now, not in 5 real seconds
        replica.tick()
    harness.clock.advance(FALLBACK)
    for replica in replicas:
        replica.tick()


def _sharing(harness: Harness, count: int) -> list[MemoryScheduler]:
    """``count`` replicas that have each sent a heartbeat, so that all see one
    another (the first to start saw only itself at its first tick)."""
    replicas = [harness.replica(replica_id=f"r{i}") for i in range(count)]
    _start(harness, replicas)
    _round(harness, replicas)
    harness.drain()
    assert all(len(r.engine.live) == count for r in replicas)
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
    # Once r2's heartbeat row ages out (3 heartbeats + 2 s: 17 s at the
    # default lease), r0 and r1 split everything.
    for _ in range(16):
        _round(harness, alive)
        assert all(r.engine.live == ("r0", "r1", "r2") for r in alive)
    for _ in range(2):
        _round(harness, alive)
    harness.drain()
    assert all(r.engine.live == ("r0", "r1") for r in alive)
    harness.clock.advance(SECOND - FALLBACK)
    for replica in alive:
        replica.tick()
    assert len(harness.drain()) == n  # at the slot, nothing left for the fallback


def test_a_sparse_schedule_still_shares_among_the_live_replicas(
    harness_for: Callable[..., Harness],  # noqa: F811
) -> None:
    """Entries due once an hour: no replica wins a slot for an hour, yet each
    heartbeat shows the others live, so each sends its own share at the slot.
    (Sharing among the owners of recent slot rows saw every replica alone here:
    whoever woke first sent every slot.)"""
    n = 12
    names = [f"hourly-{i:02d}" for i in range(n)]
    harness = harness_for({name: every(3600) for name in names})
    replicas = [harness.replica(replica_id=f"r{i}") for i in range(3)]
    _start(harness, replicas)
    for replica in replicas:
        replica.engine.sweep_now()
        replica.tick()  # a heartbeat each, minutes before anything is due
    live = ("r0", "r1", "r2")
    assert all(r.engine.live == live for r in replicas)
    split = first_replicas(names, live)
    assert set(split.values()) == set(live)  # 12 entries: each replica has some
    harness.clock.advance(HOUR - FALLBACK)  # the hourly slot, due now
    for replica in replicas:  # r0 wakes first, and claims only its own share
        replica.engine.next_sweep = 1e18  # no further heartbeat needed
        replica.tick()
    sent = harness.drain()
    assert len(sent) == n and all(m.at_us == sent[0].at_us for m in sent)
    senders = {row.entry: row.owner for row in harness.store.slot_rows() if row.state == 1}
    assert senders == split


def test_a_gracefully_stopped_replica_hands_its_share_over_at_the_next_heartbeat(
    harness_for: Callable[..., Harness],  # noqa: F811
) -> None:
    """``close`` marks the row stopped: at their next heartbeat the others split
    its entries, which then leave at the slot, not the fallback delay later,
    although its last slot rows and heartbeat are only a second old."""
    n = 30
    names = [f"job-{i:02d}" for i in range(n)]
    harness = harness_for({name: every(1) for name in names})
    replicas = _sharing(harness, 3)
    r2_share = {name for name, r in first_replicas(names, ("r0", "r1", "r2")).items() if r == "r2"}
    assert r2_share
    replicas[2].close()
    alive = replicas[:2]
    harness.clock.advance(SECOND - FALLBACK)
    for replica in alive:
        replica.engine.sweep_now()  # their next heartbeat
        replica.tick()
    assert all(r.engine.live == ("r0", "r1") for r in alive)
    sent = harness.drain()
    assert sorted(m.entry for m in sent) == names  # every slot at once, r2's too
    assert len({m.at_us for m in sent}) == 1
    senders = {row.entry: row.owner for row in harness.store.slot_rows() if row.state == 1}
    assert {senders[name] for name in r2_share} <= {"r0", "r1"}


def test_a_replica_counts_itself_before_its_row_is_read_and_a_paused_one_is_dropped(
    harness_for: Callable[..., Harness],  # noqa: F811
) -> None:
    harness = harness_for({f"job-{i}": every(1) for i in range(6)})
    replicas = [harness.replica(replica_id=f"r{i}") for i in range(2)]
    _start(harness, replicas)
    assert replicas[0].engine.live == ("r0",)  # its first heartbeat: only itself
    # r1 stops ticking (SIGSTOP): r0 drops it once its row is older than
    # 3 heartbeats + 2 s (17 s), and not before. The clock stands 0.25 s after
    # r1's heartbeat: 16 s later r1 is still live, 17 s later not any more.
    assert live_within_us(round(replicas[1].engine.sweep_every * SECOND_US)) == 17 * SECOND_US
    for _ in range(16):
        harness.clock.advance(SECOND)
        replicas[0].engine.sweep_now()
        replicas[0].tick()
        assert replicas[0].engine.live == ("r0", "r1")
    harness.clock.advance(SECOND)
    replicas[0].engine.sweep_now()
    replicas[0].tick()
    assert replicas[0].engine.live == ("r0",)
    # and once it resumes, its own first heartbeat counts it live again
    replicas[1].engine.sweep_now()
    replicas[1].tick()
    assert replicas[1].engine.live == ("r0", "r1")
