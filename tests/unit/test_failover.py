"""A failover to a standby that lagged: the replicas write back what it lost.

Three replicas share the memory store and split 60 entries (test_sharing's
rounds). Each sends its share of a slot; then the store forgets every write
since just before it (``MemoryStore.lose_writes``: what a promoted standby
lacks) and counts a broken connection. The replicas then tick in an order in
which the others' fallback proposals come first: without the journal they win
the lost slots again and send them twice; with it, nothing is sent twice and
nothing is lost.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable
from datetime import timedelta

import pytest
from test_scheduler import (  # noqa: F401
    SECOND,
    Harness,
    _published_then_unconfirmed,
    every,
    harness_for,
    monotonic_shift,
)
from test_sharing import FALLBACK, _round, _sharing

from celery_singlebeat.store.base import Claim, SlotKey
from celery_singlebeat.store.journal import SentJournal, hold_seconds
from celery_singlebeat.testing import MemoryScheduler, MemoryStore

ENTRIES = 60


def _fail_over(
    harness: Harness, replicas: list[MemoryScheduler], shift: list[float]
) -> Counter[tuple[str, int]]:
    """One slot sent, its writes lost, then the fleet ticks on past the hold:
    how many times each (entry, slot) of that slot and the next reached the broker."""
    harness.clock.advance(SECOND - FALLBACK)
    slot_us = harness.t0_us
    for replica in replicas:
        replica.tick()  # each sends its share of the slot
    harness.store.lose_writes(slot_us - 1)
    harness.clock.advance(FALLBACK)
    for replica in replicas[1:] + replicas[:1]:  # the fallbacks of r0's share first
        replica.tick()
    # past the hold: every replica has written its own again, the fallbacks go on
    shift[0] += hold_seconds(replicas[0].engine.sweep_every) + 0.1
    _round(harness, replicas)
    return Counter((m.entry, m.at_us) for m in harness.drain() if m.at_us <= slot_us + 1_000_000)


def test_the_slots_a_failover_lost_are_written_again_not_sent_twice(
    harness_for: Callable[..., Harness],  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    harness = harness_for({f"job-{i:02d}": every(1) for i in range(ENTRIES)})
    shift = monotonic_shift(harness)
    replicas = _sharing(harness, 3)
    caplog.set_level(logging.ERROR, logger="celery_singlebeat")
    sent = _fail_over(harness, replicas, shift)
    assert len(sent) == 2 * ENTRIES  # the lost slot and the next: none lost
    assert max(sent.values()) == 1, [key for key, n in sent.items() if n > 1]
    # each replica wrote back its own share and said so once, at ERROR
    lost = sum(r.stats["lost_writes"] for r in replicas)
    assert lost == ENTRIES
    errors = [r for r in caplog.records if getattr(r, "decision", None) == "lost_writes"]
    assert len(errors) == 3
    assert all(
        "a failover to a standby that had not received them" in r.getMessage() for r in errors
    )
    assert sorted(r.count for r in errors) == sorted(r.stats["lost_writes"] for r in replicas)
    rows = {(row.entry, row.slot_us): row for row in harness.store.slot_rows()}
    assert all(row.state == 1 for row in rows.values())


def test_without_the_journal_the_fallbacks_send_the_lost_slots_again(
    harness_for: Callable[..., Harness],  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The control: the same failover with singlebeat_failover_window = 0."""
    harness = harness_for(
        {f"job-{i:02d}": every(1) for i in range(ENTRIES)}, singlebeat_failover_window=0
    )
    shift = monotonic_shift(harness)
    replicas = _sharing(harness, 3)
    sent = _fail_over(harness, replicas, shift)
    assert len(sent) == 2 * ENTRIES
    doubled = [key for key, n in sent.items() if n > 1]
    # r0's share, proposed again by the fallbacks that ticked before it
    assert doubled and all(n <= 2 for n in sent.values())
    assert sum(r.stats["lost_writes"] for r in replicas) == 0


def test_the_journal_keeps_the_window_before_the_last_confirm() -> None:
    journal = SentJournal(10.0)
    journal.add([Claim("a", 1, 1)], at=100.0)
    journal.add([Claim("b", 2, 1), Claim("c", 2, 1)], at=105.0)
    assert len(journal) == 3
    journal.add([Claim("d", 3, 1)], at=112.0)  # a's batch is now older than 10 s
    assert journal.recent() == [Claim("b", 2, 1), Claim("c", 2, 1), Claim("d", 3, 1)]
    # however long the outage after it: the window is measured from the last confirm
    assert len(journal.recent()) == 3
    off = SentJournal(0)
    off.add([Claim("a", 1, 1)], at=1.0)
    assert off.recent() == [] and len(off) == 0


def _dead_replicas_share(
    harness_for: Callable[..., Harness],  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    policy: str,
) -> tuple[Harness, list[float], list[MemoryScheduler], set[str], int]:
    """Three replicas sharing the entries, a grace (5 s) shorter than the hold
    (7 s): the harness, the monotonic shift, the replicas, r0's share (the
    entries it proposes first), about to lose r0, and the instant now."""
    harness = harness_for(
        {f"job-{i:02d}": every(1) for i in range(ENTRIES)},
        singlebeat_missed_policy=policy,
        singlebeat_missed_grace=5,
    )
    shift = monotonic_shift(harness)
    replicas = _sharing(harness, 3)
    share = {name for name, tracked in replicas[0].engine.tracked.items() if tracked.first}
    assert share and hold_seconds(replicas[1].engine.sweep_every) > 5
    caplog.set_level(logging.WARNING, logger="celery_singlebeat")
    return harness, shift, replicas, share, harness.t0_us


def _rounds(harness: Harness, shift: list[float], replicas: list[MemoryScheduler], n: int) -> None:
    """``n`` seconds of r1 and r2 ticking; r0 ticks no more."""
    for _ in range(n):
        shift[0] += 1.0
        _round(harness, replicas[1:])


def _assert_share_sent_once(
    harness: Harness,
    replicas: list[MemoryScheduler],
    share: set[str],
    start_us: int,
    slots: int,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """r0's share: ``slots`` slots of each entry after ``start_us`` sent, nothing
    sent twice, and none dropped as missed."""
    sent = Counter((m.entry, m.at_us) for m in harness.drain())
    for entry in sorted(share):
        got = [at for (name, at) in sent if name == entry and at > start_us]
        assert len(got) == slots, (entry, len(got))
    assert max(sent.values()) == 1
    assert not [r for r in caplog.records if "missed slot(s)" in r.getMessage()]
    assert sum(r.stats.get("skipped", 0) for r in replicas) == 0


@pytest.mark.parametrize("policy", ["skip", "coalesce"])
def test_a_dead_replicas_share_held_past_the_grace_is_sent_not_dropped(
    harness_for: Callable[..., Harness],  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    policy: str,
) -> None:
    """r0 stops (killed, or paused) while its row still looks live, and the
    connection breaks (a failover, a restart). Only the others' fallbacks
    propose r0's share, and they are held for a sweep + 2 s (7 s), longer
    than the grace (5 s). When the hold ends, the slots it delayed are judged
    as of its start: every one of them is sent, once; none is dropped as
    missed."""
    harness, shift, replicas, share, start_us = _dead_replicas_share(
        harness_for, monkeypatch, caplog, policy
    )
    harness.store.lose_writes(harness.store._now_us())  # a broken connection, nothing lost
    rounds = int(hold_seconds(replicas[1].engine.sweep_every)) + 3
    _rounds(harness, shift, replicas, rounds)
    _assert_share_sent_once(harness, replicas, share, start_us, rounds, caplog)


def test_a_share_dealt_anew_during_the_hold_is_judged_as_of_its_start(
    harness_for: Callable[..., Harness],  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """r0 dies; its share goes out through the others' fallbacks. Then the
    connection breaks and the fallbacks are held (7 s). While they are, r0's
    heartbeat row stops being live (3 heartbeats + 2 s: 17 s), the entries are
    dealt out anew and r0's share moves to the entries r1 and r2 propose first,
    which no hold delays. The slots the hold kept back are judged as of its
    start there too: none is dropped as missed for a delay of our own."""
    harness, shift, replicas, share, start_us = _dead_replicas_share(
        harness_for, monkeypatch, caplog, "coalesce"
    )
    # r0 is dead: the fallbacks send its share. Its row stops being live 17 s
    # after its last heartbeat: 11 s here, 6 s into the 7 s hold, more than
    # the grace (5 s) after the hold began
    before = 11
    _rounds(harness, shift, replicas, before)
    harness.store.lose_writes(harness.store._now_us())  # a broken connection, nothing lost
    rounds = int(hold_seconds(replicas[1].engine.sweep_every)) + 3
    _rounds(harness, shift, replicas, rounds)
    # dealt anew during the hold: r1 and r2 now propose r0's share first
    r1, r2 = replicas[1].engine.tracked, replicas[2].engine.tracked
    assert all(r1[name].first != r2[name].first for name in share)
    _assert_share_sent_once(harness, replicas, share, start_us, before + rounds, caplog)


def test_a_confirm_cut_off_by_the_break_is_written_but_not_counted_as_lost(
    harness_for: Callable[..., Harness],  # noqa: F811
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The connection breaks during the confirm of two published slots: the
    database never acknowledged them, so the write-back after the reconnect
    records them (the confirm's retry) without the failover alarm, which is
    for acknowledged writes the database no longer has."""
    caplog.set_level(logging.INFO, logger="celery_singlebeat")
    harness = harness_for({"a": every(1), "b": every(1)})
    store, replica, pending = _published_then_unconfirmed(harness)
    store.interruptions += 1  # the confirm's connection broke
    harness.clock.advance(SECOND)
    replica.tick()
    states = {SlotKey(r.entry, r.slot_us): r.state for r in store.slot_rows()}
    assert [states.get(key) for key in pending] == [1, 1]
    assert replica.stats["lost_writes"] == 0
    assert not [r for r in caplog.records if getattr(r, "decision", None) == "lost_writes"]
    assert [r for r in caplog.records if "reconnected to the database" in r.getMessage()]


@pytest.mark.parametrize("policy", ["skip", "coalesce"])
def test_slots_a_hold_kept_back_stay_on_time_after_an_outage_that_cut_it_short(
    harness_for: Callable[..., Harness],  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    policy: str,
) -> None:
    """The chaos run's seeds 2 and 6: r0 dies (killed, or paused right after
    a claim) just after a database restart started the others' hold (7 s), so
    only their held fallbacks would propose its share; 2 s into the hold the
    database goes away for 30 s. The slots of r0's share that the hold kept
    back while the database still answered were delayed by the hold, not by
    the outage: they are judged as of that hold's start after the outage too,
    and sent once. (Judged as of the reconnect, the missed-run policy dropped
    them: no slot row was ever written.) The slots that fell due while the
    database was away are the policy's, as after any outage."""
    harness, shift, replicas, share, start_us = _dead_replicas_share(
        harness_for, monkeypatch, caplog, policy
    )
    harness.store.lose_writes(harness.store._now_us())  # a restart: nothing lost
    held = 2
    _rounds(harness, shift, replicas, held)
    assert not [m for m in harness.drain() if m.entry in share]  # held, not sent
    outage = 30
    with harness.store.outage():
        _rounds(harness, shift, replicas, outage)
    assert all(r.engine.outage.since is not None for r in replicas[1:])
    rounds = int(hold_seconds(replicas[1].engine.sweep_every)) + 3
    _rounds(harness, shift, replicas, rounds)
    sent = Counter((m.entry, m.at_us) for m in harness.drain())
    assert max(sent.values()) == 1
    period = SECOND // timedelta(microseconds=1)
    first_us = start_us - FALLBACK // timedelta(microseconds=1) + period
    kept = [first_us + k * period for k in range(held)]
    for entry in sorted(share):
        assert [sent[(entry, at)] for at in kept] == [1] * held, entry
    # the outage's slots older than the grace when sending resumed: the policy's
    back_us = first_us + (held + outage) * period
    gone = [at for at in range(first_us + (held + 1) * period, back_us - 6 * period, period)]
    for entry in sorted(share):
        assert not [at for at in gone if (entry, at) in sent], entry


def test_a_claim_the_failover_lost_whose_claimer_stopped_is_sent_by_another_replica(
    harness_for: Callable[..., Harness],  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The chaos run's seed 8 (issue 30): r0 claims its share of a slot and
    stops (killed, or paused) before it publishes; the fallbacks lose the
    slot to its claims. A failover to a standby that lacked those rows
    follows: r0 cannot write them back, and every replica has planned past
    the slot, so nobody proposed it again. Now r1 and r2 propose again, when
    their hold ends, the slots they saw another replica win: r0's are won and
    sent, once each; their own, written back, are refused."""
    harness, shift, replicas, share, _ = _dead_replicas_share(
        harness_for, monkeypatch, caplog, "coalesce"
    )
    r0, others = replicas[0], replicas[1:]
    harness.clock.advance(SECOND - FALLBACK)
    slot_us = harness.t0_us
    lease_us = r0.settings.lease_us
    claimed = harness.store.claim("r0", [SlotKey(name, slot_us) for name in share], lease_us)
    assert len(claimed) == len(share)  # r0's claims; it stops before it publishes
    for replica in others:
        replica.tick()  # their own shares, sent
    harness.clock.advance(FALLBACK)
    for replica in others:
        replica.tick()  # r0's share as fallbacks: lost to its claims
    assert harness.store.lose_writes(slot_us - 1) >= len(share)
    rounds = int(hold_seconds(others[0].engine.sweep_every)) + 3
    _rounds(harness, shift, replicas, rounds)
    sent = Counter((m.entry, m.at_us) for m in harness.drain())
    assert max(sent.values()) == 1, [key for key, n in sent.items() if n > 1]
    at_slot = {entry for entry, at in sent if at == slot_us}
    missing = sorted(share - at_slot)
    assert not missing, f"{len(missing)} slots of r0's lost claims never sent: {missing[:5]}"
    assert len(at_slot) == ENTRIES
    assert sum(r.stats["recovered"] for r in others) == len(share)
    said = [r for r in caplog.records if getattr(r, "decision", None) == "recovered"]
    assert said and sum(r.count for r in said) == len(share)
    assert all("the database no longer has their claims" in r.getMessage() for r in said)


def test_a_lagging_standby_has_a_row_inserted_before_its_cut_as_it_was_then() -> None:
    """The memory store's failover is the standby's view, row by row: a slot
    claimed before the cut and taken over, released and taken again after it
    is there at its first fence and lease, not gone; a slot first claimed
    after the cut is gone. (The explorer's seeds 1322 and 2496: the old model
    dropped the whole row, a state no database is in, and the slot was lost
    with it.)"""
    US = 1_000_000
    now = [1_000 * US]
    store = MemoryStore(lambda: now[0])
    store.prepare(True)
    store.register(["a"])
    early, late = SlotKey("a", now[0] - US), SlotKey("a", now[0] + US)
    (first,) = store.claim("r1", [early], 3 * US)
    before = store.slot_rows()
    cut_us = now[0]
    now[0] += 4 * US  # the lease runs out
    assert [c.fence for c in store.take_over("r2", 3 * US, 10)] == [2]
    store.release("r2", [Claim("a", early.slot_us, 2)])
    assert [c.fence for c in store.take_over("r3", 3 * US, 10)] == [3]
    assert store.claim("r3", [late], 3 * US)
    assert store.lose_writes(cut_us) == 2
    assert store.slot_rows() == before
    assert first.fence == 1
    # the standby's row is abandoned by now: the next takeover has it, once
    assert [c.fence for c in store.take_over("r2", 3 * US, 10)] == [2]
