# ruff: noqa: F811 - the shared `backend` fixture is imported, then named as a parameter
"""Stored schedules (``ScheduleStore``, ``store/schedule_store.py``), one suite
for every backend of ``test_store_contract`` (memory, SQLite, PostgreSQL,
MariaDB): writes and their errors, all-or-nothing batches, no-op writes, the
history and its diffs, the feed and its cursor, the prune's floor, the one
statement of ``feed_versions``, the caller's connection (SQLAlchemy, Django),
``sent_count``. Commit order under concurrent writers and the Hypothesis model
of the feed are in ``test_schedule_feed_order.py``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from conftest import IN_CI, direct_engine
from sqlalchemy import Column, Integer, MetaData, String, Table, select
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session
from test_fleet_contract import Operator
from test_store_contract import LONG_LEASE, Backend, backend, round_trips, wait_db_past  # noqa: F401

from celery_singlebeat.exceptions import ScheduleConflict, ScheduleExists, ScheduleNotFound
from celery_singlebeat.store.base import (
    EDITABLE,
    SCHEDULE_REVISION_KEY,
    ScheduleRow,
    ScheduleWrite,
    SlotKey,
    Store,
    Written,
)
from celery_singlebeat.store.schedule_edits import digest
from celery_singlebeat.store.sql import SqlStore
from celery_singlebeat.store.sql.schema import Tables

SECRET = "hunter2-token"


def fields(**changes: Any) -> dict[str, Any]:
    """Every editable field but the name, as a create or a replace gives them."""
    base: dict[str, Any] = {
        "task": "tasks.report",
        "spec": '{"kind":"interval","every_us":10000000}',
        "args": "[1,2]",
        "kwargs": json.dumps({"token": SECRET}),
        "options": '{"queue":"q1"}',
        "enabled": True,
        "start_us": None,
        "end_us": None,
        "max_runs": None,
        "policy": None,
        "jitter_us": 0,
        "description": "a report",
        "managed_by": None,
    }
    base.update(changes)
    return base


def create(name: str, **changes: Any) -> ScheduleWrite:
    return ScheduleWrite("create", name, fields(**changes))


def editable(row: ScheduleRow) -> dict[str, Any]:
    return {f: getattr(row, f) for f in EDITABLE[1:]}


def versions(store: Store) -> int:
    return store.feed_versions()


# -- writes ----------------------------------------------------------------------


def test_a_create_is_read_back_everywhere_at_one_revision(backend: Backend) -> None:
    store = backend.ready()
    assert store.schedule_rows() == ([], 0)
    assert store.feed_versions() == 0
    before = store.ping()
    [row] = store.write_schedules([create("report", max_runs=3, end_us=10**15)], "alice", "new")
    assert editable(row) == fields(max_runs=3, end_us=10**15)
    assert row.revision >= 1 and not row.deleted
    assert before <= row.created_us == row.updated_us <= store.ping()
    assert (row.created_by, row.updated_by) == ("alice", "alice")
    assert store.schedule_row("report") == row
    assert store.schedule_row("other") is None
    assert store.schedule_rows() == ([row], row.revision)
    assert store.feed_versions() == row.revision
    feed = store.schedule_feed(0)
    assert (feed.rows, feed.revision, feed.complete) == ([row], row.revision, True)
    assert store.schedule_feed(row.revision) == ([], row.revision, True)


def test_each_batch_takes_one_revision_for_all_its_rows(backend: Backend) -> None:
    store = backend.ready()
    rows = store.write_schedules([create("a"), create("b"), create("c")], "bob")
    assert len({r.revision for r in rows}) == 1
    [later] = store.write_schedules([ScheduleWrite("update", "a", {"jitter_us": 5})], "bob")
    assert later.revision > rows[0].revision
    assert [r.name for r in store.schedule_log()] == ["a", "a", "b", "c"]


def test_create_update_replace_delete_and_their_errors(backend: Backend) -> None:
    store = backend.ready()
    [a] = store.write_schedules([create("a")], "u1")
    with pytest.raises(ScheduleExists) as exists:
        store.write_schedules([create("a")], "u1")
    assert exists.value.name == "a" and "'a'" in str(exists.value)
    for op in ("update", "delete"):
        with pytest.raises(ScheduleNotFound) as missing:
            store.write_schedules(
                [ScheduleWrite(op, "nope", {"enabled": False} if op == "update" else {})], "u1"
            )
        assert missing.value.name == "nope"

    [b] = store.write_schedules([ScheduleWrite("update", "a", {"enabled": False})], "u2")
    assert b.enabled is False and b.revision > a.revision
    assert (b.created_us, b.created_by, b.updated_by) == (a.created_us, "u1", "u2")
    assert editable(b) == {**editable(a), "enabled": False}

    [c] = store.write_schedules([ScheduleWrite("replace", "a", fields(task="tasks.other"))], "u3")
    assert editable(c) == fields(task="tasks.other") and c.created_us == a.created_us
    [n] = store.write_schedules([ScheduleWrite("replace", "new", fields())], "u3")
    assert n.created_by == "u3" and store.schedule_row("new") == n

    [gone] = store.write_schedules([ScheduleWrite("delete", "a")], "u4")
    assert gone.deleted and gone.revision > c.revision and gone.updated_by == "u4"
    assert editable(gone) == editable(c)  # the tombstone keeps what was deleted
    assert store.schedule_row("a") is None
    assert [r.name for r in store.schedule_rows()[0]] == ["new"]
    for op in ("update", "delete"):
        with pytest.raises(ScheduleNotFound):
            store.write_schedules(
                [ScheduleWrite(op, "a", {"enabled": True} if op == "update" else {})], "u4"
            )


def test_a_create_over_a_tombstone_revives_the_name_and_its_history_continues(
    backend: Backend,
) -> None:
    store = backend.ready()
    [first] = store.write_schedules([create("a", description="one")], "u1")
    store.write_schedules([ScheduleWrite("delete", "a")], "u2")
    wait_db_past(store, first.created_us)
    [again] = store.write_schedules([create("a", description="two")], "u3")
    assert not again.deleted and again.description == "two"
    assert again.created_us > first.created_us and again.created_by == "u3"
    assert [(r.action, r.by) for r in store.schedule_log("a")] == [
        ("created", "u3"),
        ("deleted", "u2"),
        ("created", "u1"),
    ]


def test_if_revision_refuses_a_stale_edit_naming_both_revisions(backend: Backend) -> None:
    store = backend.ready()
    [a] = store.write_schedules([create("a")], "u1")
    [b] = store.write_schedules(
        [ScheduleWrite("update", "a", {"jitter_us": 1}, if_revision=a.revision)], "u1"
    )
    with pytest.raises(ScheduleConflict) as conflict:
        store.write_schedules(
            [ScheduleWrite("update", "a", {"jitter_us": 2}, if_revision=a.revision)], "u2"
        )
    assert str(conflict.value) == (
        f"schedule entry 'a' is at revision {b.revision}, not {a.revision}: "
        "reload it and apply the edit again"
    )
    assert (conflict.value.name, conflict.value.revision) == ("a", b.revision)
    with pytest.raises(ScheduleConflict):
        store.write_schedules([ScheduleWrite("delete", "a", if_revision=a.revision)], "u2")
    with pytest.raises(ScheduleConflict, match="has no live row"):
        store.write_schedules([ScheduleWrite("replace", "z", fields(), if_revision=1)], "u2")
    assert store.schedule_row("a") == b


def test_a_batch_is_all_or_nothing(backend: Backend) -> None:
    store = backend.ready()
    [x, y] = store.write_schedules([create("x"), create("y")], "u1")
    top = store.feed_versions()
    log = store.schedule_log()
    batches = [
        # the third write conflicts
        [
            create("new1"),
            ScheduleWrite("update", "x", {"enabled": False}),
            ScheduleWrite("replace", "new2", fields(), if_revision=x.revision + 100),
        ],
        [create("new1"), ScheduleWrite("delete", "x"), ScheduleWrite("update", "nope", {})],
        [create("new1"), ScheduleWrite("delete", "x"), create("y")],
    ]
    for batch, error in zip(batches, (ScheduleConflict, ScheduleNotFound, ScheduleExists)):
        with pytest.raises(error):
            store.write_schedules(batch, "u2")
        assert store.schedule_rows() == ([x, y], top)
        assert store.schedule_log() == log
        assert store.schedule_feed(top).rows == []


def test_a_write_that_changes_nothing_is_no_change(backend: Backend) -> None:
    store = backend.ready()
    [a] = store.write_schedules([create("a")], "u1")
    top = store.feed_versions()
    same = [
        [ScheduleWrite("replace", "a", fields())],
        [ScheduleWrite("update", "a", {"enabled": True, "jitter_us": 0})],
        [ScheduleWrite("update", "a", {})],
    ]
    for batch in same:
        assert store.write_schedules(batch, "u2", "again") == [a]
    assert store.feed_versions() == top
    assert len(store.schedule_log()) == 1
    # in a batch with a change, the unchanged write keeps its row and revision
    rows = store.write_schedules(
        [ScheduleWrite("replace", "a", fields()), create("b")], "u3", "mixed"
    )
    assert rows[0] == a and rows[1].revision > top
    assert [r.name for r in store.schedule_log()] == ["b", "a"]


def test_a_batch_no_store_could_write_is_refused_before_any_round_trip(
    backend: Backend,
) -> None:
    store = backend.ready()
    store.write_schedules([create("a")], "u1")
    bad: list[tuple[list[ScheduleWrite], str, str, str]] = [
        ([create("b")], "x" * 121, "", "by"),
        ([create("b")], "u", "y" * 1001, "why"),
        ([create("b"), ScheduleWrite("delete", "b")], "u", "", "twice"),
        ([ScheduleWrite("create", "b", {"task": "t"})], "u", "", "missing"),
        ([ScheduleWrite("update", "a", {"revision": 9})], "u", "", "read-only"),
        ([ScheduleWrite("update", "a", {"spec": "{not json"})], "u", "", "spec: expected a JSON"),
        ([ScheduleWrite("update", "a", {"enabled": 1})], "u", "", "enabled"),
        ([ScheduleWrite("update", "a", {"max_runs": "3"})], "u", "", "max_runs"),
        ([ScheduleWrite("rename", "a")], "u", "", "op 'rename'"),
        ([ScheduleWrite("delete", "a", {"enabled": False})], "u", "", "takes no fields"),
        ([create("")], "u", "", "name"),
        ([create("n" * 256)], "u", "", "name"),
    ]
    before = round_trips(store)
    for writes, by, why, words in bad:
        with pytest.raises(ValueError, match=words):
            store.write_schedules(writes, by, why)
    assert round_trips(store) == before
    assert store.write_schedules([], "u") == []


# -- the history -----------------------------------------------------------------


def test_the_history_diffs_each_change_and_shows_arguments_only_by_digest(
    backend: Backend,
) -> None:
    store = backend.ready()
    [a] = store.write_schedules([create("a")], "alice", "first")
    new_kwargs = json.dumps({"token": SECRET + "-2"})
    [b] = store.write_schedules(
        [
            ScheduleWrite(
                "update",
                "a",
                {
                    "kwargs": new_kwargs,
                    "options": '{"queue":"q2","priority":5}',
                    "policy": '{"kind":"skip"}',
                    "enabled": False,
                },
            )
        ],
        "bob",
        "move it to q2",
    )
    store.write_schedules([ScheduleWrite("delete", "a")], "carol")
    log = store.schedule_log("a")
    assert [(r.action, r.by, r.why) for r in log] == [
        ("deleted", "carol", ""),
        ("changed", "bob", "move it to q2"),
        ("created", "alice", "first"),
    ]
    assert [r.revision for r in log] == sorted((r.revision for r in log), reverse=True)
    assert log[1].revision == b.revision and log[1].at_us == b.updated_us
    assert json.loads(log[1].changes) == {
        "kwargs": [digest(a.kwargs), digest(new_kwargs)],
        "options": [{"queue": "q1"}, {"queue": "q2", "priority": 5}],
        "policy": [None, {"kind": "skip"}],
        "enabled": [True, False],
    }
    created = json.loads(log[2].changes)
    assert created["spec"] == [None, json.loads(a.spec)]
    assert created["args"] == [None, digest("[1,2]")] and created["args"][1].startswith("sha256:")
    assert len(created["args"][1]) == len("sha256:") + 12
    assert "max_runs" not in created  # null from null: not a change
    assert json.loads(log[0].changes)["task"] == ["tasks.report", None]
    for row in log:
        assert SECRET not in row.changes
    assert store.schedule_log(limit=2) == log[:2]
    assert store.schedule_log("other") == []


# -- the feed ----------------------------------------------------------------------


def test_the_feed_reports_every_write_after_its_cursor_in_revision_order(
    backend: Backend,
) -> None:
    store = backend.ready()
    store.write_schedules([create("a"), create("b")], "u")
    rows, top = store.schedule_rows()
    store.write_schedules([ScheduleWrite("update", "b", {"jitter_us": 7})], "u")
    store.write_schedules([ScheduleWrite("delete", "a"), create("c")], "u")
    store.write_schedules([ScheduleWrite("update", "b", {"jitter_us": 8})], "u")
    feed = store.schedule_feed(top)
    assert [(r.name, r.deleted) for r in feed.rows] == [("a", True), ("c", False), ("b", False)]
    revisions = [r.revision for r in feed.rows]
    assert revisions == sorted(revisions) and revisions[0] > top
    assert feed.revision == revisions[-1] == store.feed_versions() and feed.complete
    # a follower's view at the cursor is the table's
    view = {r.name: r for r in rows}
    for row in feed.rows:
        if row.deleted:
            view.pop(row.name, None)
        else:
            view[row.name] = row
    assert sorted(view.values()) == sorted(store.schedule_rows()[0])
    assert store.schedule_feed(feed.revision) == ([], feed.revision, True)


def test_a_prune_deletes_old_tombstones_and_history_and_raises_the_floor(
    backend: Backend,
) -> None:
    store = backend.ready()
    store.write_schedules([create("a"), create("b"), create("keep")], "u")
    cursor = store.feed_versions()
    [gone] = store.write_schedules([ScheduleWrite("delete", "a")], "u")
    store.write_schedules([ScheduleWrite("delete", "b")], "u")
    assert store.prune_schedules(10**12, 10**12) == 0  # nothing that old
    assert store.schedule_feed(cursor).complete
    [b_gone] = store.schedule_feed(gone.revision).rows
    wait_db_past(store, b_gone.updated_us)
    [revived] = store.write_schedules([create("b")], "u")  # no tombstone any more
    # "older than 0 µs" is strictly older: past the last write's instant first
    wait_db_past(store, revived.updated_us)
    log_rows = len(store.schedule_log(limit=1000))
    assert log_rows == 6
    # every tombstone and history row is older than 0 µs now: only "a" goes of
    # the tombstones ("b" is live again), and every history row
    deleted = store.prune_schedules(0, 0)
    assert deleted == 1 + log_rows
    assert store.schedule_log() == []
    assert [r.name for r in store.schedule_rows()[0]] == ["b", "keep"]
    stale = store.schedule_feed(cursor)
    assert stale.complete is False  # "a"'s delete is lost to this cursor: reload
    assert [r.name for r in stale.rows] == ["b"]
    assert store.schedule_feed(gone.revision).complete
    assert store.schedule_feed(revived.revision).complete
    # the floor never goes down; a second prune (another replica's) finds nothing
    assert store.prune_schedules(0, 0) == 0
    assert store.schedule_feed(cursor).complete is False


def test_after_the_newest_tombstone_is_pruned_a_reload_s_cursor_is_the_floor(
    backend: Backend,
) -> None:
    """Else every feed from the reload's cursor would be incomplete: a reload a second."""
    store = backend.ready()
    store.write_schedules([create("a")], "u")
    [gone] = store.write_schedules([ScheduleWrite("delete", "a")], "u")
    wait_db_past(store, gone.updated_us)
    assert store.prune_schedules(0, 10**12) == 1
    # no row left, but the floor: a reader still at the revision before the
    # delete must learn that something moved (its feed is incomplete: reload)
    assert store.feed_versions() == gone.revision
    assert store.schedule_revision == gone.revision
    assert store.schedule_feed(0).complete is False
    rows, cursor = store.schedule_rows()
    assert (rows, cursor) == ([], gone.revision)
    assert store.schedule_feed(cursor) == ([], cursor, True)


def test_feed_versions_sees_a_write_and_a_control_change_in_one_statement(
    backend: Backend,
) -> None:
    store = backend.ready()
    operator = Operator(backend)
    assert store.feed_versions() == 0
    controls = store.controls_version
    assert controls is not None
    reader = backend.open()
    [row] = store.write_schedules([create("a")], "u")
    before = round_trips(reader)
    assert reader.feed_versions() == row.revision
    assert round_trips(reader) - before == 1
    operator.pause("a")
    before = round_trips(reader)
    assert reader.feed_versions() == row.revision
    assert round_trips(reader) - before == 1
    assert reader.controls_version == controls + 1


def test_schedule_rows_and_a_feed_from_its_revision_miss_nothing(backend: Backend) -> None:
    store = backend.ready()
    store.write_schedules([create(f"e{i}") for i in range(5)], "u")
    rows, top = store.schedule_rows()
    assert [r.name for r in rows] == [f"e{i}" for i in range(5)]
    assert top == store.feed_versions()
    store.write_schedules([ScheduleWrite("delete", "e1")], "u")
    rows2, top2 = store.schedule_rows()
    assert top2 > top and [r.name for r in rows2] == ["e0", "e2", "e3", "e4"]
    assert [r.name for r in store.schedule_feed(top).rows] == ["e1"]
    if isinstance(store, SqlStore):
        before = round_trips(store)
        store.schedule_rows()
        store.schedule_feed(top)
        store.schedule_row("e0")
        assert round_trips(store) - before == 3


@pytest.mark.parametrize("backend", ["sqlite", "postgres", "mysql"], indirect=True)
def test_readers_never_wait_for_a_writer_holding_the_counter(backend: Backend) -> None:
    """A write in a transaction left open holds the revision counter's lock:
    other writers wait for it, readers do not (they never read that row)."""
    # (the memory store has no transactions to hold open: SQL backends only)
    store = backend.ready()
    [row] = store.write_schedules([create("a")], "u")
    engine = direct_engine(backend.url or "")
    try:
        with engine.connect() as conn:
            tx = conn.begin()
            store.write_schedules([ScheduleWrite("update", "a", {"jitter_us": 9})], "u", "", conn)
            reader = backend.open()
            started = time.monotonic()
            assert reader.feed_versions() == row.revision  # the open write is not seen
            assert reader.schedule_feed(row.revision).rows == []
            assert reader.schedule_rows() == ([row], row.revision)
            assert time.monotonic() - started < 2
            tx.rollback()
    finally:
        engine.dispose()
    assert store.schedule_row("a") == row


def test_prepare_creates_the_counter_row_once_and_again_is_harmless(backend: Backend) -> None:
    store = backend.ready()
    store.write_schedules([create("a")], "u")
    store.prepare(create=True)  # another replica preparing later
    [b] = store.write_schedules([create("b")], "u")
    assert b.revision == 2
    if backend.url is not None:
        tables = Tables(backend.prefix)
        engine = direct_engine(backend.url)
        try:
            with engine.connect() as conn:
                value = conn.execute(
                    select(tables.meta.c.value_us).where(tables.meta.c.key == SCHEDULE_REVISION_KEY)
                ).scalar_one()
        finally:
            engine.dispose()
        assert value == 2


# -- sent_count ------------------------------------------------------------------


def test_sent_count_counts_the_entry_s_slot_rows_since_an_instant(backend: Backend) -> None:
    store = backend.ready()
    now = store.ping()
    store.register(["a", "b"])
    won = store.claim("r1", [SlotKey("a", now - 3), SlotKey("a", now - 2)], LONG_LEASE)
    store.confirm("r1", won[:1])
    store.claim("r1", [SlotKey("a", now - 1), SlotKey("b", now - 1)], LONG_LEASE)
    assert store.sent_count("a", now - 3) == 3
    assert store.sent_count("a", now - 2) == 2
    assert store.sent_count("a", now) == 0
    assert store.sent_count("b", 0) == 1
    assert store.sent_count("c", 0) == 0


# -- PostgreSQL: a write notifies the controls channel ----------------------------


@pytest.mark.parametrize("backend", ["postgres"], indirect=True)
def test_a_write_on_postgresql_is_heard_by_the_controls_listener(backend: Backend) -> None:
    # only PostgreSQL has a notification channel
    store = backend.ready()
    listener = store.listen()
    assert listener is not None
    try:
        assert listener.poll() is False
        store.write_schedules([create("a")], "u")
        deadline = time.monotonic() + 5
        while not listener.poll():
            assert time.monotonic() < deadline, "no notification at the commit"
            time.sleep(0.01)
        store.write_schedules([create("a")._replace(op="replace")], "u")  # no change
        time.sleep(0.1)
        assert listener.poll() is False
    finally:
        listener.close()


# -- the caller's connection -----------------------------------------------------


@pytest.fixture
def caller_table(backend: Backend) -> Iterator[tuple[Engine, Table]]:
    """A table of the caller's own, beside the store's, and an engine on it."""
    # the tests that use it run on the SQL backends (the memory store joins no
    # caller's transaction: test_memory_store_refuses_a_connection)
    assert backend.url is not None
    engine = direct_engine(backend.url)
    metadata = MetaData()
    table = Table(
        f"{backend.prefix}orders",
        metadata,
        Column("id", Integer, primary_key=True, autoincrement=False),
        Column("note", String(50)),
    )
    metadata.create_all(engine)
    try:
        yield engine, table
    finally:
        metadata.drop_all(engine)
        engine.dispose()


@pytest.mark.parametrize("backend", ["memory"], indirect=True)
def test_memory_store_refuses_a_connection(backend: Backend) -> None:
    with pytest.raises(TypeError, match="connection= is not supported"):
        backend.memory.write_schedules([create("a")], "u", connection=object())


@pytest.mark.parametrize("how", ["connection", "session"])
@pytest.mark.parametrize("backend", ["sqlite", "postgres", "mysql"], indirect=True)
def test_a_write_on_the_caller_s_connection_commits_and_rolls_back_with_its_rows(
    backend: Backend, caller_table: tuple[Engine, Table], how: str
) -> None:
    engine, orders = caller_table
    store = backend.ready()

    def write(order: int, name: str, commit: bool) -> None:
        if how == "connection":
            with engine.connect() as conn:
                tx = conn.begin()
                conn.execute(orders.insert().values(id=order, note="mine"))
                [row] = store.write_schedules([create(name)], "app", "with an order", conn)
                assert row.name == name
                tx.commit() if commit else tx.rollback()
        else:
            with Session(engine) as session:
                session.execute(orders.insert().values(id=order, note="mine"))
                store.write_schedules([create(name)], "app", "with an order", session)
                session.commit() if commit else session.rollback()

    write(1, "rolled-back", commit=False)
    write(2, "committed", commit=True)
    with engine.connect() as conn:
        assert [r[0] for r in conn.execute(select(orders.c.id))] == [2]
    assert [r.name for r in store.schedule_rows()[0]] == ["committed"]
    assert [r.name for r in store.schedule_log()] == ["committed"]
    assert [r.name for r in store.schedule_feed(0).rows] == ["committed"]
    # the rolled-back write's revision number is taken by no row: a gap, skipped
    assert store.schedule_feed(0).revision >= 1


@pytest.mark.parametrize("backend", ["sqlite", "postgres", "mysql"], indirect=True)
def test_a_connection_to_another_kind_of_database_is_refused(backend: Backend) -> None:
    store = backend.ready()
    other = "sqlite://" if backend.kind != "sqlite" else "postgresql+psycopg://u@127.0.0.1:1/x"
    engine = direct_engine(other)
    try:
        if backend.kind == "sqlite":
            conn: Any = Session(engine)  # a session does not connect before it is asked
            with pytest.raises(Exception):  # noqa: B017 - connecting fails first on purpose
                store.write_schedules([create("a")], "u", connection=conn)
        else:
            with engine.connect() as conn, pytest.raises(ValueError, match="sqlite connection"):
                store.write_schedules([create("a")], "u", connection=conn)
    finally:
        engine.dispose()
    with pytest.raises(TypeError, match="expected a SQLAlchemy Connection"):
        store.write_schedules([create("a")], "u", connection=42)
    assert store.schedule_rows() == ([], 0)


# -- Django's connection, inside transaction.atomic() ---------------------------

_DJANGO = """
import json, sys
import django
from django.conf import settings
settings.configure(DATABASES={"default": %(database)r})
django.setup()
from django.db import connection, transaction
from sqlalchemy.engine import make_url
from celery_singlebeat.store.base import ScheduleWrite
from celery_singlebeat.store.sql import SqlStore

fields = %(fields)r
store = SqlStore(make_url(%(url)r), table_prefix=%(prefix)r)
store.prepare(create=True)
orders = %(prefix)r + "django_orders"
with connection.cursor() as cursor:
    cursor.execute(f"CREATE TABLE {orders} (id INTEGER PRIMARY KEY)")

class Rollback(Exception):
    pass

try:
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute(f"INSERT INTO {orders} (id) VALUES (1)")
        store.write_schedules([ScheduleWrite("create", "gone", fields)], "dj", "", connection)
        raise Rollback()
except Rollback:
    pass
with transaction.atomic():
    with connection.cursor() as cursor:
        cursor.execute(f"INSERT INTO {orders} (id) VALUES (2)")
    [row] = store.write_schedules(
        [ScheduleWrite("create", "committed", fields)], "dj", "why", connection
    )
    inside = store.schedule_row("committed")  # another connection: not committed yet
with connection.cursor() as cursor:
    cursor.execute(f"SELECT id FROM {orders}")
    ids = [r[0] for r in cursor.fetchall()]
    cursor.execute(f"DROP TABLE {orders}")
print(json.dumps({
    "ids": ids,
    "names": [r.name for r in store.schedule_rows()[0]],
    "inside": inside is not None,
    "row": row.name,
    "log": [(r.name, r.by, r.why) for r in store.schedule_log()],
}))
store.close()
"""


def _django_database(backend: Backend) -> dict[str, str]:
    assert backend.url is not None
    if backend.kind == "sqlite":
        return {"ENGINE": "django.db.backends.sqlite3", "NAME": backend.url[len("sqlite:///") :]}
    from sqlalchemy.engine import make_url

    url = make_url(backend.url)
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": url.database or "",
        "USER": url.username or "",
        "PASSWORD": str(url.password or ""),
        "HOST": url.host or "",
        "PORT": str(url.port or ""),
    }


@pytest.mark.parametrize("backend", ["sqlite", "postgres"], indirect=True)
def test_a_write_inside_django_s_atomic_commits_and_rolls_back_with_its_rows(
    backend: Backend,
) -> None:
    try:
        import django  # noqa: F401
    except ImportError:
        if IN_CI:
            pytest.fail("Django is not installed; CI=true: a missing dev dependency is a failure")
        pytest.skip("Django is not installed")
    code = _DJANGO % {
        "database": _django_database(backend),
        "fields": fields(),
        "url": backend.url,
        "prefix": backend.prefix,
    }
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    answer = json.loads(result.stdout.strip().splitlines()[-1])
    assert answer == {
        "ids": [2],
        "names": ["committed"],
        "inside": False,
        "row": "committed",
        "log": [["committed", "dj", "why"]],
    }


@pytest.mark.parametrize("backend", ["sqlite", "postgres", "mysql"], indirect=True)
def test_a_concurrent_write_waits_for_the_open_one_and_takes_the_next_revision(
    backend: Backend,
) -> None:
    """Writers serialize on the counter row: the second write's statement
    waits for the first transaction's end, then commits the next revision."""
    # (the memory store has no transactions to hold open: SQL backends only)
    store = backend.ready()
    other = backend.open()
    engine = direct_engine(backend.url)
    done: list[ScheduleRow] = []
    try:
        with engine.connect() as conn:
            tx = conn.begin()
            [first] = store.write_schedules([create("first")], "u", "", conn)
            thread = threading.Thread(
                target=lambda: done.extend(other.write_schedules([create("second")], "u"))
            )
            thread.start()
            time.sleep(0.3)
            assert done == []  # waiting for the counter's lock
            tx.commit()
        thread.join(20)
    finally:
        engine.dispose()
    assert [r.revision for r in done] == [first.revision + 1]
    assert [r.name for r in store.schedule_feed(0).rows] == ["first", "second"]


# -- names a live replica's catalog lists ----------------------------------------------


def test_catalogued_names_are_those_of_live_replicas_catalogs_in_one_statement(
    backend: Backend,
) -> None:
    """A stored entry may not take a name a live replica's beat_schedule has,
    whatever its release: ``catalogued`` says which of the names asked a live
    replica's catalog lists, and which replicas; a stopped replica's names
    are free again."""
    from test_fleet_contract import catalog, info

    store = backend.ready()
    for rid, names in (("r1", ("a", "b")), ("r2", ("a", "x")), ("old", ("c",))):
        store.publish_catalog(rid, catalog(*names))
        store.heartbeat(info(rid, store.ping()))
    store.stopped("old")
    assert store.catalogued([]) == {}
    before = round_trips(store)
    assert store.catalogued(["a", "b", "c", "z", "a"]) == {"a": ["r1", "r2"], "b": ["r1"]}
    assert round_trips(store) - before == 1
    # a name stored already is not a catalogued one
    store.write_schedules([create("stored-only")], by="t")
    assert store.catalogued(["stored-only", "x"]) == {"x": ["r2"]}


# -- the claim's check of a stored entry's revision -----------------------------


def test_the_claim_refuses_a_slot_proposed_under_a_definition_replaced_over_a_second_before(
    backend: Backend,
) -> None:
    """SlotStore.claim's ``revisions``: a stored entry's slot proposed under
    revision R is not won once the row has another revision written more than
    STALE_DEFINITION_US before the later of now and the slot's instant; an
    early claim (a slot up to EARLY_TOLERANCE_US ahead) is judged at its
    instant, and a delete is a replacement too."""
    from celery_singlebeat.store.values import EARLY_TOLERANCE_US, STALE_DEFINITION_US

    store = backend.ready()
    store.register(["s"])
    (first,) = store.write_schedules([create("s")], by="t")
    r1 = Written(first.revision, first.updated_us)
    now = store.ping()
    assert [c.slot_us for c in store.claim("a", [SlotKey("s", now)], LONG_LEASE, {"s": r1})]
    (second,) = store.write_schedules(
        [ScheduleWrite("update", "s", {"task": "tasks.other"})], by="t"
    )
    r2, replaced = Written(second.revision, second.updated_us), second.updated_us
    assert r2.revision > r1.revision
    # within the second after the edit, the old definition's slots still go out
    soon = store.ping() + 1000
    assert soon < replaced + STALE_DEFINITION_US
    assert store.claim("b", [SlotKey("s", soon)], LONG_LEASE, {"s": r1})
    # a slot early-claimed before that second is over, whose instant is after
    # it, is judged at its instant: refused under the old revision...
    wait_db_past(store, replaced + STALE_DEFINITION_US - EARLY_TOLERANCE_US + 100_000)
    late = replaced + STALE_DEFINITION_US + 50_000
    assert store.claim("c", [SlotKey("s", late)], LONG_LEASE, {"s": r1}) == []
    # ...and won under the new one (not refused for being early)
    assert [c.slot_us for c in store.claim("c", [SlotKey("s", late)], LONG_LEASE, {"s": r2})] == [
        late
    ]
    # past the second, an old revision is refused at now too; a delete replaces
    wait_db_past(store, replaced + STALE_DEFINITION_US)
    now = store.ping()
    assert store.claim("d", [SlotKey("s", now)], LONG_LEASE, {"s": r1}) == []
    (gone,) = store.write_schedules([ScheduleWrite("delete", "s", {})], by="t")
    wait_db_past(store, gone.updated_us + STALE_DEFINITION_US)
    later = store.ping()
    assert store.claim("d", [SlotKey("s", later)], LONG_LEASE, {"s": r2}) == []
    # a claim without revisions (a beat_schedule entry's) is not judged so
    assert store.claim("d", [SlotKey("s", later + 1)], LONG_LEASE)


def test_the_claim_tells_two_writes_that_took_one_revision_number_apart(
    backend: Backend,
) -> None:
    """A standby promoted without the last write counts revisions on from
    below it: the next write takes the lost one's number. A replica that read
    the lost write proposes under that number with the lost write's instant;
    the claim compares both, so the slot is refused once the row's write (the
    same number, another instant) is more than STALE_DEFINITION_US old, as for
    any replaced definition. (On numbers alone it was won: issue 30.)"""
    from celery_singlebeat.store.values import STALE_DEFINITION_US

    store = backend.ready()
    store.register(["s"])
    (row,) = store.write_schedules([create("s")], by="t")
    # the lost write: the same number, stamped a moment before the row's
    lost = Written(row.revision, row.updated_us - 250_000)
    ours = Written(row.revision, row.updated_us)
    soon = store.ping()
    # within the second after the row's write, the lost one's slots still go out
    if soon < row.updated_us + STALE_DEFINITION_US:
        assert store.claim("a", [SlotKey("s", soon)], LONG_LEASE, {"s": lost})
    wait_db_past(store, row.updated_us + STALE_DEFINITION_US)
    now = store.ping()
    assert store.claim("b", [SlotKey("s", now)], LONG_LEASE, {"s": lost}) == []
    # the write the row holds is not refused
    assert [c.slot_us for c in store.claim("b", [SlotKey("s", now)], LONG_LEASE, {"s": ours})] == [
        now
    ]


def test_the_claim_counts_a_replacement_from_the_first_write_after_the_claimers(
    backend: Backend,
) -> None:
    """A replica paused through two edits wakes with the first definition
    while the row holds a write a few ms old: the first definition was
    replaced by the write after it, over a second before, so its slot is
    refused (the chaos run, issue 30: on the row's instant alone it was won
    and sent 13 s after the replacement). Under the row's own write it is won."""
    from celery_singlebeat.store.values import STALE_DEFINITION_US

    store = backend.ready()
    store.register(["s"])
    (first,) = store.write_schedules([create("s")], by="t")
    (second,) = store.write_schedules(
        [ScheduleWrite("update", "s", {"task": "tasks.other"})], by="t"
    )
    wait_db_past(store, second.updated_us + STALE_DEFINITION_US)
    (third,) = store.write_schedules(
        [ScheduleWrite("update", "s", {"task": "tasks.third"})], by="t"
    )
    now = store.ping()
    assert now < third.updated_us + STALE_DEFINITION_US
    old = Written(first.revision, first.updated_us)
    assert store.claim("a", [SlotKey("s", now)], LONG_LEASE, {"s": old}) == []
    # the second definition was replaced by the third only now: still in its second
    assert store.claim(
        "b", [SlotKey("s", now)], LONG_LEASE, {"s": Written(second.revision, second.updated_us)}
    )


def test_a_takeover_refuses_a_stored_slot_to_a_replica_that_has_not_read_a_write_a_second_old(
    backend: Backend,
) -> None:
    """SlotStore.take_over's ``seen``: an abandoned claim of a stored entry is
    not taken by a replica whose stored schedules are read up to a revision
    below a write made more than STALE_DEFINITION_US before the slot (it
    would send the slot under the definition that write replaced: the chaos
    run's seed 12, a replica that slept 18 s through an edit); within that
    second it is, and so is it by a replica that read the write, or by one
    that follows no stored schedules (``seen`` None)."""
    from celery_singlebeat.store.values import STALE_DEFINITION_US

    store = backend.ready()
    store.register(["s"])
    (first,) = store.write_schedules([create("s")], by="t")
    now = store.ping()
    (claim,) = store.claim(
        "a", [SlotKey("s", now)], 1, {"s": Written(first.revision, first.updated_us)}
    )
    (second,) = store.write_schedules(
        [ScheduleWrite("update", "s", {"task": "tasks.other"})], by="t"
    )
    wait_db_past(store, now + 2)  # the claim's 1 µs lease has run out
    if store.ping() < second.updated_us + STALE_DEFINITION_US:
        # the slot is older than the write: a slot of the first definition
        (taken,) = store.take_over("b", 1, 10, seen=first.revision)
        assert taken.fence == claim.fence + 1
        wait_db_past(store, store.ping() + 2)
    later = store.ping() + 1
    (again,) = store.claim(
        "a", [SlotKey("s", later)], 1, {"s": Written(second.revision, second.updated_us)}
    )
    wait_db_past(store, second.updated_us + STALE_DEFINITION_US + 1000)
    # the slot at `later` is due after the write; the write is over a second
    # older than now: refused to a replica that read only the first revision
    stuck = [
        c for c in store.take_over("b", LONG_LEASE, 10, seen=first.revision) if c.slot_us == later
    ]
    assert stuck == []
    # read up to the write: taken; the row is then that replica's
    (taken,) = [
        c for c in store.take_over("c", LONG_LEASE, 10, seen=second.revision) if c.slot_us == later
    ]
    assert taken.fence == again.fence + 1
    # a replica that follows no stored schedules is not judged so (its
    # sending holds a stored entry's slot back, as any entry it lacks)
    store.release("c", [taken])
    (other,) = [c for c in store.take_over("d", LONG_LEASE, 10) if c.slot_us == later]
    assert other.fence == taken.fence + 1
