"""Durations and instants as operators type them.

A duration is a number with a unit, or several (``500ms``, ``90s``, ``15m``,
``1h30m``, ``2d``, ``1w``); a bare number is seconds. An instant is ISO-8601
with its offset (``2026-03-01T12:00:00Z``, ``2026-03-01T13:00+01:00``): one
without an offset is refused, since the pod's zone and the fleet's may differ.
"""

from __future__ import annotations

import re
from typing import Any, NamedTuple

import click

from ..timeline.clock import NaiveInstantError, datetime_to_us, parse_instant

_UNIT_US = {
    "ms": 1_000,
    "s": 1_000_000,
    "m": 60_000_000,
    "h": 3_600_000_000,
    "d": 86_400_000_000,
    "w": 7 * 86_400_000_000,
}
_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w)")
_WHOLE = re.compile(r"(?:\d+(?:\.\d+)?(?:ms|s|m|h|d|w))+")


def parse_duration(text: str) -> int:
    """Microseconds in ``text``; ValueError when it is not a positive duration."""
    value = text.strip().lower()
    if re.fullmatch(r"\d+(?:\.\d+)?", value):
        total = round(float(value) * 1_000_000)
    elif _WHOLE.fullmatch(value):
        total = sum(round(float(n) * _UNIT_US[u]) for n, u in _PART.findall(value))
    else:
        raise ValueError(f"{text!r} is not a duration (e.g. 90s, 15m, 1h30m, 2d)")
    if total <= 0:
        raise ValueError(f"{text!r}: a duration must be positive")
    return total


def instant_us(text: str) -> int:
    """Microseconds since the epoch of an ISO-8601 instant with its offset
    (:func:`~celery_singlebeat.timeline.clock.parse_instant`), its errors worded
    for an option that takes a duration too."""
    try:
        return datetime_to_us(parse_instant(text))
    except NaiveInstantError:
        raise ValueError(f"{text!r} has no UTC offset: add Z or +HH:MM") from None
    except ValueError:
        raise ValueError(
            f"{text!r} is neither a duration (90s, 15m, 1h30m) nor an ISO-8601 instant "
            "(2026-03-01T12:00:00Z)"
        ) from None


# Unsubscripted: click 8.2 made ParamType generic, and the click that Celery 5.2
# brings (8.1) cannot be subscripted at run time.
class Duration(click.ParamType):  # type: ignore[type-arg]
    """A positive duration, converted to microseconds."""

    name = "duration"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int):
            return value
        try:
            return parse_duration(str(value))
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


class When(NamedTuple):
    """An instant, or a duration counted from the database's now."""

    #: microseconds since the epoch (an instant) or from now (a duration)
    value_us: int
    relative: bool


class InstantOrDuration(click.ParamType):  # type: ignore[type-arg]
    """``--until 30m`` / ``--since 1h`` or an ISO-8601 instant."""

    name = "instant|duration"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> When:
        if isinstance(value, When):
            return value
        text = str(value)
        try:
            return When(parse_duration(text), True)
        except ValueError:
            pass
        try:
            return When(instant_us(text), False)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)
