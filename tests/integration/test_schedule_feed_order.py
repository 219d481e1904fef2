"""The stored-schedule feed under concurrent writers: revisions become visible
in revision order, so a follower that moves its cursor never skips a commit.

Two tests. On PostgreSQL and MariaDB, writer threads (each its own store,
some holding their transaction open a moment after the write) write while a
reader follows the feed: every answer continues the previous one (each
revision comes once, whole, after every lower one), and the reader's
cumulative view ends equal to the table. Then a Hypothesis model on SQLite
and memory: random steps of 2 or 3 writers (writes in their own transaction
or in one they hold open, so that a transaction begun earlier commits later,
and a write that waits for another's lock), a follower and a prune; after
each step, the follower's view equals the reference model at the cursor it
reports.
"""

from __future__ import annotations

import queue
import random
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from conftest import direct_engine, drop_tables
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st
from sqlalchemy.engine import Connection, Engine, make_url

from celery_singlebeat.exceptions import ScheduleExists, ScheduleNotFound
from celery_singlebeat.store.base import EDITABLE, ScheduleFeed, ScheduleRow, ScheduleWrite, Store
from celery_singlebeat.store.sql import SqlStore
from celery_singlebeat.testing import MemoryStore

BASE: dict[str, Any] = {
    "task": "tasks.t",
    "spec": '{"kind":"interval","every_us":1000000}',
    "args": "[]",
    "kwargs": "{}",
    "options": "{}",
    "enabled": True,
    "start_us": None,
    "end_us": None,
    "max_runs": None,
    "policy": None,
    "jitter_us": 0,
    "description": "",
    "managed_by": None,
}

View = dict[str, tuple[Any, ...]]


def editable(row: ScheduleRow) -> tuple[Any, ...]:
    return tuple(row[: len(EDITABLE)])


class Follower:
    """A replica's side: the rows it knows, kept by the feed from a cursor."""

    def __init__(self, store: Store) -> None:
        self.store = store
        rows, self.cursor = store.schedule_rows()
        self.view: View = {r.name: editable(r) for r in rows}
        self.reloads = 0

    def follow(self) -> ScheduleFeed:
        feed = self.store.schedule_feed(self.cursor)
        if not feed.complete:
            rows, self.cursor = self.store.schedule_rows()
            self.view = {r.name: editable(r) for r in rows}
            self.reloads += 1
            return feed
        for row in feed.rows:
            if row.deleted:
                self.view.pop(row.name, None)
            else:
                self.view[row.name] = editable(row)
        self.cursor = feed.revision
        return feed


# -- many writers, one follower, real databases ------------------------------------


@pytest.fixture(params=["postgres", "mysql"])
def server_url(request: pytest.FixtureRequest, table_prefix: str) -> Iterator[tuple[str, str]]:
    url = request.getfixturevalue("pg_url" if request.param == "postgres" else "mysql_url")
    yield url, table_prefix
    drop_tables(url, table_prefix)


def test_a_follower_of_concurrent_writers_sees_every_revision_in_order(
    server_url: tuple[str, str],
) -> None:
    url, prefix = server_url
    names = [f"e{i}" for i in range(12)]
    writers, batches = 4, 40
    stores = [SqlStore(make_url(url), table_prefix=prefix) for _ in range(writers + 1)]
    stores[0].prepare(create=True)
    engine = direct_engine(url, pool_size=writers)
    written: list[ScheduleRow] = []
    lock = threading.Lock()
    errors: list[BaseException] = []
    done = threading.Event()

    def write(index: int) -> None:
        rng = random.Random(index)
        store = stores[index]
        try:
            for n in range(batches):
                chosen = rng.sample(names, rng.randint(1, 3))
                batch = [
                    ScheduleWrite("delete", name)
                    if rng.random() < 0.25
                    else ScheduleWrite("replace", name, {**BASE, "description": f"{index}.{n}"})
                    for name in chosen
                ]
                try:
                    if rng.random() < 0.5:
                        rows = store.write_schedules(batch, f"w{index}")
                    else:
                        # in a transaction of the writer's own, held open a moment
                        with engine.connect() as conn:
                            tx = conn.begin()
                            rows = store.write_schedules(batch, f"w{index}", "", conn)
                            time.sleep(rng.uniform(0, 0.02))
                            tx.commit()
                except ScheduleNotFound:
                    continue  # a delete of a name already deleted: nothing written
                with lock:
                    written.extend(rows)
        except BaseException as exc:  # reported by the test
            errors.append(exc)

    follower = Follower(stores[writers])
    answers: list[list[ScheduleRow]] = []

    def follow() -> None:
        try:
            while True:
                finished = done.is_set()
                before = follower.cursor
                feed = follower.follow()
                assert feed.complete
                assert all(r.revision > before for r in feed.rows)
                answers.append(feed.rows)
                if finished:
                    return
                time.sleep(0.002)
        except BaseException as exc:  # reported by the test
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(i,)) for i in range(writers)]
    reader = threading.Thread(target=follow)
    reader.start()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    done.set()
    reader.join(60)
    try:
        assert not errors, errors
        # each answer continues the last: revisions only grow, across answers too
        seen = [r.revision for rows in answers for r in rows]
        assert seen == sorted(seen)
        # a revision comes whole, in one answer, as the batch wrote it
        by_revision: dict[int, set[str]] = {}
        for row in written:
            by_revision.setdefault(row.revision, set()).add(row.name)
        for rows in answers:
            for revision in {r.revision for r in rows}:
                assert {r.name for r in rows if r.revision == revision} <= by_revision[revision]
        # nothing skipped: the follower's view is the table's
        live, top = stores[0].schedule_rows()
        assert follower.view == {r.name: editable(r) for r in live}
        assert follower.cursor == top == stores[0].feed_versions()
        # the revisions handed out are dense but for batches that changed nothing
        assert len(by_revision) > writers * batches // 2
    finally:
        for store in stores:
            store.close()
        engine.dispose()


# -- the Hypothesis model: SQLite and memory ----------------------------------------

NAMES = ("a", "b", "c")

write_op = st.tuples(
    st.sampled_from(("create", "replace", "replace", "replace", "update", "delete", "delete")),
    st.sampled_from(NAMES),
    st.integers(0, 2),
)
#: (what, which writer, a batch's writes): writes weigh most, then the
#: transactions that hold the lock, then the follower and the prune
step = st.tuples(
    st.sampled_from(
        ["write"] * 5 + ["begin"] * 2 + ["commit"] * 2 + ["rollback"] + ["follow"] * 2 + ["prune"]
    ),
    st.integers(0, 2),
    st.lists(write_op, min_size=1, max_size=2),
)


def to_writes(ops: list[tuple[str, str, int]]) -> list[ScheduleWrite]:
    batch: dict[str, ScheduleWrite] = {}
    for op, name, value in ops:  # one write per name: the last one given
        if op == "delete":
            batch[name] = ScheduleWrite(op, name)
        elif op == "update":
            batch[name] = ScheduleWrite(op, name, {"jitter_us": value})
        else:
            batch[name] = ScheduleWrite(op, name, {**BASE, "description": str(value)})
    return list(batch.values())


def model_apply(state: View, writes: list[ScheduleWrite]) -> tuple[View, bool] | type[Exception]:
    """The reference: what a batch does to the live entries (editable fields),
    or the error that refuses it; and whether it changed anything."""
    after = dict(state)
    for write in writes:
        live = after.get(write.name)
        if write.op == "create" and live is not None:
            return ScheduleExists
        if write.op in ("update", "delete") and live is None:
            return ScheduleNotFound
        if write.op == "delete":
            del after[write.name]
            continue
        values = dict(zip(EDITABLE, live)) if live is not None else {"name": write.name}
        if write.op == "update":
            values.update(write.fields)
        else:
            values = {"name": write.name, **write.fields}
        after[write.name] = tuple(values[f] for f in EDITABLE)
    return after, after != state


@dataclass
class Writer:
    """One writer: its store, and on SQLite a thread of its own (a write may
    wait for another writer's lock) and a connection for the transaction it
    may hold open."""

    store: Store
    engine: Engine | None
    conn: Connection | None = None
    tx: Any = None
    #: the state its open transaction sees (committed + its own writes), and
    #: whether it wrote there (then it holds SQLite's write lock)
    pending: View | None = None
    wrote: list[int] = field(default_factory=list)
    jobs: queue.Queue[tuple[Callable[[], Any], queue.Queue[Any]]] = field(
        default_factory=queue.Queue
    )
    thread: threading.Thread | None = None

    def start(self) -> None:
        def serve() -> None:
            while True:
                job, answer = self.jobs.get()
                if job is None:  # type: ignore[comparison-overlap]
                    return
                try:
                    answer.put((True, job()))
                except BaseException as exc:  # handed to the test
                    answer.put((False, exc))

        self.thread = threading.Thread(target=serve, daemon=True)
        self.thread.start()

    def submit(self, job: Callable[[], Any]) -> queue.Queue[Any]:
        answer: queue.Queue[Any] = queue.Queue()
        self.jobs.put((job, answer))
        return answer

    def stop(self) -> None:
        if self.thread is not None:
            self.jobs.put((None, queue.Queue()))  # type: ignore[arg-type]
            self.thread.join(10)


def outcome(answer: queue.Queue[Any], timeout: float = 20.0) -> Any:
    """What a writer's job returned, or the exception it raised (an outcome too)."""
    _ok, value = answer.get(timeout=timeout)
    return value


class Run:
    """One Hypothesis example: writers, a follower and the reference model."""

    def __init__(self, kind: str, path: str, writers: int) -> None:
        self.kind = kind
        self.prefix = f"h{uuid.uuid4().hex[:8]}_"
        self.url = f"sqlite:///{path}"
        self.opened: list[SqlStore] = []
        self.engines: list[Engine] = []
        if kind == "memory":
            shared = MemoryStore()
            shared.prepare(create=True)
            self.writers = [Writer(shared, None) for _ in range(writers)]
            self.follower = Follower(shared)
        else:
            first = self._store()
            first.prepare(create=True)
            self.writers = []
            for _ in range(writers):
                engine = direct_engine(self.url)
                self.engines.append(engine)
                writer = Writer(self._store(), engine)
                writer.start()
                self.writers.append(writer)
            self.follower = Follower(self._store())
        #: committed live entries, and the committed states by revision
        self.state: View = {}
        self.history: list[tuple[int, View]] = [(0, {})]
        #: a write waiting for another writer's lock: (writer, writes, answer)
        self.blocked: tuple[Writer, list[ScheduleWrite], queue.Queue[Any]] | None = None

    def _store(self) -> SqlStore:
        store = SqlStore(make_url(self.url), table_prefix=self.prefix)
        self.opened.append(store)
        return store

    def close(self) -> None:
        holder = self.holder()
        if holder is not None:  # first: a write waiting for its lock then ends too
            holder.tx.rollback()
            holder.tx = None
        if self.blocked is not None:
            outcome(self.blocked[2])
        for writer in self.writers:
            if writer.tx is not None:
                writer.tx.rollback()
            if writer.conn is not None:
                writer.conn.close()
            writer.stop()
        for store in self.opened:
            store.close()
        for engine in self.engines:
            engine.dispose()

    # -- the model ------------------------------------------------------------

    def state_at(self, revision: int) -> View:
        return [view for rev, view in self.history if rev <= revision][-1]

    def commit_state(self, view: View, revisions: list[int]) -> None:
        """A commit made ``view`` visible, with the revisions of its batches."""
        if revisions:
            top = self.history[-1][0]
            # commit order is revision order: a commit never brings a revision
            # below one already visible
            assert min(revisions) > top, (revisions, top)
            self.history.append((max(revisions), view))
        self.state = view

    def holder(self) -> Writer | None:
        """The writer whose open transaction wrote (SQLite's write lock)."""
        return next((w for w in self.writers if w.wrote), None)

    def settle(self, writer: Writer, writes: list[ScheduleWrite], result: Any) -> None:
        """Check a write's outcome against the model, and record it."""
        seen = writer.pending if writer.pending is not None else self.state
        if writer.pending is not None and self.kind == "sqlite":
            # the write's first statement took the counter (and SQLite's write
            # lock) in the writer's transaction, whatever followed
            writer.wrote.append(-1)
        expected = model_apply(seen, writes)
        if isinstance(expected, type):
            assert isinstance(result, expected), (writes, result)
            return
        assert not isinstance(result, BaseException), (writes, result)
        view, changed = expected
        rows: list[ScheduleRow] = result
        assert [r.name for r in rows] == [w.name for w in writes]
        touched = {n for n in set(seen) | set(view) if seen.get(n) != view.get(n)}
        revisions = sorted({r.revision for r in rows if r.name in touched})
        assert len(revisions) == (1 if changed else 0), rows
        if writer.pending is not None:
            writer.pending = view
            writer.wrote.extend(revisions)
        else:
            self.commit_state(view, revisions)

    # -- the steps --------------------------------------------------------------

    def step(self, action: tuple[Any, ...]) -> None:
        what = action[0]
        if what == "follow":
            self.follow()
        elif what == "prune":
            if self.holder() is None and self.blocked is None:
                time.sleep(0.002)  # the newest tombstone is older than now, even on SQLite's ms
                self.follower.store.prune_schedules(0, 10**12)
        else:
            writer = self.writers[action[1] % len(self.writers)]
            if self.blocked is not None and self.blocked[0] is writer:
                return  # waiting: it can do nothing else
            if what == "write":
                self.write(writer, to_writes(action[2]))
            elif self.kind == "memory":
                return  # no transactions to hold open in memory
            elif what == "begin" and writer.conn is None:
                assert writer.engine is not None
                writer.conn = writer.engine.connect()
                writer.tx = writer.conn.begin()
                writer.pending = dict(self.state)
            elif what in ("commit", "rollback") and writer.conn is not None:
                self.end(writer, commit=what == "commit")

    def write(self, writer: Writer, writes: list[ScheduleWrite]) -> None:
        if self.kind == "memory":
            try:
                result: Any = writer.store.write_schedules(writes, "w")
            except (ScheduleExists, ScheduleNotFound) as exc:
                result = exc
            self.settle(writer, writes, result)
            return
        conn = writer.conn
        holder = self.holder()
        if holder is not None and holder is not writer and self.blocked is not None:
            return  # one waiting write at a time keeps the model's order known
        if writer.pending is not None and holder is None:
            # its transaction begun earlier sees what others committed since
            if writer.pending != self.state:
                event("a transaction begun earlier wrote after later commits")
            writer.pending = dict(self.state)
        answer = writer.submit(lambda: writer.store.write_schedules(writes, "w", "", conn))
        if holder is not None and holder is not writer:
            time.sleep(0.05)
            assert answer.empty(), "a write went through another writer's lock"
            self.blocked = (writer, writes, answer)
            event("a write waited for another writer's transaction")
            return
        self.settle(writer, writes, outcome(answer))

    def end(self, writer: Writer, commit: bool) -> None:
        assert writer.conn is not None
        held = writer is self.holder()
        if commit:
            writer.tx.commit()
            assert writer.pending is not None
            if writer.wrote:
                # it held the lock since its first write: nobody committed since
                self.commit_state(writer.pending, [r for r in writer.wrote if r > 0])
        else:
            writer.tx.rollback()
        writer.conn.close()
        writer.conn, writer.tx, writer.pending, writer.wrote = None, None, None, []
        if held and self.blocked is not None:
            # the lock is free: the write that waited for it goes through now
            waiting, writes, answer = self.blocked
            self.blocked = None
            if waiting.pending is not None:
                waiting.pending = dict(self.state)
            self.settle(waiting, writes, outcome(answer))

    def follow(self) -> None:
        reloads = self.follower.reloads
        self.follower.follow()
        if self.follower.reloads > reloads:
            event("the follower reloaded after a prune")
        # what the follower holds is the model at the cursor it reports, and
        # (nothing in flight being committed) the last committed revision
        assert self.follower.view == self.state_at(self.follower.cursor)
        assert self.follower.view == self.state
        assert self.follower.cursor == self.history[-1][0]


def check_model(kind: str, path: str, writers: int, steps: list[tuple[Any, ...]]) -> None:
    run = Run(kind, path, writers)
    try:
        for action in steps:
            run.step(action)
        # every transaction still open ends (the lock's holder first, which
        # lets a waiting write through); the follower then holds it all
        while run.holder() is not None:
            run.end(run.holder(), commit=True)  # type: ignore[arg-type]
        for writer in run.writers:
            if writer.conn is not None:
                run.end(writer, commit=True)
        run.follow()
    finally:
        run.close()


_SETTINGS = {
    "deadline": None,
    "suppress_health_check": [HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
}


_A = [("replace", "a", 1)]
_B = [("replace", "b", 1)]

#: the cases the model is for, always run: a transaction begun first that
#: commits last; a write waiting for another writer's transaction; a prune
#: that deletes a tombstone the follower has not read
_CASES = [
    [("begin", 0, _A), ("write", 1, _B), ("follow", 0, _A), ("write", 0, _A), ("follow", 0, _A),
     ("commit", 0, _A), ("follow", 0, _A)],
    [("begin", 0, _A), ("write", 0, _A), ("write", 1, _B), ("follow", 0, _A), ("commit", 0, _A),
     ("follow", 0, _A), ("begin", 1, _A), ("write", 1, [("delete", "b", 0)]),
     ("write", 0, [("delete", "a", 0)]), ("rollback", 1, _A), ("follow", 0, _A)],
    [("write", 0, _A + _B), ("follow", 0, _A), ("write", 1, [("delete", "a", 0)]),
     ("prune", 0, _A), ("follow", 0, _A), ("write", 1, [("delete", "b", 0)]), ("prune", 0, _A),
     ("follow", 0, _A)],
]  # fmt: skip


@settings(max_examples=60, **_SETTINGS)  # type: ignore[arg-type]
@given(writers=st.integers(2, 3), steps=st.lists(step, min_size=8, max_size=40))
@example(writers=2, steps=_CASES[0])
@example(writers=2, steps=_CASES[1])
@example(writers=3, steps=_CASES[2])
def test_the_sqlite_feed_follows_the_reference_model(
    tmp_path: Any, writers: int, steps: list[tuple[Any, ...]]
) -> None:
    check_model("sqlite", f"{tmp_path}/model.sqlite", writers, steps)


@settings(max_examples=300, **_SETTINGS)  # type: ignore[arg-type]
@given(writers=st.integers(2, 3), steps=st.lists(step, min_size=8, max_size=40))
@example(writers=3, steps=_CASES[2])
def test_the_memory_feed_follows_the_reference_model(
    writers: int, steps: list[tuple[Any, ...]]
) -> None:
    check_model("memory", "", writers, steps)
