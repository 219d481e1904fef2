"""Wall-clock instants of a Celery ``crontab``, computed without any "now".

Celery's own ``crontab.remaining_estimate`` answers "how long until the next
run, seen from this process at this moment": two pods asking at different
moments, or with different clocks, may disagree. Coordination needs the
instants themselves, identical on every replica, so this module enumerates
them from the crontab's fields and its time zone alone.

Semantics match Celery's crontab: a minute fires when its month, day of month,
day of week (0 = Sunday), hour and minute are all in the crontab's sets.

Daylight-saving changes, in the crontab's time zone:

* **Autumn (a wall-clock hour happens twice):** a matching wall time fires
  once, at its *first* occurrence. The repeated hour does not fire again.
* **Spring (a wall-clock hour does not exist):** a matching wall time inside
  the gap fires at the instant the gap maps to with the pre-change offset, i.e.
  shifted forward by the gap (02:30 in Europe/Berlin becomes 03:30 CEST), the
  way cron daemons run jobs of the skipped hour right after the change. If that
  coincides with another run of the same crontab, the two are one slot.

Away from a change (the zone's offset is the same for three hours on either
side) wall time and instant differ by a constant, and the instants are found
directly; only near a change are the candidate wall times mapped one by one.
"""

from __future__ import annotations

import calendar
import re
from array import array
from bisect import bisect_right
from collections.abc import Iterator
from datetime import date, datetime, timedelta, timezone, tzinfo
from functools import lru_cache
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from ..exceptions import ScheduleError
from .clock import US, datetime_to_us, us_to_datetime

# Offsets change by at most this much at a transition (real zones: 30 min to 2 h);
# a candidate this far past the first match in wall time cannot map to an earlier
# instant, so the search may stop there.
_MAX_SHIFT = timedelta(hours=3)
_MAX_SHIFT_US = 3 * 3600 * US
# The zone's offset is sampled this often to tell a steady stretch from a change:
# no zone changes its offset and back again within an hour.
_PROBE_US = 3600 * US
_DAY_US = 86_400 * US
_MINUTE = timedelta(minutes=1)
# Look this far for a match: the calendar repeats every 400 years, and a rare
# combination such as "29 February on a Monday" may be 40 years away.
_HORIZON_MONTHS = 400 * 12


def _replaceable(tz: tzinfo) -> tzinfo:
    """``tz``, or the same zone from zoneinfo if ``tz`` is a pytz zone.

    Wall times are mapped to instants with ``wall.replace(tzinfo=tz, fold=0)``.
    A pytz zone (Celery 5.2's ``app.timezone``, or one set on a crontab) does not
    support that: it gives every wall time its first historical offset (Berlin:
    LMT, +00:53), so each run would be off by minutes, all year round.
    """
    zone = getattr(tz, "zone", None)
    if not (isinstance(zone, str) and hasattr(tz, "localize")):
        return tz
    try:
        return ZoneInfo(zone)
    except (ZoneInfoNotFoundError, ValueError):
        raise ScheduleError(
            f"time zone {zone!r} (pytz) is unknown to zoneinfo: install the tzdata package"
        ) from None


#: the zones whose offset never changes, by their IANA names (UTC's aliases
#: and the ``Etc/GMT±N`` zones): a crontab in one of them maps wall times to
#: instants by one subtraction, its runs hours away included, where another
#: zone's are mapped one by one (a daily crontab in UTC cost 43 µs a run)
_FIXED_KEYS = re.compile(r"(Etc/)?(UTC|UCT|Universal|Zulu|Greenwich|GMT0|GMT([+-]\d{1,2})?)")


def _fixed_offset(tz: tzinfo) -> timedelta | None:
    """The offset of a zone that has only one, or None."""
    if isinstance(tz, timezone):
        return tz.utcoffset(None)
    key = getattr(tz, "key", None)
    if isinstance(key, str) and _FIXED_KEYS.fullmatch(key):
        return tz.utcoffset(datetime(2000, 1, 1))
    return None


#: the fields of the crontab objects read lately, by identity: stored entries
#: with one schedule text share one crontab object (schedules/rows.py), and
#: reading its five sets again for each of 100,000 entries was a tenth of a
#: replica's start-up. Each value keeps its crontab, so an id is not reused
#: while it is here.
_BY_OBJECT: dict[tuple[int, tzinfo], tuple[object, CronFields]] = {}
_BY_OBJECT_MAX = 8192


@lru_cache(maxsize=4096)
def _shared(
    minutes: frozenset[int],
    hours: frozenset[int],
    days_of_week: frozenset[int],
    days_of_month: frozenset[int],
    months: frozenset[int],
    tz: tzinfo,
) -> CronFields:
    """One :class:`CronFields` per distinct crontab and zone (bounded: beyond
    4,096 distinct ones, the least recently built are simply built again)."""
    return CronFields(
        set(minutes), set(hours), set(days_of_week), set(days_of_month), set(months), tz
    )


class CronFields:
    """The parsed fields of a crontab plus the time zone its wall clock is in.

    Immutable once built (nothing below assigns to it), so one instance may
    serve every entry with the same crontab and zone (:meth:`from_crontab`)."""

    __slots__ = (
        "_fixed",
        "_possible",
        "_times",
        "days_of_month",
        "days_of_week",
        "hours",
        "minutes",
        "months",
        "tz",
    )

    def __init__(
        self,
        minutes: set[int],
        hours: set[int],
        days_of_week: set[int],
        days_of_month: set[int],
        months: set[int],
        tz: tzinfo,
    ) -> None:
        self.minutes = sorted(minutes)
        self.hours = sorted(hours)
        self.days_of_week = frozenset(days_of_week)
        self.days_of_month = frozenset(days_of_month)
        self.months = frozenset(months)
        self.tz = _replaceable(tz)
        #: the zone's one offset, if it has only one
        self._fixed = _fixed_offset(self.tz)
        #: matching minutes of a matching day, as minutes since midnight, ascending.
        #: Unsigned 16-bit, not a list of ints: every entry keeps one, and
        #: ``crontab()`` has 1,440 of them (a list cost 48 KiB per entry,
        #: 240 MB in each replica for 5,000 such entries; the array, 2.8 KiB).
        self._times = array("H", [h * 60 + m for h in self.hours for m in self.minutes])
        # "31 February" never matches: answer None at once instead of searching
        # the whole horizon (29 February exists, so leap days stay possible).
        self._possible = bool(self._times and self.days_of_week) and any(
            d <= calendar.monthrange(2000, m)[1] for m in self.months for d in self.days_of_month
        )

    @classmethod
    def from_crontab(cls, schedule: object, tz: tzinfo) -> CronFields:
        """Read the fields of a ``celery.schedules.crontab``.

        Equal crontabs in one zone get one shared, immutable instance: a
        schedule often holds thousands of entries with the same crontab
        (``crontab()``, ``crontab(minute=0)``), and each replica tracks every
        entry."""
        try:
            known = _BY_OBJECT.get((id(schedule), tz))
        except TypeError:  # a tzinfo that cannot be hashed
            known = None
        if known is not None and known[0] is schedule:
            return known[1]
        fields = (
            frozenset(schedule.minute),  # type: ignore[attr-defined]
            frozenset(schedule.hour),  # type: ignore[attr-defined]
            frozenset(schedule.day_of_week),  # type: ignore[attr-defined]
            frozenset(schedule.day_of_month),  # type: ignore[attr-defined]
            frozenset(schedule.month_of_year),  # type: ignore[attr-defined]
        )
        try:
            made = _shared(*fields, tz)
        except TypeError:  # a tzinfo that cannot be hashed: not shared
            minutes, hours, days_of_week, days_of_month, months = (set(f) for f in fields)
            return cls(minutes, hours, days_of_week, days_of_month, months, tz)
        if len(_BY_OBJECT) >= _BY_OBJECT_MAX:
            _BY_OBJECT.clear()
        _BY_OBJECT[(id(schedule), tz)] = (schedule, made)
        return made

    def _day_matches(self, day: date) -> bool:
        return (
            day.month in self.months
            and day.day in self.days_of_month
            and (day.isoweekday() % 7) in self.days_of_week
        )

    def _days(self, start: date, forward: bool, stop: date | None = None) -> Iterator[date]:
        """Matching days from ``start`` to ``stop`` (both included), ascending or
        descending; without ``stop``, as far as the horizon."""
        if not self._possible:
            return
        year, month = start.year, start.month
        for _ in range(_HORIZON_MONTHS):
            if stop is not None and (
                (year, month) > (stop.year, stop.month)
                if forward
                else (year, month) < (stop.year, stop.month)
            ):
                return
            if month in self.months:
                last = calendar.monthrange(year, month)[1]
                # the first month from the start's day, not from the 1st
                same = (year, month) == (start.year, start.month)
                if forward:
                    days = range(start.day if same else 1, last + 1)
                else:
                    days = range(min(start.day, last) if same else last, 0, -1)
                for day_number in days:
                    day = date(year, month, day_number)
                    if stop is not None and (day > stop if forward else day < stop):
                        return
                    if self._day_matches(day):
                        yield day
            month += 1 if forward else -1
            if month == 13:
                year, month = year + 1, 1
            elif month == 0:
                year, month = year - 1, 12
            if not 1 <= year <= 9999:
                return

    def _forward(self, start: datetime, stop: datetime | None = None) -> Iterator[datetime]:
        """Matching naive wall times >= ``start`` (minute precision), ascending,
        on days up to ``stop``'s."""
        first_day = start.date()
        for day in self._days(first_day, True, None if stop is None else stop.date()):
            first = day == first_day
            for hour in self.hours:
                if first and hour < start.hour:
                    continue
                for minute in self.minutes:
                    if first and hour == start.hour and minute < start.minute:
                        continue
                    yield datetime(day.year, day.month, day.day, hour, minute)

    def _backward(self, start: datetime) -> Iterator[datetime]:
        """Matching naive wall times <= ``start`` (minute precision), descending."""
        first_day = start.date()
        for day in self._days(first_day, forward=False):
            first = day == first_day
            for hour in reversed(self.hours):
                if first and hour > start.hour:
                    continue
                for minute in reversed(self.minutes):
                    if first and hour == start.hour and minute > start.minute:
                        continue
                    yield datetime(day.year, day.month, day.day, hour, minute)

    def _instant_us(self, wall: datetime) -> int:
        # fold=0: first occurrence of a repeated time; for a time in a spring gap,
        # zoneinfo applies the offset in force before the gap (shift forward).
        return datetime_to_us(wall.replace(tzinfo=self.tz, fold=0))

    def _offset_at(self, instant_us: int) -> timedelta:
        offset = us_to_datetime(instant_us).astimezone(self.tz).utcoffset()
        return offset if offset is not None else timedelta(0)

    def _steady_offset(self, first_us: int, last_us: int) -> timedelta | None:
        """The zone's offset if it is the same from ``first_us`` to ``last_us``, else None."""
        if self._fixed is not None:
            return self._fixed
        offset = self._offset_at(first_us)
        probe = first_us + _PROBE_US
        while probe < last_us:
            if self._offset_at(probe) != offset:
                return None
            probe += _PROBE_US
        return offset if self._offset_at(last_us) == offset else None

    @staticmethod
    def _local(instant_us: int, offset: timedelta) -> datetime:
        return (us_to_datetime(instant_us) + offset).replace(tzinfo=None)

    def _wall(self, instant_us: int) -> datetime:
        local = us_to_datetime(instant_us).astimezone(self.tz)
        return local.replace(tzinfo=None, second=0, microsecond=0)

    def next_after(self, instant_us: int) -> int | None:
        """The first run strictly after ``instant_us``, or None if there is none."""
        offset = self._steady_offset(instant_us - _MAX_SHIFT_US, instant_us + _MAX_SHIFT_US)
        if offset is not None:
            # No change within three hours either way: a run within that window
            # is the first matching wall time after the local time, less the offset.
            local = self._local(instant_us, offset).replace(second=0, microsecond=0)
            wall = next(self._forward(local + _MINUTE), None)
            if wall is None:
                return None
            at = datetime_to_us(wall.replace(tzinfo=timezone.utc) - offset)
            if self._fixed is not None or (
                at <= instant_us + _MAX_SHIFT_US and self._instant_us(wall) == at
            ):
                return at
        best: int | None = None
        limit: datetime | None = None
        # Start one shift early: a gap time shifted forward may land after instant_us.
        for wall in self._forward(self._wall(instant_us) - _MAX_SHIFT):
            if limit is not None and wall > limit:
                break
            at = self._instant_us(wall)
            if at > instant_us and (best is None or at < best):
                best = at
                if limit is None:
                    limit = wall + _MAX_SHIFT
        return best

    def latest_at_or_before(self, instant_us: int) -> int | None:
        """The last run at or before ``instant_us``, or None if there is none."""
        offset = self._steady_offset(instant_us - _MAX_SHIFT_US, instant_us + _MAX_SHIFT_US)
        if offset is not None:
            local = self._local(instant_us, offset).replace(second=0, microsecond=0)
            wall = next(self._backward(local), None)
            if wall is None:
                return None
            at = datetime_to_us(wall.replace(tzinfo=timezone.utc) - offset)
            if self._fixed is not None or (
                at >= instant_us - _MAX_SHIFT_US and self._instant_us(wall) == at
            ):
                return at
        best: int | None = None
        limit: datetime | None = None
        for wall in self._backward(self._wall(instant_us) + _MAX_SHIFT):
            if limit is not None and wall < limit:
                break
            at = self._instant_us(wall)
            if at <= instant_us and (best is None or at > best):
                best = at
                if limit is None:
                    limit = wall - _MAX_SHIFT
        return best

    def count_between(self, first_us: int, last_us: int) -> int:
        """How many runs fall in ``[first_us, last_us]``, without visiting each one.

        Day by day: where the offset is steady, runs and matching wall times
        correspond one to one and are counted from the fields; around a change
        the day's wall times are mapped to instants and the distinct ones counted.
        """
        count = 0
        after = first_us - 1
        while after < last_us:
            # Jump over stretches without runs (a monthly crontab, a 40-year gap).
            upcoming = self.next_after(after)
            if upcoming is None or upcoming > last_us:
                break
            after = upcoming - 1
            until = min(last_us, after + _DAY_US)
            offset = self._steady_offset(after - _MAX_SHIFT_US, until + _MAX_SHIFT_US)
            if offset is not None:
                count += self._count_walls(self._local(after, offset), self._local(until, offset))
            else:
                start = self._wall(after) - _MAX_SHIFT
                stop = self._wall(until) + _MAX_SHIFT
                instants = set()
                for wall in self._forward(start, stop):
                    if wall > stop:
                        break
                    at = self._instant_us(wall)
                    if after < at <= until:
                        instants.add(at)
                count += len(instants)
            after = until
        return count

    def _count_walls(self, after: datetime, until: datetime) -> int:
        """Matching wall times in ``(after, until]``."""
        times = self._times
        count = 0
        first, last = after.date(), until.date()
        for day in self._days(first, True, last):
            low = bisect_right(times, after.hour * 60 + after.minute) if day == first else 0
            high = bisect_right(times, until.hour * 60 + until.minute) if day == last else None
            count += (len(times) if high is None else high) - low
        return count
