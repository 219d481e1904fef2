"""How the admin shows the store's values: instants (microseconds on the
database's clock) as UTC text with their distance from the database's now,
durations in the units a person reads, a catalog's or a stored row's schedule
as text.

Pure formatting: no query, so a list page calls these once per cell at no
cost beyond the page's own rows; and :func:`display`, the typed form of
Django's column decorator.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, TypeVar, cast

from django.contrib import admin

from ...timeline.clock import US, slot_text

F = TypeVar("F", bound=Callable[..., Any])


def display(**options: Any) -> Callable[[F], F]:
    """Django's ``admin.display`` (a column's title, its ordering, a boolean
    shown as an icon), typed: Django ships no types, and an untyped
    decorator would untype every column method under it."""
    return cast(Callable[[F], F], admin.display(**options))


def instant_text(us: int | None) -> str:
    """An instant as ISO 8601 UTC to the millisecond (``-`` for none)."""
    return "-" if us is None else slot_text(us)


def span_text(us: int) -> str:
    """A duration, rounded to the unit a person reads: ``850 ms``, ``12 s``,
    ``4 min``, ``3 h``, ``2 d``."""
    whole = abs(us)
    if whole < US:
        return f"{whole // 1000} ms"
    seconds = whole / US
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    if seconds < 172_800:
        return f"{seconds / 3600:.0f} h"
    return f"{seconds / 86_400:.0f} d"


def relative_text(us: int | None, now_us: int) -> str:
    """An instant relative to ``now_us`` (the database's clock): ``in 5 s``,
    ``3 min ago``."""
    if us is None:
        return "-"
    if us >= now_us:
        return f"in {span_text(us - now_us)}"
    return f"{span_text(now_us - us)} ago"


def when_text(us: int | None, now_us: int | None) -> str:
    """An instant and, when the database's now is known, how far it is from it."""
    if us is None:
        return "-"
    if now_us is None:
        return instant_text(us)
    return f"{instant_text(us)} ({relative_text(us, now_us)})"


def spec_text(spec: str) -> str:
    """A stored row's schedule (its ``spec`` column, the data form of
    docs/schedules.md) as a person reads it: ``every 30s``,
    ``0 3 * * * (Europe/Paris)``, ``at 2026-12-24T17:00:00+00:00``."""
    try:
        data: Any = json.loads(spec)
    except ValueError:
        return spec
    if not isinstance(data, dict):
        return spec
    if "every" in data:
        return f"every {data['every']:g}s"
    if "crontab" in data:
        return str(data["crontab"]) + (f" ({data['tz']})" if data.get("tz") else "")
    if "at" in data:
        return f"at {data['at']}"
    return spec


__all__ = ["display", "instant_text", "relative_text", "span_text", "spec_text", "when_text"]
