"""How :meth:`.Operator.status` reads its entries from the rows: the next slot,
the slot missed, the pause in force, the order.

The database gives each entry's anchor, high-water mark, newest slot row and
catalog row (``operator_statements.status_entries``); the next slot is
rebuilt here from the catalog's spec, as the replicas build it
(:func:`celery_singlebeat.timeline.catalog_form.sequence_of`), without a
database. ``tests/unit/test_fleet_status.py`` holds it to the replicas' slot
sequences.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..values import PAUSE_ALL, Pause
from .operator_results import (
    ABANDONED,
    CLAIMED,
    DUE_SLACK_US,
    REQUESTED,
    SENT,
    EntryStatus,
)

if TYPE_CHECKING:
    from ...timeline.slots import SlotSequence


def interval_next_after(anchor_us: int, period_us: int, instant_us: int) -> int:
    """The first slot after ``instant_us`` of an interval of ``period_us``
    from ``anchor_us``: the rule of
    :meth:`celery_singlebeat.timeline.slots.IntervalSequence.next_after`,
    spelt out here rather than asked of an ``IntervalSequence``. Status asks
    it once or twice for each of up to 100,000 entries, and building a
    sequence per entry made that pass a seventh slower (0.37 s to 0.42 s at
    100,000 entries, for the same answers). ``tests/unit/test_fleet_status.py``
    holds the two rules equal."""
    if instant_us < anchor_us:
        return anchor_us + period_us
    return anchor_us + ((instant_us - anchor_us) // period_us + 1) * period_us


#: the slot state codes of status_entries (operator_statements._LAST_STATE)
_STATES = (CLAIMED, SENT, ABANDONED, REQUESTED)


def entry_statuses(rows: Sequence[Any], now_us: int, pauses: list[Pause]) -> list[EntryStatus]:
    """The entries of status_entries' rows, the next due first.

    One pass, positional: it runs once per entry, 100,000 times within
    status()'s 2 s. Each distinct spec is parsed once (100,000 entries share a
    handful). An interval's slots are computed from its period and the entry's
    anchor (:func:`interval_next_after`); every other kind depends on the spec
    alone, so its answers are kept per (spec, instant): crontab entries of one
    spec last ran at the same instants.
    """
    from ...timeline.catalog_form import sequence_of
    from ...timeline.slots import IntervalSequence

    paused = {p.entry: p for p in pauses}
    pause_all = paused.get(PAUSE_ALL)
    #: spec -> its period (an interval), its sequence, or None (unknown)
    parsed: dict[str, int | SlotSequence | None] = {}
    answers: dict[tuple[str, int], int | None] = {}
    cutoff = now_us - DUE_SLACK_US

    def next_after(
        spec: str, kind: int | SlotSequence, anchor_us: int, instant_us: int
    ) -> int | None:
        if isinstance(kind, int):
            return interval_next_after(anchor_us, kind, instant_us)
        key = (spec, instant_us)
        if key not in answers:
            answers[key] = kind.next_after(instant_us)
        return answers[key]

    entries = []
    for (
        name,
        anchor,
        high_water,
        newest,
        code,
        sent,
        sender,
        delay,
        live,
        task,
        schedule,
        spec,
    ) in rows:
        if high_water is not None and (newest is None or high_water > newest):
            # the entry's newest rows were pruned: only their high-water mark is left
            last, state = high_water, None
        else:
            last, state = newest, None if code is None else _STATES[code]
        pause = paused.get(name, pause_all)
        kind = None
        if spec is not None:
            if spec in parsed:
                kind = parsed[spec]
            else:
                found = sequence_of(spec, 0)
                kind = parsed[spec] = (
                    found.period_us if isinstance(found, IntervalSequence) else found
                )
        next_us = overdue_us = None
        if kind is not None:
            first = next_after(spec, kind, anchor, anchor if last is None else last)
            if first is not None and first < cutoff:
                overdue_us = None if pause is not None else first
                next_us = next_after(spec, kind, anchor, cutoff)
            else:
                next_us = first
        entries.append(
            EntryStatus(
                name,
                task,
                schedule,
                int(live),  # MySQL sums to a Decimal
                next_us,
                overdue_us,
                kind is not None,
                last,
                state,
                sent,
                sender,
                delay,
                pause,
            )
        )
    # by name, then (stable) by when due: two sorts of plain keys cost a
    # fifth of one by a (due, name) tuple
    entries.sort(key=_name_of)
    entries.sort(key=_due_key)
    return entries


def _name_of(entry: EntryStatus) -> str:
    return entry.name


#: sorts after every instant: entries whose next slot is unknown come last
_NEVER = 2**63


def _due_key(entry: EntryStatus) -> int:
    """Overdue entries by the slot they missed, the others by their next slot."""
    if entry.overdue_slot_us is not None:
        return entry.overdue_slot_us
    return _NEVER if entry.next_slot_us is None else entry.next_slot_us
