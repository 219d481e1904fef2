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
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import date, datetime, timedelta, timezone, tzinfo

from .clock import US, datetime_to_us

# Offsets change by at most this much at a transition (real zones: 30 min to 2 h);
# a candidate this far past the first match in wall time cannot map to an earlier
# instant, so the search may stop there.
_MAX_SHIFT = timedelta(hours=3)
# Give up after this many days without a match (e.g. "30 February").
_MAX_DAYS = 366 * 8


class CronFields:
    """The parsed fields of a crontab plus the time zone its wall clock is in."""

    __slots__ = ("days_of_month", "days_of_week", "hours", "minutes", "months", "tz")

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
        self.tz = tz

    @classmethod
    def from_crontab(cls, schedule: object, tz: tzinfo) -> CronFields:
        """Read the fields of a ``celery.schedules.crontab``."""
        return cls(
            minutes=set(schedule.minute),  # type: ignore[attr-defined]
            hours=set(schedule.hour),  # type: ignore[attr-defined]
            days_of_week=set(schedule.day_of_week),  # type: ignore[attr-defined]
            days_of_month=set(schedule.day_of_month),  # type: ignore[attr-defined]
            months=set(schedule.month_of_year),  # type: ignore[attr-defined]
            tz=tz,
        )

    def _day_matches(self, day: date) -> bool:
        return (
            day.month in self.months
            and day.day in self.days_of_month
            and (day.isoweekday() % 7) in self.days_of_week
        )

    def _forward(self, start: datetime) -> Iterator[datetime]:
        """Matching naive wall times >= ``start`` (minute precision), ascending."""
        day = start.date()
        first = True
        for _ in range(_MAX_DAYS):
            if self._day_matches(day):
                for hour in self.hours:
                    if first and hour < start.hour:
                        continue
                    for minute in self.minutes:
                        if first and hour == start.hour and minute < start.minute:
                            continue
                        yield datetime(day.year, day.month, day.day, hour, minute)
            day += timedelta(days=1)
            first = False

    def _backward(self, start: datetime) -> Iterator[datetime]:
        """Matching naive wall times <= ``start`` (minute precision), descending."""
        day = start.date()
        first = True
        for _ in range(_MAX_DAYS):
            if self._day_matches(day):
                for hour in reversed(self.hours):
                    if first and hour > start.hour:
                        continue
                    for minute in reversed(self.minutes):
                        if first and hour == start.hour and minute > start.minute:
                            continue
                        yield datetime(day.year, day.month, day.day, hour, minute)
            day -= timedelta(days=1)
            first = False

    def _instant_us(self, wall: datetime) -> int:
        # fold=0: first occurrence of a repeated time; for a time in a spring gap,
        # zoneinfo applies the offset in force before the gap (shift forward).
        return datetime_to_us(wall.replace(tzinfo=self.tz, fold=0))

    def _wall(self, instant_us: int) -> datetime:
        local = datetime.fromtimestamp(instant_us / US, tz=timezone.utc).astimezone(self.tz)
        return local.replace(tzinfo=None, second=0, microsecond=0)

    def next_after(self, instant_us: int) -> int | None:
        """The first run strictly after ``instant_us``, or None if there is none."""
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
