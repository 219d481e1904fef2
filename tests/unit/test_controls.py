# ruff: noqa: F811 - the shared fixtures are imported, then named as parameters
"""Pause, resume and run-now as the scheduler honours them, on the in-memory store.

The operator's writes are the memory store's helpers (``pause``, ``resume``,
``request_run``: what the CLI writes in SQL); the replicas are the real
scheduler loop, their messages read back from kombu's memory broker.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import timedelta

import pytest
from test_scheduler import TASK, Harness, every, harness_for, monotonic_shift  # noqa: F401

from celery_singlebeat import Schedules
from celery_singlebeat.engine.controls import PROBE_EVERY_S, PROBE_WAIT_S
from celery_singlebeat.engine.feed import BACKSTOP_S, READ_EVERY_S, Feed
from celery_singlebeat.engine.sharing import FALLBACK_DELAY_US
from celery_singlebeat.store.base import PAUSE_ALL, ControlListener
from celery_singlebeat.testing import MemoryScheduler
from celery_singlebeat.timeline.clock import US
from celery_singlebeat.timeline.slots import slot_task_id

SECOND = timedelta(seconds=1)
FALLBACK = timedelta(microseconds=FALLBACK_DELAY_US)


def run(
    harness: Harness,
    replicas: list,
    seconds: int,
    shift: list[float] | None = None,  # type: ignore[type-arg]
    fallback: bool = False,
) -> list:  # type: ignore[type-arg]
    """Tick every replica once per second of fake time (and of the monotonic
    clock the sweeps follow, when ``shift`` is given); the messages sent.

    With ``fallback``, the replicas tick at each second and again
    FALLBACK_DELAY_US after it, as the loop wakes for the slots another live
    replica proposes first: every proposal of a slot is then made in its own
    second, before whatever the test does next."""
    sent = []
    for _ in range(seconds):
        harness.clock.advance(SECOND - FALLBACK if fallback else SECOND)
        if shift is not None:
            shift[0] += 1.0
        for replica in replicas:
            replica.tick()
        if fallback:
            harness.clock.advance(FALLBACK)
            for replica in replicas:
                replica.tick()
        sent.extend(harness.drain())
    return sent


def test_a_paused_entry_is_sent_by_no_replica_and_resumes_on_time_without_catch_up(
    harness_for: Callable[..., Harness],
) -> None:
    """The replicas see one another live (their heartbeats): one proposes "a"
    at its instant, the others 250 ms later, and they tick at both instants
    (``fallback``), so that every proposal of a paused slot is refused before
    the resume. (A slot due less than 250 ms before a resume may still go
    out: docs/guarantees.md.)"""
    harness = harness_for({"a": every(1), "b": every(1)})
    replicas = [harness.replica(), harness.replica(), harness.replica()]
    before = run(harness, replicas, 3, fallback=True)
    assert {m.entry for m in before} == {"a", "b"}
    harness.store.pause("a", by="ops")
    paused_from = harness.store.ping()
    during = run(harness, replicas, 5, fallback=True)
    assert [m for m in during if m.entry == "a"] == []
    assert len([m for m in during if m.entry == "b"]) == 5
    # refusals of a paused entry are counted as paused, not lost to another replica
    assert sum(r.stats["paused"] for r in replicas) >= 1
    harness.store.resume("a")
    resumed_at = harness.store.ping()
    after = run(harness, replicas, 3, fallback=True)
    a_slots = sorted(m.at_us for m in after if m.entry == "a")
    # the next slot after the resume goes out at its tick; the paused span is not caught up
    assert len(a_slots) == 3
    assert a_slots[0] > resumed_at and a_slots[0] <= resumed_at + US
    assert not any(paused_from < at <= resumed_at for at in a_slots)
    for replica in replicas:
        replica.close()


def test_pausing_every_entry_and_a_pause_that_ends_by_itself(
    harness_for: Callable[..., Harness],
) -> None:
    harness = harness_for({"a": every(1), "b": every(1)})
    replicas = [harness.replica(), harness.replica()]
    run(harness, replicas, 2)
    harness.store.pause(PAUSE_ALL, until_us=harness.store.ping() + 3 * US + US // 2)
    sent = run(harness, replicas, 6)
    # 3 s paused, then both entries again at every tick
    assert sorted({m.entry for m in sent}) == ["a", "b"]
    assert len(sent) == 2 * 3
    for replica in replicas:
        replica.close()


def test_run_now_sends_one_extra_message_with_its_own_task_id_and_slot_header(
    harness_for: Callable[..., Harness], monkeypatch: pytest.MonkeyPatch
) -> None:
    harness = harness_for({"hourly": every(3600, priority=3)})
    shift = monotonic_shift(harness)
    replicas = [harness.replica(), harness.replica(), harness.replica()]
    run(harness, replicas, 1, shift)
    assert harness.drain() == []
    key = harness.store.request_run("hourly")
    # the request is an abandoned row: the first sweep of any replica (every
    # lease/3 = 5 s here, sooner when a statement reads the control change) takes it
    sent = run(harness, replicas, 6, shift)
    assert [(m.entry, m.at_us) for m in sent] == [(key.entry, key.slot_us)]
    message = sent[0]
    assert message.task_id == slot_task_id("hourly", key.slot_us)
    assert message.properties.get("priority") == 3
    assert message.headers["singlebeat_slot"]["at_us"] == key.slot_us
    assert run(harness, replicas, 20, shift) == []
    for replica in replicas:
        replica.close()


def test_replica_rows_record_each_replica_and_a_graceful_stop(
    harness_for: Callable[..., Harness], monkeypatch: pytest.MonkeyPatch
) -> None:
    harness = harness_for({"a": every(1), "b": every(2)})
    shift = monotonic_shift(harness)
    replicas = [harness.replica(), harness.replica()]
    # a few heartbeats: the first records the share each replica had before it
    # saw the other (both proposing everything first)
    run(harness, replicas, 12, shift)
    rows = harness.store.replica_rows()
    assert set(rows) == {r.settings.replica_id for r in replicas}
    for replica in replicas:
        row = rows[replica.settings.replica_id]
        assert row["tracked"] == 2 and row["stopped_us"] is None
        assert row["version"] and row["pid"] > 0
        assert sorted(harness.store.catalog_of(replica.settings.replica_id)) == ["a", "b"]
    # every entry is proposed first by some replica (views may differ for a sweep)
    firsts = [rows[r.settings.replica_id]["proposes_first"] for r in replicas]
    assert all(0 <= f <= 2 for f in firsts) and sum(firsts) >= 2
    replicas[0].close()
    assert harness.store.replica_rows()[replicas[0].settings.replica_id]["stopped_us"] is not None
    replicas[1].close()


def test_an_idle_sweep_with_no_claimed_row_anywhere_skips_the_takeover(
    harness_for: Callable[..., Harness], monkeypatch: pytest.MonkeyPatch
) -> None:
    harness = harness_for({"hourly": every(3600)})
    shift = monotonic_shift(harness)
    replica = harness.replica()
    run(harness, [replica], 1, shift)
    taken: list[int] = []
    real = harness.store.take_over

    def counting(*args: object, **kwargs: object) -> list:  # type: ignore[type-arg]
        taken.append(1)
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(harness.store, "take_over", counting)
    beats: list[int] = []
    real_beat = harness.store.heartbeat

    def beating(*args: object, **kwargs: object) -> list:  # type: ignore[type-arg]
        beats.append(1)
        return real_beat(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(harness.store, "heartbeat", beating)
    before = harness.store.round_trips
    reads = replica.engine.feed.reads
    run(harness, [replica], 30, shift)  # a sweep every lease/3 = 5 s, or a read sooner
    assert taken == []
    # one heartbeat a sweep (6 or 7: a sweep due before the next feed read comes
    # at the read), and the feed read of about every second between them
    feed_reads = replica.engine.feed.reads - reads
    assert 6 <= len(beats) <= 7, len(beats)
    assert 20 <= feed_reads <= 26, feed_reads
    assert harness.store.round_trips - before == len(beats) + feed_reads
    # a claimed row anywhere (here: a run-now request) and the sweep takes over
    harness.store.request_run("hourly")
    sent = run(harness, [replica], 6, shift)
    assert taken and [m.entry for m in sent] == ["hourly"]
    replica.close()


# -- the listening channel, proven by probes ----------------------------------


class FakeListener(ControlListener):
    """A listening channel whose probes come back (``hears``) or never do
    (a pooler in transaction mode); ``changes`` are control changes to report."""

    def __init__(self, hears: bool) -> None:
        self.hears = hears
        self.probes = 0
        self.closed = False
        self.changes = 0
        self._pending = False
        self._heard = False

    def poll(self) -> bool:
        if self._pending and self.hears:
            self._pending, self._heard = False, True
        changed, self.changes = self.changes > 0, 0
        return changed

    def close(self) -> None:
        self.closed = True

    def probe(self) -> None:
        self.probes += 1
        self._pending, self._heard = True, False

    @property
    def probe_heard(self) -> bool:
        return self._heard


def listening_replica(
    harness: Harness, listeners: list[FakeListener], hears: list[bool]
) -> MemoryScheduler:
    """A replica whose store opens a FakeListener for each ``listen()``, hearing
    or deaf in the order of ``hears``."""

    def listen() -> FakeListener:
        listener = FakeListener(hears[len(listeners)])
        listeners.append(listener)
        return listener

    harness.store.listen = listen  # type: ignore[method-assign]
    return harness.replica()


def tick_for(replica: MemoryScheduler, shift: list[float], seconds: float, step: float) -> None:
    for _ in range(round(seconds / step)):
        shift[0] += step
        replica.tick()


def test_a_channel_whose_probe_never_comes_back_is_dropped_for_the_feed_read(
    harness_for: Callable[..., Harness], caplog: pytest.LogCaptureFixture
) -> None:
    """Behind PgBouncer in transaction mode a LISTEN succeeds and nothing ever
    arrives: the replica's first probe does not come back within
    PROBE_WAIT_S, so it closes the channel, stops listening (a warning says
    why and names the setting) and reads the feed every READ_EVERY_S, not every
    BACKSTOP_S."""
    caplog.set_level(logging.INFO, logger="celery_singlebeat")
    harness = harness_for({"rare": every(3600)})
    shift = monotonic_shift(harness)
    listeners: list[FakeListener] = []
    replica = listening_replica(harness, listeners, [False])
    engine = replica.engine
    replica.tick()
    (deaf,) = listeners
    assert engine.feed.every() == BACKSTOP_S and deaf.probes == 1
    tick_for(replica, shift, PROBE_WAIT_S - 0.5, 0.25)
    assert not deaf.closed, "judged deaf before the probe's time was up"
    tick_for(replica, shift, 1.0, 0.25)
    assert deaf.closed and engine.controls.listener is None
    assert not engine.controls.listening
    assert "hears nothing" in caplog.text and "singlebeat_listen = False" in caplog.text
    assert engine.feed.every() == READ_EVERY_S
    reads = engine.feed.reads
    tick_for(replica, shift, 10 * READ_EVERY_S, 0.05)
    # about one a READ_EVERY_S, less the sweeps' heartbeats that read for it
    # (every BACKSTOP_S there would be 2)
    assert engine.feed.reads - reads >= 7
    assert engine.feed.next_read - engine.feed.last_read == pytest.approx(READ_EVERY_S)
    assert len(listeners) == 1, "a deaf channel was opened again"


def test_a_channel_that_hears_its_probes_is_kept_and_proven_every_minute(
    harness_for: Callable[..., Harness],
) -> None:
    harness = harness_for({"rare": every(3600)})
    shift = monotonic_shift(harness)
    listeners: list[FakeListener] = []
    replica = listening_replica(harness, listeners, [True])
    replica.tick()
    (good,) = listeners
    tick_for(replica, shift, 3 * PROBE_EVERY_S + 3, 0.5)
    assert not good.closed and replica.engine.controls.listener is good
    assert good.probes == 4  # at the start, then once a PROBE_EVERY_S
    assert replica.engine.feed.every() == BACKSTOP_S
    # a control change it hears makes the next tick read the versions at once
    # (by a read, or by a sweep's heartbeat), not at the next backstop read
    feed = replica.engine.feed
    last = feed.last_read
    while feed.last_read == last:  # just after a periodic read or sweep
        tick_for(replica, shift, 0.01, 0.01)
    last = feed.last_read
    good.changes = 1
    tick_for(replica, shift, 0.01, 0.01)
    assert feed.last_read is not None and last is not None and feed.last_read > last


def test_a_channel_that_went_deaf_later_is_opened_again(
    harness_for: Callable[..., Harness], caplog: pytest.LogCaptureFixture
) -> None:
    """A channel that heard its probes and then stopped (a middlebox forgot the
    connection) is closed and opened again at the next sweep; listening goes on."""
    caplog.set_level(logging.INFO, logger="celery_singlebeat")
    harness = harness_for({"rare": every(3600)})
    shift = monotonic_shift(harness)
    listeners: list[FakeListener] = []
    replica = listening_replica(harness, listeners, [True, True])
    replica.tick()
    first = listeners[0]
    tick_for(replica, shift, 1.0, 0.25)
    first.hears = False
    tick_for(replica, shift, PROBE_EVERY_S + PROBE_WAIT_S + replica.engine.ctx.sweep_every, 0.5)
    assert first.closed and "stopped hearing" in caplog.text
    assert len(listeners) == 2 and replica.engine.controls.listener is listeners[1]
    assert replica.engine.controls.listening


# -- a listener that hears its probes but misses the changes ------------------

DEAF = "heard no notification for a change"
HEARS_AGAIN = "hears the changes' notifications again"


def edit_seen_after(
    replica: MemoryScheduler, shift: list[float], schedules: Schedules, name: str, step: float
) -> float:
    """Add a stored entry, tick until the replica tracks it; the seconds that took."""
    schedules.upsert(name, TASK, timedelta(hours=1))
    start = shift[0]
    while name not in replica.engine.tracked:
        assert shift[0] - start < 2 * BACKSTOP_S, f"{name} never seen"
        tick_for(replica, shift, step, step)
    return shift[0] - start


def just_after_a_read(replica: MemoryScheduler, shift: list[float]) -> None:
    """Tick until a read (the feed's or a heartbeat) has just been made."""
    feed = replica.engine.feed
    last = feed.last_read
    while feed.last_read == last:
        tick_for(replica, shift, 0.01, 0.01)


def _proven_listener(
    harness_for: Callable[..., Harness], caplog: pytest.LogCaptureFixture
) -> tuple[Harness, list[float], MemoryScheduler, FakeListener, Feed, Schedules]:
    """One listening replica whose channel proved itself (its probe came
    back), an hourly entry, and the API over its store."""
    caplog.set_level(logging.INFO, logger="celery_singlebeat")
    harness = harness_for({"rare": every(3600)})
    shift = monotonic_shift(harness)
    listeners: list[FakeListener] = []
    replica = listening_replica(harness, listeners, [True])
    replica.tick()
    (listener,) = listeners
    schedules = Schedules(store=harness.store, by="test")
    tick_for(replica, shift, PROBE_WAIT_S, 0.25)
    return harness, shift, replica, listener, replica.engine.feed, schedules


def test_a_listener_deaf_to_changes_is_found_out_and_the_feed_read_every_period(
    harness_for: Callable[..., Harness], caplog: pytest.LogCaptureFixture
) -> None:
    """Its probes come back, yet no edit is ever heard (or it went deaf between
    two probes): the first edit is read at the backstop, the move with nothing
    heard makes the replica read every READ_EVERY_S, saying so once, and every
    later edit takes effect within READ_EVERY_S. A notification heard again
    brings the backstop back, said once too."""
    _, shift, replica, deafish, feed, schedules = _proven_listener(harness_for, caplog)
    assert feed.every() == BACKSTOP_S and replica.engine.controls.listener is deafish

    just_after_a_read(replica, shift)
    # nothing heard: the first edit waits for the backstop read, as before
    assert edit_seen_after(replica, shift, schedules, "first", 0.05) > 1.0
    tick_for(replica, shift, 0.05, 0.05)
    assert feed.every() == READ_EVERY_S
    assert caplog.text.count(DEAF) == 1
    assert "revision moved" in caplog.text
    for n in range(3):
        just_after_a_read(replica, shift)
        assert edit_seen_after(replica, shift, schedules, f"later-{n}", 0.05) <= READ_EVERY_S + 0.1
    reads = feed.reads
    tick_for(replica, shift, 10 * READ_EVERY_S, 0.05)
    assert feed.reads - reads >= 7  # every BACKSTOP_S there would be 2
    assert caplog.text.count(DEAF) == 1, "the change was logged more than once"
    assert not deafish.closed and deafish.probes >= 1  # its probes still come back

    # notices again: the next one heard puts the backstop back
    schedules.upsert("heard", TASK, timedelta(hours=1))
    deafish.changes = 1
    tick_for(replica, shift, 0.05, 0.05)
    assert "heard" in replica.engine.tracked
    assert feed.every() == BACKSTOP_S
    tick_for(replica, shift, 3 * BACKSTOP_S, 0.25)
    assert caplog.text.count(HEARS_AGAIN) == 1 and caplog.text.count(DEAF) == 1


def test_a_listener_that_hears_each_change_keeps_the_backstop_at_no_extra_statement(
    harness_for: Callable[..., Harness], caplog: pytest.LogCaptureFixture
) -> None:
    """Every edit notified, one of them heard only at the tick after the read
    that found it (its notification was still on the way): never judged deaf,
    and idle the replica sends what it sent before (the sweeps' heartbeats,
    which count as the backstop read)."""
    harness, shift, replica, good, feed, schedules = _proven_listener(harness_for, caplog)
    for n in range(3):
        schedules.upsert(f"edit-{n}", TASK, timedelta(hours=1))
        good.changes = 1
        tick_for(replica, shift, 0.05, 0.05)
        assert f"edit-{n}" in replica.engine.tracked
        tick_for(replica, shift, 1.0, 0.25)
    # the race: a commit just before a periodic read, heard one tick later
    while feed.next_read - (replica.engine.ctx.env.monotonic()) > 0.25:
        tick_for(replica, shift, 0.25, 0.25)
    schedules.upsert("late", TASK, timedelta(hours=1))
    just_after_a_read(replica, shift)
    good.changes = 1
    tick_for(replica, shift, 0.05, 0.05)
    assert "late" in replica.engine.tracked
    assert feed.every() == BACKSTOP_S
    # idle: one statement per backstop period, the heartbeat's
    tick_for(replica, shift, 1.0, 0.25)
    reads, trips = feed.reads, harness.store.round_trips
    tick_for(replica, shift, 30.0, 0.25)
    assert feed.reads == reads, "a feed read of its own while the heartbeats read"
    assert harness.store.round_trips - trips <= 30.0 / BACKSTOP_S + 1
    assert DEAF not in caplog.text and HEARS_AGAIN not in caplog.text
