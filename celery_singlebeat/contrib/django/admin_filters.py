"""The list filters of the fleet's pages that stay cheap over a million rows.

A filter on an entry or a replica cannot list its values (100,000 entries;
``SELECT DISTINCT`` over the slot rows): :class:`TextFilter` takes the value
typed in a box instead. Time ranges are counted back from the database's
clock, which is the clock the rows' instants were written on.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from ...timeline.clock import US
from . import store


class TextFilter(admin.SimpleListFilter):
    """A filter whose value is typed (an entry name, a replica id), matched
    exactly against ``field``: an index lookup, never a list of every value."""

    template = "celery_singlebeat/text_filter.html"
    field = ""

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return []

    def has_output(self) -> bool:
        return True

    def choices(self, changelist: Any) -> Any:
        # the template needs the other parameters of the page, to keep them
        yield {
            "parameter": self.parameter_name,
            "value": self.value() or "",
            "others": [
                (k, v)
                for k, values in changelist.params.items()
                if k != self.parameter_name
                for v in (values if isinstance(values, list) else [values])
            ],
            "clear_url": changelist.get_query_string(remove=[self.parameter_name]),
        }

    def queryset(self, request: HttpRequest, queryset: Any) -> Any:
        value = self.value()
        if value:
            return queryset.filter(**{self.field: value})
        return queryset


class SlotEntryFilter(TextFilter):
    """The slots of one entry (the slot table's key starts with it)."""

    title = "entry"
    parameter_name = "entry"
    field = "entry"


class SlotOwnerFilter(TextFilter):
    """The slots a replica claimed last (or sent)."""

    title = "replica"
    parameter_name = "owner"
    field = "owner"


class SlotInstantFilter(TextFilter):
    """One slot: its instant in microseconds (a run's link to its slot)."""

    title = "slot (µs)"
    parameter_name = "slot_us"
    field = "slot_us"

    def queryset(self, request: HttpRequest, queryset: Any) -> Any:
        value = self.value()
        if value and value.lstrip("-").isdigit():
            return queryset.filter(slot_us=int(value))
        return queryset


class TakenOverFilter(admin.SimpleListFilter):
    """Slots that changed hands: a fence above 1 is a claim won again after
    another (a takeover, or the same owner's retry); fence 0 is a run-now
    request no replica has taken yet (store/sql/slot_statements.py)."""

    title = "taken over"
    parameter_name = "taken_over"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [
            ("yes", "Yes (fence > 1)"),
            ("no", "No (fence ≤ 1)"),
            ("requested", "Run-now request"),
        ]

    def queryset(self, request: HttpRequest, queryset: Any) -> Any:
        if self.value() == "yes":
            return queryset.filter(fence__gt=1)
        if self.value() == "no":
            return queryset.filter(fence__lte=1, fence__gt=0)
        if self.value() == "requested":
            return queryset.filter(fence=0)
        return queryset


class SlotSinceFilter(admin.SimpleListFilter):
    """Slots of the last hour, day, week or month, by the database's clock."""

    title = "slot time"
    parameter_name = "since"
    spans = {"1h": 3600, "24h": 86_400, "7d": 7 * 86_400, "30d": 30 * 86_400}

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [
            ("1h", "Last hour"),
            ("24h", "Last 24 hours"),
            ("7d", "Last 7 days"),
            ("30d", "Last 30 days"),
            ("future", "Ahead (run-now, claimed early)"),
        ]

    def queryset(self, request: HttpRequest, queryset: Any) -> Any:
        value = self.value()
        if value is None:
            return queryset
        now = store.operator().now_us()
        if value == "future":
            return queryset.filter(slot_us__gt=now)
        seconds = self.spans.get(value)
        if seconds is None:
            return queryset
        return queryset.filter(slot_us__gte=now - seconds * US, slot_us__lte=now)


__all__ = [
    "SlotEntryFilter",
    "SlotInstantFilter",
    "SlotOwnerFilter",
    "SlotSinceFilter",
    "TakenOverFilter",
    "TextFilter",
]
