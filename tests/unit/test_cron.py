"""Crontab instants (celery_singlebeat.timeline.cron): daylight-saving rules, field semantics,
inverse consistency, agreement with Celery where Celery is right, and speed.

The rules under test, from cron.py's docstring: in autumn a matching wall time
fires once, at its first occurrence; in spring a wall time inside the gap fires
shifted forward by the gap, and coincides with the run of the shifted wall time
if there is one. Every expected instant below is written out in UTC by hand.
"""

from __future__ import annotations

import random
import time
from datetime import date, datetime, timedelta, timezone, tzinfo
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from celery import Celery
from celery.schedules import crontab
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from celery_singlebeat.timeline.clock import US, datetime_to_us, us_to_datetime
from celery_singlebeat.timeline.cron import CronFields
from celery_singlebeat.timeline.slots import CronSequence, sequence_for

BERLIN = ZoneInfo("Europe/Berlin")
NEW_YORK = ZoneInfo("America/New_York")
UTC = ZoneInfo("UTC")
MINUTE_US = 60 * US
HOUR_US = 60 * MINUTE_US

# Deterministic property tests: no example database in the work tree, no flaky
# deadline on a loaded CI box.
PROPERTY = settings(
    max_examples=150,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)


def utc_us(*args: int) -> int:
    return datetime_to_us(datetime(*args, tzinfo=timezone.utc))  # type: ignore[misc]


def fields(tz: tzinfo, **kwargs: Any) -> CronFields:
    return CronFields.from_crontab(crontab(**kwargs), tz)


def runs_between(cron: CronFields, first_us: int, end_us: int) -> list[int]:
    """Every run in [first_us, end_us), found by stepping with next_after."""
    runs: list[int] = []
    at = cron.next_after(first_us - 1)
    while at is not None and at < end_us:
        runs.append(at)
        at = cron.next_after(at)
    return runs


def local_day(tz: tzinfo, day: date) -> tuple[int, int]:
    """The instants of local midnight of ``day`` and of the next day (both unambiguous
    in the zones used here: their changes happen at 01:00-03:00)."""
    start = datetime(day.year, day.month, day.day, tzinfo=tz)
    following = day + timedelta(days=1)
    end = datetime(following.year, following.month, following.day, tzinfo=tz)
    return datetime_to_us(start), datetime_to_us(end)


def oracle(schedule: crontab, tz: tzinfo, first_day: date, days: int) -> list[int]:
    """The runs by definition: every matching wall minute of each day, mapped to its
    instant with fold=0 (zoneinfo: first occurrence; a gap time takes the offset
    before the change), duplicates merged. Slow and obviously right."""
    instants = set()
    for n in range(days):
        day = first_day + timedelta(days=n)
        if (
            day.month not in schedule.month_of_year
            or day.day not in schedule.day_of_month
            or day.isoweekday() % 7 not in schedule.day_of_week
        ):
            continue
        for hour in schedule.hour:
            for minute in schedule.minute:
                wall = datetime(day.year, day.month, day.day, hour, minute, tzinfo=tz, fold=0)
                instants.add(datetime_to_us(wall))
    return sorted(instants)


def hours_from(
    start_us: int, count: int, step_us: int = HOUR_US, drop: tuple[int, ...] = ()
) -> list[int]:
    return [start_us + k * step_us for k in range(count) if k not in drop]


# (zone, local day, crontab, expected runs that day in UTC)
DST_DAYS = [
    # Europe/Berlin spring, 29 March 2026: 02:00 CET -> 03:00 CEST, a 23-hour day.
    # Hourly: the 02:00 wall time shifts to 03:00 CEST and is the 03:00 run: 23 runs,
    # one per real hour.
    ("Europe/Berlin", date(2026, 3, 29), {"minute": 0}, hours_from(utc_us(2026, 3, 28, 23), 23)),
    (
        "Europe/Berlin",
        date(2026, 3, 29),
        {"minute": "*/30"},
        hours_from(utc_us(2026, 3, 28, 23), 46, 30 * MINUTE_US),
    ),
    # 02:30 does not exist: it runs at 03:30 CEST = 01:30Z, once.
    ("Europe/Berlin", date(2026, 3, 29), {"minute": 30, "hour": 2}, [utc_us(2026, 3, 29, 1, 30)]),
    # Autumn, 25 October 2026: 03:00 CEST -> 02:00 CET, a 25-hour day. The repeated
    # 02:00 CET (01:00Z) does not fire again: 24 runs.
    (
        "Europe/Berlin",
        date(2026, 10, 25),
        {"minute": 0},
        hours_from(utc_us(2026, 10, 24, 22), 25, drop=(3,)),
    ),
    (
        "Europe/Berlin",
        date(2026, 10, 25),
        {"minute": "*/30"},
        hours_from(utc_us(2026, 10, 24, 22), 50, 30 * MINUTE_US, drop=(6, 7)),
    ),
    # 02:30 happens twice; it fires at its first occurrence, 02:30 CEST = 00:30Z, only.
    (
        "Europe/Berlin",
        date(2026, 10, 25),
        {"minute": 30, "hour": 2},
        [utc_us(2026, 10, 25, 0, 30)],
    ),
    # America/New_York spring, 8 March 2026: 02:00 EST -> 03:00 EDT.
    ("America/New_York", date(2026, 3, 8), {"minute": 0}, hours_from(utc_us(2026, 3, 8, 5), 23)),
    (
        "America/New_York",
        date(2026, 3, 8),
        {"minute": "*/30"},
        hours_from(utc_us(2026, 3, 8, 5), 46, 30 * MINUTE_US),
    ),
    # 02:30 EST would be 07:30Z = 03:30 EDT.
    ("America/New_York", date(2026, 3, 8), {"minute": 30, "hour": 2}, [utc_us(2026, 3, 8, 7, 30)]),
    # Autumn, 1 November 2026: 02:00 EDT -> 01:00 EST; 01:00-01:59 repeats.
    (
        "America/New_York",
        date(2026, 11, 1),
        {"minute": 0},
        hours_from(utc_us(2026, 11, 1, 4), 25, drop=(2,)),
    ),
    (
        "America/New_York",
        date(2026, 11, 1),
        {"minute": "*/30"},
        hours_from(utc_us(2026, 11, 1, 4), 50, 30 * MINUTE_US, drop=(4, 5)),
    ),
    # 02:30 is after the repeated hour there: once, at 02:30 EST = 07:30Z ...
    (
        "America/New_York",
        date(2026, 11, 1),
        {"minute": 30, "hour": 2},
        [utc_us(2026, 11, 1, 7, 30)],
    ),
    # ... and 01:30, which is repeated, fires at 01:30 EDT = 05:30Z only.
    (
        "America/New_York",
        date(2026, 11, 1),
        {"minute": 30, "hour": 1},
        [utc_us(2026, 11, 1, 5, 30)],
    ),
]


@pytest.mark.parametrize(
    ("zone", "day", "crontab_kwargs", "expected"),
    DST_DAYS,
    ids=[f"{z}-{d}-{'/'.join(map(str, s.values()))}" for z, d, s, _ in DST_DAYS],
)
def test_runs_on_daylight_saving_days(
    zone: str, day: date, crontab_kwargs: dict[str, Any], expected: list[int]
) -> None:
    tz = ZoneInfo(zone)
    cron = fields(tz, **crontab_kwargs)
    start, end = local_day(tz, day)
    runs = runs_between(cron, start, end)

    assert runs == expected
    assert len(set(runs)) == len(runs), "an instant came up twice"
    # No run at the second occurrence of a repeated wall time.
    assert all(us_to_datetime(r).astimezone(tz).fold == 0 for r in runs)
    # Counting agrees with stepping, and stepping backwards finds the same runs.
    assert cron.count_between(start, end - 1) == len(expected)
    backwards: list[int] = []
    at = cron.latest_at_or_before(end - 1)
    while at is not None and at >= start:
        backwards.append(at)
        at = cron.latest_at_or_before(at - 1)
    assert backwards[::-1] == expected


def test_spring_gap_time_shifted_onto_an_existing_run_is_one_slot() -> None:
    # 02:30 and 03:30 Berlin: on 29 March 2026 02:30 becomes 03:30 CEST, the same
    # instant as the 03:30 run, so that day has one run; the day before has two.
    cron = fields(BERLIN, minute=30, hour="2,3")
    assert runs_between(cron, *local_day(BERLIN, date(2026, 3, 29))) == [utc_us(2026, 3, 29, 1, 30)]
    assert runs_between(cron, *local_day(BERLIN, date(2026, 3, 28))) == [
        utc_us(2026, 3, 28, 1, 30),
        utc_us(2026, 3, 28, 2, 30),
    ]
    # A shifted gap time after the instant asked about is found although its wall
    # time (02:30) is earlier than the wall time of that instant (03:10 CEST).
    assert cron.next_after(utc_us(2026, 3, 29, 1, 10)) == utc_us(2026, 3, 29, 1, 30)


def test_runs_over_both_changes_match_the_definition() -> None:
    # Every 7 minutes at night, with the instants enumerated wall time by wall time as the
    # oracle: this covers the fast path next to the changes and the slow path on them.
    schedule = crontab(minute="*/7", hour="0-4")
    for tz, first_day in ((BERLIN, date(2026, 3, 28)), (NEW_YORK, date(2026, 10, 31))):
        expected = oracle(schedule, tz, first_day, 3)
        cron = CronFields.from_crontab(schedule, tz)
        start = datetime_to_us(datetime(first_day.year, first_day.month, first_day.day, tzinfo=tz))
        assert runs_between(cron, start, expected[-1] + 1) == expected


CASES = [
    (BERLIN, {"minute": 0}),
    (BERLIN, {"minute": "*/30"}),
    (BERLIN, {"minute": 30, "hour": 2}),
    (BERLIN, {"minute": "5,35", "hour": "1-3"}),
    (NEW_YORK, {"minute": 0}),
    (NEW_YORK, {"minute": 30, "hour": "1,2"}),
    (NEW_YORK, {"minute": "*/20", "hour": "0-2", "day_of_week": "sun"}),
    (UTC, {"minute": 15, "hour": "*/6"}),
]
# Instants spread over the four 2026 changes and a quiet day, to the microsecond.
CHANGES_US = [
    utc_us(2026, 3, 8, 7),
    utc_us(2026, 3, 29, 1),
    utc_us(2026, 10, 25, 1),
    utc_us(2026, 11, 1, 6),
    utc_us(2026, 6, 15, 12),
]
INSTANTS = st.builds(
    lambda base, offset: base + offset,
    st.sampled_from(CHANGES_US),
    st.integers(min_value=-36 * HOUR_US, max_value=36 * HOUR_US),
)


@PROPERTY
@given(case=st.sampled_from(CASES), instant=INSTANTS)
def test_latest_at_or_before_is_the_inverse_of_next_after(
    case: tuple[tzinfo, dict[str, Any]], instant: int
) -> None:
    tz, crontab_kwargs = case
    cron = fields(tz, **crontab_kwargs)
    following = cron.next_after(instant)
    assert following is not None and following > instant
    # a run is its own latest run, and nothing runs strictly between instant and it
    assert cron.latest_at_or_before(following) == following
    previous_of_following = cron.latest_at_or_before(following - 1)
    assert previous_of_following is None or previous_of_following <= instant
    latest = cron.latest_at_or_before(instant)
    assert latest is not None and latest <= instant
    assert cron.next_after(latest) == following
    assert cron.next_after(latest - 1) == latest


@PROPERTY
@given(case=st.sampled_from(CASES), first=INSTANTS, length=st.integers(0, 4 * 24 * HOUR_US))
def test_count_between_equals_stepping(
    case: tuple[tzinfo, dict[str, Any]], first: int, length: int
) -> None:
    tz, crontab_kwargs = case
    cron = fields(tz, **crontab_kwargs)
    assert cron.count_between(first, first + length) == len(
        runs_between(cron, first, first + length + 1)
    )


def test_day_of_week_and_day_of_month_must_both_match_like_celery() -> None:
    # Celery's crontab ANDs the two (unlike Vixie cron's OR): Friday the 13th.
    cron = fields(UTC, minute=0, hour=0, day_of_week="fri", day_of_month=13)
    start = utc_us(2026, 1, 1)
    runs = runs_between(cron, start, utc_us(2028, 1, 1))
    expected = [
        datetime_to_us(datetime(d.year, d.month, d.day, tzinfo=timezone.utc))
        for d in (date(2026, 1, 1) + timedelta(days=n) for n in range(730))
        if d.day == 13 and d.isoweekday() == 5
    ]
    assert runs == expected
    assert [us_to_datetime(r).date() for r in runs[:3]] == [
        date(2026, 2, 13),
        date(2026, 3, 13),
        date(2026, 11, 13),
    ]


def test_month_of_year() -> None:
    cron = fields(BERLIN, minute=0, hour=12, day_of_month=1, month_of_year="1,7")
    runs = runs_between(cron, utc_us(2026, 1, 1), utc_us(2027, 12, 31))
    # noon CET is 11:00Z, noon CEST 10:00Z
    assert runs == [
        utc_us(2026, 1, 1, 11),
        utc_us(2026, 7, 1, 10),
        utc_us(2027, 1, 1, 11),
        utc_us(2027, 7, 1, 10),
    ]
    assert cron.latest_at_or_before(utc_us(2026, 12, 31)) == utc_us(2026, 7, 1, 10)


def test_fields_that_never_match_give_none_at_once() -> None:
    # Celery refuses crontab(day_of_month=31, month_of_year=2) itself, so build the
    # fields directly: "31 February" and "30/31 February" never occur.
    for days in ({31}, {30, 31}):
        cron = CronFields({0}, {0}, set(range(7)), days, {2}, BERLIN)
        started = time.perf_counter()
        assert cron.next_after(utc_us(2026, 1, 1)) is None
        assert cron.latest_at_or_before(utc_us(2026, 1, 1)) is None
        assert cron.count_between(0, utc_us(2100, 1, 1)) == 0
        assert time.perf_counter() - started < 0.1


def test_a_combination_decades_apart_is_still_found() -> None:
    # 29 February on a Monday: 2044, then 2072 (2100 is no leap year). A search
    # that gives up after a few years would drop this entry as "never again".
    cron = fields(UTC, minute=0, hour=0, day_of_month=29, month_of_year=2, day_of_week="mon")
    started = time.perf_counter()
    assert cron.next_after(utc_us(2026, 1, 1)) == utc_us(2044, 2, 29)
    assert cron.next_after(utc_us(2044, 2, 29)) == utc_us(2072, 2, 29)
    assert cron.latest_at_or_before(utc_us(2071, 12, 31)) == utc_us(2044, 2, 29)
    assert cron.count_between(utc_us(2026, 1, 1), utc_us(2080, 1, 1)) == 2
    assert time.perf_counter() - started < 0.5


def test_fixed_offset_zone() -> None:
    tz = timezone(timedelta(hours=5, minutes=30))
    cron = fields(tz, minute=0, hour=9)
    assert cron.next_after(utc_us(2026, 5, 1)) == utc_us(2026, 5, 1, 3, 30)
    assert cron.latest_at_or_before(utc_us(2026, 5, 1)) == utc_us(2026, 4, 30, 3, 30)


CELERY_CRONTABS = [
    {},
    {"minute": 0},
    {"minute": "*/15"},
    {"minute": 30, "hour": 2},
    {"minute": "0,30", "hour": "9-17", "day_of_week": "mon-fri"},
    {"minute": 0, "hour": 0, "day_of_month": 1},
    {"minute": 15, "hour": 12, "day_of_month": "1,15", "month_of_year": "1-6"},
    {"minute": 0, "hour": 8, "day_of_week": "sat,sun"},
]


@pytest.mark.parametrize(
    "crontab_kwargs", CELERY_CRONTABS, ids=lambda s: "/".join(map(str, s.values()))
)
def test_agrees_with_celerys_remaining_estimate_in_utc(crontab_kwargs: dict[str, Any]) -> None:
    # In UTC there is no daylight saving, where Celery is right: our next run after
    # t must be t + the remaining time Celery computes when its "now" is t.
    app = Celery(set_as_current=False)
    app.conf.timezone = "UTC"
    ours = CronSequence(fields(UTC, **crontab_kwargs))
    rng = random.Random(20260329)
    for _ in range(40):
        instant = utc_us(2026, 1, 1) + rng.randrange(0, 2 * 365 * 24 * HOUR_US)
        now = us_to_datetime(instant)
        theirs = crontab(**crontab_kwargs, app=app, nowfun=lambda now=now: now)
        expected = datetime_to_us(now + theirs.remaining_estimate(now))
        assert ours.next_after(instant) == expected, now


@pytest.mark.parametrize(
    ("zone", "offset"),
    [("UTC", timedelta(0)), ("Etc/GMT-2", timedelta(hours=2)), ("Etc/GMT+5", timedelta(hours=-5))],
)
def test_a_zone_of_one_offset_runs_as_that_offset(zone: str, offset: timedelta) -> None:
    # Such a zone maps even runs a day away by one subtraction (cron.py's
    # _FIXED_KEYS): its runs must be those of the fixed offset, found the long way.
    rng = random.Random(20261204)
    for crontab_kwargs in CELERY_CRONTABS:
        named, fixed = (
            fields(ZoneInfo(zone), **crontab_kwargs),
            fields(timezone(offset), **crontab_kwargs),
        )
        for _ in range(40):
            instant = utc_us(2026, 1, 1) + rng.randrange(0, 365 * 24 * HOUR_US)
            assert named.next_after(instant) == fixed.next_after(instant), (crontab_kwargs, instant)
            assert named.latest_at_or_before(instant) == fixed.latest_at_or_before(instant)
    daily = fields(ZoneInfo(zone), minute=0, hour=9)
    nine = datetime(2026, 5, 2, 9, tzinfo=timezone(offset))
    assert daily.next_after(datetime_to_us(nine) - 20 * HOUR_US) == datetime_to_us(nine)


def test_sequence_for_builds_a_cron_sequence_in_the_given_zone() -> None:
    sequence = sequence_for(crontab(minute=30, hour=2), 0, BERLIN)
    assert isinstance(sequence, CronSequence)
    assert sequence.next_after(utc_us(2026, 3, 28, 12)) == utc_us(2026, 3, 29, 1, 30)


def test_next_after_is_fast_for_a_dense_crontab() -> None:
    # A complexity guard, generous on purpose: each call must not map hours of
    # candidate minutes (which took ~0.6 ms a call, 0.6 s here).
    cron = fields(BERLIN, minute="*")
    at = utc_us(2026, 5, 1)
    started = time.perf_counter()
    for _ in range(1000):
        following = cron.next_after(at)
        assert following == at + MINUTE_US
        at = following
    assert time.perf_counter() - started < 0.3


def test_equal_crontabs_in_one_zone_share_their_parsed_fields() -> None:
    berlin = ZoneInfo("Europe/Berlin")
    first = CronFields.from_crontab(crontab(minute="*/15"), berlin)
    # equal fields spelt differently are the same crontab
    assert CronFields.from_crontab(crontab(minute="0,15,30,45"), berlin) is first
    assert CronFields.from_crontab(crontab(minute="*/15"), ZoneInfo("UTC")) is not first
    assert CronFields.from_crontab(crontab(minute="*/20"), berlin) is not first
    assert CronFields.from_crontab(crontab(minute="*/15", hour=3), berlin) is not first


def test_a_zone_that_cannot_be_hashed_still_gets_its_fields() -> None:
    class Unhashable(tzinfo):
        __hash__ = None  # type: ignore[assignment]

        def utcoffset(self, dt: datetime | None) -> timedelta:
            return timedelta(hours=2)

        def dst(self, dt: datetime | None) -> timedelta:
            return timedelta(0)

    fields = CronFields.from_crontab(crontab(minute=0, hour=12), Unhashable())
    at = fields.next_after(datetime_to_us(datetime(2026, 6, 1, tzinfo=timezone.utc)))
    assert at == datetime_to_us(datetime(2026, 6, 1, 10, 0, tzinfo=timezone.utc))
