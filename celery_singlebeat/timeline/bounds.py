"""Slot sequences that bound, jitter or end another: the maths of a stored entry.

A stored schedule (``celery_singlebeat.schedules``) is a Celery schedule plus
limits a person sets on it: runs only from ``start`` and until ``end``, at
most ``max_runs`` runs, each run moved later by a deterministic jitter, or one
run at an instant. Each limit is a :class:`~celery_singlebeat.timeline.slots.SlotSequence`
wrapping another, so the engine, the fleet's status and ``next_runs`` all
compute one set of instants from one rule, and every replica finds the same:

* :class:`AtSequence`: one instant;
* :class:`JitteredSequence`: each instant moved later by an offset drawn from
  a key (the entry's name) and the instant, the same on every machine;
* :class:`BoundedSequence`: only the instants within ``[start, end]``, and only
  the first ``max_runs`` of them counted from a fixed instant.

:func:`bounded_sequence` builds the whole stack for a schedule and its
:class:`Bounds`. Instants are integers, microseconds since the epoch (UTC).
Pure: no store, no configuration, no clock of its own.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone, tzinfo

from .clock import datetime_to_us
from .slots import IntervalSequence, SlotSequence, period_of, sequence_for

#: Up to this many runs, the last of ``max_runs`` is found by walking the
#: instants one by one; beyond, by bisecting on ``count_between`` (a walk of
#: a million crontab minutes would take minutes of CPU at start-up).
_WALK_LIMIT = 4096


def jitter_offset_us(key: str, instant_us: int, jitter_us: int) -> int:
    """The offset of ``instant_us`` in ``[0, jitter_us)``: a hash of ``key`` and
    the instant, the same on every machine and Python version (blake2b of fixed
    bytes, never ``hash()``, which is salted per process)."""
    if jitter_us <= 0:
        return 0
    digest = hashlib.blake2b(
        key.encode("utf-8") + b"\x00" + instant_us.to_bytes(16, "big", signed=True),
        digest_size=8,
    ).digest()
    return int.from_bytes(digest, "big") % jitter_us


@dataclass(frozen=True)
class AtSequence:
    """A single slot at ``at_us``."""

    __slots__ = ("at_us",)

    at_us: int

    def next_after(self, instant_us: int) -> int | None:
        return self.at_us if self.at_us > instant_us else None

    def latest_at_or_before(self, instant_us: int) -> int | None:
        return self.at_us if self.at_us <= instant_us else None

    def count_between(self, first_us: int, last_us: int) -> int:
        return 1 if first_us <= self.at_us <= last_us else 0


class JitteredSequence:
    """Each instant ``b`` of ``inner`` moved to ``b + jitter_offset_us(key, b)``.

    The caller guarantees ``jitter_us`` is at most the shortest gap between two
    instants of ``inner`` (a stored entry's validation refuses more), so the
    moved instants stay strictly increasing and each keeps its place: the
    sequence is a one-to-one, order-keeping image of ``inner``.
    """

    __slots__ = ("inner", "jitter_us", "key")

    def __init__(self, inner: SlotSequence, key: str, jitter_us: int) -> None:
        if jitter_us < 0:
            raise ValueError(f"jitter_us={jitter_us}: must be 0 or more")
        self.inner = inner
        self.key = key
        self.jitter_us = jitter_us

    def moved(self, instant_us: int) -> int:
        """Where the inner instant ``instant_us`` is sent."""
        return instant_us + jitter_offset_us(self.key, instant_us, self.jitter_us)

    def _first_inner_after(self, instant_us: int) -> int | None:
        """The inner instant whose moved instant is the first after ``instant_us``."""
        # A moved instant is below its inner one plus the jitter, so any inner
        # instant at or before ``instant_us - jitter`` moves to at most
        # ``instant_us``; the first candidate is the one after that.
        at = self.inner.next_after(instant_us - self.jitter_us)
        while at is not None and self.moved(at) <= instant_us:
            # at most once: the next inner instant is a gap (>= jitter) later,
            # hence after ``instant_us``
            at = self.inner.next_after(at)
        return at

    def _last_inner_at_or_before(self, instant_us: int) -> int | None:
        """The inner instant whose moved instant is the last at or before ``instant_us``."""
        at = self.inner.latest_at_or_before(instant_us)
        while at is not None and self.moved(at) > instant_us:
            at = self.inner.latest_at_or_before(at - 1)
        return at

    def next_after(self, instant_us: int) -> int | None:
        at = self._first_inner_after(instant_us)
        return None if at is None else self.moved(at)

    def latest_at_or_before(self, instant_us: int) -> int | None:
        at = self._last_inner_at_or_before(instant_us)
        return None if at is None else self.moved(at)

    def count_between(self, first_us: int, last_us: int) -> int | None:
        low = self._first_inner_after(first_us - 1)
        if low is None or self.moved(low) > last_us:
            return 0
        high = self._last_inner_at_or_before(last_us)
        if high is None:  # unknown (a schedule that cannot look back)
            return None
        return self.inner.count_between(low, high)

    def __repr__(self) -> str:
        return f"JitteredSequence({self.inner!r}, key={self.key!r}, jitter_us={self.jitter_us})"


class BoundedSequence:
    """The instants of ``inner`` within ``[start_us, end_us]`` (both included;
    None: no bound on that side); with ``max_runs``, only the first
    ``max_runs`` of them at or after ``max(runs_from_us, start_us)``.

    ``max_runs`` needs a lower bound (``runs_from_us`` or ``start_us``): the
    runs are counted from a fixed instant, so that every replica, and every
    restart, counts the same ones. The instant of the last allowed run is found
    once, when first needed, and kept.
    """

    __slots__ = ("_known", "_last", "end_us", "inner", "low_us", "max_runs", "start_us")

    def __init__(
        self,
        inner: SlotSequence,
        start_us: int | None = None,
        end_us: int | None = None,
        runs_from_us: int | None = None,
        max_runs: int | None = None,
    ) -> None:
        if max_runs is not None:
            if max_runs < 1:
                raise ValueError(f"max_runs={max_runs}: must be 1 or more")
            if runs_from_us is None and start_us is None:
                raise ValueError("max_runs needs runs_from_us or start_us to count from")
        self.inner = inner
        self.start_us = start_us
        self.end_us = end_us
        self.max_runs = max_runs
        low = start_us
        if max_runs is not None and runs_from_us is not None:
            low = runs_from_us if low is None else max(low, runs_from_us)
        #: the first instant a run may be at (None: unbounded)
        self.low_us = low
        #: the last allowed run of ``max_runs`` (None: the sequence ends
        #: before that many), once ``_known``
        self._last: int | None = None
        self._known = False

    @property
    def high_us(self) -> int | None:
        """The last instant a run may be at (None: unbounded)."""
        if self.max_runs is None:
            return self.end_us
        if not self._known:
            self._last = self._nth_run()
            self._known = True
        last = self._last
        if last is None:
            return self.end_us
        return last if self.end_us is None else min(last, self.end_us)

    def _nth_run(self) -> int | None:
        """The ``max_runs``-th instant of ``inner`` at or after ``low_us``."""
        assert self.max_runs is not None and self.low_us is not None
        n, low = self.max_runs, self.low_us
        inner = self.inner
        if isinstance(inner, IntervalSequence):
            first = inner.next_after(low - 1)
            return first + (n - 1) * inner.period_us
        if n <= _WALK_LIMIT or inner.count_between(low, low) is None:
            at: int | None = low - 1
            for _ in range(n):
                assert at is not None
                at = inner.next_after(at)
                if at is None:
                    return None
            return at
        return self._nth_by_counting(n, low)

    def _nth_by_counting(self, n: int, low: int) -> int | None:
        """The n-th instant at or after ``low``, bisecting on ``count_between``."""
        inner = self.inner
        first = inner.next_after(low - 1)
        if first is None:
            return None
        # gallop: a span that holds at least n instants
        span = 1_000_000
        high = first + span
        while True:
            counted = inner.count_between(low, high)
            assert counted is not None
            if counted >= n:
                break
            if inner.next_after(high) is None:
                return None
            span *= 2
            high = first + span
        # the smallest instant t with n instants in [low, t]
        lo, hi = first, high
        while lo < hi:
            mid = (lo + hi) // 2
            counted = inner.count_between(low, mid)
            assert counted is not None
            if counted >= n:
                hi = mid
            else:
                lo = mid + 1
        return lo

    def next_after(self, instant_us: int) -> int | None:
        low = self.low_us
        at = self.inner.next_after(instant_us if low is None else max(instant_us, low - 1))
        if at is None:
            return None
        high = self.high_us
        return None if high is not None and at > high else at

    def latest_at_or_before(self, instant_us: int) -> int | None:
        high = self.high_us
        at = self.inner.latest_at_or_before(instant_us if high is None else min(instant_us, high))
        if at is None or (self.low_us is not None and at < self.low_us):
            return None
        return at

    def count_between(self, first_us: int, last_us: int) -> int | None:
        low, high = self.low_us, self.high_us
        first = first_us if low is None else max(first_us, low)
        last = last_us if high is None else min(last_us, high)
        if first > last:
            return 0
        return self.inner.count_between(first, last)

    def __repr__(self) -> str:
        return (
            f"BoundedSequence({self.inner!r}, start_us={self.start_us}, end_us={self.end_us}, "
            f"low_us={self.low_us}, max_runs={self.max_runs})"
        )


@dataclass(frozen=True)
class At:
    """The schedule of one run at an instant (an aware datetime, kept in UTC).

    Not a Celery schedule: the replicas compute its one slot through the
    :func:`~celery_singlebeat.timeline.slots.sequence_for` hook (``slot_sequence``).
    """

    at: datetime

    def __post_init__(self) -> None:
        if not isinstance(self.at, datetime):
            raise TypeError(f"At({self.at!r}): expected a datetime")
        if self.at.tzinfo is None or self.at.utcoffset() is None:
            raise ValueError(f"At({self.at!r}): naive datetime; pass an aware one")
        # one spelling per instant: entries that run at one instant encode alike
        object.__setattr__(self, "at", self.at.astimezone(timezone.utc))

    @property
    def at_us(self) -> int:
        """The instant, microseconds since the epoch."""
        return datetime_to_us(self.at)

    def slot_sequence(self, anchor_us: int, tz: tzinfo) -> SlotSequence:
        """Its single slot (the anchor and zone do not matter)."""
        return AtSequence(self.at_us)

    def __repr__(self) -> str:
        return f"At({self.at.isoformat()})"


@dataclass(frozen=True)
class Bounds:
    """The limits of a stored schedule, as slot instants.

    ``start_us``/``end_us``: the runs fall within them (None: unbounded).
    ``max_runs`` runs at most, counted from ``runs_from_us`` (a stored entry's
    ``start``, else its creation). ``jitter_us``: each run moved later by up to
    that much, drawn from ``jitter_key`` (the entry's name) and the run.
    """

    start_us: int | None = None
    end_us: int | None = None
    runs_from_us: int | None = None
    max_runs: int | None = None
    jitter_us: int = 0
    jitter_key: str = ""

    @property
    def bounded(self) -> bool:
        """Whether any limit is set (False: the schedule's own instants)."""
        return (
            self.start_us is not None
            or self.end_us is not None
            or self.max_runs is not None
            or self.jitter_us > 0
        )


#: no limits
UNBOUNDED = Bounds()


@dataclass(frozen=True)
class BoundedSchedule:
    """A schedule (Celery's, or :class:`At`) within :class:`Bounds`.

    Its slots are :func:`bounded_sequence`'s, through the ``slot_sequence``
    hook of :func:`~celery_singlebeat.timeline.slots.sequence_for`; the catalog
    describes it by its inner schedule and its bounds
    (:func:`celery_singlebeat.timeline.catalog_form.spec_of`), and the operator's status
    rebuilds the same sequence from that spec.
    """

    inner: object
    bounds: Bounds = UNBOUNDED

    def slot_sequence(self, anchor_us: int, tz: tzinfo) -> SlotSequence:
        """The bounded slots of the inner schedule (see :func:`bounded_sequence`)."""
        return bounded_sequence(self.inner, anchor_us, tz, self.bounds)


def bounded_sequence(schedule: object, anchor_us: int, tz: tzinfo, bounds: Bounds) -> SlotSequence:
    """The slots of ``schedule`` within ``bounds``: the one rule for the engine,
    the fleet's status and ``next_runs``.

    An interval with a start runs at the start, then every period after it
    (its anchor is ``start - period``, whatever the entry's stored anchor), so
    that when it runs does not depend on when a replica first saw it; without
    a start it keeps the stored anchor (``slots.sequence_for``). Jitter moves
    the schedule's own instants; start, end and ``max_runs`` apply to the moved
    ones (a run is sent within ``[start, end]``).
    """
    period = period_of(schedule)
    if period is not None and bounds.start_us is not None:
        anchor_us = bounds.start_us - period // timedelta(microseconds=1)
    sequence = sequence_for(schedule, anchor_us, tz)
    if bounds.jitter_us > 0:
        sequence = JitteredSequence(sequence, bounds.jitter_key, bounds.jitter_us)
    if bounds.start_us is not None or bounds.end_us is not None or bounds.max_runs is not None:
        runs_from = bounds.runs_from_us
        if bounds.max_runs is not None and runs_from is None and bounds.start_us is None:
            runs_from = anchor_us  # nothing better to count from: the entry's anchor
        sequence = BoundedSequence(
            sequence, bounds.start_us, bounds.end_us, runs_from, bounds.max_runs
        )
    return sequence


__all__ = [
    "UNBOUNDED",
    "At",
    "AtSequence",
    "BoundedSchedule",
    "BoundedSequence",
    "Bounds",
    "JitteredSequence",
    "bounded_sequence",
    "jitter_offset_us",
]
