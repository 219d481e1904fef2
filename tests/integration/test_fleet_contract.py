# ruff: noqa: F811 - the shared `backend` fixture is imported, then named as a parameter
"""The fleet side of the storage contract (``FleetStore``, ``store/fleet_store.py``):
heartbeats, catalogs, pauses, run-now rows, and ``listen()``.

Runs on every backend of ``test_store_contract`` (memory, SQLite, PostgreSQL,
MariaDB). Operator writes are made the way the CLI makes them: through the
memory store's helpers, or straight SQL on the tables for the SQL stores.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import pytest
from conftest import behind_pooler, direct_engine, drop_tables
from sqlalchemy import select, text
from sqlalchemy.engine import make_url
from test_store_contract import LONG_LEASE, Backend, backend, wait_db_past  # noqa: F401

from celery_singlebeat.store.base import (
    CONTROLS_KEY,
    PAUSE_ALL,
    CatalogEntry,
    ControlListener,
    ReplicaInfo,
    SlotKey,
    Store,
    controls_channel,
)
from celery_singlebeat.store.sql import SqlStore
from celery_singlebeat.store.sql.operator import Operator as SqlOperator
from celery_singlebeat.store.sql.schema import Tables
from celery_singlebeat.testing import MemoryStore
from celery_singlebeat.timeline.clock import US


class Operator:
    """Writes what the CLI writes: pauses, resumes, run-now requests."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self.memory: MemoryStore | None = backend.memory
        self.tables = Tables(backend.prefix)

    def _write(self, *statements: object) -> None:
        assert self.backend.url is not None
        engine = direct_engine(self.backend.url)
        try:
            with engine.begin() as conn:
                for statement in statements:
                    conn.execute(statement)  # type: ignore[call-overload]
                meta = self.tables.meta
                conn.execute(
                    meta.update()
                    .where(meta.c.key == CONTROLS_KEY)
                    .values(value_us=meta.c.value_us + 1)
                )
        finally:
            engine.dispose()

    def pause(self, entry: str, until_us: int | None = None) -> None:
        if self.memory is not None:
            self.memory.pause(entry, until_us)
            return
        self._write(
            self.tables.pauses.insert().values(
                entry=entry, until_us=until_us, paused_by="op", reason="test", at_us=0
            )
        )

    def resume(self, entry: str) -> None:
        if self.memory is not None:
            self.memory.resume(entry)
            return
        self._write(self.tables.pauses.delete().where(self.tables.pauses.c.entry == entry))

    def request_run(self, store: Store, entry: str) -> SlotKey:
        if self.memory is not None:
            return self.memory.request_run(entry)
        slot_us = store.ping()
        self._write(
            self.tables.slots.insert().values(
                entry=entry,
                slot_us=slot_us,
                state=0,
                owner="",
                fence=0,
                lease_until_us=0,
                claimed_us=slot_us,
            )
        )
        return SlotKey(entry, slot_us)


@pytest.fixture
def operator(backend: Backend) -> Iterator[Operator]:
    yield Operator(backend)


def info(replica: str, now_us: int, first: int = 1) -> ReplicaInfo:
    return ReplicaInfo(replica, "host", 42, "1.2.3", now_us, now_us, -3, 5, first, 5 * US)


def catalog(*names: str) -> list[CatalogEntry]:
    return [
        CatalogEntry(n, "tasks.t", "every 10s", '{"kind":"interval","every_us":10}') for n in names
    ]


def test_heartbeat_records_the_replica_and_reads_the_control_version(
    backend: Backend, operator: Operator
) -> None:
    store = backend.ready()
    now = store.ping()
    store.register(["a"], "r1")
    store.claim("r1", [SlotKey("a", now)], LONG_LEASE)
    live = store.heartbeat(info("r1", now))
    assert live == ["r1"]
    before = store.controls_version
    assert before is not None
    assert store.open_claims == 1  # type: ignore[attr-defined]
    operator.pause("a")
    store.heartbeat(info("r1", now))
    assert store.controls_version == before + 1
    # the claim reads it too, where the store can fold it in
    operator.resume("a")
    store.claim("r1", [SlotKey("a", store.ping())], LONG_LEASE)
    if backend.kind in ("memory", "postgres", "mysql", "sqlite"):
        assert store.controls_version == before + 2


def test_paused_slots_are_neither_claimed_nor_taken_over(
    backend: Backend, operator: Operator
) -> None:
    store = backend.ready()
    store.register(["a", "b"], "r1")
    store.publish_catalog("r1", catalog("a", "b"))
    now = store.ping()
    # an abandoned claim of "a" from before the pause
    store.claim("r0", [SlotKey("a", now - 10)], 1)
    wait_db_past(store, store.ping() + 2)
    operator.pause("a")
    assert [p.entry for p in store.pauses()] == ["a"]
    won = store.claim("r1", [SlotKey("a", now), SlotKey("b", now)], LONG_LEASE)
    assert [c.entry for c in won] == ["b"]
    assert store.take_over("r1", LONG_LEASE, 10) == []
    operator.resume("a")
    assert store.pauses() == []
    later = store.ping()
    assert [c.entry for c in store.claim("r1", [SlotKey("a", later)], LONG_LEASE)] == ["a"]
    assert [(c.entry, c.slot_us) for c in store.take_over("r1", LONG_LEASE, 10)] == [
        ("a", now - 10)
    ]


def test_pause_of_every_entry_and_a_pause_that_ended(backend: Backend, operator: Operator) -> None:
    store = backend.ready()
    store.register(["a", "b"], "r1")
    now = store.ping()
    operator.pause(PAUSE_ALL)
    assert store.claim("r1", [SlotKey("a", now), SlotKey("b", now)], LONG_LEASE) == []
    operator.resume(PAUSE_ALL)
    operator.pause("a", until_us=store.ping() + 1)
    wait_db_past(store, store.ping() + 2)
    assert store.pauses() == []
    assert len(store.claim("r1", [SlotKey("a", now), SlotKey("b", now)], LONG_LEASE)) == 2


def test_a_run_now_row_goes_only_to_a_replica_whose_catalog_has_the_entry(
    backend: Backend, operator: Operator
) -> None:
    store = backend.ready()
    store.register(["a"], "old")
    store.publish_catalog("old", catalog("b"))
    store.publish_catalog("new", catalog("a", "b"))
    key = operator.request_run(store, "a")
    assert store.take_over("old", LONG_LEASE, 10) == []
    taken = store.take_over("new", LONG_LEASE, 10)
    assert [(c.entry, c.slot_us, c.fence) for c in taken] == [(key.entry, key.slot_us, 1)]
    assert not taken[0].taken_over
    assert store.confirm("new", taken) == taken


def test_publish_catalog_replaces_the_replica_s_entries(backend: Backend) -> None:
    store = backend.ready()
    store.heartbeat(info("r1", store.ping()))
    store.publish_catalog("r1", catalog("a", "b"))
    store.publish_catalog("r1", catalog("b", "c"))
    if isinstance(store, MemoryStore):
        assert sorted(store.catalog_of("r1")) == ["b", "c"]
        return
    assert isinstance(store, SqlStore)
    t = store.tables
    with store.engine.connect() as conn:
        named = conn.execute(select(t.replicas.c.catalog).where(t.replicas.c.id == "r1")).scalar()
        rows = conn.execute(select(t.catalog.c.entry).where(t.catalog.c.catalog == named)).all()
    assert sorted(r.entry for r in rows) == ["b", "c"]


def test_publishing_a_catalog_leaves_the_database_clock_right(backend: Backend) -> None:
    """The catalog's row count is not the database's time: read as the clock
    (column 0 of a fetch), a count of 2 put "now" at 2 us after the epoch until
    the next statement that reads the clock, which on PostgreSQL (LISTEN: an
    idle tick sends none) came with the heartbeat: a replica whose entries
    changed claimed nothing for up to 5 s, then sent those slots in a burst."""
    store = backend.ready()
    store.heartbeat(info("r1", store.ping()))
    store.publish_catalog("r1", catalog("a", "b"))  # rows written: count 0 first
    store.publish_catalog("r2", catalog("a", "b"))  # the same catalog: count 2
    store.publish_catalog("r3", catalog("c"))
    assert abs(store.clock.now_us() - time.time() * US) < 5 * US


def test_replicas_with_the_same_entries_share_one_catalog(backend: Backend) -> None:
    """Stored by content: the second replica of a release writes no rows."""
    store = backend.ready()
    entries = catalog("a", "b", "c")
    store.publish_catalog("r1", entries)
    for rid in ("r1", "r2", "r3"):
        store.heartbeat(info(rid, store.ping()))
    store.publish_catalog("r2", list(reversed(entries)))  # the order does not matter
    store.publish_catalog("r3", entries)
    if isinstance(store, MemoryStore):  # each replica's catalog as given
        assert all(sorted(store.catalog_of(r)) == ["a", "b", "c"] for r in ("r1", "r2", "r3"))
        return
    assert isinstance(store, SqlStore)
    t = store.tables
    with store.engine.connect() as conn:
        named = {r.catalog for r in conn.execute(select(t.replicas.c.catalog)).all()}
        rows = conn.execute(select(t.catalog.c.entry, t.catalog.c.catalog)).all()
        headers = conn.execute(select(t.catalogs.c.id, t.catalogs.c.entries)).all()
    assert len(named) == 1 and None not in named
    assert sorted(r.entry for r in rows) == ["a", "b", "c"]
    assert [tuple(h) for h in headers] == [(named.pop(), 3)]


def test_stopped_marks_the_row(backend: Backend) -> None:
    store = backend.ready()
    now = store.ping()
    store.heartbeat(info("r1", now))
    store.stopped("r1")
    if isinstance(store, MemoryStore):
        assert store.replica_rows()["r1"]["stopped_us"] is not None
        return
    assert isinstance(store, SqlStore)
    with store.engine.connect() as conn:
        row = conn.execute(store.tables.replicas.select()).one()
    assert row.stopped_us is not None and row.stopped_us >= now
    assert (row.host, row.pid, row.version, row.tracked) == ("host", 42, "1.2.3", 5)
    store.heartbeat(info("r1", now))
    with store.engine.connect() as conn:
        assert conn.execute(store.tables.replicas.select()).one().stopped_us is None


# -- listen(): hearing of a control change without a round trip --------------------


def wait_for(condition: Callable[[], bool], what: str, timeout: float = 5.0) -> None:
    """Poll ``condition`` until it holds; fail naming ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not within {timeout}s")
        time.sleep(0.02)


def direct_session(backend: Backend) -> None:
    """The backend, when its connections reach PostgreSQL itself: LISTEN
    needs a session of its own, which a pooler in transaction mode does not
    give (``make test-pgbouncer``). There the channel is deaf by design, and
    ``test_behind_pgbouncer_in_transaction_mode_...`` below holds that case
    (``make test`` runs it against a PgBouncer of its own): skipped there."""
    assert backend.url is not None
    if behind_pooler(backend.url):
        pytest.skip("LISTEN through a pooler in transaction mode hears nothing (by design)")


@pytest.mark.parametrize("backend", ["memory", "sqlite", "mysql"], indirect=True)
def test_listen_is_none_where_the_store_has_no_notification_channel(backend: Backend) -> None:
    """MySQL/MariaDB, SQLite and the memory store: no channel, so a replica
    learns of a change from controls_version at its next heartbeat or claim."""
    store = backend.ready()
    assert store.listen() is None


@pytest.mark.parametrize("backend", ["postgres"], indirect=True)
def test_a_listener_hears_each_control_change_at_its_commit(backend: Backend) -> None:
    direct_session(backend)
    store = backend.ready()
    listener = store.listen()
    assert isinstance(listener, ControlListener)
    try:
        # another replica's view writes the controls, as the CLI does
        other = backend.open()
        assert isinstance(other, SqlStore)
        operator = SqlOperator(other)
        assert listener.poll() is False  # idle: nothing was committed since listen()
        operator.pause([PAUSE_ALL], None, by="op")
        wait_for(listener.poll, "the pause heard")
        assert listener.poll() is False  # heard once; idle again
        operator.resume(None)
        wait_for(listener.poll, "the resume heard")
        # the version the listener announced is the one the heartbeat reads
        version = store.controls_version
        store.heartbeat(info("r1", store.ping()))
        assert store.controls_version is not None and store.controls_version != version
    finally:
        listener.close()
    listener.close()  # idempotent


@pytest.mark.parametrize("backend", ["postgres"], indirect=True)
def test_a_listener_raises_once_its_connection_is_gone(backend: Backend) -> None:
    """The caller closes it and listens again later (the heartbeat reads what
    changed meanwhile); each listen() opens a listener of its own."""
    direct_session(backend)
    store = backend.ready()
    first, second = store.listen(), store.listen()
    assert isinstance(first, ControlListener) and isinstance(second, ControlListener)
    try:
        assert backend.url is not None
        engine = direct_engine(backend.url)
        try:
            with engine.connect() as conn:
                # the listeners' sessions: their last statement was the LISTEN
                ended = conn.execute(
                    text(
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                        "WHERE query = :listen"
                    ),
                    {"listen": f'LISTEN "{controls_channel(backend.prefix)}"'},
                ).all()
        finally:
            engine.dispose()
        assert len(ended) == 2

        def raised() -> bool:
            try:
                first.poll()
            except Exception:
                return True
            return False

        wait_for(raised, "the lost connection reported")
    finally:
        first.close()
        second.close()
    first.close()  # quiet on a connection already lost


@pytest.mark.parametrize("backend", ["postgres"], indirect=True)
def test_a_listener_hears_its_own_probe_which_is_no_control_change(backend: Backend) -> None:
    """The probe proves the channel: it comes back to the listener that sent
    it (``probe_heard``), is not reported as a change by any listener, and
    does not count as heard for another listener's probe."""
    direct_session(backend)
    store = backend.ready()
    first, second = store.listen(), store.listen()
    assert isinstance(first, ControlListener) and isinstance(second, ControlListener)
    try:
        second.probe()
        first.probe()
        assert not first.probe_heard
        changes = []

        def back() -> bool:
            changes.extend([first.poll(), second.poll()])
            return first.probe_heard and second.probe_heard

        wait_for(back, "both probes back")
        assert not any(changes), "a probe was reported as a control change"
        first.probe()  # a new token: the one heard before no longer counts
        assert not first.probe_heard
        wait_for(lambda: (first.poll(), first.probe_heard)[1], "the second probe back")
    finally:
        first.close()
        second.close()


def test_behind_pgbouncer_in_transaction_mode_a_listener_hears_nothing_but_its_probe_tells(
    pgbouncer_url: str, table_prefix: str
) -> None:
    """Why the probe exists: through a real PgBouncer in transaction pooling
    mode the LISTEN succeeds, and neither a control change nor the probe ever
    reaches the listener, without an error."""
    store = SqlStore(make_url(pgbouncer_url), table_prefix=table_prefix)
    try:
        store.prepare(create=True)
        listener = store.listen()
        assert isinstance(listener, ControlListener)
        try:
            listener.probe()
            SqlOperator(store).pause([PAUSE_ALL], None, by="op")
            deadline = time.monotonic() + 3.0
            while time.monotonic() < deadline:
                assert listener.poll() is False
                assert not listener.probe_heard
                time.sleep(0.05)
        finally:
            listener.close()
    finally:
        store.close()
        drop_tables(pgbouncer_url, table_prefix)
