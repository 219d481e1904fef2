"""Slot sequences and the missed-run policy (celery_singlebeat.timeline.slots).

Intervals must give the same grid on every replica and across restarts, schedules
must convert the way Celery's own ScheduleEntry converts them, estimate-based
schedules must give whole-second instants that do not depend on where the
enumeration started, and plan_due must apply coalesce / skip / all exactly,
also after outages of millions of slots.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from typing import Any
from zoneinfo import ZoneInfo

import ephem
import pytest
from celery import Celery
from celery.beat import ScheduleEntry
from celery.schedules import crontab, schedule, solar
from hypothesis import given, settings
from hypothesis import strategies as st

from celery_singlebeat.exceptions import ScheduleError
from celery_singlebeat.timeline.clock import US, datetime_to_us, us_to_datetime
from celery_singlebeat.timeline.slots import (
    CronSequence,
    EstimateSequence,
    IntervalSequence,
    MissedPolicy,
    Plan,
    SlotSequence,
    plan_due,
    sequence_for,
    slot_header,
    slot_task_id,
)

UTC = ZoneInfo("UTC")
BERLIN = ZoneInfo("Europe/Berlin")
MINUTE_US = 60 * US
DAY_US = 86_400 * US
GRACE_US = 5 * US
ANCHOR_US = datetime_to_us(datetime(2026, 1, 1, 0, 0, 0, 123_456, tzinfo=timezone.utc))

PROPERTY = settings(max_examples=300, deadline=None, derandomize=True, database=None)


def utc_us(*args: int) -> int:
    return datetime_to_us(datetime(*args, tzinfo=timezone.utc))  # type: ignore[misc]


def policy(mode: str, max_missed: int = 100, grace_us: int = GRACE_US) -> MissedPolicy:
    return MissedPolicy(mode=mode, grace_us=grace_us, max_missed=max_missed)


@pytest.fixture(scope="module")
def app() -> Celery:
    app = Celery("test_slots", set_as_current=False)
    app.conf.timezone = "UTC"
    return app


# -- intervals -----------------------------------------------------------------


def test_interval_slots_are_anchor_plus_whole_periods() -> None:
    seq = IntervalSequence(ANCHOR_US, 7 * US)
    # k >= 1: the anchor itself (the moment the entry was first seen) is no slot
    assert seq.next_after(ANCHOR_US - 100 * US) == ANCHOR_US + 7 * US
    assert seq.next_after(ANCHOR_US) == ANCHOR_US + 7 * US
    assert seq.next_after(ANCHOR_US + 7 * US - 1) == ANCHOR_US + 7 * US
    assert seq.next_after(ANCHOR_US + 7 * US) == ANCHOR_US + 14 * US
    assert seq.latest_at_or_before(ANCHOR_US + 7 * US - 1) is None
    assert seq.latest_at_or_before(ANCHOR_US + 20 * US) == ANCHOR_US + 14 * US
    assert seq.count_between(ANCHOR_US - 50 * US, ANCHOR_US + 21 * US) == 3
    assert seq.count_between(ANCHOR_US + 8 * US, ANCHOR_US + 13 * US) == 0


def walk(seq: SlotSequence, start_us: int, count: int) -> list[int]:
    slots: list[int] = []
    at: int | None = start_us
    for _ in range(count):
        at = seq.next_after(at) if at is not None else None
        assert at is not None
        slots.append(at)
    return slots


def test_intervals_across_restarts_and_replicas_share_one_grid() -> None:
    # The anchor is stored once; a replica starting later (or this one after a
    # restart) builds its sequence from the stored anchor and gets the same instants.
    period = timedelta(seconds=7, milliseconds=250)
    first = sequence_for(period, ANCHOR_US, UTC)
    early = walk(first, ANCHOR_US + 3_200_000, 50)
    later = sequence_for(period, ANCHOR_US, UTC)
    late = walk(later, ANCHOR_US + 100_900_000, 20)
    assert set(late) < set(early)
    assert all((slot - ANCHOR_US) % 7_250_000 == 0 for slot in early + late)
    # A restart resumes from its last slot: the countdown is not reset to
    # "restart + period" but continues the grid.
    last_slot = early[10]
    restarted = sequence_for(period, ANCHOR_US, UTC)
    assert restarted.next_after(last_slot) == early[11]
    assert restarted.next_after(last_slot + 5 * US) == early[11]  # restarted mid-period


@pytest.mark.parametrize(
    ("given_schedule", "period_us"),
    [
        (30, 30 * US),
        (0.25, 250_000),
        (timedelta(minutes=2), 120 * US),
        (schedule(run_every=1.5), 1_500_000),
        (schedule(run_every=timedelta(milliseconds=1)), 1000),
    ],
    ids=["int", "float", "timedelta", "schedule-number", "schedule-1ms"],
)
def test_interval_schedules_as_celery_entries_hold_them(
    app: Celery, given_schedule: Any, period_us: int
) -> None:
    entry = ScheduleEntry(name="e", task="t", schedule=given_schedule, app=app)
    seq = sequence_for(entry.schedule, ANCHOR_US, app.timezone)
    assert seq == IntervalSequence(ANCHOR_US, period_us)


@pytest.mark.parametrize(
    "given_schedule", [0.0005, timedelta(0), timedelta(seconds=-1), schedule(timedelta(0))]
)
def test_intervals_shorter_than_a_millisecond_are_rejected(
    app: Celery, given_schedule: Any
) -> None:
    entry = ScheduleEntry(name="e", task="t", schedule=given_schedule, app=app)
    with pytest.raises(ScheduleError, match="shorter than 1 ms"):
        sequence_for(entry.schedule, ANCHOR_US, UTC)


def test_other_schedules_take_the_matching_sequence(app: Celery) -> None:
    class EveryTenSeconds(schedule):  # a subclass may override is_due: no grid assumed
        pass

    assert isinstance(sequence_for(crontab(minute=0), 0, UTC), CronSequence)
    assert isinstance(sequence_for(solar("sunrise", 52.5, 13.4, app=app), 0, UTC), EstimateSequence)
    assert isinstance(sequence_for(EveryTenSeconds(10), 0, UTC), EstimateSequence)
    with pytest.raises(ScheduleError, match="unsupported schedule type str"):
        sequence_for("every minute", 0, UTC)


def test_slot_task_id_and_header_identify_the_slot() -> None:
    slot = utc_us(2026, 3, 29, 1, 30)
    task_id = slot_task_id("report", slot)
    assert task_id == slot_task_id("report", slot)  # same on every replica
    assert uuid.UUID(task_id).version == 5
    assert len({task_id, slot_task_id("report", slot + 1), slot_task_id("report2", slot)}) == 3
    # The separator keeps ("a1", 23) and ("a", 123) apart.
    assert slot_task_id("a1", 23) != slot_task_id("a", 123)
    assert slot_header("report", slot) == {
        "entry": "report",
        "at": "2026-03-29T01:30:00+00:00",
        "at_us": slot,
    }


# -- estimate-based schedules --------------------------------------------------


def test_solar_slots_are_whole_seconds_independent_of_the_start(app: Celery) -> None:
    # Two replicas starting hours apart (one mid-second) must agree on every slot
    # key; each sunrise must be one slot, even when its instant rounds down.
    sequence = sequence_for(solar("sunrise", 52.52, 13.405, app=app), 0, UTC)
    a = walk(sequence, utc_us(2026, 6, 1, 3), 12)
    b = walk(sequence, utc_us(2026, 6, 1, 17, 42, 13) + 654_321, 12)
    assert a == b
    assert all(slot % US == 0 for slot in a)
    gaps = [later - earlier for earlier, later in zip(a, a[1:])]
    assert all(23 * 3600 * US < gap < 25 * 3600 * US for gap in gaps), gaps
    # Each slot is that day's sunrise, to the nearest second (computed here with
    # Celery's conventions: upper limb at -0:34, no refraction model).
    observer = ephem.Observer()
    observer.lat, observer.lon = "52.52", "13.405"
    observer.horizon, observer.pressure = "-0:34", 0
    for slot in a[:3]:
        observer.date = us_to_datetime(slot - 3600 * US).replace(tzinfo=None)
        rising = observer.next_rising(ephem.Sun()).datetime().replace(tzinfo=timezone.utc)
        assert abs(datetime_to_us(rising) - slot) <= US // 2 + 1000


@pytest.mark.parametrize(
    ("event", "lat", "lon"),
    # (not where astronomical dawn fails for weeks, as in Reykjavik: Celery
    # 5.2's solar raises a TypeError there; a later one skips to its return)
    [("sunset", 48.85, 2.35), ("sunrise", -33.87, 151.21), ("dawn_astronomical", 40.42, -3.70)],
)
def test_each_solar_event_is_one_slot_from_wherever_it_is_asked(
    app: Celery, event: str, lat: float, lon: float
) -> None:
    # ephem finds one event a few hundredths of a second apart when asked from
    # different instants; an event near a half second then rounded to two slots
    # a second apart (Paris, sunset of 2026-03-10: 17:47:57 and :58) and went
    # out twice. A year of events walked from one instant must be the slots
    # found from any instant, and from just around each slot.
    sequence = sequence_for(solar(event, lat, lon, app=app), 0, UTC)
    year = walk(sequence, utc_us(2026, 1, 1), 366)
    gaps = [later - earlier for earlier, later in zip(year, year[1:])]
    assert min(gaps) > 23 * 3600 * US, us_to_datetime(year[gaps.index(min(gaps))])
    for earlier, slot, later in zip(year, year[1:], year[2:]):
        assert sequence.next_after((earlier + slot) // 2) == slot
        for offset in (-US, -US // 2, -1):
            assert sequence.next_after(slot + offset) == slot
        for offset in (0, 1, US // 2):
            assert sequence.next_after(slot + offset) == later


class QuarterHourPlus:
    """A custom schedule: events at every quarter hour plus ``fraction_us``."""

    def __init__(self, fraction_us: int) -> None:
        self.fraction_us = fraction_us
        self.nowfun: Callable[[], datetime] | None = None

    def remaining_estimate(self, last_run_at: datetime) -> timedelta:
        assert self.nowfun is not None, "EstimateSequence pins now"
        now_us = datetime_to_us(self.nowfun())
        period = 15 * MINUTE_US
        event = (now_us - self.fraction_us) // period * period + period + self.fraction_us
        return timedelta(microseconds=event - now_us)


@pytest.mark.parametrize("fraction_us", [300_000, 700_000])
def test_custom_estimate_schedule_rounds_each_event_once(fraction_us: int) -> None:
    # 0.3 s rounds down (the slot is before the event: asking again from the slot
    # finds the same event, which must not become a second slot one second later);
    # 0.7 s rounds up.
    sequence = EstimateSequence(QuarterHourPlus(fraction_us))
    base = utc_us(2026, 1, 1)
    rounded = US if fraction_us > US // 2 else 0
    expected = [base + k * 15 * MINUTE_US + rounded for k in (0, 1, 2, 3)]
    assert walk(sequence, base - 14 * MINUTE_US + 17, 4) == expected
    assert walk(sequence, base - 1, 4) == expected
    assert sequence.latest_at_or_before(base) is None
    assert sequence.count_between(base, base + DAY_US) is None


def test_failing_estimate_is_a_schedule_error() -> None:
    class Broken:
        nowfun = None

        def remaining_estimate(self, last_run_at: datetime) -> timedelta:
            raise RuntimeError("no ephemeris")

    with pytest.raises(ScheduleError, match="no ephemeris"):
        EstimateSequence(Broken()).next_after(0)


# -- plan_due ------------------------------------------------------------------

MINUTELY = IntervalSequence(ANCHOR_US, MINUTE_US)
S = [ANCHOR_US + k * MINUTE_US for k in range(10)]  # S[1] is the first slot


@pytest.mark.parametrize("mode", ["coalesce", "skip", "all"])
def test_on_time_slots_are_proposed_by_every_policy(mode: str) -> None:
    for late_us in (0, 2 * US, GRACE_US):  # up to and including the grace
        plan = plan_due(MINUTELY, S[1], S[1] + late_us, policy(mode))
        assert plan == Plan([S[1]], 0, None, None, S[2])


def test_a_slot_later_than_grace_is_missed() -> None:
    now = S[1] + GRACE_US + 1
    assert plan_due(MINUTELY, S[1], now, policy("skip")) == Plan([], 1, S[1], S[1], S[2])
    assert plan_due(MINUTELY, S[1], now, policy("coalesce")) == Plan([S[1]], 0, None, None, S[2])


def test_a_slot_judged_as_of_an_earlier_instant_is_on_time_then() -> None:
    """judged_at_us: the caller held its proposals since then on purpose."""
    now = S[1] + GRACE_US + 7 * US
    assert plan_due(MINUTELY, S[1], now, policy("skip")) == Plan([], 1, S[1], S[1], S[2])
    # on time when the hold began: proposed, as at that instant
    held = plan_due(MINUTELY, S[1], now, policy("skip"), judged_at_us=S[1] + GRACE_US)
    assert held == Plan([S[1]], 0, None, None, S[2])
    # missed already when it began: still missed
    late = plan_due(MINUTELY, S[1], now, policy("skip"), judged_at_us=S[1] + GRACE_US + 1)
    assert late == Plan([], 1, S[1], S[1], S[2])
    # an instant after now changes nothing: never judged later than now
    assert plan_due(MINUTELY, S[1], S[1], policy("skip"), judged_at_us=S[3]) == plan_due(
        MINUTELY, S[1], S[1], policy("skip")
    )


@pytest.mark.parametrize("mode", ["coalesce", "skip", "all"])
def test_slots_a_hold_kept_back_are_judged_as_of_its_start_after_a_later_break(
    mode: str,
) -> None:
    """kept: a hold began at S[1] and kept S[1] and S[2] back until the
    connection broke again just after S[2]; the database was away until long
    after S[5], and the next hold began at ``back``. S[1] and S[2] are judged
    as of the first hold's start (on time); S[3] and S[4], which fell due
    while the database was away, as of ``back``: the policy's."""
    back = S[5] + 2 * US  # S[5] on time, S[3] and S[4] missed
    kept = [(S[1], S[2] + US)]
    plan = plan_due(MINUTELY, S[1], back, policy(mode), judged_at_us=back, kept=kept)
    missed = {"coalesce": [], "skip": [], "all": [S[3], S[4]]}[mode]
    skipped = 0 if mode == "all" else 2
    assert plan == Plan(
        [S[1], S[2], *missed, S[5]],
        skipped,
        S[3] if skipped else None,
        S[4] if skipped else None,
        S[6],
    )
    # without the span, the break's length made them late
    assert plan_due(MINUTELY, S[1], back, policy("skip"), judged_at_us=back) == Plan(
        [S[5]], 4, S[1], S[4], S[6]
    )
    # a span the entry has planned past changes nothing; one slot late before
    # the hold began stays the policy's (skip drops it, as without the break)
    assert plan_due(MINUTELY, S[3], back, policy("skip"), back, kept) == plan_due(
        MINUTELY, S[3], back, policy("skip"), back
    )
    early = [(S[2] + GRACE_US + 1, S[2] + GRACE_US + US)]
    assert plan_due(MINUTELY, S[1], back, policy("skip"), back, early) == Plan(
        [S[5]], 4, S[1], S[4], S[6]
    )


def test_not_due_yet_proposes_nothing() -> None:
    assert plan_due(MINUTELY, S[2], S[1] + 30 * US, policy("all")) == Plan([], 0, None, None, S[2])
    assert plan_due(MINUTELY, None, S[5], policy("all")) == Plan([], 0, None, None, None)


# S[1]..S[4] missed (now is 30 s after S[4]); S[5] is next.
MISSED_ONLY_NOW = S[4] + 30 * US
# S[1]..S[3] missed; S[4] on time (2 s late).
MISSED_THEN_ON_TIME_NOW = S[4] + 2 * US


@pytest.mark.parametrize(
    ("mode", "max_missed", "now", "expected"),
    [
        # coalesce: only the latest missed slot, and only with no on-time slot after it
        ("coalesce", 100, MISSED_ONLY_NOW, Plan([S[4]], 3, S[1], S[3], S[5])),
        ("coalesce", 1, MISSED_ONLY_NOW, Plan([S[4]], 3, S[1], S[3], S[5])),
        ("coalesce", 100, MISSED_THEN_ON_TIME_NOW, Plan([S[4]], 3, S[1], S[3], S[5])),
        ("skip", 100, MISSED_ONLY_NOW, Plan([], 4, S[1], S[4], S[5])),
        ("skip", 100, MISSED_THEN_ON_TIME_NOW, Plan([S[4]], 3, S[1], S[3], S[5])),
        ("all", 100, MISSED_ONLY_NOW, Plan(S[1:5], 0, None, None, S[5])),
        # all: at most max_missed, the most recent ones
        ("all", 2, MISSED_ONLY_NOW, Plan([S[3], S[4]], 2, S[1], S[2], S[5])),
        ("all", 2, MISSED_THEN_ON_TIME_NOW, Plan([S[2], S[3], S[4]], 1, S[1], S[1], S[5])),
    ],
)
def test_missed_policies(mode: str, max_missed: int, now: int, expected: Plan) -> None:
    assert plan_due(MINUTELY, S[1], now, policy(mode, max_missed)) == expected


def reference_plan(seq: SlotSequence, next_us: int | None, now: int, pol: MissedPolicy) -> Plan:
    """plan_due by its definition, visiting every slot."""
    slots: list[int] = []
    at = next_us
    while at is not None and at <= now:
        slots.append(at)
        at = seq.next_after(at)
    missed = [s for s in slots if now - s > pol.grace_us]
    on_time = [s for s in slots if now - s <= pol.grace_us]
    if pol.mode == "all":
        sent = missed[-pol.max_missed :]
    elif pol.mode == "coalesce" and missed and not on_time:
        sent = missed[-1:]
    else:
        sent = []
    skipped = [s for s in missed if s not in sent]
    return Plan(
        sent + on_time,
        len(skipped),
        skipped[0] if skipped else None,
        skipped[-1] if skipped else None,
        at,
    )


POLICIES = st.builds(
    MissedPolicy,
    mode=st.sampled_from(["coalesce", "skip", "all"]),
    grace_us=st.integers(0, 20 * MINUTE_US),
    max_missed=st.integers(1, 8),
)


@PROPERTY
@given(
    period_us=st.integers(1000, 10 * MINUTE_US),
    start=st.integers(0, 10 * MINUTE_US),
    span=st.integers(0, 3 * 3600 * US),
    pol=POLICIES,
)
def test_interval_plan_matches_the_definition(
    period_us: int, start: int, span: int, pol: MissedPolicy
) -> None:
    seq = IntervalSequence(ANCHOR_US, period_us)
    first = seq.next_after(ANCHOR_US + start)
    if (span // period_us) > 5000:
        span = 5000 * period_us  # keep the reference walk short
    now = first + span
    assert plan_due(seq, first, now, pol) == reference_plan(seq, first, now, pol)


CRONTABS = [
    {"minute": "*/10"},
    {"minute": 0},
    {"minute": 30, "hour": "1-3"},
    {"minute": "*/15", "hour": "0-3", "day_of_week": "sun"},
]


@PROPERTY
@given(
    fields=st.sampled_from(CRONTABS),
    zone=st.sampled_from(["Europe/Berlin", "America/New_York"]),
    start=st.sampled_from([utc_us(2026, 3, 27), utc_us(2026, 10, 23), utc_us(2026, 10, 31)]),
    offset=st.integers(0, 2 * DAY_US),
    span=st.integers(0, 3 * DAY_US),
    pol=POLICIES,
)
def test_crontab_plan_matches_the_definition_across_changes(
    fields: dict[str, Any], zone: str, start: int, offset: int, span: int, pol: MissedPolicy
) -> None:
    seq = sequence_for(crontab(**fields), 0, ZoneInfo(zone))
    first = seq.next_after(start + offset)
    assert first is not None
    now = first + span
    assert plan_due(seq, first, now, pol) == reference_plan(seq, first, now, pol)


def test_a_month_long_outage_of_a_one_second_interval_is_counted_without_walking() -> None:
    seq = IntervalSequence(ANCHOR_US, US)
    now = ANCHOR_US + 30 * DAY_US
    total = 30 * 86_400  # slots ANCHOR+1s .. now
    on_time = 6  # now-5s .. now: lateness <= grace
    missed = total - on_time
    started = time.perf_counter()
    skip = plan_due(seq, ANCHOR_US + US, now, policy("skip"))
    coalesce = plan_due(seq, ANCHOR_US + US, now, policy("coalesce"))
    every = plan_due(seq, ANCHOR_US + US, now, policy("all", 100))
    elapsed = time.perf_counter() - started
    assert elapsed < 0.5  # a complexity guard (walking 2.6 M slots takes seconds)
    last_missed = now - 6 * US
    on_time_slots = [now - k * US for k in range(5, -1, -1)]
    assert skip == Plan(on_time_slots, missed, ANCHOR_US + US, last_missed, now + US)
    assert coalesce == skip  # an on-time slot follows: nothing missed is sent
    recent = [last_missed - k * US for k in range(99, -1, -1)]
    assert every == Plan(
        recent + on_time_slots, missed - 100, ANCHOR_US + US, last_missed - 100 * US, now + US
    )


@pytest.mark.parametrize(
    ("first_day", "end_day", "lost"),
    [
        # every minute is a run in spring (gap times coincide with real minutes) ...
        ((2026, 3, 1), (2026, 5, 1), 0),
        # ... and in autumn the 60 minutes of the repeated hour do not run again
        ((2026, 10, 1), (2026, 12, 1), 60),
    ],
)
def test_a_crontab_missed_for_months_is_counted_exactly_and_fast(
    first_day: tuple[int, int, int], end_day: tuple[int, int, int], lost: int
) -> None:
    seq = sequence_for(crontab(), 0, BERLIN)
    first = utc_us(*first_day)
    now = utc_us(*end_day) + 30 * US  # 30 s late for the run at end_day 00:00
    started = time.perf_counter()
    plan = plan_due(seq, first, now, policy("all", 100))
    coalesce = plan_due(seq, first, now, policy("coalesce"))
    assert time.perf_counter() - started < 0.5  # walking them took ~6 s a month
    last = utc_us(*end_day)
    missed = (last - first) // MINUTE_US + 1 - lost
    assert plan.propose == [last - k * MINUTE_US for k in range(99, -1, -1)]
    assert plan.skipped == missed - 100
    assert (plan.skipped_first_us, plan.skipped_last_us) == (first, last - 100 * MINUTE_US)
    assert plan.next_us == last + MINUTE_US
    assert coalesce == Plan([last], missed - 1, first, last - MINUTE_US, last + MINUTE_US)


def test_an_hourly_crontab_missed_for_a_year() -> None:
    seq = sequence_for(crontab(minute=0), 0, BERLIN)
    first = seq.next_after(utc_us(2026, 1, 1) - 1)
    assert first == utc_us(2026, 1, 1)
    now = utc_us(2027, 1, 1) + 60 * US
    plan = plan_due(seq, first, now, policy("skip"))
    # every hour from 2026-01-01 00:00Z to 2027-01-01 00:00Z (that one is 60 s late),
    # but the repeated 02:00 CET of 25 October
    assert plan.skipped == 365 * 24 + 1 - 1
    assert plan.propose == []
    assert plan.next_us == utc_us(2027, 1, 1, 1)


def test_estimate_sequences_are_planned_by_walking(app: Celery) -> None:
    seq = sequence_for(solar("sunrise", 52.52, 13.405, app=app), 0, UTC)
    first = seq.next_after(utc_us(2026, 6, 1))
    assert first is not None
    now = first + 10 * DAY_US
    plan = plan_due(seq, first, now, policy("all", 3))
    assert plan == reference_plan(seq, first, now, policy("all", 3))
    # one sunrise a day, June 1 to 11, all later than grace: 3 sent, 8 skipped
    assert plan.skipped == 8 and len(plan.propose) == 3
