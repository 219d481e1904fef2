"""Entries from sources: added, edited and removed while replicas tick.

Three replicas share a MemoryStore and a MemorySource on simulated time
(their clocks are injected, nothing is patched). The test edits the source
between ticks, as a writer would between two statements of the replicas, and
checks what reached the broker against the definitions in force:

* every slot is sent at most once, of an entry the source had at the tick
  that sent it, at an instant of the definition in force then, never earlier
  than the change that made that definition (no burst of past slots);
* every instant of a definition is sent exactly once, from a tick interval
  after the change that made it (the replicas see a change at their next
  tick) until the next change;
* nothing of a removed entry is sent from the tick that saw its removal on.
"""

from __future__ import annotations

import logging
import random
from collections import Counter
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

import pytest
from celery.schedules import crontab
from celery.schedules import schedule as interval
from test_scheduler import TASK, Harness, every, harness_for  # noqa: F401 - fixture

from celery_singlebeat import ConfigurationError, Schedules, signals
from celery_singlebeat.engine import Environment
from celery_singlebeat.sources import EntryDefinition, EntrySource
from celery_singlebeat.store.values import Written
from celery_singlebeat.testing import MemoryScheduler, MemorySource, MemoryStore
from celery_singlebeat.timeline.clock import US, datetime_to_us
from celery_singlebeat.timeline.slots import sequence_for

#: the replicas sleep at most this long (beat_max_loop_interval) plus the
#: wake-up jitter: a change is seen by every replica within it
TICK_GAP_US = 1_010_000 + 250_000


def simulate(harness: Harness, seed: int) -> None:
    clock = harness.clock
    harness.simulated = Environment(
        monotonic=lambda: clock() / US, time=lambda: clock() / US, random=random.Random(seed)
    )


class Run:
    """Replicas ticking when they ask to, the source edited between ticks."""

    def __init__(self, harness: Harness, source: MemorySource, replicas: int) -> None:
        self.harness = harness
        self.source = source
        self.replicas = [
            harness.replica(replica_id=f"r{i}", sources=[source]) for i in range(replicas)
        ]
        self.wake = {r.settings.replica_id: harness.clock() for r in self.replicas}
        #: (entry, slot instant, the simulated time it was published, replica)
        self.published: list[tuple[str, int, int, str]] = []
        #: entry -> [(from when, definition or None for removed)]
        self.history: dict[str, list[tuple[int, EntryDefinition | None]]] = {}
        signals.slot_published.connect(self._on_published, weak=False)

    def close(self) -> None:
        signals.slot_published.disconnect(self._on_published)

    def _on_published(self, sender: Any = None, **details: Any) -> None:
        if sender in self.replicas:
            at_us = datetime_to_us(details["slot"])
            self.published.append(
                (details["entry"], at_us, self.harness.clock(), sender.settings.replica_id)
            )

    def set(self, name: str, schedule: Any) -> None:
        definition = self.source.set(name, TASK, schedule)
        self.history.setdefault(name, []).append((self.harness.clock(), definition))

    def remove(self, name: str) -> None:
        self.source.remove(name)
        self.history[name].append((self.harness.clock(), None))

    def run_until(self, until_us: int) -> None:
        clock = self.harness.clock
        while clock() < until_us:
            for replica in self.replicas:
                rid = replica.settings.replica_id
                if self.wake[rid] <= clock():
                    self.wake[rid] = clock() + int(replica.tick() * US)
            nxt = min(min(self.wake.values()), until_us)
            clock.advance(timedelta(microseconds=max(nxt - clock(), 1)))

    def in_force(self, name: str, at_us: int) -> tuple[int, EntryDefinition | None]:
        """The definition of ``name`` in force at ``at_us`` and since when."""
        current: tuple[int, EntryDefinition | None] = (0, None)
        for since, definition in self.history.get(name, []):
            if since <= at_us:
                current = (since, definition)
        return current

    def anchor_of(self, name: str) -> int:
        # registering an existing name changes nothing and returns its row
        return self.harness.store.register([name])[name].anchor_us


def instants(definition: EntryDefinition, anchor_us: int, first_us: int, last_us: int) -> list[int]:
    """The instants of ``definition`` in ``[first_us, last_us)``."""
    sequence = sequence_for(definition.schedule, anchor_us, definition.tz or _utc())
    out: list[int] = []
    at = sequence.next_after(first_us - 1)
    while at is not None and at < last_us:
        out.append(at)
        at = sequence.next_after(at)
    return out


def _utc() -> Any:
    from datetime import timezone

    return timezone.utc


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_entries_added_edited_and_removed_while_three_replicas_tick(
    harness_for: Callable[..., Harness],  # noqa: F811
    seed: int,
) -> None:
    harness = harness_for({"static": every(2)})
    simulate(harness, seed)
    source = MemorySource(now_us=harness.clock)
    run = Run(harness, source, replicas=3)
    try:
        t0 = harness.clock()
        chooser = random.Random(seed)
        names = [f"stored-{i}" for i in range(8)]
        for name in names[:4]:
            run.set(name, chooser.choice([1, 1.5, 2, 3]))
        run.run_until(t0 + 3 * US)
        for step in range(1, 25):
            # between two ticks: one edit, at a random instant of the second
            run.run_until(t0 + 3 * US + step * 2 * US + chooser.randrange(0, US))
            name = chooser.choice(names)
            live = name in source.entries
            action = chooser.choice(["edit", "remove"] if live else ["add"])
            if action == "remove":
                run.remove(name)
            else:
                run.set(name, chooser.choice([0.5, 1, 1.5, 2, 3, 5]))
        end = harness.clock() + 4 * US
        run.run_until(end)
    finally:
        run.close()
    sent = Counter((entry, at) for entry, at, _, _ in run.published)
    assert sent and max(sent.values()) == 1, "a slot was sent twice"
    # every message: of an entry the source had, at an instant of the definition
    # in force when it was sent, not before that definition was made
    for entry, at, published_at, replica in run.published:
        if entry == "static":
            continue
        since, definition = run.in_force(entry, published_at)
        assert definition is not None, f"{entry}@{at} sent by {replica} after its removal"
        assert at >= since, f"{entry}@{at} is before its definition's change at {since}"
        sequence = sequence_for(definition.schedule, run.anchor_of(entry), _utc())
        assert sequence.next_after(at - 1) == at, f"{entry}@{at} is no instant of {definition}"
    # every instant of every definition, from a tick gap after its change until
    # the next change (or the end of the run), sent exactly once
    expected: set[tuple[str, int]] = set()
    for entry, changes in run.history.items():
        for index, (since, definition) in enumerate(changes):
            if definition is None:
                continue
            until = changes[index + 1][0] if index + 1 < len(changes) else end
            first = since + TICK_GAP_US
            expected.update(
                (entry, at)
                for at in instants(definition, run.anchor_of(entry), first, until - US // 2)
            )
    missing = expected - sent.keys()
    assert not missing, f"{len(missing)} instants never sent, e.g. {sorted(missing)[:3]}"
    assert len(expected) > 100, "the run exercised too little"
    removals = [c for changes in run.history.values() for c in changes if c[1] is None]
    assert removals, "the run removed nothing: the test tests less than it says"
    # and the write-back: each stored slot reported once, by the replica that sent it
    stored = Counter((e, at) for e, at, _, _ in run.published if e != "static")
    assert Counter(source.sent_slots) == stored


def test_a_removed_entry_is_not_sent_from_the_tick_that_sees_it(
    harness_for: Callable[..., Harness],  # noqa: F811
) -> None:
    """The claim of the tick that sees the removal proposes nothing of it, even
    a slot due that very tick."""
    harness = harness_for({})
    source = MemorySource(now_us=harness.clock)
    source.set("job", TASK, 1)
    replica = harness.replica(sources=[source])
    replica.tick()
    harness.clock.advance(timedelta(seconds=1))
    replica.tick()
    assert [m.entry for m in harness.drain()] == ["job"]
    harness.clock.advance(timedelta(seconds=1))  # the next slot is due now
    source.remove("job")
    replica.tick()
    assert harness.drain() == []
    assert "job" not in replica.engine.tracked
    assert "job" not in harness.store.catalog_of(replica.settings.replica_id)


def test_an_edit_sends_no_burst_of_past_slots_and_follows_the_new_definition(
    harness_for: Callable[..., Harness],  # noqa: F811
) -> None:
    """An hourly entry edited to every 10 s: its next slot is the new
    definition's first after the tick that sees the edit, not the 360 slots of
    the last hour, nor the old definition's next one."""
    harness = harness_for({})
    source = MemorySource(now_us=harness.clock)
    source.set("report", TASK, 3600)
    replica = harness.replica(sources=[source])
    replica.tick()
    harness.clock.advance(timedelta(minutes=30))
    replica.tick()
    assert harness.drain() == []
    source.set("report", TASK, 10)
    edited_at = harness.clock()
    replica.tick()
    assert harness.drain() == []  # nothing of the past
    harness.clock.advance(timedelta(seconds=10))
    replica.tick()
    sent = harness.drain()
    assert len(sent) == 1 and edited_at < sent[0].at_us <= harness.clock()
    assert replica.stats["skipped"] == 0


def test_a_new_entry_continues_from_its_last_recorded_slot(
    harness_for: Callable[..., Harness],  # noqa: F811
) -> None:
    """Removed and added again (or added by a replica that starts later), an
    entry resumes after the last slot any replica claimed, not at "now"."""
    harness = harness_for({})
    source = MemorySource(now_us=harness.clock)
    source.set("job", TASK, 1)
    a = harness.replica(sources=[source])
    a.tick()
    for _ in range(3):
        harness.clock.advance(timedelta(seconds=1))
        a.tick()
    first = harness.drain()
    assert len(first) == 3
    source.remove("job")
    a.tick()
    source.set("job", TASK, 1)
    a.tick()
    harness.clock.advance(timedelta(seconds=1))
    a.tick()
    again = harness.drain()
    assert [m.at_us for m in again] == [first[-1].at_us + US]


def test_a_name_in_two_sources_stops_beat_at_start_up_naming_both(
    harness_for: Callable[..., Harness],  # noqa: F811
) -> None:
    harness = harness_for({"job": every(1)})
    source = MemorySource(label="crm entries", now_us=harness.clock)
    source.set("job", TASK, 5)
    with pytest.raises(ConfigurationError) as raised:
        MemoryScheduler(harness.app, store=harness.store, sources=[source])
    message = str(raised.value)
    assert "'job'" in message and "beat_schedule" in message and "crm entries" in message


def test_a_name_another_source_has_is_refused_at_run_time_and_the_first_stays(
    harness_for: Callable[..., Harness],  # noqa: F811
    caplog: pytest.LogCaptureFixture,
) -> None:
    harness = harness_for({"job": every(1)})
    source = MemorySource(label="crm entries", now_us=harness.clock)
    replica = harness.replica(sources=[source])
    replica.tick()
    source.set("job", TASK, 3600)
    with caplog.at_level(logging.ERROR, logger="celery_singlebeat"):
        replica.tick()
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert any(
        "crm entries added entry 'job', which beat_schedule already defines" in e for e in errors
    ), errors
    harness.clock.advance(timedelta(seconds=1))
    replica.tick()
    assert [m.entry for m in harness.drain()] == ["job"]  # still every second
    assert replica.entries["job"].source == "beat_schedule"


def test_an_entry_that_cannot_be_scheduled_is_refused_naming_its_source(
    harness_for: Callable[..., Harness],  # noqa: F811
    caplog: pytest.LogCaptureFixture,
) -> None:
    class NoEstimate:
        """A schedule that cannot say when it runs next."""

    harness = harness_for({})
    source = MemorySource(label="crm entries", now_us=harness.clock)
    source.set("ok", TASK, 1)
    replica = harness.replica(sources=[source])
    replica.tick()
    source.set("x" * 300, TASK, 1)
    source.set("odd", TASK, NoEstimate())
    with caplog.at_level(logging.ERROR, logger="celery_singlebeat"):
        replica.tick()
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert any("crm entries entry name 'xxxx" in e and "300" not in e for e in errors)
    assert any("crm entries['odd']: unsupported schedule type NoEstimate" in e for e in errors)
    assert set(replica.engine.tracked) == {"ok"}


def test_beat_schedule_messages_name_beat_schedule(
    harness_for: Callable[..., Harness],  # noqa: F811
) -> None:
    harness = harness_for({"job": every(1, singlebeat_missed_polcy="skip")})
    with pytest.raises(ConfigurationError, match=r"beat_schedule\['job'\]\.options: unknown"):
        harness.replica()


def test_a_crontab_entry_from_a_source_runs_in_its_own_zone(
    harness_for: Callable[..., Harness],  # noqa: F811
) -> None:
    from zoneinfo import ZoneInfo

    harness = harness_for({})
    source = MemorySource(now_us=harness.clock)
    zone = ZoneInfo("Pacific/Chatham")  # +12:45 or +13:45, never a whole hour off UTC
    source.set("quarter", TASK, crontab(minute="0"), tz=zone)
    replica = harness.replica(sources=[source])
    replica.tick()
    for _ in range(2 * 60):
        harness.clock.advance(timedelta(minutes=1))
        replica.tick()
    sent = harness.drain()
    assert len(sent) == 2
    assert all((m.at_us // US // 60) % 60 == 15 for m in sent)  # hh:15 UTC


def test_an_interval_source_entry_keeps_its_anchor_across_an_edit(
    harness_for: Callable[..., Harness],  # noqa: F811
) -> None:
    """The anchor is the entry's registration, not the edit: every 2 s stays on
    the same grid when edited to every 4 s (decided here, documented in
    docs/algorithm.md, "Entry sources")."""
    harness = harness_for({})
    source = MemorySource(now_us=harness.clock)
    source.set("job", TASK, interval(timedelta(seconds=2)))
    replica = harness.replica(sources=[source])
    replica.tick()
    anchor = harness.store.register(["job"])["job"].anchor_us  # an existing row: read
    harness.clock.advance(timedelta(seconds=3))
    replica.tick()
    source.set("job", TASK, interval(timedelta(seconds=4)))
    replica.tick()
    for _ in range(10):
        harness.clock.advance(timedelta(seconds=1))
        replica.tick()
    later = [m.at_us for m in harness.drain()][1:]
    assert later and all((at - anchor) % (4 * US) == 0 for at in later)


def test_the_cycle_collector_is_off_while_changes_are_applied_and_as_it_was_after(
    harness_for: Callable[..., Harness],  # noqa: F811
) -> None:
    """A first read of many entries makes millions of objects in no cycle:
    the collector waits (engine/watch.py) and is as the process had it after."""
    import gc

    seen: list[bool] = []

    class Watching(MemorySource):
        def changes(self, cursor: object) -> tuple[Any, object]:
            seen.append(gc.isenabled())
            return super().changes(cursor)

    harness = harness_for({})
    source = Watching(now_us=harness.clock)
    source.set("job", TASK, 1)
    replica = harness.replica(sources=[source])
    assert gc.isenabled()
    replica.tick()
    assert seen and not any(seen)
    assert gc.isenabled()
    gc.disable()
    try:
        replica.tick()
        assert not gc.isenabled()  # not turned on behind the process's back
    finally:
        gc.enable()
    assert len(seen) >= 2 and not any(seen)


class _LaggingTableSource(EntrySource):
    """A third source, which the engine has never heard of: the entries of the
    store's schedules table as first read, never followed (a source whose
    reader lags behind every edit). Its definitions name the write they came
    from (:meth:`written`) when ``name_writes`` is on, and the table already
    lists its entries, so no catalog does (``catalogued`` False)."""

    label = "lagging table"
    catalogued = False

    def __init__(self, store: MemoryStore, name_writes: bool) -> None:
        self._store = store
        self._name_writes = name_writes
        self._writes: dict[str, Written] = {}

    def load(self) -> tuple[Sequence[EntryDefinition], object]:
        rows, revision = self._store.schedule_rows()
        definitions = []
        for row in rows:
            self._writes[row.name] = Written(row.revision, row.updated_us)
            definitions.append(
                EntryDefinition(
                    name=row.name,
                    task=row.task,
                    schedule=timedelta(seconds=1),
                    revision=str(row.revision),
                    source=self.label,
                    since_us=row.updated_us,
                )
            )
        return definitions, revision

    def written(self, definition: EntryDefinition) -> Written | None:
        return self._writes.get(definition.name) if self._name_writes else None


@pytest.mark.parametrize("name_writes", [True, False])
def test_a_source_the_engine_does_not_know_has_its_outdated_writes_refused_at_the_claim(
    harness_for: Callable[..., Harness],  # noqa: F811
    name_writes: bool,
) -> None:
    """What differs between sources is said by the interface alone: a custom
    source that names its definitions' writes gets the claim's check that
    stored schedules get (no slot more than a second after an edit goes out
    under the definition it replaced, however late the source reads it), and
    one that names none gets nothing checked; neither is catalogued."""
    harness = harness_for({}, singlebeat_schedules=False)
    simulate(harness, 4)
    harness.store.prepare(True)
    schedules = Schedules(store=harness.store, by="test")
    schedules.upsert("a", TASK, timedelta(seconds=1))
    replica = harness.replica(sources=[_LaggingTableSource(harness.store, name_writes)])
    clock = harness.clock
    end = clock() + 3 * US
    while clock() < end:
        clock.advance(timedelta(microseconds=max(int(replica.tick() * US), 1)))
    edited = schedules.update("a", args=[2])
    edited_us = int(edited.updated.timestamp() * US)
    end = clock() + 5 * US
    while clock() < end:
        clock.advance(timedelta(microseconds=max(int(replica.tick() * US), 1)))
    sent = [m.at_us for m in harness.drain() if m.entry == "a"]
    assert [at for at in sent if at < edited_us], "nothing sent before the edit"
    after = [at for at in sent if at > edited_us + US]
    if name_writes:
        assert after == [], "a slot went out under a definition replaced over a second before"
        assert replica.stats["lost"] > 0
    else:
        assert len(after) >= 3, "no write named, nothing to check: the slots go on"
    assert replica.entries["a"].source == "lagging table"
    assert "a" not in harness.store.catalog_of(replica.settings.replica_id)
