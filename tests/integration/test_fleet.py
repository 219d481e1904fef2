"""The operator's side of the store (``celery_singlebeat/store/sql/operator.py``)
against SQLite, PostgreSQL and MariaDB: what operators read, and the controls,
each one transaction that validates, writes and raises the control version.

The replicas' rows are written by hand (``tests/fleet_rows.py``), so that each
test chooses which replica is live, lost or stopped and what each catalog says.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from conftest import PG_URL
from fleet_rows import FleetRows, cron, every
from sqlalchemy import text
from sqlalchemy.engine import make_url

from celery_singlebeat.exceptions import ControlError, SchemaError, StoreUnavailable
from celery_singlebeat.store.base import PAUSE_ALL, controls_channel
from celery_singlebeat.store.sql import SqlStore
from celery_singlebeat.store.sql.operator import Operator
from celery_singlebeat.store.sql.operator_results import DUE_SLACK_US
from celery_singlebeat.timeline.clock import US
from celery_singlebeat.timeline.slots import slot_task_id

A, B, C, D = "pod-a:11:aa", "pod-b:12:bb", "pod-c:13:cc", "pod-d:14:dd"
MINUTE = 60 * US


@pytest.fixture
def rows(db_url: str, table_prefix: str) -> Iterator[FleetRows]:
    made = FleetRows(db_url, table_prefix)
    yield made
    leaked = made.store.engine.pool.checkedout()  # type: ignore[attr-defined]
    made.close()
    assert leaked == 0, "a pooled connection was left checked out"


@pytest.fixture
def operator(rows: FleetRows) -> Operator:
    return Operator(rows.store)


def live_fleet(rows: FleetRows, now: int) -> None:
    """A live, a lost (60 s unseen at a 5 s heartbeat), C stopped; A and B have
    'report' (every 10 s) and 'nightly'; only B has 'lonely'."""
    rows.replica(A, seen_us=now, tracked=3, proposes_first=2)
    rows.replica(B, seen_us=now - MINUTE, tracked=3, proposes_first=1)
    rows.replica(C, seen_us=now - 2 * US, stopped_us=now - 2 * US)
    for name in ("report", "nightly", "lonely"):
        rows.entry(name, now - 95 * US)
    for replica in (A, B):
        rows.catalog(replica, "report", every(10), task="proj.report")
        rows.catalog(replica, "nightly", cron("0", "3"), task="proj.nightly")
    rows.catalog(B, "lonely", every(10))


def test_status_reads_every_entry_replica_and_pause(rows: FleetRows, operator: Operator) -> None:
    now = rows.now_us()
    anchor = now - 95 * US
    live_fleet(rows, now)
    rows.replica(D, seen_us=now - 4 * US)
    # report: the slot at anchor + 90 s sent 3 ms late by A; its next is anchor + 100 s
    rows.slot("report", anchor + 90 * US, owner=A, sent_us=anchor + 90 * US + 3000)
    # stale: its last claimed slot is 35 s old: anchor + 60 s fell due and nobody took it
    rows.entry("stale", anchor)
    rows.catalog(A, "stale", every(10))
    rows.slot("stale", anchor + 50 * US, owner=A, sent_us=anchor + 50 * US + 1000)
    # stuck: its newest row is a claim whose lease ran out unsent, changed hands twice
    rows.entry("stuck", anchor)
    rows.catalog(A, "stuck", every(10))
    rows.slot("stuck", anchor + 80 * US, owner=B, sent_us=anchor + 80 * US + 9000)
    rows.slot("stuck", anchor + 90 * US, owner=D, fence=3, lease_until_us=now - US)
    # mixed: two live replicas disagree (a rolling deploy)
    rows.entry("mixed", anchor)
    rows.catalog(A, "mixed", every(10))
    rows.catalog(D, "mixed", every(20), schedule="every 20s")
    # orphan: registered, in no catalog
    rows.entry("orphan", anchor)
    # held: overdue like stale, but paused: not called overdue
    rows.entry("held", anchor)
    rows.catalog(A, "held", every(10))
    operator.pause(["held"], None, "ops@host", "migration")

    status = operator.status(now_us=now)
    assert status.now_us == now
    by_name = {e.name: e for e in status.entries}
    assert set(by_name) == {
        "report",
        "nightly",
        "lonely",
        "stale",
        "stuck",
        "mixed",
        "orphan",
        "held",
    }

    report = by_name["report"]
    assert (report.task, report.schedule, report.replicas) == ("proj.report", "every 10s", 1)
    assert report.next_slot_us == anchor + 100 * US and report.overdue_slot_us is None
    assert report.last_slot_us == anchor + 90 * US and report.last_state == "sent"
    assert (report.last_sender, report.last_delay_us) == (A, 3000)
    assert report.last_sent_slot_us == anchor + 90 * US
    assert report.pause is None and report.next_known

    stale = by_name["stale"]
    assert stale.overdue_slot_us == anchor + 60 * US
    assert stale.next_slot_us == anchor + 100 * US  # the next one after now - slack

    stuck = by_name["stuck"]
    assert stuck.last_state == "abandoned" and stuck.last_slot_us == anchor + 90 * US
    # the last *sent* slot and its sender, not the abandoned claim's holder
    assert (stuck.last_sent_slot_us, stuck.last_sender) == (anchor + 80 * US, B)
    assert stuck.last_delay_us == 9000

    # the catalog row of the live replica of the greatest id
    assert (by_name["mixed"].replicas, by_name["mixed"].schedule) == (2, "every 20s")
    # nightly: a crontab never run; its next 03:00 UTC after registration
    nightly = by_name["nightly"]
    day = 86_400 * US
    three = (anchor // day) * day + 3 * 3600 * US
    expected = three if three > anchor else three + day
    if expected < now - DUE_SLACK_US:
        assert nightly.overdue_slot_us == expected
    else:
        assert nightly.next_slot_us == expected and nightly.overdue_slot_us is None
    # lonely: only the lost replica has it
    assert by_name["lonely"].replicas == 0 and by_name["lonely"].task is not None

    orphan = by_name["orphan"]
    assert orphan.task is None and orphan.next_slot_us is None and not orphan.next_known
    held = by_name["held"]
    assert held.overdue_slot_us is None and held.pause is not None
    assert (held.pause.by, held.pause.reason, held.pause.until_us) == (
        "ops@host",
        "migration",
        None,
    )

    # overdue first, the rest by next slot, unknown last
    order = [e.name for e in status.entries]
    # lonely (never run, only a lost replica has it) fell due at anchor + 10 s
    assert order[:2] == ["lonely", "mixed"] and order[-1] == "orphan", order
    assert order.index("stale") < order.index("report")
    assert [r.state for r in status.replicas] == ["live", "live", "lost", "stopped"], (
        status.replicas
    )
    assert {r.id: r.state for r in status.replicas} == {
        A: "live",
        D: "live",
        B: "lost",
        C: "stopped",
    }
    share = {r.id: r.share for r in status.replicas}
    assert share[A] == pytest.approx(2 / 3) and share[C] is None
    assert [p.entry for p in status.pauses] == ["held"]

    # by default the database's clock, read in the same round trips
    before = rows.now_us()
    assert before <= operator.status().now_us <= rows.now_us()


def test_a_pause_of_every_entry_pauses_each_and_expired_pauses_do_not(
    rows: FleetRows, operator: Operator
) -> None:
    now = rows.now_us()
    live_fleet(rows, now)
    operator.pause([PAUSE_ALL], now + 10 * MINUTE, "ops", "deploy")
    operator.pause(["report"], now + 20 * US, "ops", "short")
    status = operator.status(now_us=now)
    assert {e.name: e.pause.entry for e in status.entries if e.pause} == {
        "report": "report",
        "nightly": "*",
        "lonely": "*",
    }
    # once its own pause expired, report is paused by '*' only
    later = operator.status(now_us=now + 21 * US)
    assert {e.name: e.pause.entry for e in later.entries if e.pause}["report"] == "*"
    assert [p.entry for p in later.pauses] == ["*"]


def test_history_states_requesters_and_filters(rows: FleetRows, operator: Operator) -> None:
    now = rows.now_us()
    live_fleet(rows, now)
    rows.slot("report", now - 30 * US, owner=A, sent_us=now - 30 * US + 2000)
    rows.slot("report", now - 20 * US, owner=B, fence=2, lease_until_us=now - US)
    rows.slot("nightly", now - 10 * US, owner=A, lease_until_us=now + 10 * US)
    asked = operator.run_now("report", "ops@host", "catch up")

    history = operator.history(now_us=asked.requested_us)
    assert [(h.entry, h.state) for h in history] == [
        ("report", "requested"),
        ("nightly", "claimed"),
        ("report", "abandoned"),
        ("report", "sent"),
    ]
    requested, claimed, abandoned, sent = history
    assert (requested.requested_by, requested.request_reason) == ("ops@host", "catch up")
    assert requested.fence == 0 and requested.holder is None and requested.sender is None
    assert requested.task_id == asked.task_id == slot_task_id("report", asked.slot_us)
    assert (claimed.holder, claimed.sender) == (A, None)
    assert (abandoned.holder, abandoned.fence) == (B, 2)
    assert (sent.sender, sent.holder, sent.delay_us) == (A, None, 2000)
    assert sent.task_id == slot_task_id("report", now - 30 * US)
    assert sent.requested_by is None

    assert [h.state for h in operator.history("report")] == ["requested", "abandoned", "sent"]
    assert [h.entry for h in operator.history(since_us=now - 15 * US)] == ["report", "nightly"]
    assert [h.state for h in operator.history(limit=2)] == ["requested", "claimed"]
    assert operator.history("nobody") == []


def test_controls_validate_change_nothing_on_refusal_and_raise_the_version(
    rows: FleetRows, operator: Operator
) -> None:
    now = rows.now_us()
    live_fleet(rows, now)
    start = rows.controls_version()

    # unknown names: refused with close matches, nothing written
    with pytest.raises(
        ControlError, match=r"'reprot' \(did you mean 'report'\?\); nothing changed"
    ):
        operator.pause(["report", "reprot"], None, "ops")
    # an entry only a lost replica has is unknown to the live fleet
    with pytest.raises(ControlError, match="no live replica has the entry 'lonely'"):
        operator.pause(["lonely"], None, "ops")
    with pytest.raises(ControlError, match="in the past"):
        operator.pause(["report"], now - US, "ops")
    with pytest.raises(ControlError, match="reason"):
        operator.pause(["report"], None, "ops", "x" * 501)
    with pytest.raises(ControlError, match="'nope'"):
        operator.run_now("nope", "ops")
    assert rows.select(rows.tables.pauses) == [] and rows.select(rows.tables.slots) == []
    assert rows.controls_version() == start

    # pause: one row per entry, the version raised once per control
    paused = operator.pause(["report", "nightly"], None, "ops@host", "migration", for_us=MINUTE)
    assert [p.entry for p in paused.pauses] == ["report", "nightly"]
    assert paused.controls_version == rows.controls_version() == start + 1
    row = {r.entry: r for r in rows.select(rows.tables.pauses)}["report"]
    assert (row.paused_by, row.reason) == ("ops@host", "migration")
    assert row.until_us == row.at_us + MINUTE and now <= row.at_us <= rows.now_us()

    # run now refuses a paused entry, saying by whom and why
    with pytest.raises(ControlError, match="'report' is paused by ops@host: migration"):
        operator.run_now("report", "ops")

    # resume: the pause of all entries keeps them paused, and the result says so
    operator.pause([PAUSE_ALL], None, "ops", "freeze")
    resumed = operator.resume(["report"])
    assert resumed.resumed == ["report"] and resumed.not_paused == []
    assert resumed.still_paused_by is not None and resumed.still_paused_by.reason == "freeze"
    with pytest.raises(ControlError, match=r"paused \(with every entry: '\*'\) by ops: freeze"):
        operator.run_now("report", "ops")
    again = operator.resume(["report", PAUSE_ALL])
    assert again.resumed == [PAUSE_ALL] and again.not_paused == ["report"]
    assert again.still_paused_by is None
    assert [r.entry for r in rows.select(rows.tables.pauses)] == ["nightly"]

    # a pause row of an entry no live replica has can still be lifted
    rows._insert(
        rows.tables.pauses, entry="removed", until_us=None, paused_by="x", reason="", at_us=now
    )
    assert operator.resume(["removed"]).resumed == ["removed"]
    with pytest.raises(ControlError, match="'never-there'"):
        operator.resume(["never-there"])
    everything = operator.resume(None)
    assert everything.resumed == ["nightly"] and rows.select(rows.tables.pauses) == []

    # run now: an abandoned slot row nobody held, and who asked
    asked = operator.run_now("report", "ops@host", "catch up")
    slot = rows.select(rows.tables.slots)[0]
    assert (slot.entry, slot.slot_us, slot.state, slot.owner, slot.fence) == (
        "report",
        asked.slot_us,
        0,
        "",
        0,
    )
    assert (slot.lease_until_us, slot.claimed_us, slot.sent_us) == (0, asked.slot_us, None)
    request = rows.select(rows.tables.requests)[0]
    assert (request.entry, request.slot_us, request.requested_by, request.reason) == (
        "report",
        asked.slot_us,
        "ops@host",
        "catch up",
    )
    assert asked.controls_version == rows.controls_version()
    assert rows.controls_version() == start + 7  # one per control above that succeeded


def test_run_now_takes_the_next_free_microsecond(
    rows: FleetRows, operator: Operator, monkeypatch: pytest.MonkeyPatch
) -> None:
    now = rows.now_us()
    live_fleet(rows, now)
    # the database's clock read as one instant, for which rows exist already
    fixed = now + US  # A stays live at that instant
    monkeypatch.setattr(operator, "_now", lambda conn: fixed)
    rows.slot("report", fixed, owner=A, sent_us=fixed + 1000)
    rows.slot("report", fixed + 1, owner=A, sent_us=fixed + 1000)
    first = operator.run_now("report", "ops")
    second = operator.run_now("report", "ops")
    assert (first.slot_us, second.slot_us) == (fixed + 2, fixed + 3)
    assert first.task_id != second.task_id


def test_a_failed_control_rolls_back_and_leaves_the_pool_clean(
    rows: FleetRows, operator: Operator
) -> None:
    now = rows.now_us()
    live_fleet(rows, now)
    start = rows.controls_version()
    # the slot row is written first, then the request row fails: neither stays
    with rows.engine.begin() as conn:
        conn.execute(text(f"DROP TABLE {rows.prefix}requests"))
    with pytest.raises(SchemaError, match="create-schema"):
        operator.run_now("report", "ops")
    assert rows.select(rows.tables.slots) == []
    assert rows.controls_version() == start
    # the connection went back to the pool outside any transaction: the next
    # control commits (an aborted PostgreSQL transaction would refuse it)
    assert operator.pause(["report"], None, "ops").controls_version == start + 1
    assert len(rows.select(rows.tables.pauses)) == 1
    rows.tables.requests.create(rows.engine)


def test_controls_notify_the_replicas_at_commit_on_postgres(pg_url: str, table_prefix: str) -> None:
    rows = FleetRows(pg_url, table_prefix)
    try:
        now = rows.now_us()
        live_fleet(rows, now)
        operator = Operator(rows.store)
        channel = controls_channel(table_prefix)
        conninfo = make_url(pg_url).set(drivername="postgresql").render_as_string(False)
        with psycopg.connect(conninfo, autocommit=True) as listener:
            listener.execute(f'LISTEN "{channel}"')
            operator.pause(["report"], None, "ops")
            operator.resume(["report"])
            with pytest.raises(ControlError):
                operator.run_now("nope", "ops")
            got: list[Any] = []
            deadline = time.monotonic() + 5
            while len(got) < 2 and time.monotonic() < deadline:
                got.extend(listener.notifies(timeout=0.2, stop_after=1))
            assert [n.channel for n in got] == [channel, channel]
            # the refused one sent nothing
            assert list(listener.notifies(timeout=0.3, stop_after=1)) == []
    finally:
        rows.close()


def test_leases_and_releasing_one_by_hand(rows: FleetRows, operator: Operator) -> None:
    now = rows.now_us()
    rows.lock("proj.billing", owner="w1", token=now, expires_us=now + MINUTE, acquired_us=now)
    rows.lock("proj.old", owner="w2", token=now - 9, expires_us=now - US, acquired_us=now - MINUTE)
    rows.lock("proj.done", owner="w3", token=now - 5, expires_us=0, acquired_us=now - MINUTE)
    assert [(x.key, x.state, x.holder) for x in operator.leases()] == [
        ("proj.billing", "held", "w1"),
        ("proj.done", "released", "w3"),
        ("proj.old", "expired", "w2"),
    ]
    assert operator.lease("proj.billing") is not None and operator.lease("proj.x") is None
    assert operator.release_lease("proj.billing") is True
    assert operator.lease("proj.billing").state == "released"  # type: ignore[union-attr]
    # the token is left as it was: the next holder's is larger still
    assert operator.lease("proj.billing").token == now  # type: ignore[union-attr]
    assert operator.release_lease("proj.billing") is False
    assert operator.release_lease("proj.old") is False
    assert operator.lease("proj.old").state == "expired"  # type: ignore[union-attr]
    with pytest.raises(ControlError, match=r"'proj.bililng' \(did you mean 'proj.billing'"):
        operator.release_lease("proj.bililng")


def test_prune_deletes_at_once_what_the_periodic_prunes_delete(
    rows: FleetRows, operator: Operator
) -> None:
    now = rows.now_us()
    retention = 15 * MINUTE
    old = now - retention - MINUTE
    rows.replica(A, seen_us=now)
    rows.replica(B, seen_us=old)  # lost long ago
    rows.replica(C, seen_us=now - US, stopped_us=old)  # stopped long ago
    rows.replica(D, seen_us=now - 2 * MINUTE, stopped_us=now - 2 * MINUTE)  # stopped lately
    for replica in (A, B, C, D):
        rows.catalog(replica, "report", every(10))
    rows.catalog("pod-z:1:zz", "report", every(10))  # a replica row that never was
    rows.entry("report", old - MINUTE)
    rows.slot("report", old, owner=A, sent_us=old + 1000)  # sent, past the retention
    rows.slot("report", old - US, owner=A)  # claimed: never pruned
    rows.slot("report", now - MINUTE, owner=A, sent_us=now - MINUTE + 1000)
    for slot_us in (old, now - MINUTE):
        rows._insert(
            rows.tables.requests,
            entry="report",
            slot_us=slot_us,
            requested_by="ops",
            reason="",
            at_us=slot_us,
        )
    week_ago = old - 8 * 86_400 * US
    rows.lock("proj.old", owner="w", token=week_ago, expires_us=0, acquired_us=week_ago)
    # a replica pruned a moment ago: its turn is an hour away, this prune runs anyway
    meta = rows.tables.meta
    with rows.engine.begin() as conn:
        conn.execute(meta.update().where(meta.c.key == "prune").values(value_us=now + 3600 * US))

    report = operator.prune(retention, 7 * 86_400 * US)
    assert (report.slots, report.singleton_rows) == (1, 1)
    assert (report.fleet.replicas, report.fleet.catalog, report.fleet.requests) == (2, 3, 1)
    assert {r.id for r in rows.select(rows.tables.replicas)} == {A, D}
    assert {r.catalog for r in rows.select(rows.tables.catalog)} == {A, D}
    assert [r.slot_us for r in rows.select(rows.tables.requests)] == [now - MINUTE]
    assert sorted(r.slot_us for r in rows.select(rows.tables.slots)) == [old - US, now - MINUTE]
    entry = rows.select(rows.tables.entries)[0]
    assert entry.last_slot_us == old  # the high-water mark, raised before the delete
    assert rows.select(rows.tables.locks) == []
    # again: nothing left to delete; the store's method (the replicas' periodic
    # prune) deletes the same rows
    assert operator.prune(retention, 7 * 86_400 * US).fleet == (0, 0, 0)
    rows.replica(B, seen_us=old)
    rows.catalog(B, "report", every(10))
    assert rows.store.prune_fleet(retention) == 2


def test_missing_tables_say_to_create_the_schema(db_url: str, table_prefix: str) -> None:
    store = SqlStore(make_url(db_url), table_prefix=table_prefix)
    operator = Operator(store)
    try:
        calls = (operator.status, operator.replicas, lambda: operator.pause(["x"], None, "ops"))
        for call in calls:
            with pytest.raises(SchemaError, match="create-schema") as caught:
                call()
            assert "\n" not in str(caught.value)
        assert store.engine.pool.checkedout() == 0  # type: ignore[attr-defined]
    finally:
        store.close()


def test_an_unreachable_database_is_store_unavailable_without_its_password() -> None:
    url = make_url(PG_URL).set(password="S3cret-pw", port=1)
    store = SqlStore(url, table_prefix="sb_")
    try:
        for call in (Operator(store).status, lambda: Operator(store).run_now("x", "ops")):
            with pytest.raises(StoreUnavailable) as caught:
                call()
            assert "S3cret-pw" not in str(caught.value) and "refused" in str(caught.value)
    finally:
        store.close()
