"""The admin over what the replicas write: the registered entries, the
``beat_schedule`` catalog, the slot history, SingletonTask's runs and
leases, the replicas themselves. All read-only; the controls (pause, resume,
run now, release) are actions (:mod:`.admin_actions`).

What a row shows from elsewhere (an entry's task and pause, a slot's last
sender, a replica's state judged on the database's clock) is read once per
page in :meth:`enrich`, never once per row, so every list costs a constant
number of queries whatever the number of entries and slots.
"""

from __future__ import annotations

import re
from typing import Any

from django.contrib import admin
from django.db import connections
from django.db.models import OuterRef, Q, Subquery
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html

from ...store.base import PAUSE_ALL
from ...store.sql.operator_results import EXPIRED, HELD, RELEASED
from ...timeline.catalog_form import sequence_of
from ...timeline.slots import slot_task_id
from . import store
from .admin_actions import ENTRY_ACTIONS, ControlsMixin, release_leases
from .admin_changelist import StoreListAdmin
from .admin_display import display, relative_text, span_text, when_text
from .admin_filters import (
    SlotEntryFilter,
    SlotInstantFilter,
    SlotOwnerFilter,
    SlotSinceFilter,
    TakenOverFilter,
)
from .models import CatalogEntry, Entry, Lease, Pause, Replica, Run, Slot

#: a Celery task id (a UUID), which the slot search looks up among the runs
_TASK_ID = re.compile(
    r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$"
)


def _now(request: HttpRequest) -> int:
    """The database's clock, read once per request (every row of a page is
    judged by the same instant)."""
    cached = getattr(request, "_singlebeat_now_us", None)
    if cached is None:
        cached = store.operator().now_us()
        setattr(request, "_singlebeat_now_us", cached)  # noqa: B010  (a request attribute)
    return int(cached)


def _slots_of(pairs: list[tuple[str, int]]) -> dict[tuple[str, int], Slot]:
    """The slot rows of the (entry, slot_us) pairs, in one query by their key."""
    if not pairs:
        return {}
    where = Q()
    for entry, slot_us in pairs:
        where |= Q(entry=entry, slot_us=slot_us)
    return {(s.entry, s.slot_us): s for s in Slot.objects.filter(where)}


def _pauses_of(names: list[str]) -> dict[str, Pause]:
    return {p.entry: p for p in Pause.objects.filter(entry__in=[*names, PAUSE_ALL])}


def _pause_text(pause: Pause | None, now_us: int) -> str:
    if pause is None or (pause.until_us is not None and pause.until_us <= now_us):
        return ""
    end = (
        "until resumed"
        if pause.until_us is None
        else f"until {relative_text(pause.until_us, now_us)}"
    )
    every = " (all: '*')" if pause.entry == PAUSE_ALL else ""
    why = f": {pause.reason}" if pause.reason else ""
    return f"paused{every} by {pause.paused_by} {end}{why}"


class EntryListAdmin(ControlsMixin, StoreListAdmin):
    """What the entry lists share: the task, schedule and next slot from the
    catalog, the last slot's sender, the pause in force."""

    def enrich(self, request: HttpRequest, rows: Any) -> list[Any]:
        rows = list(rows)
        now = _now(request)
        names = [str(getattr(r, self.control_key)) for r in rows]
        # each entry's latest sent slot: a correlated subquery per listed entry,
        # which walks the slot table's key (entry, slot_us) backwards from its
        # end: a few index pages each, whatever the slots kept
        latest = Slot.objects.filter(entry=OuterRef("name"), state=1).order_by("-slot_us")
        entries = {
            e.name: e
            for e in Entry.objects.filter(name__in=names).annotate(
                sb_sent_us=Subquery(latest.values("slot_us")[:1])
            )
        }
        catalog: dict[str, CatalogEntry] = {}
        for c in CatalogEntry.objects.filter(entry__in=names).order_by("entry", "-catalog"):
            catalog.setdefault(c.entry, c)
        last = _slots_of(
            [(e.name, e.sb_sent_us) for e in entries.values() if e.sb_sent_us is not None]
        )
        pauses = _pauses_of(names)
        for row, name in zip(rows, names):
            entry = entries.get(name)
            cat = getattr(row, "sb_catalog", None) or catalog.get(name)
            row.sb_catalog = cat
            row.sb_next = None
            if cat is not None and entry is not None:
                sequence = sequence_of(cat.spec, entry.anchor_us)
                row.sb_next = None if sequence is None else sequence.next_after(now)
            sent = None if entry is None else entry.sb_sent_us
            row.sb_last = None if sent is None else last.get((name, sent))
            row.sb_pause = _pause_text(pauses.get(name) or pauses.get(PAUSE_ALL), now)
            row.sb_now = now
        return rows

    @display(description="task")
    def task_name(self, obj: Any) -> str:
        cat = getattr(obj, "sb_catalog", None)
        return "-" if cat is None else str(cat.task)

    @display(description="schedule")
    def schedule_text(self, obj: Any) -> str:
        cat = getattr(obj, "sb_catalog", None)
        return "-" if cat is None else str(cat.schedule)

    @display(description="next slot")
    def next_slot(self, obj: Any) -> str:
        return when_text(getattr(obj, "sb_next", None), getattr(obj, "sb_now", None))

    @display(description="last sent")
    def last_slot(self, obj: Any) -> str:
        slot = getattr(obj, "sb_last", None)
        return "-" if slot is None else when_text(slot.slot_us, getattr(obj, "sb_now", None))

    @display(description="last sender")
    def last_sender(self, obj: Any) -> str:
        slot = getattr(obj, "sb_last", None)
        return str(slot.owner) if slot is not None and slot.state == 1 else "-"

    @display(description="paused")
    def paused(self, obj: Any) -> str:
        return getattr(obj, "sb_pause", "") or "-"


@admin.register(Entry)
class EntryAdmin(EntryListAdmin):
    """Every entry the fleet registered, from any source, with the controls."""

    list_display = (
        "name",
        "task_name",
        "schedule_text",
        "next_slot",
        "last_slot",
        "last_sender",
        "paused",
        "registered_by",
    )
    search_fields = ("name",)
    actions = ENTRY_ACTIONS
    list_display_links = None

    def get_search_results(self, request: HttpRequest, queryset: Any, search_term: str) -> Any:
        # a prefix of the key, not Django's icontains (a scan of every name)
        if search_term:
            return queryset.filter(name__startswith=search_term.strip()), False
        return queryset, False


@admin.register(CatalogEntry)
class CatalogEntryAdmin(EntryListAdmin):
    """The ``beat_schedule`` entries the replicas published (one row per
    entry and catalog: replicas of one release share a catalog)."""

    control_key = "entry"
    list_display = (
        "entry",
        "task",
        "schedule",
        "next_slot",
        "last_slot",
        "last_sender",
        "paused",
        "catalog",
    )
    search_fields = ("entry", "task")
    actions = ENTRY_ACTIONS
    list_display_links = None

    def enrich(self, request: HttpRequest, rows: Any) -> list[Any]:
        for row in rows:
            row.sb_catalog = row  # the row is its own catalog row
        return super().enrich(request, rows)


@admin.register(Slot)
class SlotAdmin(StoreListAdmin):
    """The slot history: one row per run of an entry, newest first."""

    list_display = (
        "entry",
        "slot",
        "state_text",
        "owner",
        "fence",
        "claimed",
        "sent",
        "delay",
        "task_id",
    )
    list_filter = (
        SlotEntryFilter,
        SlotOwnerFilter,
        "state",
        TakenOverFilter,
        SlotSinceFilter,
        SlotInstantFilter,
    )
    search_fields = ("entry",)
    search_help_text = "An entry's name (its start), or a task id (a run's, from SingletonTask)."
    ordering = ("-slot_us",)
    sortable_by = ()
    actions = None
    list_display_links = None
    list_key_fields = ("entry", "slot_us")

    #: the filters no index of the slot table serves and that match rarely
    #: (a replica's slots are a third, a half: the index's order finds a page
    #: of them at once); the search: an entry's prefix, which the key serves
    #: only when the order does not come first
    unindexed = ("taken_over", "q")

    def get_ordering(self, request: HttpRequest) -> Any:
        # Under a filter no index serves, newest-first along the slot-time
        # index fetches a row per index entry until the page fills: seconds on
        # MariaDB when the matches are rare (a takeover is one slot in
        # hundreds). An order no index gives (a second key, the other way)
        # makes the database read the table once and sort the matches instead,
        # a bounded cost (MariaDB 0.5 s at a million rows; PostgreSQL keeps
        # its index plan with an incremental sort). One entry's slots are read
        # along the key, whatever the order.
        if any(request.GET.get(p) for p in self.unindexed) and not request.GET.get("entry"):
            return ("-slot_us", "entry")
        return ("-slot_us",)

    def get_search_results(self, request: HttpRequest, queryset: Any, search_term: str) -> Any:
        term = search_term.strip()
        if not term:
            return queryset, False
        if _TASK_ID.match(term):
            # the slot table keeps no task id (it is computed from the entry
            # and the instant); SingletonTask's runs keep theirs
            keys = list(Run.objects.filter(task_id=term).values_list("entry", "slot_us")[:100])
            where = Q(pk__in=[])
            for entry, slot_us in keys:
                where |= Q(entry=entry, slot_us=slot_us)
            return queryset.filter(where), False
        # MySQL's startswith is LIKE BINARY, which no index of a column in a
        # case-insensitive collation serves; its istartswith is plain LIKE
        lookup = "istartswith" if connections[queryset.db].vendor == "mysql" else "startswith"
        return queryset.filter(**{f"entry__{lookup}": term}), False

    def enrich(self, request: HttpRequest, rows: Any) -> list[Any]:
        now = _now(request)
        for row in rows:
            row.sb_now = now
        return list(rows)

    @display(description="slot (UTC)", ordering="slot_us")
    def slot(self, obj: Slot) -> str:
        return when_text(obj.slot_us, getattr(obj, "sb_now", None))

    @display(description="state")
    def state_text(self, obj: Slot) -> str:
        if obj.state == 1:
            return "sent"
        if obj.fence == 0:
            return "requested"
        now = getattr(obj, "sb_now", None)
        return "abandoned" if now is not None and obj.lease_until_us < now else "claimed"

    @display(description="claimed")
    def claimed(self, obj: Slot) -> str:
        return when_text(obj.claimed_us, None) if obj.fence else "-"

    @display(description="sent")
    def sent(self, obj: Slot) -> str:
        return when_text(obj.sent_us, None)

    @display(description="delay")
    def delay(self, obj: Slot) -> str:
        return "-" if obj.sent_us is None else span_text(obj.sent_us - obj.slot_us)

    @display(description="task id")
    def task_id(self, obj: Slot) -> str:
        return slot_task_id(obj.entry, obj.slot_us)


@admin.register(Run)
class RunAdmin(StoreListAdmin):
    """SingletonTask's runs of slots: who ran each, how it ended; a task id
    leads to its slot."""

    list_display = ("entry", "slot", "state", "owner", "task_id", "attempts", "outcome")
    list_filter = ("state",)
    search_fields = ("=task_id", "=entry")
    list_key_fields = ("entry", "slot_us")
    search_help_text = "A task id, or an entry's name (exactly)."
    ordering = ("-slot_us",)
    sortable_by = ()
    actions = None
    list_display_links = None

    @display(description="slot (UTC)")
    def slot(self, obj: Run) -> str:
        url = reverse("admin:celery_singlebeat_slot_changelist")
        return format_html(
            '<a href="{}?entry={}&amp;slot_us={}">{}</a>',
            url,
            obj.entry,
            obj.slot_us,
            when_text(obj.slot_us, None),
        )


@admin.register(Replica)
class ReplicaAdmin(StoreListAdmin):
    """The beat replicas, judged on the database's clock: live, stopped
    (graceful) or lost; their heartbeat's age and their loop's lag."""

    list_display = (
        "id",
        "host",
        "pid",
        "version",
        "state",
        "heartbeat_age",
        "loop_lag",
        "clock_offset",
        "tracked",
        "proposes_first",
    )
    search_fields = ("=id", "host")
    actions = None
    list_display_links = None

    def enrich(self, request: HttpRequest, rows: Any) -> list[Any]:
        now = _now(request)
        # the operator's one meaning of live (timeline/membership.py)
        states = {r.id: r.state for r in store.operator().replicas(now_us=now)}
        for row in rows:
            row.sb_now = now
            row.sb_state = states.get(row.id, "-")
        return list(rows)

    @display(description="state")
    def state(self, obj: Replica) -> str:
        return str(getattr(obj, "sb_state", "-"))

    @display(description="heartbeat age", ordering="seen_us")
    def heartbeat_age(self, obj: Replica) -> str:
        now = getattr(obj, "sb_now", None)
        return "-" if now is None else span_text(max(0, now - obj.seen_us))

    @display(description="loop lag")
    def loop_lag(self, obj: Replica) -> str:
        now = getattr(obj, "sb_now", None)
        return "-" if now is None else span_text(max(0, now - obj.loop_us))

    @display(description="clock offset")
    def clock_offset(self, obj: Replica) -> str:
        sign = "+" if obj.offset_us >= 0 else "-"
        return f"{sign}{span_text(obj.offset_us)}"


@admin.register(Lease)
class LeaseAdmin(ControlsMixin, StoreListAdmin):
    """SingletonTask's keys: who holds each and until when; release by hand."""

    list_display = ("name", "holder", "state", "expires", "acquired", "token")
    search_fields = ("name", "owner")
    actions = (release_leases,)
    list_display_links = None

    def enrich(self, request: HttpRequest, rows: Any) -> list[Any]:
        now = _now(request)
        for row in rows:
            row.sb_now = now
        return list(rows)

    @display(description="holder", ordering="owner")
    def holder(self, obj: Lease) -> str:
        return str(obj.owner)

    @display(description="state")
    def state(self, obj: Lease) -> str:
        now = getattr(obj, "sb_now", 0)
        return RELEASED if obj.expires_us == 0 else HELD if obj.expires_us >= now else EXPIRED

    @display(description="expires", ordering="expires_us")
    def expires(self, obj: Lease) -> str:
        return (
            "-" if obj.expires_us == 0 else when_text(obj.expires_us, getattr(obj, "sb_now", None))
        )

    @display(description="acquired")
    def acquired(self, obj: Lease) -> str:
        return when_text(obj.acquired_us, getattr(obj, "sb_now", None))


__all__ = [
    "CatalogEntryAdmin",
    "EntryAdmin",
    "EntryListAdmin",
    "LeaseAdmin",
    "ReplicaAdmin",
    "RunAdmin",
    "SlotAdmin",
]
