"""slot_bounds: one run, start and end, the first N runs and the jitter, as slot
sequences, against a brute-force enumeration of the instants they stand for.

Each sequence answers three questions (``next_after``, ``latest_at_or_before``,
``count_between``); the engine, the fleet's status and ``next_runs`` use all
three, so each must agree with the set of instants the wrapper defines. The
inner sequences are intervals and crontabs (in zones with daylight-saving
changes inside the window); their instants are listed by walking them, and
the bounded set is then computed by hand from that list.
"""

from __future__ import annotations

import pickle
from bisect import bisect_left, bisect_right
from datetime import datetime, timedelta, timezone
from zoneinfo import ZoneInfo

import pytest
from celery.schedules import crontab
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from celery_singlebeat.timeline.bounds import (
    At,
    AtSequence,
    BoundedSchedule,
    BoundedSequence,
    Bounds,
    JitteredSequence,
    bounded_sequence,
    jitter_offset_us,
)
from celery_singlebeat.timeline.catalog_form import sequence_of, spec_of
from celery_singlebeat.timeline.clock import US, datetime_to_us, us_to_datetime
from celery_singlebeat.timeline.slots import (
    CronSequence,
    IntervalSequence,
    SlotSequence,
    sequence_for,
)

UTC = timezone.utc
MINUTE_US = 60 * US
HOUR_US = 60 * MINUTE_US
DAY_US = 24 * HOUR_US
#: the window the instants are listed in: two days around Europe's spring
#: change (29 March 2026, 01:00 UTC), and far enough from its edges that
#: every answer asked about lies inside it
W0 = datetime_to_us(datetime(2026, 3, 28, tzinfo=UTC))
W1 = W0 + 2 * DAY_US
MARGIN = 6 * HOUR_US

CRONTABS = [
    {"minute": "*/7"},
    {"minute": 0, "hour": "*/3"},
    {"minute": "15,45", "hour": "1-3"},
    {"minute": 30, "hour": 2},
    {"minute": "*/20", "hour": "0-4,22-23"},
]
ZONES = ["UTC", "Europe/Paris", "America/New_York"]

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def listed(sequence: SlotSequence, first_us: int = W0 - MARGIN, last_us: int = W1 + MARGIN):
    """Every instant of ``sequence`` in ``(first_us, last_us]``, by walking it."""
    out = []
    at = sequence.next_after(first_us)
    while at is not None and at <= last_us:
        out.append(at)
        at = sequence.next_after(at)
    return out


@st.composite
def inners(draw: st.DrawFn) -> SlotSequence:
    if draw(st.booleans()):
        period = draw(st.integers(min_value=1, max_value=3 * 3600)) * US
        anchor = draw(st.integers(min_value=W0 - DAY_US, max_value=W0 + HOUR_US))
        return IntervalSequence(anchor, period)
    fields = draw(st.sampled_from(CRONTABS))
    zone = draw(st.sampled_from(ZONES))
    return sequence_for(crontab(**fields), 0, ZoneInfo(zone))


def instants_in_window() -> st.SearchStrategy[int]:
    return st.integers(min_value=W0, max_value=W1)


def brute_next(points: list[int], t: int) -> int | None:
    i = bisect_right(points, t)
    return points[i] if i < len(points) else None


def brute_latest(points: list[int], t: int) -> int | None:
    i = bisect_right(points, t)
    return points[i - 1] if i else None


def brute_count(points: list[int], first: int, last: int) -> int:
    return max(0, bisect_right(points, last) - bisect_left(points, first))


def agrees(sequence: SlotSequence, points: list[int], queries: list[int]) -> None:
    """``sequence`` answers as the set ``points`` (complete over the window)."""
    for t in queries:
        assert sequence.next_after(t) == brute_next(points, t), ("next_after", t)
        assert sequence.latest_at_or_before(t) == brute_latest(points, t), ("latest", t)
    for a, b in zip(queries, queries[1:]):
        first, last = min(a, b), max(a, b)
        assert sequence.count_between(first, last) == brute_count(points, first, last), (
            "count",
            first,
            last,
        )


# -- AtSequence --------------------------------------------------------------------


def test_at_is_one_instant() -> None:
    at = AtSequence(1_000)
    assert (at.next_after(999), at.next_after(1_000), at.next_after(5_000)) == (1_000, None, None)
    assert (at.latest_at_or_before(999), at.latest_at_or_before(1_000)) == (None, 1_000)
    assert (
        at.count_between(0, 999),
        at.count_between(1_000, 1_000),
        at.count_between(0, 10**9),
    ) == (
        0,
        1,
        1,
    )


def test_at_schedule_keeps_utc_and_refuses_naive() -> None:
    paris = datetime(2026, 12, 24, 18, tzinfo=ZoneInfo("Europe/Paris"))
    at = At(paris)
    assert at.at == datetime(2026, 12, 24, 17, tzinfo=UTC) and at.at.tzinfo is UTC
    assert at == At(datetime(2026, 12, 24, 17, tzinfo=UTC))
    assert sequence_for(at, 0, UTC).next_after(0) == datetime_to_us(paris)
    with pytest.raises(ValueError, match="naive"):
        At(datetime(2026, 12, 24, 18))


# -- BoundedSequence ---------------------------------------------------------------


@SETTINGS
@given(
    inner=inners(),
    start=st.none() | instants_in_window(),
    end=st.none() | instants_in_window(),
    max_runs=st.none() | st.integers(min_value=1, max_value=40),
    runs_from=instants_in_window(),
    queries=st.lists(instants_in_window(), min_size=2, max_size=12),
)
def test_bounded_agrees_with_brute_force(
    inner: SlotSequence,
    start: int | None,
    end: int | None,
    max_runs: int | None,
    runs_from: int,
    queries: list[int],
) -> None:
    if max_runs is not None and start is None and runs_from is None:
        return
    firsts: list[int] = []
    if max_runs is not None:
        low = runs_from if start is None else max(start, runs_from)
        at = inner.next_after(low - 1)
        while at is not None and len(firsts) < max_runs:
            firsts.append(at)
            at = inner.next_after(at)
    everything = listed(inner, W0 - 2 * DAY_US, max([W1 + 2 * DAY_US, *firsts]))
    points = [p for p in everything if (start is None or p >= start) and (end is None or p <= end)]
    if max_runs is not None:
        chosen = set(firsts)
        points = [p for p in points if p in chosen]
    bounded = BoundedSequence(inner, start, end, runs_from if max_runs else None, max_runs)
    # only ask where the brute-force list is complete: nothing of the set lies
    # outside [W0 - 2 days, W1 + 2 days] that could be an answer for a query
    # in the window, unless the set is open on that side
    open_low = start is None and max_runs is None
    open_high = end is None and max_runs is None
    for t in queries:
        expected_next = brute_next(points, t)
        got = bounded.next_after(t)
        if expected_next is None and open_high:
            assert got is None or got > W1 + 2 * DAY_US
        else:
            assert got == expected_next, ("next_after", t)
        expected_latest = brute_latest(points, t)
        got = bounded.latest_at_or_before(t)
        if expected_latest is None and open_low:
            assert got is None or got < W0 - 2 * DAY_US
        else:
            assert got == expected_latest, ("latest", t)
    for a, b in zip(queries, queries[1:]):
        first, last = min(a, b), max(a, b)
        assert bounded.count_between(first, last) == brute_count(points, first, last)


def test_max_runs_counts_from_the_later_of_start_and_runs_from() -> None:
    inner = IntervalSequence(0, 10)
    assert listed(BoundedSequence(inner, start_us=100, runs_from_us=55, max_runs=3), 0, 10**4) == [
        100,
        110,
        120,
    ]
    assert listed(BoundedSequence(inner, start_us=100, runs_from_us=155, max_runs=3), 0, 10**4) == [
        160,
        170,
        180,
    ]
    # an end before the n-th run cuts the runs short
    assert listed(BoundedSequence(inner, 100, 115, None, 3), 0, 10**4) == [100, 110]


def test_max_runs_of_a_sequence_that_ends_first_keeps_what_there_is() -> None:
    bounded = BoundedSequence(AtSequence(500), runs_from_us=0, max_runs=3)
    assert listed(bounded, 0, 10**4) == [500]
    assert bounded.count_between(0, 10**4) == 1


def test_max_runs_needs_a_place_to_count_from() -> None:
    with pytest.raises(ValueError, match="count from"):
        BoundedSequence(IntervalSequence(0, 10), max_runs=3)
    with pytest.raises(ValueError, match="1 or more"):
        BoundedSequence(IntervalSequence(0, 10), runs_from_us=0, max_runs=0)


@pytest.mark.parametrize("zone", ["Europe/Paris", "America/New_York"])
def test_many_runs_of_a_crontab_are_found_by_counting_as_by_walking(zone: str) -> None:
    """Past 4,096 runs the last one is found by bisecting on count_between;
    it is the instant a walk finds."""
    cron = sequence_for(crontab(minute="*/5"), 0, ZoneInfo(zone))
    low = datetime_to_us(datetime(2026, 3, 1, 0, 2, tzinfo=UTC))
    n = 12_345  # about 43 days of 5 minutes: across the spring change
    bounded = BoundedSequence(cron, runs_from_us=low, max_runs=n)
    walked = low - 1
    for _ in range(n):
        walked = cron.next_after(walked)  # type: ignore[assignment]
    assert bounded.high_us == walked
    assert bounded.next_after(walked) is None
    assert bounded.next_after(walked - 1) == walked
    assert bounded.count_between(0, 2**62) == n


def test_many_runs_of_an_interval_are_arithmetic() -> None:
    bounded = BoundedSequence(IntervalSequence(7, 10), runs_from_us=0, max_runs=10**9)
    assert bounded.high_us == 17 + (10**9 - 1) * 10
    assert bounded.count_between(-(10**12), 10**13) == 10**9


# -- JitteredSequence --------------------------------------------------------------


def test_the_offset_is_fixed_bytes_of_blake2b() -> None:
    # the same on every machine and Python version: pinned values
    assert [jitter_offset_us("report", at, 10 * US) for at in (0, US, 1_774_000_000 * US)] == [
        jitter_offset_us("report", 0, 10 * US),
        jitter_offset_us("report", US, 10 * US),
        jitter_offset_us("report", 1_774_000_000 * US, 10 * US),
    ]
    assert jitter_offset_us("report", 0, 10 * US) == PINNED_OFFSET
    assert jitter_offset_us("x", 123, 0) == 0
    offsets = {jitter_offset_us("e", at * MINUTE_US, 30 * US) for at in range(2000)}
    assert min(offsets) >= 0 and max(offsets) < 30 * US
    assert len(offsets) > 1900  # spread, not a constant
    assert jitter_offset_us("a", 0, 10**9) != jitter_offset_us("b", 0, 10**9)


#: blake2b(b"report\x00" + (0).to_bytes(16, "big", signed=True), digest_size=8) % 10 s
PINNED_OFFSET = int.from_bytes(
    __import__("hashlib").blake2b(b"report\x00" + bytes(16), digest_size=8).digest(),
    "big",
) % (10 * US)


@SETTINGS
@given(
    inner=inners(),
    key=st.text(min_size=1, max_size=20),
    fraction=st.floats(min_value=0.0, max_value=1.0),
    queries=st.lists(instants_in_window(), min_size=2, max_size=12),
)
def test_jittered_agrees_with_brute_force(
    inner: SlotSequence, key: str, fraction: float, queries: list[int]
) -> None:
    everything = listed(inner, W0 - 2 * DAY_US, W1 + 2 * DAY_US)
    gap = min(b - a for a, b in zip(everything, everything[1:]))
    jitter = int(gap * fraction)
    jittered = JitteredSequence(inner, key, jitter)
    points = [jittered.moved(p) for p in everything]
    offsets = [m - p for m, p in zip(points, everything)]
    assert all(0 <= o < max(jitter, 1) for o in offsets)
    assert all(a < b for a, b in zip(points, points[1:])), "strictly increasing"
    agrees(jittered, points, queries)


def test_jitter_moves_each_instant_by_its_own_offset() -> None:
    inner = IntervalSequence(0, HOUR_US)
    jittered = JitteredSequence(inner, "nightly", 10 * MINUTE_US)
    runs = listed(jittered, 0, 11 * HOUR_US)[:10]
    assert [r // HOUR_US for r in runs] == list(range(1, 11))
    assert runs == [
        h * HOUR_US + jitter_offset_us("nightly", h * HOUR_US, 10 * MINUTE_US) for h in range(1, 11)
    ]
    # every replica computes the same: a second sequence, the same instants
    assert listed(JitteredSequence(inner, "nightly", 10 * MINUTE_US), 0, 11 * HOUR_US)[:10] == runs


# -- bounded_sequence, the hook, the spec ------------------------------------------


def test_an_interval_with_a_start_runs_at_the_start_whatever_its_anchor() -> None:
    start = datetime_to_us(datetime(2026, 5, 1, 9, tzinfo=UTC))
    bounds = Bounds(start_us=start)
    for anchor in (0, start - 7, start + 12_345):
        sequence = bounded_sequence(timedelta(minutes=30), anchor, UTC, bounds)
        assert listed(sequence, start - DAY_US, start + HOUR_US) == [
            start,
            start + 30 * MINUTE_US,
            start + HOUR_US,
        ]


def test_bounds_apply_to_the_jittered_instants() -> None:
    # a jittered run moved past the end is not sent
    bounds = Bounds(start_us=0, end_us=10 * HOUR_US, jitter_us=59 * MINUTE_US, jitter_key="k")
    sequence = bounded_sequence(timedelta(hours=1), 0, UTC, bounds)
    runs = listed(sequence, -1, 20 * HOUR_US)
    jittered = JitteredSequence(IntervalSequence(-HOUR_US, HOUR_US), "k", 59 * MINUTE_US)
    assert runs == [r for r in listed(jittered, -1, 20 * HOUR_US) if r <= 10 * HOUR_US]


def test_sequence_for_asks_a_schedule_for_its_own_sequence() -> None:
    class Own:
        def slot_sequence(self, anchor_us: int, tz: object) -> SlotSequence:
            return AtSequence(anchor_us + 5)

    assert sequence_for(Own(), 100, UTC).next_after(0) == 105
    bounded = BoundedSchedule(crontab(minute=0), Bounds(max_runs=2, runs_from_us=0))
    sequence = sequence_for(bounded, 0, UTC)
    assert listed(sequence, -1, DAY_US) == [0, HOUR_US]


@pytest.mark.parametrize(
    "schedule",
    [
        crontab(minute="*/15", hour="1-3"),
        timedelta(minutes=10),
        At(datetime(2026, 3, 29, 1, 30, tzinfo=UTC)),
    ],
    ids=["crontab", "interval", "at"],
)
def test_the_fleet_rebuilds_the_same_sequence_from_the_spec(schedule: object) -> None:
    tz = ZoneInfo("Europe/Paris")
    start = datetime_to_us(datetime(2026, 3, 28, 22, tzinfo=UTC))
    bounds = Bounds(
        start_us=start,
        end_us=start + DAY_US,
        runs_from_us=start - HOUR_US,
        max_runs=7,
        jitter_us=90 * US,
        jitter_key="entry",
    )
    bounded = BoundedSchedule(schedule, bounds)
    text, spec = spec_of(bounded, tz)
    assert "at most 7 runs" in text and "jitter 90s" in text and "from 2026-03-28T22:00:00Z" in text
    rebuilt = sequence_of(spec, 0)
    assert rebuilt is not None
    assert listed(rebuilt, start - DAY_US, start + 2 * DAY_US) == listed(
        sequence_for(bounded, 0, tz), start - DAY_US, start + 2 * DAY_US
    )


def test_a_schedule_without_bounds_has_its_inner_spec() -> None:
    tz = ZoneInfo("Europe/Paris")
    for schedule in (crontab(minute=5), timedelta(seconds=30)):
        assert spec_of(BoundedSchedule(schedule), tz) == spec_of(schedule, tz)
    assert isinstance(
        sequence_of(spec_of(BoundedSchedule(timedelta(seconds=30)), tz)[1], 0), IntervalSequence
    )


def test_a_spec_with_a_bound_of_a_newer_release_is_not_guessed() -> None:
    assert sequence_of('{"kind":"at","at_us":5,"bounds":{"every_other":1}}', 0) is None
    assert sequence_of('{"kind":"at","at_us":5}', 0) == AtSequence(5)


def test_sequences_pickle_and_print() -> None:
    at = At(us_to_datetime(5 * US))
    assert pickle.loads(pickle.dumps(at)) == at
    assert repr(at) == "At(1970-01-01T00:00:05+00:00)"
    assert "JitteredSequence" in repr(JitteredSequence(AtSequence(1), "k", 1))
    assert "BoundedSequence" in repr(BoundedSequence(AtSequence(1), 0))
    assert isinstance(sequence_for(crontab(), 0, UTC), CronSequence)
