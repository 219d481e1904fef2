"""How ``Operator.status`` turns the database's rows into entries (no database):
the next slot, "overdue", pauses, pruned slots and the order, against the
slot sequences the replicas themselves use."""

from __future__ import annotations

import json
from datetime import timedelta, timezone

from celery.schedules import crontab
from hypothesis import given
from hypothesis import strategies as st

from celery_singlebeat.engine.catalog import describe
from celery_singlebeat.store.base import PAUSE_ALL, Pause
from celery_singlebeat.store.sql.operator_results import DUE_SLACK_US
from celery_singlebeat.store.sql.operator_status import entry_statuses
from celery_singlebeat.timeline.clock import US
from celery_singlebeat.timeline.slots import IntervalSequence, sequence_for

NOW = 1_780_000_000 * US
EVERY_10 = describe("x", "t", timedelta(seconds=10), timezone.utc).spec
HOURLY = describe("x", "t", crontab(minute="0"), timezone.utc).spec


def row(
    name: str,
    spec: str | None = EVERY_10,
    *,
    anchor: int = NOW - 95 * US,
    high_water: int | None = None,
    newest: int | None = None,
    code: int | None = None,
    sent: int | None = None,
) -> tuple[object, ...]:
    """One status row (operator_statements._STATUS_ENTRIES' columns)."""
    sender = "r1" if sent is not None else None
    delay = 1000 if sent is not None else None
    task = None if spec is None else "proj.t"
    return (name, anchor, high_water, newest, code, sent, sender, delay, 2, task, "s", spec)


@given(
    anchor=st.integers(0, 2**50),
    period=st.integers(1000, 10**11),
    instant=st.integers(0, 2**51),
)
def test_interval_slots_are_the_interval_sequences(anchor: int, period: int, instant: int) -> None:
    spec = json.dumps({"kind": "interval", "every_us": period})
    (entry,) = entry_statuses([row("e", spec, anchor=anchor, newest=instant, code=1)], 0, [])
    assert entry.next_slot_us == IntervalSequence(anchor, period).next_after(instant)


def test_next_overdue_pruned_and_unknown() -> None:
    anchor = NOW - 95 * US
    rows = [
        # last slot anchor + 90 s: next anchor + 100 s, 5 s from now
        row("ok", newest=anchor + 90 * US, code=1, sent=anchor + 90 * US),
        # last slot anchor + 50 s: anchor + 60 s fell due 35 s ago
        row("late", newest=anchor + 50 * US, code=1, sent=anchor + 50 * US),
        # due 1 s ago: within the slack, not overdue
        row("due", anchor=NOW - 11 * US),
        # its rows pruned: the high-water mark stands for the last slot
        row("pruned", high_water=anchor + 90 * US, newest=anchor + 40 * US, code=0),
        row("custom", json.dumps({"kind": "other", "type": "Mine"})),
        row("unlisted", None),
        row("hourly", HOURLY, newest=NOW - NOW % (3600 * US), code=1),
    ]
    got = {e.name: e for e in entry_statuses(rows, NOW, [])}
    assert got["ok"].next_slot_us == anchor + 100 * US and got["ok"].overdue_slot_us is None
    assert got["ok"].last_state == "sent" and got["ok"].last_sender == "r1"
    assert got["late"].overdue_slot_us == anchor + 60 * US
    # the next one after the slack, not the missed one
    assert got["late"].next_slot_us == anchor + 100 * US
    assert got["due"].overdue_slot_us is None and got["due"].next_slot_us == NOW - US
    assert got["pruned"].last_slot_us == anchor + 90 * US and got["pruned"].last_state is None
    assert got["custom"].next_slot_us is None and not got["custom"].next_known
    assert got["unlisted"].task is None and not got["unlisted"].next_known
    hourly = sequence_for(crontab(minute="0"), 0, timezone.utc)
    assert got["hourly"].next_slot_us == hourly.next_after(NOW - NOW % (3600 * US))
    # overdue first, then by next slot, unknown last (by name)
    assert [e.name for e in entry_statuses(rows, NOW, [])] == [
        "late",
        "due",
        "ok",
        "pruned",
        "hourly",
        "custom",
        "unlisted",
    ]


def test_a_paused_entry_is_not_overdue_and_its_own_pause_wins() -> None:
    anchor = NOW - 95 * US
    rows = [row("a", newest=anchor + 10 * US, code=1), row("b", newest=anchor + 10 * US, code=1)]
    mine = Pause("a", None, "ops", "mine", NOW - US)
    every = Pause(PAUSE_ALL, NOW + 60 * US, "ops", "all", NOW - US)
    got = {e.name: e for e in entry_statuses(rows, NOW, [mine, every])}
    assert got["a"].pause == mine and got["b"].pause == every
    assert got["a"].overdue_slot_us is None and got["b"].overdue_slot_us is None
    assert got["a"].next_slot_us is not None and got["a"].next_slot_us >= NOW - DUE_SLACK_US
    unpaused = {e.name: e for e in entry_statuses(rows, NOW, [])}
    assert unpaused["a"].overdue_slot_us == anchor + 20 * US


def test_states_by_code() -> None:
    codes = {0: "claimed", 1: "sent", 2: "abandoned", 3: "requested"}
    rows = [row(f"e{c}", newest=NOW - US, code=c) for c in codes]
    got = {e.name: e.last_state for e in entry_statuses(rows, NOW, [])}
    assert got == {f"e{c}": word for c, word in codes.items()}
