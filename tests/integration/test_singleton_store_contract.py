"""The storage contract of SingletonTask's keys and runs (``store/base.py``), on every backend.

Leases on singleton keys (``acquire_lease`` … ``lease_holds``), run rows per
slot (``begin_run`` … ``abandon_run``) and their prune, against the in-memory
store, SQLite, PostgreSQL and MariaDB, with the fixtures of the scheduler's
contract suite (``test_store_contract.py``). As there, time is the backend's
own clock: a test that needs a lease to run out uses a short one and polls
``ping()`` until the database's clock has passed its end.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
from conftest import direct_engine
from sqlalchemy import inspect
from test_store_contract import (  # noqa: F401
    LONG_LEASE,
    SHORT_LEASE,
    Backend,
    backend,
    round_trips,
    run_together,
    wait_db_past,
)

from celery_singlebeat.exceptions import SchemaError
from celery_singlebeat.store.base import (
    Busy,
    Lease,
    Run,
    RunBegin,
    RunRecord,
    RunStatus,
    SlotKey,
    Store,
)
from celery_singlebeat.store.sql.schema import SCHEMA_VERSION, Tables
from celery_singlebeat.timeline.clock import US

#: statements each operation costs: one decision, one round trip, except where
#: the database has no RETURNING (MySQL/MariaDB read the row back, SQLite reads
#: a busy key's holder) and the prune (its turn, then the runs, then the locks)
_ONE = dict.fromkeys(
    [
        "acquire (free)",
        "acquire (busy)",
        "renew",
        "holds",
        "release",
        "begin (start)",
        "begin (repeat)",
        "renew run",
        "finish run",
        "abandon run",
        "prune",
        "prune (not our turn)",
    ],
    1,
)
#: begin_slot/end_slot: one statement on PostgreSQL, else the two calls they stand for
_PAIRS = {"slot (start)": 2, "slot (busy key)": 2, "slot (repeat)": 1, "slot (end)": 2}
ROUND_TRIPS: dict[str, dict[str, int]] = {
    "memory": {**_ONE, **_PAIRS},
    "postgres": {**_ONE, "prune": 3, **dict.fromkeys(_PAIRS, 1)},
    "sqlite": {**_ONE, "acquire (busy)": 2, "prune": 3, **_PAIRS, "slot (busy key)": 3},
    "mysql": {
        **_ONE,
        "acquire (free)": 2,
        "acquire (busy)": 2,
        "renew": 2,
        "begin (start)": 2,
        "begin (repeat)": 2,
        "prune": 3,
        "slot (start)": 4,
        "slot (busy key)": 4,
        "slot (repeat)": 2,
        "slot (end)": 2,
    },
}


def run_rows(backend: Backend) -> dict[tuple[str, int], dict[str, Any]]:  # noqa: F811
    """Every run row of the backend's database, by ``(entry, slot_us)`` (not via a store)."""
    if backend.memory is not None:
        return {(k.entry, k.slot_us): row for k, row in backend.memory.run_rows().items()}
    assert backend.url is not None
    runs = Tables(backend.prefix).runs
    engine = direct_engine(backend.url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(runs.select()).mappings().all()
    finally:
        engine.dispose()
    return {(r["entry"], int(r["slot_us"])): dict(r) for r in rows}


def lock_rows(backend: Backend) -> dict[str, dict[str, Any]]:  # noqa: F811
    """Every lock row of the backend's database, by key name (not via a store)."""
    if backend.memory is not None:
        return {name: dict(vars(lock)) for name, lock in backend.memory.state.leases.items()}
    assert backend.url is not None
    locks = Tables(backend.prefix).locks
    engine = direct_engine(backend.url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(locks.select()).mappings().all()
    finally:
        engine.dispose()
    return {r["name"]: dict(r) for r in rows}


def stores(backend: Backend, n: int) -> list[Store]:  # noqa: F811
    """``n`` replicas' stores, each already connected (so threads race on the statement)."""
    opened = [backend.open() for _ in range(n)]
    for store in opened:
        store.ping()
    return opened


# -- acquire ----------------------------------------------------------------------


def test_acquire_on_a_free_key_leases_it_on_the_database_clock_and_then_it_is_busy(
    backend: Backend,  # noqa: F811
) -> None:
    store = backend.ready()
    before = store.ping()
    lease = store.acquire_lease("report", "w1", LONG_LEASE)
    after = store.ping()
    assert isinstance(lease, Lease)
    assert lease.key == "report"
    # a new row: token = the database's now, and the lease ends ttl later
    assert before <= lease.token <= after
    assert lease.expires_us == lease.token + LONG_LEASE
    assert store.lease_holds("report", lease.token)
    assert not store.lease_holds("report", lease.token + 1)
    assert not store.lease_holds("other-key", lease.token)

    other = backend.open()
    assert other.acquire_lease("report", "w2", LONG_LEASE) == Busy("w1", lease.expires_us)
    # the holder asking again does not renew: it is busy for it too
    assert store.acquire_lease("report", "w1", 2 * LONG_LEASE) == Busy("w1", lease.expires_us)
    assert other.lease_holds("report", lease.token)
    # another key is independent
    assert isinstance(other.acquire_lease("other-key", "w2", LONG_LEASE), Lease)


def race_for(key: str, replicas: list[Store], ttl_us: int) -> tuple[str, Lease, list[Busy]]:
    """Every replica acquires ``key`` at once: the one winner's owner and lease, the others."""

    def acquirer(i: int, store: Store) -> Callable[[], Lease | Busy]:
        return lambda: store.acquire_lease(key, f"worker-{i}", ttl_us)

    answers = run_together([acquirer(i, s) for i, s in enumerate(replicas)])
    assert len(answers) == len(replicas)
    won = [(i, a) for i, a in enumerate(answers) if isinstance(a, Lease)]
    assert len(won) == 1
    busy = [a for a in answers if isinstance(a, Busy)]
    assert len(busy) == len(replicas) - 1
    return f"worker-{won[0][0]}", won[0][1], busy


def test_concurrent_acquirers_of_a_free_key_one_wins_the_others_see_it(
    backend: Backend,  # noqa: F811
) -> None:
    backend.ready()
    replicas = stores(backend, 8)
    # a key with no row yet (a lease long enough to outlast the slowest racer)
    owner, lease, busy = race_for("nightly", replicas, US)
    assert replicas[0].lease_holds("nightly", lease.token)
    # the losers are told who holds the key (for their logs and errors)
    assert set(busy) == {Busy(owner, lease.expires_us)}

    # a key whose lease ran out: the old holder is not reported as holding it
    wait_db_past(replicas[0], lease.expires_us)
    owner, lease2, busy = race_for("nightly", replicas, LONG_LEASE)
    assert lease2.token > lease.token
    assert set(busy) == {Busy(owner, lease2.expires_us)}

    # a released key
    assert replicas[0].release_lease(lease2)
    owner, lease3, busy = race_for("nightly", replicas, LONG_LEASE)
    assert lease3.token > lease2.token
    assert set(busy) == {Busy(owner, lease3.expires_us)}


# -- expiry, release, renew ------------------------------------------------------


def test_an_expired_lease_passes_to_another_owner_and_the_old_token_is_dead(
    backend: Backend,  # noqa: F811
) -> None:
    store = backend.ready()
    old = store.acquire_lease("k", "w1", SHORT_LEASE)
    assert isinstance(old, Lease)
    other = backend.open()
    wait_db_past(store, old.expires_us)
    assert not store.lease_holds("k", old.token)  # lapsed: no longer holds

    new = other.acquire_lease("k", "w2", LONG_LEASE)
    assert isinstance(new, Lease)
    assert new.token > old.token
    assert store.renew_lease(old, LONG_LEASE) is None
    assert store.release_lease(old) is False
    assert not store.lease_holds("k", old.token)
    # the stale holder's release freed nothing
    assert other.lease_holds("k", new.token)
    assert store.acquire_lease("k", "w1", LONG_LEASE) == Busy("w2", new.expires_us)


def test_release_frees_the_key_at_once_and_only_once(backend: Backend) -> None:  # noqa: F811
    store = backend.ready()
    lease = store.acquire_lease("k", "w1", LONG_LEASE)
    assert isinstance(lease, Lease)
    assert store.release_lease(lease) is True
    assert not store.lease_holds("k", lease.token)
    assert store.release_lease(lease) is False
    assert store.renew_lease(lease, LONG_LEASE) is None

    other = backend.open()
    new = other.acquire_lease("k", "w2", LONG_LEASE)  # no waiting for the old expiry
    assert isinstance(new, Lease)
    assert new.token > lease.token
    assert store.release_lease(lease) is False  # the new holder keeps it
    assert store.renew_lease(lease, LONG_LEASE) is None
    assert other.lease_holds("k", new.token)
    assert other.release_lease(new) is True
    # the same owner may take a released key again, with a new token
    again = store.acquire_lease("k", "w1", LONG_LEASE)
    assert isinstance(again, Lease) and again.token > new.token


def test_renew_extends_the_lease_and_keeps_the_token(backend: Backend) -> None:  # noqa: F811
    store = backend.ready()
    lease = store.acquire_lease("k", "w1", LONG_LEASE)
    assert isinstance(lease, Lease)
    wait_db_past(store, lease.token)
    renewed = store.renew_lease(lease, 2 * LONG_LEASE)
    assert renewed is not None
    assert renewed.key == "k" and renewed.token == lease.token
    assert renewed.expires_us > lease.expires_us
    assert backend.open().acquire_lease("k", "w2", LONG_LEASE) == Busy("w1", renewed.expires_us)
    # renewing with the returned lease (or the original: same token) goes on working
    assert store.renew_lease(renewed, LONG_LEASE) is not None
    assert store.lease_holds("k", lease.token)


def test_a_lapsed_lease_nobody_took_is_renewed(backend: Backend) -> None:  # noqa: F811
    store = backend.ready()
    lease = store.acquire_lease("k", "w1", SHORT_LEASE)
    assert isinstance(lease, Lease)
    wait_db_past(store, lease.expires_us)
    assert not store.lease_holds("k", lease.token)
    renewed = store.renew_lease(lease, LONG_LEASE)
    assert renewed is not None and renewed.token == lease.token
    assert renewed.expires_us > lease.expires_us + SHORT_LEASE  # now + ttl, not old end + ttl
    assert store.lease_holds("k", lease.token)
    assert backend.open().acquire_lease("k", "w2", LONG_LEASE) == Busy("w1", renewed.expires_us)


# -- prune ----------------------------------------------------------------------------


def test_tokens_keep_growing_after_the_idle_lock_row_was_pruned(
    backend: Backend,  # noqa: F811
) -> None:
    store = backend.ready()
    first = store.acquire_lease("k", "w1", LONG_LEASE)
    live = store.acquire_lease("held", "w1", LONG_LEASE)
    assert isinstance(first, Lease) and isinstance(live, Lease)
    assert store.release_lease(first)
    # idle: free, and acquired more than the retention (1 µs) ago
    wait_db_past(store, max(first.token, live.token) + 1)
    assert store.prune_singletons(1, 60 * US) == 1  # the held key's row stays
    assert backend.open().prune_singletons(1, 60 * US) is None  # not the next caller's turn

    second = store.acquire_lease("k", "w2", LONG_LEASE)
    assert isinstance(second, Lease)
    assert second.token > first.token
    assert store.lease_holds("held", live.token)
    assert store.acquire_lease("held", "w2", LONG_LEASE) == Busy("w1", live.expires_us)


def push_token_ahead(backend: Backend, key: str, by_us: int) -> int:  # noqa: F811
    """Raise a lock row's token past its ``acquired_us``; return the new token.

    What hand-overs of a key within one microsecond leave (each adds one to the
    token), or a database clock that stepped back: ``max(token + 1, now)``
    keeps the token ahead of the clock.
    """
    if backend.memory is not None:
        lock = backend.memory.state.leases[key]
        lock.token += by_us
        return lock.token
    assert backend.url is not None
    locks = Tables(backend.prefix).locks
    engine = direct_engine(backend.url)
    try:
        with engine.begin() as conn:
            conn.execute(
                locks.update().where(locks.c.name == key).values(token=locks.c.token + by_us)
            )
            return int(conn.execute(locks.select().where(locks.c.name == key)).one().token)
    finally:
        engine.dispose()


def test_a_pruned_token_ahead_of_the_clock_is_still_exceeded_by_the_next(
    backend: Backend,  # noqa: F811
) -> None:
    store = backend.ready()
    lease = store.acquire_lease("k", "w1", LONG_LEASE)
    assert isinstance(lease, Lease)
    assert store.release_lease(lease)
    token = push_token_ahead(backend, "k", 5 * US)
    wait_db_past(store, lease.token + 1)
    assert store.prune_singletons(1, 1) is not None  # its turn: the row was up for pruning
    nxt = store.acquire_lease("k", "w2", LONG_LEASE)
    assert isinstance(nxt, Lease)
    assert nxt.token > token


def test_prune_deletes_finished_runs_and_spares_live_ones(backend: Backend) -> None:  # noqa: F811
    store = backend.ready()
    done, live = Run("e", 10, "run-done"), Run("e", 20, "run-live")
    assert store.begin_run(done, "w1", "t1", LONG_LEASE).status is RunStatus.STARTED
    assert store.begin_run(live, "w1", "t2", LONG_LEASE).status is RunStatus.STARTED
    assert store.finish_run(done, "success")
    finished_at = store.ping()
    wait_db_past(store, finished_at + 1)
    assert store.prune_singletons(1, 1) == 1
    assert set(run_rows(backend)) == {("e", 20)}
    # the pruned slot starts afresh; the live one is still running
    assert store.begin_run(Run("e", 10, "again"), "w2", "t1", LONG_LEASE).status is (
        RunStatus.STARTED
    )
    assert store.begin_run(Run("e", 20, "dup"), "w2", "t2", LONG_LEASE).status is (
        RunStatus.RUNNING
    )


#: the retention the prune tests ask for: ``singlebeat_run_retention``'s minimum
HOUR = 3600 * US
#: how far from the retention's edge a row is aged: the database's clock moves on
#: between the test's ping and the prune's own reading of it, by far less than this
MARGIN = 60 * US


def age_rows(backend: Backend, kind: str, key: object, **values: int) -> None:  # noqa: F811
    """Write instants of one run row (``kind`` "runs", ``key`` its (entry, slot_us))
    or lock row ("locks", its name) directly, as if they had been written that
    long ago on the database's clock: what a prune test cannot wait an hour for."""
    if backend.memory is not None:
        if kind == "runs":
            row: object = backend.memory.state.runs[SlotKey(*key)]  # type: ignore[misc]
        else:
            row = backend.memory.state.leases[key]  # type: ignore[index]
        for column, value in values.items():
            setattr(row, column, value)
        return
    assert backend.url is not None
    tables = Tables(backend.prefix)
    if kind == "runs":
        table = tables.runs
        entry, slot_us = key  # type: ignore[misc]
        where = (table.c.entry == entry) & (table.c.slot_us == slot_us)
    else:
        table = tables.locks
        where = table.c.name == key
    engine = direct_engine(backend.url)
    try:
        with engine.begin() as conn:
            assert conn.execute(table.update().where(where).values(**values)).rowcount == 1
    finally:
        engine.dispose()


def test_prune_deletes_run_rows_past_the_retention_on_the_database_clock_and_keeps_the_rest(
    backend: Backend,  # noqa: F811
) -> None:
    """Finished more than the retention ago, or started that long ago and no
    longer running (expired): deleted. Finished within it (however long ago it
    started), started within it and expired, or still live however old:
    kept. A repeat of a kept slot is dropped; a pruned slot starts again."""
    store = backend.ready()
    runs = {slot: Run("e", slot, f"run-{slot}") for slot in (10, 20, 30, 40, 50, 60, 70)}
    for run in runs.values():
        assert store.begin_run(run, "w1", f"t{run.slot_us}", LONG_LEASE).status is (
            RunStatus.STARTED
        )
    for slot in (10, 20, 30, 70):
        assert store.finish_run(runs[slot], "success")
    now = store.ping()
    ages = {
        # finished two hours ago: gone
        10: {"started_us": now - 2 * HOUR - US, "finished_us": now - 2 * HOUR},
        # started three hours ago, finished half an hour ago: the finish counts
        20: {"started_us": now - 3 * HOUR, "finished_us": now - HOUR // 2},
        # finished just within the retention: kept; just past it (70): gone
        30: {"started_us": now - HOUR, "finished_us": now - HOUR + MARGIN},
        70: {"started_us": now - HOUR - 2 * MARGIN, "finished_us": now - HOUR - MARGIN},
        # started two hours ago, its worker gone (expired long since): gone
        40: {"started_us": now - 2 * HOUR, "expires_us": now - 2 * HOUR + LONG_LEASE},
        # started half an hour ago and expired: kept (not yet past the retention)
        50: {"started_us": now - HOUR // 2, "expires_us": now - HOUR // 2 + LONG_LEASE},
        # started two hours ago and still renewed by its heartbeat: kept
        60: {"started_us": now - 2 * HOUR, "expires_us": now + LONG_LEASE},
    }
    for slot, values in ages.items():
        age_rows(backend, "runs", ("e", slot), **values)

    # Before the prune, age alone forgets nothing: a repeat of the oldest is dropped.
    assert store.begin_run(Run("e", 10, "early"), "w2", "t10", LONG_LEASE) == RunBegin(
        RunStatus.FINISHED, "w1", "success"
    )
    assert store.prune_singletons(HOUR, 60 * US) == 3
    assert set(run_rows(backend)) == {("e", 20), ("e", 30), ("e", 50), ("e", 60)}

    def deliver(slot: int) -> RunStatus:
        return store.begin_run(Run("e", slot, f"again-{slot}"), "w2", f"t{slot}", LONG_LEASE).status

    # repeats of the kept slots: dropped (finished) or running; the expired one is retaken
    assert [deliver(s) for s in (20, 30, 60)] == [RunStatus.FINISHED] * 2 + [RunStatus.RUNNING]
    assert deliver(50) is RunStatus.STARTED
    # the pruned slots are new again: a repeat this late runs
    assert [deliver(s) for s in (10, 40, 70)] == [RunStatus.STARTED] * 3
    rows = run_rows(backend)
    assert (rows[("e", 10)]["attempts"], rows[("e", 10)]["repeats"]) == (1, 0)
    assert rows[("e", 20)]["repeats"] == 1 and rows[("e", 20)]["outcome"] == "success"


def test_prune_deletes_lock_rows_idle_past_the_retention_and_tokens_keep_growing(
    backend: Backend,  # noqa: F811
) -> None:
    """A lock row goes when it is free (released or expired), was acquired more
    than the retention ago and its token is that far behind the clock too; a
    held row (renewed for hours), a recent one, or one whose token is ahead of
    its acquisition stays."""
    store = backend.ready()
    leases: dict[str, Lease] = {}
    for key in ("released-old", "expired-old", "released-recent", "held-old", "token-ahead"):
        lease = store.acquire_lease(key, "w1", LONG_LEASE)
        assert isinstance(lease, Lease)
        leases[key] = lease
    for key in ("released-old", "released-recent", "token-ahead"):
        assert store.release_lease(leases[key])
    now = store.ping()
    old = now - 2 * HOUR
    age_rows(backend, "locks", "released-old", acquired_us=old, token=old)
    age_rows(backend, "locks", "expired-old", acquired_us=old, token=old, expires_us=old + US)
    half = now - HOUR // 2
    age_rows(backend, "locks", "released-recent", acquired_us=half, token=half)
    age_rows(backend, "locks", "held-old", acquired_us=old, token=old)  # expiry still ahead
    # hand-overs within one microsecond each add one, and a database clock may
    # step back: a token can run ahead of acquired_us, even of the clock
    ahead = now + MARGIN
    age_rows(backend, "locks", "token-ahead", acquired_us=old, token=ahead)

    assert store.prune_singletons(HOUR, 60 * US) == 2
    assert set(lock_rows(backend)) == {"released-recent", "held-old", "token-ahead"}
    other = backend.open()
    for key in ("released-old", "expired-old"):
        fresh = other.acquire_lease(key, "w2", LONG_LEASE)
        assert isinstance(fresh, Lease) and fresh.token > old, (key, fresh)
    assert store.lease_holds("held-old", old)
    assert other.acquire_lease("held-old", "w2", LONG_LEASE) == Busy(
        "w1", leases["held-old"].expires_us
    )
    for key, token in (("released-recent", half), ("token-ahead", ahead)):
        # the row stayed: its token is where the test put it, and the next one exceeds it
        nxt = other.acquire_lease(key, "w2", LONG_LEASE)
        assert isinstance(nxt, Lease) and nxt.token > token, (key, nxt)


def test_the_prune_turn_comes_round_once_per_period_for_the_whole_fleet(
    backend: Backend,  # noqa: F811
) -> None:
    """One caller per ``every_us`` among all stores; once it has passed on the
    database's clock, the next caller prunes what aged meanwhile. The
    scheduler's prune has a turn of its own, which does not use this one up."""
    store = backend.ready()
    (other,) = stores(backend, 1)
    # long enough that the calls below all come before it has passed, on a busy machine
    period = 3 * US
    assert store.prune(HOUR, LONG_LEASE) == 0  # the scheduler's turn
    assert store.prune_singletons(HOUR, period) == 0
    turn_taken = store.ping()
    assert other.prune_singletons(HOUR, period) is None
    assert store.prune_singletons(HOUR, period) is None

    run = Run("e", 10, "run-1")
    assert store.begin_run(run, "w1", "t", LONG_LEASE).status is RunStatus.STARTED
    assert store.finish_run(run, "success")
    now = store.ping()
    age_rows(backend, "runs", ("e", 10), started_us=now - 2 * HOUR, finished_us=now - 2 * HOUR)
    wait_db_past(store, turn_taken + period, timeout=10)
    assert other.prune_singletons(HOUR, LONG_LEASE) == 1
    assert run_rows(backend) == {}
    assert store.prune_singletons(HOUR, LONG_LEASE) is None


# -- runs ---------------------------------------------------------------------------


def test_begin_run_starts_once_then_counts_repeats_and_reports_the_outcome(
    backend: Backend,  # noqa: F811
) -> None:
    store = backend.ready()
    first = Run("report", 1_000, "run-1")
    assert store.begin_run(first, "w1", "task-1", LONG_LEASE) == RunBegin(
        RunStatus.STARTED, "w1", None
    )
    [row] = run_rows(backend).values()
    assert (row["run_id"], row["state"], row["owner"], row["task_id"]) == (
        "run-1",
        0,
        "w1",
        "task-1",
    )
    assert (row["attempts"], row["repeats"]) == (1, 0)
    assert row["expires_us"] == row["started_us"] + LONG_LEASE

    other = backend.open()
    before = other.ping()
    assert other.begin_run(Run("report", 1_000, "run-2"), "w2", "task-1", LONG_LEASE) == (
        RunBegin(RunStatus.RUNNING, "w1", None)
    )
    after = other.ping()
    row = run_rows(backend)[("report", 1_000)]
    assert (row["run_id"], row["owner"], row["attempts"], row["repeats"]) == ("run-1", "w1", 1, 1)
    assert row.get("last_repeat_us") is not None
    assert before <= row["last_repeat_us"] <= after

    assert store.finish_run(first, "success") is True
    assert other.begin_run(Run("report", 1_000, "run-3"), "w2", "task-1", LONG_LEASE) == (
        RunBegin(RunStatus.FINISHED, "w1", "success")
    )
    row = run_rows(backend)[("report", 1_000)]
    assert (row["state"], row["outcome"], row["repeats"], row["attempts"]) == (
        1,
        "success",
        2,
        1,
    )
    # a finished run is never started, renewed, finished or abandoned again
    assert store.finish_run(first, "failure") is False
    assert store.renew_run(first, LONG_LEASE) is False
    assert store.abandon_run(first) is False
    assert other.begin_run(Run("report", 1_000, "run-4"), "w3", "t", LONG_LEASE).outcome == (
        "success"
    )
    # another slot of the same entry is independent
    assert other.begin_run(Run("report", 2_000, "run-5"), "w2", "t", LONG_LEASE).status is (
        RunStatus.STARTED
    )


def test_a_lapsed_running_row_is_retaken_and_its_first_start_is_dead(
    backend: Backend,  # noqa: F811
) -> None:
    store = backend.ready()
    first, second = Run("e", 10, "run-1"), Run("e", 10, "run-2")
    assert store.begin_run(first, "w1", "task", SHORT_LEASE).status is RunStatus.STARTED
    started = run_rows(backend)[("e", 10)]
    wait_db_past(store, started["expires_us"])

    other = backend.open()
    assert other.begin_run(second, "w2", "task", LONG_LEASE) == RunBegin(
        RunStatus.STARTED, "w2", None
    )
    row = run_rows(backend)[("e", 10)]
    assert (row["run_id"], row["owner"], row["attempts"], row["repeats"]) == ("run-2", "w2", 2, 0)
    assert row["started_us"] > started["started_us"]
    assert store.finish_run(first, "success") is False
    assert store.renew_run(first, LONG_LEASE) is False
    assert store.abandon_run(first) is False
    assert run_rows(backend)[("e", 10)]["state"] == 0
    assert other.renew_run(second, LONG_LEASE) is True
    assert other.finish_run(second, "success") is True


def test_renew_run_keeps_the_row_live_past_its_first_expiry(backend: Backend) -> None:  # noqa: F811
    store = backend.ready()
    run = Run("e", 10, "run-1")
    assert store.begin_run(run, "w1", "task", SHORT_LEASE).status is RunStatus.STARTED
    first_end = run_rows(backend)[("e", 10)]["expires_us"]
    assert store.renew_run(run, LONG_LEASE) is True
    assert run_rows(backend)[("e", 10)]["expires_us"] > first_end + SHORT_LEASE
    wait_db_past(store, first_end)
    assert backend.open().begin_run(Run("e", 10, "run-2"), "w2", "task", LONG_LEASE) == (
        RunBegin(RunStatus.RUNNING, "w1", None)
    )
    assert store.renew_run(Run("e", 10, "run-2"), LONG_LEASE) is False  # not its start
    assert store.renew_run(Run("e", 99, "run-1"), LONG_LEASE) is False  # no such row


def test_abandon_run_lets_the_next_delivery_start_at_once(backend: Backend) -> None:  # noqa: F811
    store = backend.ready()
    first, second = Run("e", 10, "run-1"), Run("e", 10, "run-2")
    assert store.begin_run(first, "w1", "task", LONG_LEASE).status is RunStatus.STARTED
    assert store.abandon_run(Run("e", 10, "someone-else")) is False
    assert backend.open().begin_run(Run("e", 10, "x"), "w2", "task", LONG_LEASE).status is (
        RunStatus.RUNNING
    )
    assert store.abandon_run(first) is True
    assert store.begin_run(second, "w2", "task", LONG_LEASE) == RunBegin(
        RunStatus.STARTED, "w2", None
    )
    row = run_rows(backend)[("e", 10)]
    assert (row["run_id"], row["attempts"]) == ("run-2", 2)
    assert store.finish_run(first, "success") is False
    assert store.finish_run(second, "retry") is True


def test_a_start_whose_body_did_not_run_takes_back_its_attempt(
    backend: Backend,  # noqa: F811
) -> None:
    """abandon_run(ran=False) (the key busy, the database lost): the retake
    counts the attempt again, so ``attempts`` counts the body's starts, and a
    second call (a retry after a lost answer) takes nothing more back."""
    store = backend.ready()
    first, second, third = Run("e", 10, "run-1"), Run("e", 10, "run-2"), Run("e", 10, "run-3")
    assert store.begin_run(first, "w1", "task", LONG_LEASE).status is RunStatus.STARTED
    assert store.abandon_run(first, ran=False) is True
    assert store.abandon_run(first, ran=False) is True  # an answer lost, the call again
    assert run_rows(backend)[("e", 10)]["attempts"] == 0
    assert store.begin_run(second, "w2", "task", LONG_LEASE).status is RunStatus.STARTED
    assert run_rows(backend)[("e", 10)]["attempts"] == 1
    assert store.abandon_run(second) is True  # its body ran and called self.retry()
    assert store.begin_run(third, "w1", "task", LONG_LEASE).status is RunStatus.STARTED
    assert run_rows(backend)[("e", 10)]["attempts"] == 2


def test_concurrent_deliveries_of_one_slot_start_it_once(backend: Backend) -> None:  # noqa: F811
    backend.ready()
    replicas = stores(backend, 8)

    def deliver(i: int, store: Store) -> Callable[[], RunBegin]:
        return lambda: store.begin_run(Run("e", 10, f"run-{i}"), f"w{i}", "task", LONG_LEASE)

    answers = run_together([deliver(i, s) for i, s in enumerate(replicas)])
    assert len(answers) == 8
    counts = Counter(a.status for a in answers)
    assert counts == {RunStatus.STARTED: 1, RunStatus.RUNNING: 7}
    winner = next(i for i, a in enumerate(answers) if a.status is RunStatus.STARTED)
    assert {a.owner for a in answers} == {f"w{winner}"}
    row = run_rows(backend)[("e", 10)]
    assert (row["run_id"], row["attempts"], row["repeats"]) == (f"run-{winner}", 1, 7)


def test_begin_slot_starts_the_run_and_takes_the_key_or_takes_nothing_for_a_repeat(
    backend: Backend,  # noqa: F811
) -> None:
    store = backend.ready()
    begin, lease = store.begin_slot(Run("e", 10, "run-1"), "k", "w1", "t1", LONG_LEASE)
    assert begin.status is RunStatus.STARTED and isinstance(lease, Lease)
    # a repeat of the slot takes no lease and is counted
    repeat, nothing = store.begin_slot(Run("e", 10, "run-2"), "k", "w2", "t1", LONG_LEASE)
    assert (repeat.status, repeat.owner, nothing) == (RunStatus.RUNNING, "w1", None)
    # another slot finds the key busy: its run is started, the key is not taken
    other, busy = store.begin_slot(Run("e", 20, "run-3"), "k", "w2", "t2", LONG_LEASE)
    assert other.status is RunStatus.STARTED
    assert isinstance(busy, Busy) and busy.owner == "w1"
    assert store.lease_holds("k", lease.token)
    assert run_rows(backend)[("e", 10)]["repeats"] == 1


def test_end_slot_finishes_or_abandons_the_run_and_releases_the_key(
    backend: Backend,  # noqa: F811
) -> None:
    store = backend.ready()
    _, lease = store.begin_slot(Run("e", 10, "run-1"), "k", "w1", "t", LONG_LEASE)
    assert isinstance(lease, Lease)
    assert store.end_slot(Run("e", 10, "run-1"), "success", lease) == (True, True)
    assert (run_rows(backend)[("e", 10)]["state"], run_rows(backend)[("e", 10)]["outcome"]) == (
        1,
        "success",
    )
    assert store.end_slot(Run("e", 10, "run-1"), "success", lease) == (False, False)  # idempotent
    # abandoned for a retry: the slot starts again at once, the key is free
    _, lease2 = store.begin_slot(Run("e", 20, "run-2"), "k", "w1", "t", LONG_LEASE)
    assert isinstance(lease2, Lease) and lease2.token > lease.token
    assert store.end_slot(Run("e", 20, "run-2"), None, lease2) == (True, True)
    again, lease3 = store.begin_slot(Run("e", 20, "run-3"), "k", "w2", "t", LONG_LEASE)
    assert again.status is RunStatus.STARTED and isinstance(lease3, Lease)
    assert run_rows(backend)[("e", 20)]["attempts"] == 2


# -- cost ---------------------------------------------------------------------------


def cost(store: Store, call: Callable[[], object]) -> int:
    before = round_trips(store)
    call()
    return round_trips(store) - before


def test_each_lease_and_run_operation_costs_a_fixed_number_of_round_trips(
    backend: Backend,  # noqa: F811
) -> None:
    store = backend.ready()
    store.ping()  # connected
    store.acquire_lease("warm-up", "w1", LONG_LEASE)
    figures = {"acquire (free)": cost(store, lambda: store.acquire_lease("k", "w1", LONG_LEASE))}
    lease = store.acquire_lease("k2", "w1", LONG_LEASE)
    assert isinstance(lease, Lease)
    run = Run("e", 10, "run-1")
    figures |= {
        "acquire (busy)": cost(store, lambda: store.acquire_lease("k2", "w2", LONG_LEASE)),
        "renew": cost(store, lambda: store.renew_lease(lease, LONG_LEASE)),
        "holds": cost(store, lambda: store.lease_holds("k2", lease.token)),
        "release": cost(store, lambda: store.release_lease(lease)),
        "begin (start)": cost(store, lambda: store.begin_run(run, "w1", "t", LONG_LEASE)),
        "begin (repeat)": cost(
            store, lambda: store.begin_run(Run("e", 10, "r2"), "w2", "t", LONG_LEASE)
        ),
        "renew run": cost(store, lambda: store.renew_run(run, LONG_LEASE)),
        "finish run": cost(store, lambda: store.finish_run(run, "success")),
        "abandon run": cost(store, lambda: store.abandon_run(run)),
        "prune": cost(store, lambda: store.prune_singletons(LONG_LEASE, LONG_LEASE)),
        "prune (not our turn)": cost(store, lambda: store.prune_singletons(LONG_LEASE, LONG_LEASE)),
    }
    slot = Run("e", 20, "run-3")
    answers: list[Any] = []
    figures |= {
        "slot (start)": cost(
            store, lambda: answers.append(store.begin_slot(slot, "k3", "w1", "t", LONG_LEASE))
        ),
        "slot (busy key)": cost(
            store, lambda: store.begin_slot(Run("e", 30, "run-4"), "k3", "w2", "t", LONG_LEASE)
        ),
        "slot (repeat)": cost(
            store, lambda: store.begin_slot(Run("e", 20, "run-5"), "k3", "w2", "t", LONG_LEASE)
        ),
        "slot (end)": cost(store, lambda: store.end_slot(slot, "success", answers[0][1])),
    }
    assert figures == ROUND_TRIPS[backend.kind]


# -- schema made by the previous release ----------------------------------------------------


def make_previous_release_schema(backend: Backend) -> None:  # noqa: F811
    """What 0.1.0 created: meta (with its rows), entries and slots, no slot_us index."""
    assert backend.url is not None
    tables = Tables(backend.prefix)
    engine = direct_engine(backend.url)
    try:
        with engine.begin() as conn:
            for table in (tables.meta, tables.entries, tables.slots):
                table.create(conn)
            for index in tables.slots.indexes:
                if index.name == f"ix_{backend.prefix}slots_slot":
                    index.drop(conn)
            conn.execute(
                tables.meta.insert(),
                [
                    {"key": "schema_version", "value_us": SCHEMA_VERSION},
                    {"key": "prune", "value_us": 0},
                ],
            )
    finally:
        engine.dispose()


def schema_of(backend: Backend) -> tuple[set[str], set[str]]:  # noqa: F811
    """The table names, and the index names of the slots table."""
    assert backend.url is not None
    engine = direct_engine(backend.url)
    try:
        inspector = inspect(engine)
        tables = set(inspector.get_table_names())
        indexes = {i["name"] for i in inspector.get_indexes(f"{backend.prefix}slots")}
    finally:
        engine.dispose()
    return {t for t in tables if t.startswith(backend.prefix)}, {str(i) for i in indexes}


# The memory store has no tables to leave out.
@pytest.mark.parametrize("backend", ["sqlite", "postgres", "mysql"], indirect=True)
def test_prepare_without_create_names_the_tables_the_previous_release_lacked(
    backend: Backend,  # noqa: F811
) -> None:
    make_previous_release_schema(backend)
    p = backend.prefix
    # the tables added since: SingletonTask's, the fleet's (issue 12), then the
    # stored schedules' (issue 24)
    added = ", ".join(
        f"{p}{t}"
        for t in (
            "catalog",
            "catalogs",
            "locks",
            "pauses",
            "replicas",
            "requests",
            "runs",
            "schedule_log",
            "schedules",
        )
    )
    with pytest.raises(SchemaError, match=rf"\({added}\)") as raised:
        backend.open().prepare(create=False)
    assert "singlebeat_create_schema" in str(raised.value)
    assert f"{p}slots" not in str(raised.value)


@pytest.mark.parametrize("backend", ["sqlite", "postgres", "mysql"], indirect=True)
def test_prepare_upgrades_a_schema_made_by_the_previous_release(
    backend: Backend,  # noqa: F811
) -> None:
    make_previous_release_schema(backend)
    old = backend.open()
    anchor = old.register(["e"])["e"].anchor_us  # the old tables work as they are

    backend.open().prepare(create=True)
    tables, indexes = schema_of(backend)
    p = backend.prefix
    assert tables == {t.name for t in Tables(p).metadata.sorted_tables}
    assert {f"{p}{name}" for name in ("meta", "entries", "slots", "locks", "runs")} <= tables
    assert f"ix_{p}slots_slot" in indexes  # promised at the next start (CHANGELOG)

    store = backend.open()
    store.prepare(create=False)
    assert store.register(["e"])["e"].anchor_us == anchor
    assert isinstance(store.acquire_lease("k", "w1", LONG_LEASE), Lease)
    assert store.begin_run(Run("e", 10, "r"), "w1", "t", LONG_LEASE).status is RunStatus.STARTED
    assert store.prune_singletons(LONG_LEASE, LONG_LEASE) == 0  # its turn row was added


def test_reassert_runs_writes_back_a_retake_the_failover_lost(backend: Backend) -> None:  # noqa: F811
    """A worker retook the expired run row of a worker that died, then a
    failover lost the retake: the database has the dead run's row again. The
    record of the retake is written over it (the row is then the live run's,
    which can finish it); a row a later start retook is left alone."""
    store = backend.ready()
    ttl = 60_000_000
    dead = Run("s", 10, "run-dead")
    assert store.begin_run(dead, "w1", "task", 1).status is RunStatus.STARTED
    wait_db_past(store, store.ping() + 2)  # its 1 µs expiry has passed
    retake = Run("s", 10, "run-retake")
    assert store.begin_run(retake, "w2", "task", ttl).status is RunStatus.STARTED
    before = run_rows(backend)[("s", 10)]
    assert (before["run_id"], before["attempts"]) == ("run-retake", 2)
    record = RunRecord(retake, "w2", "task", before["started_us"], before["expires_us"])
    # the failover's loss: the row as it was before the retake
    start = before["started_us"]
    lost = {"run_id": "run-dead", "owner": "w1", "attempts": 1,
            "started_us": start - 10, "expires_us": start - 5}  # fmt: skip
    if backend.memory is not None:
        row_object = backend.memory.state.runs[SlotKey("s", 10)]
        for name, value in lost.items():
            setattr(row_object, name, value)
    else:
        assert backend.url is not None
        runs = Tables(backend.prefix).runs
        engine = direct_engine(backend.url)
        try:
            with engine.begin() as conn:
                conn.execute(
                    runs.update()
                    .where((runs.c.entry == "s") & (runs.c.slot_us == 10))
                    .values(**lost)
                )
        finally:
            engine.dispose()
    assert store.finish_run(retake, "success") is False  # not its row any more
    assert store.reassert_runs([record]) == [record]
    row = run_rows(backend)[("s", 10)]
    assert (row["run_id"], row["owner"], row["state"], row["attempts"]) == (
        "run-retake", "w2", 0, 2,
    )  # fmt: skip
    assert store.reassert_runs([record]) == []  # idempotent
    assert store.finish_run(retake, "success") is True
    # a start after the record's (a later retake) is not overwritten
    late = RunRecord(Run("s", 10, "run-old"), "w3", "task", before["started_us"] - 20, 0)
    assert store.reassert_runs([late]) == []
    assert run_rows(backend)[("s", 10)]["run_id"] == "run-retake"
