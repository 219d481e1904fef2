"""The database clock estimate (celery_singlebeat.timeline.clock) and the microsecond helpers.

DatabaseClock takes its local clocks as arguments; the tests pass clocks they
set by hand, so every sample's latency and age is exact.
"""

from __future__ import annotations

import random
from datetime import datetime, timedelta, timezone
from zoneinfo import ZoneInfo

import pytest

from celery_singlebeat.timeline.clock import US, DatabaseClock, datetime_to_us, us_to_datetime


class Clocks:
    """A hand-set wall clock (seconds since the epoch) and monotonic clock."""

    def __init__(self) -> None:
        self.wall_s = 1_780_000_000.0
        self.monotonic_s = 1000.0

    def wall(self) -> float:
        return self.wall_s

    def monotonic(self) -> float:
        return self.monotonic_s


@pytest.fixture
def clocks() -> Clocks:
    return Clocks()


@pytest.fixture
def clock(clocks: Clocks) -> DatabaseClock:
    return DatabaseClock(wall=clocks.wall, monotonic=clocks.monotonic)


T0 = 1_780_000_000 * US


def observe(clock: DatabaseClock, offset_us: int, latency_us: int, sent_us: int = T0) -> None:
    """A round trip sent at ``sent_us`` (local) whose answer, stamped by the database
    halfway through, is ``offset_us`` ahead of the local clock."""
    midpoint = sent_us + latency_us // 2
    clock.observe(midpoint + offset_us, sent_us, sent_us + latency_us)


def test_unsynchronised_until_the_first_round_trip(clock: DatabaseClock, clocks: Clocks) -> None:
    assert not clock.synchronised
    assert clock.offset_us == 0
    assert clock.now_us() == T0  # the local clock until told otherwise
    observe(clock, offset_us=-250_000, latency_us=2000)
    assert clock.synchronised


def test_offset_is_taken_from_the_round_trip_midpoint(clock: DatabaseClock, clocks: Clocks) -> None:
    # sent at T0, answered at T0 + 4 ms; the database said T0 + 2 ms + 1.5 s
    clock.observe(T0 + 2000 + 1_500_000, T0, T0 + 4000)
    assert clock.offset_us == 1_500_000
    clocks.wall_s += 10
    assert clock.now_us() == T0 + 10 * US + 1_500_000
    assert clock.now() == us_to_datetime(T0 + 10 * US + 1_500_000)
    assert clock.now().tzinfo is timezone.utc


def test_keeps_the_lowest_latency_sample(clock: DatabaseClock, clocks: Clocks) -> None:
    observe(clock, offset_us=500_000, latency_us=2000)
    # slower round trips bound the offset less tightly: ignored, even slightly slower
    observe(clock, offset_us=501_200, latency_us=3000)
    observe(clock, offset_us=499_500, latency_us=2001)
    assert clock.offset_us == 500_000
    # a faster one replaces it, and so does an equally fast, newer one
    observe(clock, offset_us=500_400, latency_us=1000)
    assert clock.offset_us == 500_400
    clocks.monotonic_s += 1
    observe(clock, offset_us=500_300, latency_us=1000)
    assert clock.offset_us == 500_300


def test_a_stale_sample_is_replaced(clock: DatabaseClock, clocks: Clocks) -> None:
    observe(clock, offset_us=500_000, latency_us=1000)
    clocks.monotonic_s += DatabaseClock.max_sample_age_s - 1
    observe(clock, offset_us=510_000, latency_us=50_000)
    assert clock.offset_us == 500_000  # still fresh: the slow sample is ignored
    clocks.monotonic_s += 2  # now older than max_sample_age_s
    observe(clock, offset_us=510_000, latency_us=50_000)
    assert clock.offset_us == 510_000
    # the replacement becomes the sample to beat
    observe(clock, offset_us=520_000, latency_us=60_000)
    assert clock.offset_us == 510_000


def test_a_clock_step_is_believed_at_once(clock: DatabaseClock, clocks: Clocks) -> None:
    # A sample whose error bound excludes the kept offset: one clock stepped
    # (NTP, VM resume). Keeping the old, tighter sample would misjudge "now" by
    # the whole step for up to max_sample_age_s.
    observe(clock, offset_us=500_000, latency_us=1000)
    observe(clock, offset_us=90_500_000, latency_us=5000)
    assert clock.offset_us == 90_500_000
    # ... and a consistent, slower sample after that does not move it back
    observe(clock, offset_us=90_501_000, latency_us=8000)
    assert clock.offset_us == 90_500_000


def test_a_wall_clock_step_back_during_a_round_trip(clock: DatabaseClock) -> None:
    # received before sent (NTP stepped the clock back): latency counts as zero
    clock.observe(T0 + 300_000, T0 + 1000, T0)
    assert clock.synchronised
    assert clock.offset_us == 300_000 - 500


def test_microseconds_round_trip_exactly_over_the_whole_datetime_range() -> None:
    lowest = datetime_to_us(datetime.min.replace(tzinfo=timezone.utc))
    highest = datetime_to_us(datetime.max.replace(tzinfo=timezone.utc))
    rng = random.Random(1970)
    values = [0, 1, -1, lowest, highest, T0, T0 + 999_999]
    values += [rng.randint(lowest, highest) for _ in range(2000)]
    values += [T0 + rng.randint(-(10**15), 10**15) for _ in range(2000)]
    for value in values:
        moment = us_to_datetime(value)
        assert moment.tzinfo is timezone.utc
        assert datetime_to_us(moment) == value


def test_datetime_to_us_of_any_zone_and_naive_rejected() -> None:
    berlin = datetime(2026, 3, 29, 3, 30, tzinfo=ZoneInfo("Europe/Berlin"))
    assert datetime_to_us(berlin) == datetime_to_us(
        datetime(2026, 3, 29, 1, 30, tzinfo=timezone.utc)
    )
    assert datetime_to_us(datetime(1970, 1, 1, 1, tzinfo=timezone(timedelta(hours=1)))) == 0
    with pytest.raises(ValueError, match="naive datetime"):
        datetime_to_us(datetime(2026, 1, 1))
