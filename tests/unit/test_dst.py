"""Crontab entries across daylight-saving changes, through the whole scheduler.

Several ``MemoryScheduler`` replicas share one ``MemoryStore`` and a fake clock
that the test moves through the 24 hours around each change (Europe/Berlin and
America/New_York, spring and autumn 2026). Every message that really reached
the (in-memory) broker is read back and compared with the instants the
documented rules give (docs/algorithm.md, "Crontab"), computed here
independently of ``celery_singlebeat.timeline.cron``:

* a wall time that happens twice (autumn) runs once, at its first occurrence;
* a wall time inside the spring gap runs once, at the instant it maps to with
  the offset before the gap (02:30 -> 03:30 summer time); if that instant is
  also another run of the same crontab, the two are one run.

Time inside the scheduler (sweeps, prunes, the live-replica reads) follows the
fake clock, so a day of ticks also exercises sharing, pruning and the
high-water mark the way a real day would.
"""

from __future__ import annotations

import random
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone, tzinfo
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from celery import Celery
from celery.schedules import crontab
from kombu.simple import SimpleQueue

from celery_singlebeat.engine import Environment
from celery_singlebeat.engine.sharing import first_replicas
from celery_singlebeat.testing import FakeClock, MemoryScheduler, MemoryStore
from celery_singlebeat.timeline.clock import US, DatabaseClock, datetime_to_us, us_to_datetime
from celery_singlebeat.timeline.slots import SLOT_HEADER, sequence_for

TASK = "sbdst.probe"
MINUTE = timedelta(minutes=1)
UTC = timezone.utc
#: the task-id namespace docs/algorithm.md section 4 documents.
NAMESPACE = uuid.UUID("0b6c8a52-5f0e-4c1c-9a57-6b3c0c4f2d11")


@dataclass(frozen=True)
class Change:
    """One daylight-saving change: its zone, its instant, and whether a wall hour
    is skipped (spring) or repeated (autumn)."""

    zone: str
    at: datetime
    spring: bool

    @property
    def tz(self) -> ZoneInfo:
        return ZoneInfo(self.zone)

    @property
    def id(self) -> str:
        return f"{self.zone.split('/')[1]}-{'spring' if self.spring else 'autumn'}"


CHANGES = [
    # 02:00 CET -> 03:00 CEST: 02:00-02:59 does not exist.
    Change("Europe/Berlin", datetime(2026, 3, 29, 1, tzinfo=UTC), spring=True),
    # 03:00 CEST -> 02:00 CET: 02:00-02:59 happens twice.
    Change("Europe/Berlin", datetime(2026, 10, 25, 1, tzinfo=UTC), spring=False),
    # 02:00 EST -> 03:00 EDT: 02:00-02:59 does not exist.
    Change("America/New_York", datetime(2026, 3, 8, 7, tzinfo=UTC), spring=True),
    # 02:00 EDT -> 01:00 EST: 01:00-01:59 happens twice.
    Change("America/New_York", datetime(2026, 11, 1, 6, tzinfo=UTC), spring=False),
]
BY_ID = {c.id: c for c in CHANGES}


def crontab_fields() -> dict[str, dict[str, Any]]:
    """The crontab fields of every entry (a fresh crontab is built per test)."""
    return {
        "quarter": {"minute": "*/15"},
        "hourly": {"minute": 0, "hour": "*"},
        "at-01:30": {"minute": 30, "hour": 1},
        "at-02:00": {"minute": 0, "hour": 2},
        "at-02:30": {"minute": 30, "hour": 2},
        "at-03:00": {"minute": 0, "hour": 3},
        "every-5-01-03": {"minute": "*/5", "hour": "1-3"},
    }


# -- the expected instants, from the documented rules --------------------------


def matches(schedule: crontab, wall: datetime) -> bool:
    return (
        wall.minute in schedule.minute
        and wall.hour in schedule.hour
        and wall.day in schedule.day_of_month
        and wall.month in schedule.month_of_year
        and wall.isoweekday() % 7 in schedule.day_of_week
    )


def expected_runs(schedule: crontab, tz: ZoneInfo, after_us: int, until_us: int) -> set[int]:
    """The runs in ``(after_us, until_us]``, minute by minute in UTC.

    A UTC minute whose local time matches runs, unless that local time is the
    second occurrence of a repeated wall time (``fold == 1``). Where the local
    time jumps forward, each matching wall time it skipped runs at that wall
    time read with the offset before the jump. Equal instants are one run. The
    walk starts three hours early: a wall time skipped before ``after_us`` may
    run after it.
    """
    runs: set[int] = set()
    at = us_to_datetime(after_us - after_us % (60 * US)) - timedelta(hours=3)
    previous = at.astimezone(tz)
    while datetime_to_us(at) <= until_us:
        at += MINUTE
        local = at.astimezone(tz)
        candidates = []
        if local.fold == 0 and matches(schedule, local):
            candidates.append(at)
        wall = previous.replace(tzinfo=None) + MINUTE
        while wall < local.replace(tzinfo=None):  # skipped by a spring change
            if matches(schedule, wall):
                offset = previous.utcoffset()
                assert offset is not None
                candidates.append((wall - offset).replace(tzinfo=UTC))
            wall += MINUTE
        runs.update(
            datetime_to_us(c) for c in candidates if after_us < datetime_to_us(c) <= until_us
        )
        previous = local
    return runs


def expected_slots(
    schedules: dict[str, crontab], tz: ZoneInfo, after_us: int, until_us: int
) -> set[tuple[str, int]]:
    return {
        (name, at)
        for name, schedule in schedules.items()
        for at in expected_runs(schedule, tz, after_us, until_us)
    }


def utc_us(*args: int) -> int:
    return datetime_to_us(datetime(*args, tzinfo=UTC))  # type: ignore[misc, arg-type]


# Hand-checked runs of the single-time entries, to pin the oracle to the rules.
SINGLE_RUNS = {
    # 02:30 / 02:00 do not exist: 03:30 / 03:00 CEST; 03:00 runs at 03:00 CEST too
    # (a different entry from at-02:00: both run).
    "Berlin-spring": {
        "at-01:30": [utc_us(2026, 3, 29, 0, 30)],
        "at-02:00": [utc_us(2026, 3, 29, 1, 0)],
        "at-02:30": [utc_us(2026, 3, 29, 1, 30)],
        "at-03:00": [utc_us(2026, 3, 29, 1, 0)],
    },
    # 02:xx happens twice: the first occurrence, in summer time (CEST, UTC+2).
    "Berlin-autumn": {
        "at-01:30": [utc_us(2026, 10, 24, 23, 30)],
        "at-02:00": [utc_us(2026, 10, 25, 0, 0)],
        "at-02:30": [utc_us(2026, 10, 25, 0, 30)],
        "at-03:00": [utc_us(2026, 10, 25, 2, 0)],
    },
    "New_York-spring": {
        "at-01:30": [utc_us(2026, 3, 8, 6, 30)],
        "at-02:00": [utc_us(2026, 3, 8, 7, 0)],
        "at-02:30": [utc_us(2026, 3, 8, 7, 30)],
        "at-03:00": [utc_us(2026, 3, 8, 7, 0)],
    },
    # 01:xx happens twice: the first occurrence, in EDT (UTC-4); 02:xx is EST.
    "New_York-autumn": {
        "at-01:30": [utc_us(2026, 11, 1, 5, 30)],
        "at-02:00": [utc_us(2026, 11, 1, 7, 0)],
        "at-02:30": [utc_us(2026, 11, 1, 7, 30)],
        "at-03:00": [utc_us(2026, 11, 1, 8, 0)],
    },
}


@pytest.mark.parametrize("change", CHANGES, ids=lambda c: c.id)
def test_the_expected_instants_follow_the_documented_rules(change: Change) -> None:
    tz = change.tz
    before = change.at - timedelta(seconds=1)
    after = change.at + timedelta(seconds=1)
    # the change is where the test says it is
    assert (before.astimezone(tz).utcoffset(), after.astimezone(tz).utcoffset()) == (
        (timedelta(hours=1), timedelta(hours=2))
        if change.zone == "Europe/Berlin" and change.spring
        else (timedelta(hours=2), timedelta(hours=1))
        if change.zone == "Europe/Berlin"
        else (timedelta(hours=-5), timedelta(hours=-4))
        if change.spring
        else (timedelta(hours=-4), timedelta(hours=-5))
    )
    start = datetime_to_us(change.at) - 12 * 3600 * US
    end = datetime_to_us(change.at) + 12 * 3600 * US
    schedules = {name: crontab(**fields) for name, fields in crontab_fields().items()}
    for name, runs in SINGLE_RUNS[change.id].items():
        assert sorted(expected_runs(schedules[name], tz, start, end)) == runs, name
    # 24 real hours: in spring one run per real hour (the missing 02:00 is the
    # 03:00 run); in autumn the repeated hour's runs do not happen again
    hourly = expected_runs(schedules["hourly"], tz, start, end)
    quarter = expected_runs(schedules["quarter"], tz, start, end)
    fives = expected_runs(schedules["every-5-01-03"], tz, start, end)
    if change.spring:
        assert (len(hourly), len(quarter)) == (24, 24 * 4)
        assert len(fives) == 24  # 01:xx, and 03:xx which 02:xx falls on
    else:
        assert (len(hourly), len(quarter)) == (23, 23 * 4)
        assert len(fives) == 36  # each of 01:xx, 02:xx, 03:xx once
    # the longest wait between two runs, as docs/algorithm.md states it: none
    # longer than usual in spring; in autumn the repeated hour is added to it
    extra = timedelta(0) if change.spring else timedelta(hours=1)
    assert longest_wait(hourly) == timedelta(hours=1) + extra
    assert longest_wait(quarter) == timedelta(minutes=15) + extra


def longest_wait(runs: set[int]) -> timedelta:
    ordered = sorted(runs)
    return timedelta(microseconds=max(b - a for a, b in zip(ordered, ordered[1:])))


# -- the harness ----------------------------------------------------------------


@dataclass
class Sent:
    entry: str
    at_us: int
    task_id: str


class Fleet:
    """Replicas of one app sharing a MemoryStore, their time on a FakeClock."""

    def __init__(self, app: Celery, queue: SimpleQueue, clock: FakeClock, env: Environment) -> None:
        self.app = app
        self.env = env
        self.queue = queue
        self.clock = clock
        self.store = MemoryStore(now_us=clock)
        self.replicas: list[MemoryScheduler] = []

    def add(self, store: Any = None) -> MemoryScheduler:
        """A replica named ``r<n>``: fixed ids make the split of the entries
        among the replicas (rendezvous hashing of the ids) the same each run."""
        replica = MemoryScheduler(
            self.app, store=store or self.store, env=self.env, replica_id=f"r{len(self.replicas)}"
        )
        self.replicas.append(replica)
        return replica

    def drain(self) -> list[Sent]:
        out: list[Sent] = []
        while True:
            try:
                message = self.queue.get(block=False)  # type: ignore[no-untyped-call]
            except self.queue.Empty:
                return out
            slot = message.headers[SLOT_HEADER]
            out.append(Sent(slot["entry"], slot["at_us"], message.headers["id"]))

    @property
    def now_us(self) -> int:
        return self.clock()

    def advance_to(self, at_us: int) -> None:
        self.clock.advance(timedelta(microseconds=at_us - self.clock()))


def simulated_env(clock: FakeClock, seed: int) -> Environment:
    """The replicas' monotonic clock follows the fake clock; their wake-up
    jitter is reproducible (``seed``)."""
    return Environment(
        monotonic=lambda: clock() / US, time=lambda: clock() / US, random=random.Random(seed)
    )


@pytest.fixture
def fleet_for() -> Iterator[Callable[..., Fleet]]:
    opened: list[tuple[Any, SimpleQueue]] = []

    def build(schedule: dict[str, crontab], start: datetime, seed: int = 0, **conf: Any) -> Fleet:
        queue_name = f"sbdst-{uuid.uuid4().hex[:10]}"
        app = Celery("sbdst", broker="memory://", set_as_current=False)
        app.conf.update(
            task_default_queue=queue_name,
            result_expires=None,
            beat_schedule={name: {"task": TASK, "schedule": s} for name, s in schedule.items()},
        )
        app.conf.update(conf)
        conn = app.connection_for_read()
        queue = conn.SimpleQueue(queue_name, no_ack=True)
        opened.append((conn, queue))
        clock = FakeClock(start)
        return Fleet(app, queue, clock, simulated_env(clock, seed))

    yield build
    for conn, queue in opened:
        queue.close()  # type: ignore[no-untyped-call]
        conn.release()


def crontabs(tz_given_by: str, zone: str) -> tuple[dict[str, crontab], dict[str, Any]]:
    """The entries and the app settings: the zone is the app's ``timezone``, or
    each crontab's own ``tz`` (and the app's timezone another zone)."""
    schedules = {name: crontab(**fields) for name, fields in crontab_fields().items()}
    if tz_given_by == "app":
        return schedules, {"timezone": zone}
    for schedule in schedules.values():
        schedule.tz = ZoneInfo(zone)
    return schedules, {"timezone": "Asia/Tokyo"}


def assert_sent_exactly(sent: list[Sent], expected: set[tuple[str, int]]) -> None:
    counts = Counter((m.entry, m.at_us) for m in sent)
    repeated = sorted((k, n) for k, n in counts.items() if n > 1)
    assert repeated == []
    missing = sorted(expected - set(counts))
    extra = sorted(set(counts) - expected)
    assert (
        [(e, us_to_datetime(a).isoformat()) for e, a in missing],
        [(e, us_to_datetime(a).isoformat()) for e, a in extra],
    ) == ([], [])
    for message in sent:
        assert message.task_id == str(uuid.uuid5(NAMESPACE, f"{message.entry}\0{message.at_us}"))


# -- stepping the clock -----------------------------------------------------------


def run_fixed_steps(fleet: Fleet, end_us: int, steps: Callable[[], float], seed: int) -> None:
    """Advance by ``steps()`` seconds at a time; every replica ticks each step, in a
    new order each time."""
    order = random.Random(seed)
    while True:
        for replica in order.sample(fleet.replicas, len(fleet.replicas)):
            replica.tick()
        if fleet.now_us >= end_us:
            return
        step_us = int(steps() * US)
        fleet.advance_to(min(end_us, fleet.now_us + step_us))


def run_as_beat(fleet: Fleet, end_us: int, every: dict[int, float] | None = None) -> None:
    """Each replica sleeps what its tick returns, as ``celery beat`` does; the
    clock jumps to the next wake-up. ``every``: replica index -> a fixed period
    instead (a replica that only gets to tick that often)."""
    every = every or {}
    wake = [fleet.now_us] * len(fleet.replicas)
    while True:
        now = fleet.now_us
        for i, replica in enumerate(fleet.replicas):
            if wake[i] <= now:
                delay = replica.tick()
                wake[i] = now + max(1, int(every.get(i, delay) * US))
        if now >= end_us:
            return
        fleet.advance_to(min(end_us, min(wake)))


# -- tests ---------------------------------------------------------------------


def window(change: Change, before: timedelta, after: timedelta) -> tuple[datetime, int]:
    """From ``before`` the change to ``after`` it, both plus 30 s: the last tick is
    then half a minute past a whole minute, well after every slot's 250 ms
    fallback delay, so every slot up to the end must have been sent (and no slot
    falls on the first tick)."""
    half = timedelta(seconds=30)
    return change.at - before + half, datetime_to_us(change.at + after + half)


HALF_DAY = timedelta(hours=12)


@pytest.mark.parametrize("change", CHANGES, ids=lambda c: c.id)
def test_a_day_around_the_change_three_replicas_sleeping_as_beat_does(
    fleet_for: Callable[..., Fleet], change: Change
) -> None:
    # Each replica sleeps what its tick returns (until its next slot, plus 0-10 ms
    # of jitter), so the three race for every slot within milliseconds. A 60 s
    # loop (and a lease long enough for it) keeps a simulated day short.
    schedules, conf = crontabs("app", change.zone)
    start, end_us = window(change, HALF_DAY, HALF_DAY)
    fleet = fleet_for(
        schedules, start, seed=1, beat_max_loop_interval=60, singlebeat_lease=180, **conf
    )
    for _ in range(3):
        fleet.add()
    run_as_beat(fleet, end_us)
    expected = expected_slots(schedules, change.tz, datetime_to_us(start), end_us)
    assert_sent_exactly(fleet.drain(), expected)
    # the work was shared: every replica that proposes some entries first sent
    # (here 2, 1 and 4 of the 7 entries: the split is the ids' rendezvous)
    ids = sorted(r.settings.replica_id for r in fleet.replicas)
    shares = Counter(first_replicas(schedules, ids).values())
    assert len(shares) == 3
    assert all(r.stats["sent"] > 0 for r in fleet.replicas if shares[r.settings.replica_id])
    assert sum(r.stats["skipped"] for r in fleet.replicas) == 0


@pytest.mark.parametrize("change", CHANGES, ids=lambda c: c.id)
def test_a_day_around_the_change_in_coarse_37_second_steps(
    fleet_for: Callable[..., Fleet], change: Change
) -> None:
    # Every replica ticks every 37 s, in a new order each step: each slot is first
    # seen 0-37 s late (mostly later than the 5 s grace: coalesce sends the latest
    # missed one, which is the only one). The zone is each crontab's own ``tz``;
    # the app's timezone is another zone, which must not matter.
    schedules, conf = crontabs("crontab", change.zone)
    start, end_us = window(change, HALF_DAY, HALF_DAY)
    fleet = fleet_for(schedules, start, **conf)
    for _ in range(2):
        fleet.add()
    run_fixed_steps(fleet, end_us, lambda: 37.0, seed=2)
    expected = expected_slots(schedules, change.tz, datetime_to_us(start), end_us)
    assert_sent_exactly(fleet.drain(), expected)


@pytest.mark.parametrize("change", CHANGES, ids=lambda c: c.id)
def test_the_hours_around_the_change_in_random_steps_with_a_restart_inside_it(
    fleet_for: Callable[..., Fleet], change: Change
) -> None:
    # Random 1-10 s steps, every replica ticking each step in a new order. Ten
    # minutes after the change (inside the repeated hour in autumn) a replica is
    # killed and a new one starts: it must resume after the slots the fleet sent,
    # not send the repeated hour's runs again.
    schedules, conf = crontabs("app", change.zone)
    start, end_us = window(change, timedelta(hours=2), timedelta(hours=2))
    fleet = fleet_for(schedules, start, seed=3, **conf)
    for _ in range(3):
        fleet.add()
    steps = random.Random(3)
    restart_us = datetime_to_us(change.at + timedelta(minutes=10))
    run_fixed_steps(fleet, restart_us, lambda: steps.uniform(1, 10), seed=3)
    fleet.replicas.pop(1)
    fleet.add()
    run_fixed_steps(fleet, end_us, lambda: steps.uniform(1, 10), seed=4)
    expected = expected_slots(schedules, change.tz, datetime_to_us(start), end_us)
    assert_sent_exactly(fleet.drain(), expected)
    assert fleet.replicas[-1].stats["sent"] > 0


# -- a replica with its own clock, and one that ticks late -----------------------


class EstimateClock(DatabaseClock):
    """A replica's estimate of the database clock, over its own wall clock
    (``source``), and off by ``error_us`` (within the 250 ms a claim tolerates,
    as a slow round trip leaves it)."""

    def __init__(self, source: Callable[[], int], error_us: int) -> None:
        super().__init__()
        self._source = source
        self.error_us = error_us

    def local_us(self) -> int:
        return self._source()

    def now_us(self) -> int:
        return super().now_us() + self.error_us


class OwnClockView:
    """The shared store as one replica sees it: every operation is the shared
    store's, and its answer teaches this replica's own clock estimate."""

    def __init__(self, store: MemoryStore, database: FakeClock, wall_offset_us: int, error_us: int):
        self._store = store
        self._database = database
        self.clock = EstimateClock(lambda: database() + wall_offset_us, error_us)

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._store, name)
        if not callable(attr):
            return attr

        def round_trip(*args: Any, **kwargs: Any) -> Any:
            try:
                return attr(*args, **kwargs)
            finally:
                local = self.clock.local_us()
                self.clock.observe(self._database(), local, local)

        return round_trip


@pytest.mark.parametrize(
    "change", [BY_ID["Berlin-autumn"], BY_ID["New_York-autumn"]], ids=lambda c: c.id
)
def test_the_autumn_change_with_skewed_clocks_and_a_replica_ticking_every_40_s(
    fleet_for: Callable[..., Fleet], change: Change
) -> None:
    # A: the database's clock. B: its wall clock an hour ahead (the size of the
    # change), its estimate of the database 200 ms ahead. C: its wall clock an
    # hour behind, its estimate 200 ms behind, and it only gets to tick every 40 s.
    # The repeated hour still runs nothing twice, and nothing is lost.
    schedules, conf = crontabs("app", change.zone)
    start, end_us = window(change, timedelta(hours=3), timedelta(hours=3))
    fleet = fleet_for(
        schedules, start, seed=5, beat_max_loop_interval=60, singlebeat_lease=180, **conf
    )
    hour = 3600 * US
    fleet.add()
    fleet.add(OwnClockView(fleet.store, fleet.clock, hour, 200_000))
    fleet.add(OwnClockView(fleet.store, fleet.clock, -hour, -200_000))
    run_as_beat(fleet, end_us, every={2: 40.0})
    expected = expected_slots(schedules, change.tz, datetime_to_us(start), end_us)
    assert_sent_exactly(fleet.drain(), expected)
    assert sum(r.stats["sent"] for r in fleet.replicas) == len(expected)
    assert {row.state for row in fleet.store.slot_rows()} == {1}


# -- the fleet stopped across the change: the missed-run policy ------------------


@pytest.mark.parametrize(
    ("policy", "keep"), [("coalesce", 1), ("skip", 0), ("all", 5)], ids=["coalesce", "skip", "all"]
)
@pytest.mark.parametrize("change", CHANGES, ids=lambda c: c.id)
def test_a_fleet_stopped_across_the_change_applies_the_missed_run_policy(
    fleet_for: Callable[..., Fleet], change: Change, policy: str, keep: int
) -> None:
    # Both replicas are paused from an hour before the change to an hour after
    # it. On resuming, the policy decides, per entry, which of the runs that fell
    # due meanwhile are sent: the latest one (coalesce), none (skip), or the 5
    # latest (all, singlebeat_missed_max=5); each replica counts the others as
    # skipped. The runs are counted and stepped back through the change.
    schedules, conf = crontabs("app", change.zone)
    start, end_us = window(change, timedelta(hours=2), timedelta(hours=2))
    fleet = fleet_for(
        schedules,
        start,
        singlebeat_missed_policy=policy,
        singlebeat_missed_max=max(keep, 1),
        # 10 s steps: with the default 5 s grace, skip would drop runs anyway
        singlebeat_missed_grace=20,
        **conf,
    )
    for _ in range(2):
        fleet.add()
    pause_us = datetime_to_us(change.at - timedelta(hours=1) + timedelta(seconds=30))
    resume_us = datetime_to_us(change.at + timedelta(hours=1) + timedelta(seconds=30))
    run_fixed_steps(fleet, pause_us, lambda: 10.0, seed=6)
    fleet.advance_to(resume_us)
    run_fixed_steps(fleet, end_us, lambda: 10.0, seed=7)

    tz = change.tz
    start_us = datetime_to_us(start)
    expected = expected_slots(schedules, tz, start_us, pause_us)
    expected |= expected_slots(schedules, tz, resume_us, end_us)
    missed = 0
    for name, schedule in schedules.items():
        runs = sorted(expected_runs(schedule, tz, pause_us, resume_us))
        kept = runs[max(0, len(runs) - keep) :] if keep else []
        expected |= {(name, at) for at in kept}
        missed += len(runs) - len(kept)
    assert_sent_exactly(fleet.drain(), expected)
    assert [r.stats["skipped"] for r in fleet.replicas] == [missed, missed]


@pytest.mark.parametrize("change", CHANGES, ids=lambda c: c.id)
def test_a_fleet_first_started_just_after_the_change_runs_nothing_of_before_it(
    fleet_for: Callable[..., Fleet], change: Change
) -> None:
    # Started ten minutes after the change (in autumn: inside the repeated hour,
    # whose first occurrence a fleet that never ran did not see), the replicas
    # start from "now": no run of the first occurrence is sent late, and the
    # repeated hour's wall times do not run.
    schedules, conf = crontabs("app", change.zone)
    start = change.at + timedelta(minutes=10, seconds=30)
    end_us = datetime_to_us(change.at + timedelta(hours=2, seconds=30))
    fleet = fleet_for(schedules, start, seed=8, **conf)
    for _ in range(2):
        fleet.add()
    steps = random.Random(8)
    run_fixed_steps(fleet, end_us, lambda: steps.uniform(1, 10), seed=8)
    expected = expected_slots(schedules, change.tz, datetime_to_us(start), end_us)
    assert_sent_exactly(fleet.drain(), expected)
    # The :30 of the skipped or repeated hour: in spring it runs at :30 of the
    # next hour, after the start; in autumn its one run was before the start.
    name = "at-01:30" if change.id == "New_York-autumn" else "at-02:30"
    [run] = SINGLE_RUNS[change.id][name]
    assert ((name, run) in expected) is change.spring
    assert (run > datetime_to_us(start)) is change.spring


def test_a_crontab_runs_in_the_apps_zone_whatever_zone_its_nowfun_returns(
    fleet_for: Callable[..., Fleet],
) -> None:
    # Celery's crontab() takes no tz argument, and since Celery 5.3 the zone of
    # the datetimes its nowfun returns is not the crontab's zone either (Celery
    # itself reads ``crontab.tz``, the app's timezone unless set): the
    # scheduler agrees. The zone is the app's, or the ``tz`` set on the crontab.
    new_york = ZoneInfo("America/New_York")
    start = datetime(2026, 6, 1, 0, 0, 30, tzinfo=UTC)
    schedules = {
        "nowfun": crontab(minute=0, hour=17, nowfun=lambda: datetime.now(new_york)),
        "tz": crontab(minute=0, hour=17),
    }
    schedules["tz"].tz = new_york
    fleet = fleet_for(schedules, start, timezone="UTC")
    for _ in range(2):
        fleet.add()
    run_fixed_steps(fleet, datetime_to_us(start + timedelta(days=1)), lambda: 600.0, seed=9)
    assert sorted((m.entry, us_to_datetime(m.at_us)) for m in fleet.drain()) == [
        ("nowfun", datetime(2026, 6, 1, 17, tzinfo=UTC)),
        ("tz", datetime(2026, 6, 1, 21, tzinfo=UTC)),  # 17:00 EDT
    ]


@pytest.mark.parametrize("change", CHANGES, ids=lambda c: c.id)
def test_a_pytz_zone_gives_the_same_runs(fleet_for: Callable[..., Fleet], change: Change) -> None:
    # Celery 5.2's app.timezone is a pytz zone (and a crontab's tz may be set to
    # one). Attached to a wall time with datetime.replace, a pytz zone gives its
    # first historical offset (Berlin: LMT +00:53), not the offset in force.
    pytz = pytest.importorskip("pytz")
    schedules, conf = crontabs("crontab", change.zone)
    for schedule in schedules.values():
        schedule.tz = pytz.timezone(change.zone)
    start, end_us = window(change, timedelta(hours=3), timedelta(hours=3))
    fleet = fleet_for(schedules, start, **conf)
    for _ in range(2):
        fleet.add()
    run_fixed_steps(fleet, end_us, lambda: 37.0, seed=10)
    expected = expected_slots(schedules, change.tz, datetime_to_us(start), end_us)
    assert_sent_exactly(fleet.drain(), expected)


class PytzLike(tzinfo):
    """Stands in for a pytz zone where pytz is not installed: a ``zone`` name, a
    ``localize`` method, and the zone's first historical offset (LMT) for any
    wall time it is attached to with ``replace``, as pytz gives."""

    zone = "Europe/Berlin"

    def localize(self, dt: datetime, is_dst: bool | None = False) -> datetime:
        raise NotImplementedError

    def utcoffset(self, dt: datetime | None) -> timedelta:
        return timedelta(minutes=53, seconds=28)

    def dst(self, dt: datetime | None) -> timedelta:
        return timedelta(0)

    def tzname(self, dt: datetime | None) -> str:
        return "LMT"


def test_a_pytz_like_zone_is_read_as_the_zoneinfo_zone_of_its_name() -> None:
    schedule = crontab(minute=30, hour=2)
    sequence = sequence_for(schedule, 0, PytzLike())
    after = datetime_to_us(datetime(2026, 3, 29, tzinfo=UTC))
    assert sequence.next_after(after) == utc_us(2026, 3, 29, 1, 30)  # 03:30 CEST
