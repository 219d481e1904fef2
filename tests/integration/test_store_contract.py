"""The storage contract (``celery_singlebeat/store/base.py``), one suite for every backend.

Runs against the in-memory store, SQLite (a file), PostgreSQL and MariaDB.
Time is the backend's own clock: tests that need a lease to run out use a short
lease and poll ``ping()`` until the database's clock has passed it, so the
same test body works where the test cannot move the database's time.
"""

from __future__ import annotations

import random
import subprocess
import sys
import textwrap
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TypeVar

import pytest
from conftest import direct_engine, drop_tables
from sqlalchemy import inspect
from sqlalchemy.engine import make_url

from celery_singlebeat.exceptions import SchemaError
from celery_singlebeat.store.base import (
    EARLY_TOLERANCE_US,
    Claim,
    ReplicaInfo,
    Run,
    RunStatus,
    SlotKey,
    StalledRuns,
    Store,
)
from celery_singlebeat.store.sql import SqlStore
from celery_singlebeat.store.sql.schema import SCHEMA_VERSION, Tables
from celery_singlebeat.testing import MemoryStore
from celery_singlebeat.timeline.clock import US
from celery_singlebeat.timeline.membership import live_within_us

T = TypeVar("T")

LONG_LEASE = 60 * US
#: long enough to see a live lease, short enough to wait for its end
SHORT_LEASE = 50_000

#: statements one claim costs, whatever the number of slots
ROUND_TRIPS = {"memory": 1, "sqlite": 1, "postgres": 1, "mysql": 2}


@dataclass
class Backend:
    """One database under test, with a fresh table prefix."""

    kind: str
    url: str | None
    prefix: str
    memory: MemoryStore | None = None
    opened: list[SqlStore] = field(default_factory=list)

    def open(self, stalled_runs: StalledRuns | None = None) -> Store:
        """A new store instance on the shared database (a replica's view),
        with ``stalled_runs`` (the settings' re-sends of stalled runs) when given.

        The memory "database" is the store object itself, so every replica
        shares the one instance.
        """
        if self.memory is not None:
            if stalled_runs is not None:
                self.memory.stalled_runs = stalled_runs
            return self.memory
        assert self.url is not None
        store = SqlStore(make_url(self.url), table_prefix=self.prefix, stalled_runs=stalled_runs)
        self.opened.append(store)
        return store

    def ready(self) -> Store:
        """A store whose schema exists."""
        store = self.open()
        store.prepare(create=True)
        return store

    def set_schema_version(self, version: int) -> None:
        """What a newer release would have written into the meta table."""
        if self.memory is not None:
            self.memory.schema_version = version
            return
        assert self.url is not None
        tables = Tables(self.prefix)
        engine = direct_engine(self.url)
        try:
            with engine.begin() as conn:
                conn.execute(
                    tables.meta.update()
                    .where(tables.meta.c.key == "schema_version")
                    .values(value_us=version)
                )
        finally:
            engine.dispose()


@pytest.fixture(params=["memory", "sqlite", "postgres", "mysql"])
def backend(
    request: pytest.FixtureRequest, tmp_path: object, table_prefix: str
) -> Iterator[Backend]:
    kind = request.param
    if kind == "memory":
        yield Backend(kind, None, table_prefix, memory=MemoryStore())
        return
    if kind == "sqlite":
        url = f"sqlite:///{tmp_path}/singlebeat.sqlite"
    else:
        # the shared fixtures skip (locally) or fail (CI) when the service is down
        url = request.getfixturevalue("pg_url" if kind == "postgres" else "mysql_url")
    backend = Backend(kind, url, table_prefix)
    yield backend
    # every engine here has a QueuePool (SQLite files too, in SQLAlchemy 2)
    leaked = [s.engine.pool.checkedout() for s in backend.opened]  # type: ignore[attr-defined]
    for store in backend.opened:
        store.close()
    drop_tables(url, table_prefix)
    assert leaked == [0] * len(leaked), "a pooled connection was left checked out"


def wait_db_past(store: Store, instant_us: int, timeout: float = 5.0) -> None:
    """Poll the database's clock until it is later than ``instant_us``."""
    deadline = time.monotonic() + timeout
    while store.ping() <= instant_us:
        assert time.monotonic() < deadline, "database clock did not reach the instant"
        time.sleep(0.005)


def claim_expiring(store: Store, owner: str, slots: list[SlotKey]) -> list[Claim]:
    """Claim with a short lease and return once every won lease has run out."""
    won = store.claim(owner, slots, SHORT_LEASE)
    # ping() after the claim is no earlier than the claim's "now"
    wait_db_past(store, store.ping() + SHORT_LEASE)
    return won


def run_together(workers: list[Callable[[], T]], timeout: float = 60.0) -> list[T]:
    """Run the callables in threads released at the same instant; re-raise errors."""
    barrier = threading.Barrier(len(workers))
    results: list[T | None] = [None] * len(workers)
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            barrier.wait(timeout)
            results[i] = workers[i]()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(workers))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout)
        assert not thread.is_alive(), "a worker thread hung"
    if errors:
        raise errors[0]
    return [r for r in results if r is not None]


# -- prepare ------------------------------------------------------------------


def test_prepare_is_idempotent(backend: Backend) -> None:
    first = backend.ready()
    first.prepare(create=True)
    again = backend.open()
    again.prepare(create=True)
    again.prepare(create=False)
    assert set(again.register(["e"])) == {"e"}


# The memory store has no indexes.
@pytest.mark.parametrize("backend", ["sqlite", "postgres", "mysql"], indirect=True)
def test_prepare_adds_indexes_missing_from_tables_made_by_an_older_release(
    backend: Backend,
) -> None:
    assert backend.url is not None
    backend.ready()
    tables = Tables(backend.prefix)
    index = next(i for i in tables.slots.indexes if i.name == f"ix_{backend.prefix}slots_slot")
    engine = direct_engine(backend.url)
    try:
        with engine.begin() as conn:
            index.drop(conn)
        backend.open().prepare(create=True)
        names = {i["name"] for i in inspect(engine).get_indexes(tables.slots.name)}
    finally:
        engine.dispose()
    assert index.name in names


def test_threads_preparing_an_empty_schema_at_once_all_succeed(backend: Backend) -> None:
    stores = [backend.open() for _ in range(3)]
    for store in stores:
        store.ping()  # connect first, so the threads race on the DDL itself

    def prepare(store: Store) -> Callable[[], bool]:
        def run() -> bool:
            store.prepare(create=True)
            return True

        return run

    assert run_together([prepare(s) for s in stores]) == [True, True, True]
    checker = backend.open()
    checker.prepare(create=False)
    assert checker.claim("x", [SlotKey("e", 1)], LONG_LEASE) == []  # usable, e unregistered


_PREPARE_IN_CHILD = """
import sys
from sqlalchemy.engine import make_url
from celery_singlebeat.store.sql import SqlStore

store = SqlStore(make_url(sys.argv[1]), table_prefix=sys.argv[2])
store.ping()
print("ready", flush=True)
sys.stdin.readline()  # the parent releases every child at once
store.prepare(create=True)
store.close()
print("prepared", flush=True)
"""


# The memory store lives in one process; it has nothing to share across them.
@pytest.mark.parametrize("backend", ["sqlite", "postgres", "mysql"], indirect=True)
def test_processes_preparing_an_empty_schema_at_once_all_succeed(backend: Backend) -> None:
    assert backend.url is not None
    children = [
        subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(_PREPARE_IN_CHILD), backend.url, backend.prefix],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(3)
    ]
    try:
        for child in children:
            assert child.stdout is not None
            assert child.stdout.readline().strip() == "ready"
        for child in children:
            assert child.stdin is not None
            child.stdin.write("go\n")
            child.stdin.flush()
        outcomes = [child.communicate(timeout=60) for child in children]
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
    for child, (out, err) in zip(children, outcomes):
        assert child.returncode == 0, err
        assert out.strip() == "prepared"
    backend.open().prepare(create=False)


def test_prepare_without_create_on_an_empty_database_names_the_setting(backend: Backend) -> None:
    store = backend.open()
    with pytest.raises(SchemaError, match="singlebeat_create_schema"):
        store.prepare(create=False)


def test_a_newer_schema_version_is_refused(backend: Backend) -> None:
    backend.ready()
    backend.set_schema_version(SCHEMA_VERSION + 1)
    with pytest.raises(SchemaError, match="newer"):
        backend.open().prepare(create=True)


# -- register -------------------------------------------------------------------


def test_register_keeps_anchors_and_reports_the_latest_slot(backend: Backend) -> None:
    store = backend.ready()
    before = store.ping()
    first = store.register(["a", "b"])
    assert set(first) == {"a", "b"}
    assert first["a"].last_slot_us is None
    assert abs(first["a"].anchor_us - before) < 5 * US
    wait_db_past(store, first["a"].anchor_us)

    store.claim("r1", [SlotKey("a", 1_000), SlotKey("a", 3_000)], LONG_LEASE)
    later = backend.open().register(["a", "c"])
    assert set(later) == {"a", "c"}
    assert later["a"].anchor_us == first["a"].anchor_us
    assert later["a"].last_slot_us == 3_000
    assert later["c"].anchor_us > first["a"].anchor_us
    assert later["c"].last_slot_us is None
    assert store.register([]) == {}


# -- claim --------------------------------------------------------------------


def test_concurrent_claimers_win_each_slot_exactly_once(backend: Backend) -> None:
    setup = backend.ready()
    setup.register(["alpha", "beta"])
    slots = [SlotKey(name, k * US) for name in ("alpha", "beta") for k in range(1, 101)]
    stores = [backend.open() for _ in range(8)]

    def claimer(i: int, store: Store) -> Callable[[], list[Claim]]:
        mine = slots[:]
        random.Random(i).shuffle(mine)  # every claimer proposes in its own order

        def run() -> list[Claim]:
            return store.claim(f"replica-{i}", mine, LONG_LEASE)

        return run

    for store in stores:
        store.ping()
    results = run_together([claimer(i, s) for i, s in enumerate(stores)])
    wins = Counter(c.key for won in results for c in won)
    assert set(wins) == set(slots)
    assert max(wins.values()) == 1
    assert all(c.fence == 1 for won in results for c in won)


def test_duplicates_count_once_and_unregistered_entries_are_never_won(backend: Backend) -> None:
    store = backend.ready()
    store.register(["known"])
    won = store.claim(
        "r1",
        [SlotKey("known", 5), SlotKey("known", 5), SlotKey("unknown", 5), SlotKey("known", 5)],
        LONG_LEASE,
    )
    assert won == [Claim("known", 5, 1)]
    assert store.claim("r2", [SlotKey("unknown", 6)], LONG_LEASE) == []


def test_a_slot_ahead_of_the_database_clock_is_not_won(backend: Backend) -> None:
    # A replica whose clock stepped forward proposes slots before they are due;
    # the database refuses them (on its own clock) so nothing is sent early.
    store = backend.ready()
    store.register(["e"])
    now = store.ping()
    ahead = now + 90 * US
    within = now + EARLY_TOLERANCE_US // 5
    assert store.claim("r1", [SlotKey("e", ahead)], LONG_LEASE) == []
    assert store.claim("r1", [SlotKey("e", within)], LONG_LEASE) == [Claim("e", within, 1)]
    # refused, not recorded: the same slot is won once it is due
    assert backend.open().claim("r2", [SlotKey("e", ahead)], LONG_LEASE) == []


def test_a_live_lease_is_not_stolen(backend: Backend) -> None:
    store = backend.ready()
    store.register(["e"])
    assert store.claim("r1", [SlotKey("e", 10)], LONG_LEASE) == [Claim("e", 10, 1)]
    other = backend.open()
    assert other.claim("r2", [SlotKey("e", 10)], LONG_LEASE) == []
    assert other.take_over("r2", LONG_LEASE, 10) == []


def test_the_owner_wins_its_own_unsent_claim_again(backend: Backend) -> None:
    # The answer to a claim can be lost with the connection after the database
    # applied it; the owner's retry must win the slot again rather than leave it
    # to wait out the lease. A sent row is never won again, even by its owner.
    store = backend.ready()
    store.register(["e"])
    assert store.claim("r1", [SlotKey("e", 10)], LONG_LEASE) == [Claim("e", 10, 1)]
    assert store.claim("r1", [SlotKey("e", 10)], LONG_LEASE) == [Claim("e", 10, 2)]
    assert store.confirm("r1", [Claim("e", 10, 1)]) == []  # the older fence is stale
    assert store.confirm("r1", [Claim("e", 10, 2)]) == [Claim("e", 10, 2)]
    assert store.claim("r1", [SlotKey("e", 10)], LONG_LEASE) == []


def test_an_expired_lease_is_taken_by_claim_and_the_old_owner_cannot_confirm(
    backend: Backend,
) -> None:
    store = backend.ready()
    store.register(["e"])
    old = claim_expiring(store, "r1", [SlotKey("e", 10)])
    assert old == [Claim("e", 10, 1)]
    other = backend.open()
    new = other.claim("r2", [SlotKey("e", 10), SlotKey("e", 20)], LONG_LEASE)
    assert sorted(new) == [Claim("e", 10, 2), Claim("e", 20, 1)]
    assert new[0].taken_over or new[1].taken_over
    assert store.confirm("r1", old) == []
    assert sorted(other.confirm("r2", new)) == sorted(new)


def test_sent_rows_are_never_won_again(backend: Backend) -> None:
    store = backend.ready()
    store.register(["e"])
    won = claim_expiring(store, "r1", [SlotKey("e", 10)])
    # the lease ran out before the confirm: still ours, nobody took it
    assert store.confirm("r1", won) == won
    other = backend.open()
    assert other.claim("r2", [SlotKey("e", 10)], LONG_LEASE) == []
    assert other.take_over("r2", LONG_LEASE, 10) == []


# -- confirm / release ----------------------------------------------------------


def test_confirm_needs_the_owner_and_the_fence(backend: Backend) -> None:
    store = backend.ready()
    store.register(["e"])
    [claim] = store.claim("r1", [SlotKey("e", 10)], LONG_LEASE)
    assert store.confirm("r2", [claim]) == []
    assert store.confirm("r1", [claim._replace(fence=2)]) == []
    assert store.confirm("r1", [claim, claim]) == [claim]
    # a repeated confirm (an answer lost in an outage) still reports it as ours
    assert store.confirm("r1", [claim]) == [claim]
    assert store.confirm("r2", [claim]) == []


def test_release_lets_another_replica_take_over_at_once(backend: Backend) -> None:
    store = backend.ready()
    store.register(["e"])
    claims = store.claim("r1", [SlotKey("e", 10), SlotKey("e", 20)], LONG_LEASE)
    other = backend.open()
    other.release("r2", claims)  # not its claims: untouched
    store.release("r1", [claims[0]._replace(fence=7)])  # stale fence: untouched
    assert other.take_over("r2", LONG_LEASE, 10) == []

    store.release("r1", [Claim("e", 10, 1)])
    taken = other.take_over("r2", LONG_LEASE, 10)
    assert taken == [Claim("e", 10, 2)]
    assert store.confirm("r1", [Claim("e", 10, 1)]) == []
    assert other.confirm("r2", taken) == taken


def test_release_with_a_retry_delay_keeps_the_slot_off_sweeps_until_then(
    backend: Backend,
) -> None:
    # A replica that cannot publish a slot at all (its schedule lacks the entry)
    # hands it back for later, so it does not bounce between sweeps.
    store = backend.ready()
    store.register(["e"])
    [claim] = store.claim("r1", [SlotKey("e", 10)], LONG_LEASE)
    # long enough that a loaded database answers the first sweep well inside it
    retry_in_us = 2 * US
    store.release("r1", [claim], retry_in_us=retry_in_us)
    other = backend.open()
    released_at = other.ping()
    assert other.take_over("r2", LONG_LEASE, 10) == []
    wait_db_past(other, released_at + retry_in_us)
    assert other.take_over("r2", LONG_LEASE, 10) == [Claim("e", 10, 2)]


# -- take_over ------------------------------------------------------------------


def test_take_over_respects_the_limit_oldest_slots_first(backend: Backend) -> None:
    store = backend.ready()
    store.register(["a", "b", "c"])
    slots = [
        SlotKey("a", 300),
        SlotKey("a", 400),
        SlotKey("b", 100),
        SlotKey("b", 200),
        SlotKey("c", 500),
        SlotKey("c", 600),
    ]
    claim_expiring(store, "dead", slots)
    other = backend.open()
    first = other.take_over("r2", LONG_LEASE, 3)
    assert sorted(c.slot_us for c in first) == [100, 200, 300]
    rest = other.take_over("r3", LONG_LEASE, 10)
    assert sorted(c.slot_us for c in rest) == [400, 500, 600]
    assert all(c.fence == 2 and c.taken_over for c in first + rest)
    assert other.take_over("r4", LONG_LEASE, 10) == []


def test_concurrent_take_overs_never_return_the_same_row(backend: Backend) -> None:
    store = backend.ready()
    names = [f"e{i}" for i in range(6)]
    store.register(names)
    slots = [SlotKey(name, k) for name in names for k in range(1, 11)]
    claim_expiring(store, "dead", slots)
    stores = [backend.open() for _ in range(4)]
    for s in stores:
        s.ping()

    def sweeper(i: int, s: Store) -> Callable[[], list[Claim]]:
        def run() -> list[Claim]:
            taken: list[Claim] = []
            while batch := s.take_over(f"sweeper-{i}", LONG_LEASE, 7):
                assert len(batch) <= 7
                taken.extend(batch)
            return taken

        return run

    results = run_together([sweeper(i, s) for i, s in enumerate(stores)])
    counts = Counter(c.key for taken in results for c in taken)
    assert set(counts) == set(slots)
    assert max(counts.values()) == 1


# -- take_over: sent slots whose SingletonTask run stalled ---------------------

#: a run's ttl short enough to wait out; the grace (take_over's lease) after it
RUN_TTL = 50_000
GRACE = SHORT_LEASE


def sent_and_started(
    store: Store, entry: str, ttl_us: int = RUN_TTL, worker: str = "worker-1"
) -> tuple[Claim, Run]:
    """A slot of ``entry`` a second old, claimed and confirmed by ``r1``, whose
    run a worker started with ``ttl_us`` (and then, unless it renews, died)."""
    store.register([entry])
    slot_us = store.ping() - US
    [claim] = store.claim("r1", [SlotKey(entry, slot_us)], LONG_LEASE)
    assert store.confirm("r1", [claim]) == [claim]
    run = Run(entry, slot_us, f"{worker}-run")
    begun = store.begin_run(run, worker, f"task-{entry}", ttl_us)
    assert begun.status is RunStatus.STARTED
    return claim, run


def wait_past_grace(store: Store, ttl_us: int = RUN_TTL) -> None:
    """Until the runs begun so far have lapsed by more than the grace (and the
    slots' last hand-over is older than it)."""
    wait_db_past(store, store.ping() + ttl_us + GRACE)


def pause(backend: Backend, entry: str) -> None:
    """What an operator's pause writes (test_fleet_contract.py has the others)."""
    if backend.memory is not None:
        backend.memory.pause(entry)
        return
    assert backend.url is not None
    tables = Tables(backend.prefix)
    engine = direct_engine(backend.url)
    try:
        with engine.begin() as conn:
            conn.execute(
                tables.pauses.insert().values(
                    entry=entry, until_us=None, paused_by="op", reason="test", at_us=0
                )
            )
    finally:
        engine.dispose()


def resume(backend: Backend, entry: str) -> None:
    if backend.memory is not None:
        backend.memory.resume(entry)
        return
    assert backend.url is not None
    tables = Tables(backend.prefix)
    engine = direct_engine(backend.url)
    try:
        with engine.begin() as conn:
            conn.execute(tables.pauses.delete().where(tables.pauses.c.entry == entry))
    finally:
        engine.dispose()


def test_a_sent_slot_whose_run_stalled_is_taken_over_after_the_grace_and_not_before(
    backend: Backend,
) -> None:
    store = backend.ready()
    claim, run = sent_and_started(store, "e")
    other = backend.open()
    wait_db_past(other, other.ping() + RUN_TTL + US)
    # the run lapsed a second ago: not by a longer grace (a worker slow to
    # renew is not raced), by a shorter one
    assert other.take_over("r2", 2 * US, 10) == []
    [taken] = other.take_over("r2", US // 2, 10)
    assert taken == Claim("e", claim.slot_us, claim.fence + 1)
    assert taken.taken_over
    # claimed again by the taker: nobody else takes it, the old owner's confirm is stale
    assert store.take_over("r3", US // 2, 10) == []
    assert store.confirm("r1", [claim]) == []
    assert other.confirm("r2", [taken]) == [taken]
    # sent again and not yet started: not sent a third time within the grace
    # of that send, though the run lapsed longer ago
    assert other.take_over("r3", US // 2, 10) == []
    # the worker that gets the message again retakes the expired run row
    again = Run("e", claim.slot_us, "worker-2-run")
    assert other.begin_run(again, "worker-2", "task-e", LONG_LEASE).status is RunStatus.STARTED
    assert other.finish_run(again, "success")
    assert not store.finish_run(run, "success")  # the dead worker's start is gone
    wait_past_grace(other)
    assert other.take_over("r3", GRACE, 10) == []


def test_a_finished_run_a_retry_and_a_live_run_are_never_taken(backend: Backend) -> None:
    store = backend.ready()
    _, finished = sent_and_started(store, "finished")
    assert store.finish_run(finished, "failure")
    # a run abandoned for a retry: its retry message is on its way
    _, retried = sent_and_started(store, "retried")
    assert store.abandon_run(retried)
    # a run its worker renews (past its first ttl and the grace)
    _, renewed = sent_and_started(store, "renewed")
    sent_and_started(store, "live", ttl_us=LONG_LEASE)
    wait_past_grace(store)
    assert store.renew_run(renewed, LONG_LEASE)
    other = backend.open()
    assert other.take_over("r2", GRACE, 10) == []
    # no run row at all (not a SingletonTask): a sent slot stays sent
    store.register(["plain"])
    [plain] = store.claim("r1", [SlotKey("plain", store.ping() - US)], LONG_LEASE)
    store.confirm("r1", [plain])
    wait_past_grace(store)
    assert other.take_over("r2", GRACE, 10) == []


def test_a_stalled_slot_is_sent_again_up_to_the_cap_and_then_left(backend: Backend) -> None:
    # resends=2: the first start and two more, each of which died
    store = backend.ready()
    claim, _ = sent_and_started(store, "oom")
    taker = backend.open(StalledRuns(resends=2))
    fence = claim.fence
    for attempt in (2, 3):
        wait_past_grace(taker)
        [taken] = taker.take_over("r2", GRACE, 10)
        assert taken.fence == fence + 1
        fence = taken.fence
        assert taker.confirm("r2", [taken]) == [taken]
        run = Run("oom", claim.slot_us, f"attempt-{attempt}")
        assert taker.begin_run(run, f"w{attempt}", "task-oom", RUN_TTL).status is (
            RunStatus.STARTED
        )
    # the third start died too: the cap holds, the slot stays sent, the run stalled
    wait_past_grace(taker)
    assert taker.take_over("r2", GRACE, 10) == []
    # and with the re-sends off, even a first stall is left alone
    off = backend.open(StalledRuns(resends=0))
    sent_and_started(off, "off")
    wait_past_grace(off)
    assert off.take_over("r2", GRACE, 10) == []


def test_a_stalled_slot_of_a_paused_entry_is_left_alone(backend: Backend) -> None:
    store = backend.ready()
    claim, _ = sent_and_started(store, "p")
    pause(backend, "p")
    wait_past_grace(store)
    assert store.take_over("r2", GRACE, 10) == []
    resume(backend, "p")
    assert store.take_over("r2", GRACE, 10) == [claim._replace(fence=claim.fence + 1)]


def test_only_stalled_slots_within_the_retention_are_taken(backend: Backend) -> None:
    store = backend.ready()
    sent_and_started(store, "e")  # a slot a second old, its run lapsed soon after
    wait_past_grace(store)
    # a window shorter than the slot's age and the run's lapse: out of it
    short = backend.open(StalledRuns(resends=2, window_us=RUN_TTL // 2))
    assert short.take_over("r2", GRACE, 10) == []
    assert len(backend.open(StalledRuns()).take_over("r2", GRACE, 10)) == 1


def test_the_heartbeat_counts_the_runs_that_may_have_stalled_as_open_claims(
    backend: Backend,
) -> None:
    """A sweep skips the takeover when the heartbeat counts no open claim: a
    stalled run must count, or nothing claimed would leave it lost."""
    store = backend.ready()
    _beat(store, "r1")
    assert store.open_claims == 0
    claim, _run = sent_and_started(store, "e")
    _beat(store, "r1")
    assert store.open_claims == 0  # running and live
    wait_past_grace(store)
    _beat(store, "r1")
    assert store.open_claims == 1
    [taken] = store.take_over("r2", GRACE, 10)
    _beat(store, "r1")
    assert store.open_claims == 2  # the slot claimed again, and its run until it starts
    store.confirm("r2", [taken])
    again = Run("e", claim.slot_us, "again")
    store.begin_run(again, "w2", "task-e", LONG_LEASE)
    _beat(store, "r1")
    assert store.open_claims == 0


def test_concurrent_take_overs_never_return_the_same_stalled_slot(backend: Backend) -> None:
    store = backend.ready()
    names = [f"e{i}" for i in range(12)]
    for name in names:
        sent_and_started(store, name)
    wait_past_grace(store)
    stores = [backend.open() for _ in range(4)]
    for s in stores:
        s.ping()

    def sweeper(i: int, s: Store) -> Callable[[], list[Claim]]:
        def run() -> list[Claim]:
            taken: list[Claim] = []
            while batch := s.take_over(f"sweeper-{i}", GRACE, 2):
                assert len(batch) <= 2
                taken.extend(batch)
            return taken

        return run

    results = run_together([sweeper(i, s) for i, s in enumerate(stores)])
    counts = Counter(c.entry for taken in results for c in taken)
    assert set(counts) == set(names)
    assert max(counts.values()) == 1


# -- prune ----------------------------------------------------------------------


def test_prune_deletes_old_sent_rows_once_per_period_and_raises_the_mark(
    backend: Backend,
) -> None:
    store = backend.ready()
    store.register(["e", "quiet"])
    now = store.ping()
    hour = 3600 * US
    old_claimed, old_sent, old_sent_2 = now - 3 * hour, now - 2 * hour, now - 2 * hour + US
    recent = now - US
    claimed = store.claim("r1", [SlotKey("e", old_claimed)], LONG_LEASE)
    sent = store.claim("r1", [SlotKey("e", s) for s in (old_sent, old_sent_2, recent)], LONG_LEASE)
    assert len(claimed) == 1 and len(sent) == 3
    assert sorted(store.confirm("r1", sent)) == sorted(sent)

    assert store.prune(hour, 60 * US) == 2
    assert backend.open().prune(hour, 60 * US) is None  # another replica's turn is not due

    # a pruned slot, and any slot at or below the mark, can never be won again
    fresh = backend.open()
    assert fresh.claim("r2", [SlotKey("e", old_sent_2)], LONG_LEASE) == []
    assert fresh.claim("r2", [SlotKey("e", old_sent_2 - 5)], LONG_LEASE) == []
    assert fresh.register(["e"])["e"].last_slot_us == recent
    # the recent sent row survived: still not re-won
    assert fresh.claim("r2", [SlotKey("e", recent)], LONG_LEASE) == []
    # the old claimed row survived too: once released it can be taken over
    store.release("r1", claimed)
    assert fresh.take_over("r2", LONG_LEASE, 10) == [Claim("e", old_claimed, 2)]


def test_prune_raises_the_mark_even_when_slot_rows_are_gone(backend: Backend) -> None:
    store = backend.ready()
    store.register(["e"])
    now = store.ping()
    slot = now - 7200 * US
    won = store.claim("r1", [SlotKey("e", slot)], LONG_LEASE)
    store.confirm("r1", won)
    assert store.prune(3600 * US, 1) == 1
    states = backend.open().register(["e"])
    assert states["e"].last_slot_us == slot
    assert store.claim("r2", [SlotKey("e", slot)], LONG_LEASE) == []
    assert store.claim("r2", [SlotKey("e", slot + 1)], LONG_LEASE) == [Claim("e", slot + 1, 1)]


# -- clock and cost ----------------------------------------------------------------


def test_ping_returns_the_database_time_and_feeds_the_clock(backend: Backend) -> None:
    store = backend.open()
    local = time.time_ns() // 1000
    db_now = store.ping()
    # the services run on this machine: their clocks agree within a second
    assert abs(db_now - local) < US
    assert store.clock.synchronised
    assert abs(store.clock.now_us() - db_now) < US


def test_a_claim_costs_the_same_round_trips_whatever_its_size(backend: Backend) -> None:
    store = backend.ready()
    store.register(["e"])
    store.claim("warm-up", [SlotKey("e", 1)], LONG_LEASE)
    costs = []
    base = 1_000_000
    for size in (1, 100, 1000):
        before = round_trips(store)
        won = store.claim("r1", [SlotKey("e", base + k) for k in range(size)], LONG_LEASE)
        costs.append(round_trips(store) - before)
        assert len(won) == size
        base += 10_000
    assert costs == [ROUND_TRIPS[backend.kind]] * 3


def round_trips(store: Store) -> int:
    assert isinstance(store, (SqlStore, MemoryStore))
    return store.round_trips


# -- live replicas (work sharing, the fleet) ----------------------------------


def _beat(store: Store, rid: str, heartbeat_us: int = 5 * US) -> list[str]:
    now = store.clock.now_us()
    return store.heartbeat(ReplicaInfo(rid, "host", 1, "1.0", now, now, 0, 1, 1, heartbeat_us))


def test_heartbeat_reads_the_live_replicas_by_the_one_rule(
    backend: Backend,
) -> None:
    """Live: a row not stopped, seen within 3 of its heartbeats + 2 s
    (membership.replica_live), on the database's clock; sharing, the fleet's
    status and the controls all count by it. One statement on every backend
    (MariaDB's INSERT ... RETURNING)."""
    _check_the_live_rule(backend.ready(), statements=1)


@pytest.mark.parametrize("backend", ["mysql"], indirect=True)
def test_a_heartbeat_without_returning_is_the_upsert_then_the_read(
    backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """MySQL has no RETURNING (nor MariaDB before 10.5): two statements, the
    same answers."""
    from celery_singlebeat.store.sql import fleet

    monkeypatch.setattr(fleet, "_returns_from_upserts", lambda _conn: False)
    _check_the_live_rule(backend.ready(), statements=2)


def _check_the_live_rule(store: Store, statements: int) -> None:
    # its own row counts at once, though PostgreSQL's read cannot see the write
    assert _beat(store, "r1") == ["r1"]
    assert _beat(store, "r2") == ["r1", "r2"]
    _beat(store, "r3")
    store.stopped("r3")  # a graceful stop: out at once, though seen just now
    _beat(store, "quick", heartbeat_us=1)  # live for 2 s (+3 µs) after it was seen
    seen = store.ping()
    before = round_trips(store)
    assert _beat(store, "r1") == ["quick", "r1", "r2"]
    assert round_trips(store) - before == statements
    if isinstance(store, SqlStore):  # the fleet's view agrees (status, controls)
        from celery_singlebeat.store.sql.operator import Operator
        from celery_singlebeat.store.sql.operator_results import LIVE

        states = {r.id: r.state for r in Operator(store).replicas()}
        assert sorted(rid for rid, state in states.items() if state == LIVE) == [
            "quick",
            "r1",
            "r2",
        ]
    wait_db_past(store, seen + live_within_us(1))  # "quick" is now lost: a paused process
    assert _beat(store, "r2") == ["r1", "r2"]
    assert store.recent_owners(10 * US) == []  # no slot rows: sharing no longer needs them


# -- recent owners (kept for callers; sharing reads the live replicas) ---------


def test_recent_owners_are_the_holders_of_recent_slot_rows_in_one_round_trip(
    backend: Backend,
) -> None:
    store = backend.ready()
    store.register(["a", "b", "c"])
    assert store.recent_owners(10 * US) == []
    now = store.ping()
    old = now - 60 * US
    store.claim("old-replica", [SlotKey("a", old)], LONG_LEASE)
    [won] = store.claim("r2", [SlotKey("b", now - US)], LONG_LEASE)
    store.confirm("r2", [won])
    store.claim("r1", [SlotKey("c", now), SlotKey("a", now)], LONG_LEASE)
    before = round_trips(store)
    assert store.recent_owners(10 * US) == ["r1", "r2"]
    assert round_trips(store) - before == 1
    assert store.recent_owners(120 * US) == ["old-replica", "r1", "r2"]
