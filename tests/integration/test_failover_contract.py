"""The storage contract of a failover: ``SlotStore.reassert``,
``SingletonStore.reassert_runs``, and the connection's ``interruptions`` and
``stop_at_reconnect`` (``store/connection.py``).

A promoted standby that lagged lacks the last commits: a slot row a replica
claimed and confirmed is gone, or its confirm is. The test takes those writes
away by hand (on the memory store through its rows, on the SQL stores with a
direct statement) and checks what writing them again does on every backend.
"""

from __future__ import annotations

import pytest
from conftest import direct_engine, pg_backend_of, shut_socket
from sqlalchemy.engine import make_url
from test_store_contract import LONG_LEASE, Backend, backend  # noqa: F401

from celery_singlebeat.exceptions import ConnectionReplaced, StoreUnavailable
from celery_singlebeat.store.base import Claim, Run, RunRecord, RunStatus, SlotKey, Store
from celery_singlebeat.store.sql import SqlStore
from celery_singlebeat.store.sql.schema import Tables
from celery_singlebeat.testing import MemoryStore


def _lose(db: Backend, key: SlotKey, *, confirm_only: bool) -> None:
    """What the failover lost of ``key``'s row: the whole row, or its confirm."""
    if db.memory is not None:
        rows = db.memory.state.slots
        if confirm_only:
            rows[key].state, rows[key].sent_us = 0, None
        else:
            del rows[key]
        return
    assert db.url is not None
    slots = Tables(db.prefix).slots
    where = (slots.c.entry == key.entry) & (slots.c.slot_us == key.slot_us)
    engine = direct_engine(db.url)
    try:
        with engine.begin() as conn:
            if confirm_only:
                conn.execute(slots.update().where(where).values(state=0, sent_us=None))
            else:
                conn.execute(slots.delete().where(where))
    finally:
        engine.dispose()


def _row(db: Backend, key: SlotKey) -> tuple[int, str, int] | None:
    store = db.open()
    for row in store.slot_rows() if isinstance(store, MemoryStore) else _sql_rows(db):
        if (row[0], row[1]) == (key.entry, key.slot_us):
            return row[2], row[3], row[4]
    return None


def _sql_rows(db: Backend) -> list[tuple[str, int, int, str, int]]:
    assert db.url is not None
    slots = Tables(db.prefix).slots
    engine = direct_engine(db.url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                slots.select().with_only_columns(
                    slots.c.entry, slots.c.slot_us, slots.c.state, slots.c.owner, slots.c.fence
                )
            ).all()
        return [(str(r[0]), int(r[1]), int(r[2]), str(r[3]), int(r[4])) for r in rows]
    finally:
        engine.dispose()


def test_reassert_writes_back_what_was_lost_and_nothing_else(backend: Backend) -> None:  # noqa: F811
    store = backend.ready()
    store.register(["a", "b", "c", "d"])
    keys = {name: SlotKey(name, 10) for name in "abcd"}
    mine = store.claim("r1", [keys["a"], keys["b"], keys["c"]], LONG_LEASE)
    assert store.confirm("r1", mine) == mine
    [theirs] = store.claim("r2", [keys["d"]], LONG_LEASE)

    _lose(backend, keys["a"], confirm_only=False)  # claim and confirm gone
    _lose(backend, keys["b"], confirm_only=True)  # confirm gone
    # r1 writes again what it sent, d included as if it had sent it at fence 1:
    # d is r2's claim, which stays r2's
    sent = [*mine, Claim("d", 10, 1)]
    again = store.reassert("r1", sent)
    assert again == [Claim("a", 10, 1), Claim("b", 10, 1)]
    assert _row(backend, keys["a"]) == (1, "r1", 1)
    assert _row(backend, keys["b"]) == (1, "r1", 1)
    assert _row(backend, keys["c"]) == (1, "r1", 1)
    assert _row(backend, keys["d"]) == (0, "r2", theirs.fence)
    # idempotent: nothing is lost any more
    assert store.reassert("r1", sent) == []
    # a slot written again is one another replica can no longer win
    assert backend.open().claim("r2", [keys["a"]], LONG_LEASE) == []
    assert backend.open().take_over("r2", LONG_LEASE, 10) == []


def test_reassert_leaves_a_slot_another_replica_won_again(backend: Backend) -> None:  # noqa: F811
    """What is left: another replica claimed the lost slot before the write came."""
    store = backend.ready()
    store.register(["a"])
    key = SlotKey("a", 10)
    mine = store.claim("r1", [key], LONG_LEASE)
    store.confirm("r1", mine)
    _lose(backend, key, confirm_only=False)
    [won] = backend.open().claim("r2", [key], LONG_LEASE)
    assert store.reassert("r1", mine) == []
    assert _row(backend, key) == (0, "r2", won.fence)


def test_a_refused_connection_counts_as_an_interruption(backend: Backend) -> None:  # noqa: F811
    store = backend.ready()
    before = store.interruptions
    store.ping()
    assert store.interruptions == before  # a working round trip is none
    if isinstance(store, MemoryStore):
        with store.outage(), pytest.raises(StoreUnavailable):
            store.ping()
        assert store.interruptions == before + 1
        return
    assert isinstance(store, SqlStore) and backend.url is not None
    url = make_url(backend.url)
    # the same server at a port nobody listens on, or SQLite in no directory
    dead = url.set(port=1) if url.port else url.set(database="/nonexistent-dir/db.sqlite")
    down = SqlStore(dead, table_prefix=backend.prefix)
    try:
        with pytest.raises(StoreUnavailable):
            down.ping()
        assert down.interruptions >= 1
    finally:
        down.close()


def _break_connection(db: Backend, store: Store) -> None:
    """Break the store's pooled connection while it is idle, as a server
    restart or a failover does; the store finds it at its next round trip."""
    if isinstance(store, MemoryStore):
        store.lose_writes(store.ping())  # loses nothing, breaks the connection
        return
    assert isinstance(store, SqlStore) and db.url is not None
    if store.backend == "sqlite":
        # no server to end the session: close the pooled sqlite3 connection
        # under the pool, which finds it closed ("Cannot operate on a closed
        # database", a disconnect to SQLAlchemy) at the next statement
        with store.engine.connect() as conn:
            raw = conn.connection.dbapi_connection
        assert raw is not None
        raw.close()
        return
    with store.engine.connect() as conn:
        raw = conn.connection.dbapi_connection
        if store.backend == "postgresql":
            pid = pg_backend_of(raw)
        else:
            pid = conn.exec_driver_sql("SELECT CONNECTION_ID()").scalar()
    if pid is None:
        # behind a pooler (make test-pgbouncer) the store's connection ends at
        # the pooler, and no server process is its own: break it on our side
        # (back in the pool, idle), as a pooler that restarts or moves does
        shut_socket(raw)
        return
    kill = (
        f"SELECT pg_terminate_backend({int(pid)})"
        if store.backend == "postgresql"
        else f"KILL {int(pid)}"
    )
    killer = direct_engine(db.url)
    try:
        with killer.connect() as conn:
            conn.exec_driver_sql(kill)
    finally:
        killer.dispose()


def test_a_broken_connection_stops_the_statement_when_asked(backend: Backend) -> None:  # noqa: F811
    """The scheduler's store does not send a statement on the connection that
    replaced a broken one: it may be a promoted standby's, and the claim it
    carried could win slots another replica sent and is about to write back.
    (The memory store's connection breaks by ``lose_writes``.)"""
    store = backend.ready()
    store.stop_at_reconnect = True
    assert store.stop_at_reconnect is True
    store.register(["a"])
    before = store.interruptions
    _break_connection(backend, store)
    with pytest.raises(ConnectionReplaced):
        store.claim("r1", [SlotKey("a", 10)], LONG_LEASE)
    assert store.interruptions > before  # counted by the time it raised
    assert _row(backend, SlotKey("a", 10)) is None  # the claim was not sent
    # the next call runs on the new connection
    assert [c.entry for c in store.claim("r1", [SlotKey("a", 10)], LONG_LEASE)] == ["a"]
    # and a break counts once: the call after it raises nothing
    assert store.ping() > 0


def test_a_broken_connection_is_replaced_and_the_statement_sent_by_default(
    backend: Backend,  # noqa: F811
) -> None:
    """``stop_at_reconnect`` is False unless a caller sets it: the statement
    goes on the new connection (each decides alone), and the break is counted."""
    store = backend.ready()
    assert store.stop_at_reconnect is False
    store.register(["a"])
    before = store.interruptions
    _break_connection(backend, store)
    assert [c.entry for c in store.claim("r1", [SlotKey("a", 10)], LONG_LEASE)] == ["a"]
    assert store.interruptions > before
    assert _row(backend, SlotKey("a", 10)) == (0, "r1", 1)


# -- SingletonTask's run rows ----------------------------------------------------


def _lose_run(db: Backend, key: SlotKey, *, finish_only: bool) -> None:
    """What the failover lost of a run row: the whole row, or its finish."""
    if db.memory is not None:
        rows = db.memory.state.runs
        if finish_only:
            rows[key].state, rows[key].finished_us, rows[key].outcome = 0, None, None
        else:
            del rows[key]
        return
    assert db.url is not None
    runs = Tables(db.prefix).runs
    where = (runs.c.entry == key.entry) & (runs.c.slot_us == key.slot_us)
    engine = direct_engine(db.url)
    try:
        with engine.begin() as conn:
            if finish_only:
                conn.execute(
                    runs.update().where(where).values(state=0, finished_us=None, outcome=None)
                )
            else:
                conn.execute(runs.delete().where(where))
    finally:
        engine.dispose()


def test_reassert_runs_writes_back_lost_run_rows_and_nothing_else(backend: Backend) -> None:  # noqa: F811
    store = backend.ready()
    ttl = 60_000_000
    runs = {name: Run(name, 10, f"run-{name}") for name in "abcd"}
    for run in runs.values():
        assert store.begin_run(run, "w1", f"task-{run.entry}", ttl).status is RunStatus.STARTED
    for name in "abc":
        assert store.finish_run(runs[name], "success")
    now = store.ping()
    records = [
        RunRecord(runs[n], "w1", f"task-{n}", now - 1_000, now + ttl, "success", now) for n in "abc"
    ] + [RunRecord(runs["d"], "w1", "task-d", now - 1_000, now + ttl)]
    _lose_run(backend, SlotKey("a", 10), finish_only=False)  # the whole row gone
    _lose_run(backend, SlotKey("b", 10), finish_only=True)  # its finish gone
    _lose_run(backend, SlotKey("d", 10), finish_only=False)  # a running row gone
    # c lost nothing, and a row another start took is not this record's
    other = RunRecord(
        Run("e", 10, "run-e-mine"), "w1", "task-e", now - 1_000, now + ttl, "success", now
    )
    assert (
        store.begin_run(Run("e", 10, "run-e-theirs"), "w2", "task-e2", ttl).status
        is RunStatus.STARTED
    )

    again = store.reassert_runs([*records, other])
    assert [r.run.entry for r in again] == ["a", "b", "d"]
    # a repeated delivery of each is dropped again, the running one as running
    for name, status in (("a", RunStatus.FINISHED), ("b", RunStatus.FINISHED),
                         ("c", RunStatus.FINISHED), ("d", RunStatus.RUNNING)):  # fmt: skip
        begin = backend.open().begin_run(Run(name, 10, "repeat"), "w2", "again", ttl)
        assert (begin.status, begin.owner) == (status, "w1"), name
        assert begin.outcome == (None if name == "d" else "success"), name
    # the other start's row stays its own, still running
    begin = backend.open().begin_run(Run("e", 10, "repeat"), "w3", "again", ttl)
    assert (begin.status, begin.owner) == (RunStatus.RUNNING, "w2")
    # idempotent; and the running row written again is still this run's
    assert store.reassert_runs(records) == []
    assert store.finish_run(runs["d"], "success")
