"""Slots: the shared instants at which a ``beat_schedule`` entry runs.

A *slot* is one run of one entry: ``(entry name, scheduled instant)``. Every
replica must compute the same instants from the schedule and shared state
alone, because the database decides the winner of a slot by its key:

* ``crontab``: its wall-clock instants in the crontab's time zone (:mod:`.cron`).
* intervals (``timedelta``, ``celery.schedules.schedule``): ``anchor + k * period``
  for k >= 1, where the anchor is stored once in the database when the entry is
  first seen, so restarts and failovers never reset the countdown.
* a schedule with a ``slot_sequence(anchor_us, tz)`` method: what it returns
  (:class:`HasSlotSequence`; a stored entry's bounds, :mod:`.slot_bounds`).
* anything else (``solar``, custom schedules): the schedule's own
  ``remaining_estimate`` evaluated *as of* the previous slot, rounded to the
  second, which is deterministic for schedules that only depend on that instant
  (a solar event is asked again from a canonical instant first: ephem's float
  noise depends on where the search started).

Instants are integers: microseconds since the Unix epoch, UTC (``*_us`` names).
"""

from __future__ import annotations

import copy
import uuid
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta, tzinfo
from typing import Any, Protocol

from celery.schedules import crontab, solar
from celery.schedules import schedule as interval_schedule

from ..exceptions import ScheduleError
from .clock import US, datetime_to_us, us_to_datetime
from .cron import CronFields

#: Namespace of the deterministic task ids (uuid5 of entry name and slot instant).
TASK_ID_NAMESPACE = uuid.UUID("0b6c8a52-5f0e-4c1c-9a57-6b3c0c4f2d11")

#: How far before an event's hour a solar event is asked again, so that its
#: slot does not depend on where the search started (:class:`EstimateSequence`).
SOLAR_SETTLE_US = 3600 * US

#: Message header carrying the slot, so workers can drop a repeat.
SLOT_HEADER = "singlebeat_slot"


def slot_task_id(entry: str, slot_us: int) -> str:
    """The task id every publish of this slot uses, on every replica."""
    return str(uuid.uuid5(TASK_ID_NAMESPACE, f"{entry}\x00{slot_us}"))


def slot_header(entry: str, slot_us: int) -> dict[str, object]:
    """The header value identifying a slot in a task message."""
    return {"entry": entry, "at": us_to_datetime(slot_us).isoformat(), "at_us": slot_us}


class SlotSequence(Protocol):
    """The ordered instants of one entry's slots."""

    def next_after(self, instant_us: int) -> int | None:
        """The first slot strictly after ``instant_us`` (None: never again)."""

    def latest_at_or_before(self, instant_us: int) -> int | None:
        """The last slot at or before ``instant_us`` (None: none, or unknown)."""

    def count_between(self, first_us: int, last_us: int) -> int | None:
        """How many slots fall in ``[first_us, last_us]`` (None: only by walking them)."""


@dataclass(frozen=True)
class IntervalSequence:
    """Slots ``anchor + k * period`` for k >= 1."""

    __slots__ = ("anchor_us", "period_us")  # one per entry: no __dict__

    anchor_us: int
    period_us: int

    def next_after(self, instant_us: int) -> int:
        if instant_us < self.anchor_us:
            return self.anchor_us + self.period_us
        k = (instant_us - self.anchor_us) // self.period_us + 1
        return self.anchor_us + k * self.period_us

    def latest_at_or_before(self, instant_us: int) -> int | None:
        k = (instant_us - self.anchor_us) // self.period_us
        return self.anchor_us + k * self.period_us if k >= 1 else None

    def count_between(self, first_us: int, last_us: int) -> int:
        k_first = max(1, -((self.anchor_us - first_us) // self.period_us))
        k_last = (last_us - self.anchor_us) // self.period_us
        return max(0, k_last - k_first + 1)


@dataclass(frozen=True)
class CronSequence:
    """Slots of a crontab (see :mod:`.cron` for the daylight-saving rules)."""

    __slots__ = ("fields",)

    fields: CronFields

    def next_after(self, instant_us: int) -> int | None:
        return self.fields.next_after(instant_us)

    def latest_at_or_before(self, instant_us: int) -> int | None:
        return self.fields.latest_at_or_before(instant_us)

    def count_between(self, first_us: int, last_us: int) -> int:
        return self.fields.count_between(first_us, last_us)


class EstimateSequence:
    """Slots of any other schedule, from ``remaining_estimate`` as of an instant.

    ``settle_us`` is for schedules whose estimate carries float noise that
    depends on the instant it is asked from (``solar``: ephem's iterative search
    finds one sunset a few hundredths of a second apart when asked from an hour
    or from a day before it). Rounded to the second, an event that falls near a
    half second would then become two slots one second apart, asked from two
    instants, and go out twice. With ``settle_us`` every event found is asked
    again from a canonical instant (the whole hour ``settle_us`` before the
    hour the event falls in), so its slot is the same whatever instant led to
    it. It needs events of the schedule to be over ``2 * settle_us`` apart
    (one solar event of one kind at one place a day); an event that a
    schedule puts closer keeps its own rounding.
    """

    __slots__ = ("schedule", "settle_us")

    def __init__(self, schedule: object, settle_us: int | None = None) -> None:
        self.schedule = schedule
        self.settle_us = settle_us

    def next_after(self, instant_us: int) -> int | None:
        # Ask from a second before: an event that happened just before
        # ``instant_us`` may round to a slot after it, and that slot is still
        # the first one after ``instant_us``.
        probe_us = instant_us - US
        for _ in range(4):
            event_us = self._event_us(probe_us)
            slot = self._slot_of(event_us)
            if slot > instant_us:
                return slot
            # that event's slot is at or before ``instant_us``: the next event
            probe_us = max(probe_us, event_us) + US
        # A schedule that finds ever the same instant (a custom one that
        # ignores its ``nowfun``): the next whole second, as before.
        return (instant_us // US + 1) * US

    def _slot_of(self, event_us: int) -> int:
        """The slot of the event found at ``event_us``: rounded to the second."""
        if self.settle_us is not None:
            hour_us = 3600 * US
            start_us = event_us // hour_us * hour_us - self.settle_us
            settled_us = self._event_us(start_us)
            # The same event asked from the canonical start (float noise apart):
            # its value settles the slot. Another event (the schedule's events
            # are closer than the window): keep the first estimate.
            if abs(settled_us - event_us) < US:
                event_us = settled_us
        # Rounding to the nearest second lets replicas that start from
        # different instants agree on the key.
        return (event_us + US // 2) // US * US

    def _event_us(self, instant_us: int) -> int:
        """The schedule's next event as of ``instant_us``, unrounded."""
        at = us_to_datetime(instant_us)
        pinned = copy.copy(self.schedule)
        pinned.nowfun = lambda: at  # type: ignore[attr-defined]
        try:
            delta = pinned.remaining_estimate(at)  # type: ignore[attr-defined]
        except Exception as exc:  # user schedules may raise anything
            raise ScheduleError(f"{self.schedule!r}.remaining_estimate failed: {exc!r}") from exc
        return datetime_to_us(at + delta)

    def latest_at_or_before(self, instant_us: int) -> int | None:
        return None

    def count_between(self, first_us: int, last_us: int) -> None:
        return None


def period_of(schedule: object) -> timedelta | None:
    """The period of an interval schedule, or None for other kinds."""
    if isinstance(schedule, timedelta):
        return schedule
    # exact type: a subclass may override is_due, so it takes the generic path
    if type(schedule) is interval_schedule:
        run_every: Any = getattr(schedule, "run_every")  # noqa: B009
        return run_every if isinstance(run_every, timedelta) else timedelta(seconds=run_every)
    return None


class HasSlotSequence(Protocol):
    """A schedule that says its slots itself: :func:`sequence_for` asks it first.

    Duck-typed, so that a schedule defined above the slot maths (a stored
    entry's bounded, jittered or limited schedule, ``schedules/runs.py``; one
    run at an instant, ``slot_bounds.At``) reaches the engine, which calls
    :func:`sequence_for` for every entry, without the engine knowing of it.
    ``slot_sequence(anchor_us, tz)`` gets what :func:`sequence_for` got (the
    entry's stored interval anchor and its time zone) and must be as
    deterministic as every sequence here: the same on every replica.
    """

    def slot_sequence(self, anchor_us: int, tz: tzinfo) -> SlotSequence:
        """The schedule's slots, given the entry's anchor and time zone."""


def sequence_for(schedule: object, anchor_us: int, tz: tzinfo) -> SlotSequence:
    """The slot sequence of a schedule; ``anchor_us`` is used by intervals only.

    A schedule with a ``slot_sequence(anchor_us, tz)`` method
    (:class:`HasSlotSequence`) gives its own.
    """
    own = getattr(schedule, "slot_sequence", None)
    if own is not None:
        sequence: SlotSequence = own(anchor_us, tz)
        return sequence
    period = period_of(schedule)
    if period is not None:
        period_us = int(period / timedelta(microseconds=1))
        if period_us < US // 1000:
            raise ScheduleError(f"interval {period!r} is shorter than 1 ms")
        return IntervalSequence(anchor_us, period_us)
    if isinstance(schedule, crontab):
        return CronSequence(CronFields.from_crontab(schedule, tz))
    if isinstance(schedule, solar):
        return EstimateSequence(schedule, settle_us=SOLAR_SETTLE_US)
    if hasattr(schedule, "remaining_estimate"):
        return EstimateSequence(schedule)
    raise ScheduleError(f"unsupported schedule type {type(schedule).__name__}")


@dataclass(frozen=True)
class MissedPolicy:
    """What to do with slots that are due but later than ``grace``.

    ``mode`` is ``"coalesce"`` (send the latest missed slot once, unless an
    on-time slot follows it), ``"skip"`` (send none of them) or ``"all"``
    (send each, at most ``max_missed`` of the most recent).
    """

    mode: str
    grace_us: int
    max_missed: int


MISSED_MODES = ("coalesce", "skip", "all")


@dataclass
class Plan:
    """The result of :func:`plan_due`: what to propose now and what was skipped."""

    propose: list[int]
    skipped: int
    skipped_first_us: int | None
    skipped_last_us: int | None
    next_us: int | None

    def then(self, later: Plan) -> Plan:
        """This plan followed by ``later``, made from this one's ``next_us``."""
        return Plan(
            propose=self.propose + later.propose,
            skipped=self.skipped + later.skipped,
            skipped_first_us=self.skipped_first_us if self.skipped else later.skipped_first_us,
            skipped_last_us=later.skipped_last_us if later.skipped else self.skipped_last_us,
            next_us=later.next_us,
        )


#: ``(judged_us, upto_us)``: the slots at or before ``upto_us`` are judged on
#: time or late as of ``judged_us`` (:func:`plan_due`'s ``kept``)
KeptSpan = tuple[int, int]


def plan_due(
    sequence: SlotSequence,
    next_us: int | None,
    now_us: int,
    policy: MissedPolicy,
    judged_at_us: int | None = None,
    kept: Sequence[KeptSpan] = (),
) -> Plan:
    """Slots of one entry due at ``now_us``, starting at slot ``next_us``.

    A slot is *on time* while ``judged - slot <= grace`` and *missed* after
    that, where ``judged`` is ``now_us``, or ``judged_at_us`` when that is
    earlier: the caller held these proposals back on purpose since then (the
    hold after a broken connection, failover.py), and a delay of its own
    making does not make a slot late. Returns the slots to propose
    (ascending), how many missed slots the policy dropped, and the first slot
    after ``now_us`` (the entry's next due time).

    ``kept``: spans ``(judged_us, upto_us)``, ascending and disjoint, of
    slots an earlier hold kept back until the connection broke again at
    ``upto_us``; the slots of each span (after the previous one's) are judged
    as of its ``judged_us``, and the missed-run policy applies to each part
    apart. A later break does not make late what the caller itself delayed.
    """
    plan: Plan | None = None
    at = next_us
    for judged_us, upto_us in kept:
        if at is None or at > upto_us or at > now_us:
            continue
        part = _plan(sequence, at, min(upto_us, now_us), policy, judged_us)
        plan = part if plan is None else plan.then(part)
        at = part.next_us
    rest = _plan(sequence, at, now_us, policy, judged_at_us)
    return rest if plan is None else plan.then(rest)


def _plan(
    sequence: SlotSequence,
    next_us: int | None,
    now_us: int,
    policy: MissedPolicy,
    judged_at_us: int | None,
) -> Plan:
    """:func:`plan_due` with a single instant of judgement."""
    keep = max(policy.max_missed, 1)
    judged_us = now_us if judged_at_us is None else min(now_us, judged_at_us)
    cutoff = judged_us - policy.grace_us  # a slot before this is missed
    at = next_us
    missed_count = 0
    missed_first: int | None = None
    # The latest missed slots, ascending: the ``keep`` that "all" may send and the
    # one before them, which is the last skipped slot when they are sent.
    recent: deque[int] = deque(maxlen=keep + 1)
    if at is not None and at < cutoff:
        missed_first = at
        last = sequence.latest_at_or_before(cutoff - 1)
        counted = None if last is None or last < at else sequence.count_between(at, last)
        if counted is not None and last is not None:
            # An outage may have missed millions of slots: count them and step back
            # from the latest one, instead of visiting each.
            missed_count = counted
            recent.appendleft(last)
            while len(recent) < min(counted, keep + 1):
                previous = sequence.latest_at_or_before(recent[0] - 1)
                if previous is None or previous < at:
                    break
                recent.appendleft(previous)
            at = sequence.next_after(last)
        else:
            while at is not None and at < cutoff:
                missed_count += 1
                recent.append(at)
                at = sequence.next_after(at)
    on_time: list[int] = []
    while at is not None and at <= now_us:
        on_time.append(at)
        at = sequence.next_after(at)
    sent: list[int]
    if policy.mode == "all":
        sent = list(recent)[-keep:]
    elif policy.mode == "coalesce" and recent and not on_time:
        sent = [recent[-1]]
    else:
        sent = []
    skipped = missed_count - len(sent)
    return Plan(
        propose=sent + on_time,
        skipped=skipped,
        skipped_first_us=missed_first if skipped else None,
        skipped_last_us=recent[-len(sent) - 1] if skipped else None,
        next_us=at,
    )
