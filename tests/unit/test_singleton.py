"""SingletonTask in one process, on the in-memory store: options, keys, busy
policies, per-slot dedupe, the heartbeat and lost leases.

Executions go through Celery's tracer with ``apply()`` (the path a worker
takes, minus the broker); the real-worker behaviour (pools, SIGKILL, time
limits, acks_late, three beats) is in ``tests/acceptance/test_singleton_*``.
"""

from __future__ import annotations

import gc
import threading
import time
import weakref
from collections.abc import Iterator
from datetime import timedelta
from types import SimpleNamespace
from typing import Any, ClassVar

import celery
import pytest
from celery import Celery
from celery.exceptions import Reject, Retry
from kombu.exceptions import OperationalError

from celery_singlebeat import (
    ConfigurationError,
    LeaseLost,
    SingletonBusy,
    SingletonKeyError,
    SingletonTask,
    StoreUnavailable,
    signals,
)
from celery_singlebeat.singleton.heartbeat import heartbeat
from celery_singlebeat.singleton.keys import MAX_KEY_LENGTH, compute_key
from celery_singlebeat.singleton.runtime import (
    PRUNE_TURN_US,
    _runtimes,
    forget,
    runtime_for,
    set_store,
)
from celery_singlebeat.singleton.task import REPUBLISH_INTERVAL, _check_settings_at_start
from celery_singlebeat.store.base import Busy, Lease, Run, RunStatus, SlotKey
from celery_singlebeat.testing import FakeClock, MemoryStore
from celery_singlebeat.timeline.clock import US
from celery_singlebeat.timeline.slots import SLOT_HEADER, slot_header, slot_task_id

SLOT_US = 1_700_000_000_000_000

#: Celery 5.2's apply() differs from 5.3's where these tests look: it cannot
#: record an exception raised in a task on Python 3.11+ (billiard 3.6's
#: ExceptionInfo has no co_positions), and on any Python an eager retry runs
#: inside the first call, whose result is then that first call's, not the
#: retried run's. Only the oldest-Celery runs (make test-compat, test-oldest)
#: skip these; the same behaviours run in real workers in
#: tests/acceptance/test_singleton_*.
eager_exceptions = pytest.mark.skipif(
    celery.VERSION < (5, 3),
    reason="Celery < 5.3's apply() neither records a task exception on Python 3.11+ "
    "nor returns an eager retry's result",
)


@pytest.fixture
def app() -> Celery:
    app = Celery(f"t{id(object())}", broker="memory://")
    app.conf.singlebeat_url = "sqlite:////nonexistent-dir/never-opened.sqlite"
    return app


@pytest.fixture
def store(app: Celery) -> MemoryStore:
    store = MemoryStore()
    store.prepare(create=True)
    set_store(app, store)
    return store


def wait_until(predicate: Any, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)


@pytest.fixture
def received() -> Iterator[list[tuple[str, dict[str, Any]]]]:
    """Every SingletonTask signal sent during the test."""
    got: list[tuple[str, dict[str, Any]]] = []
    handlers = {}
    for name in ("singleton_skipped", "singleton_duplicate", "singleton_lease_lost"):

        def handler(sender: Any = None, _name: str = name, **kw: Any) -> None:
            got.append((_name, kw))

        handlers[name] = handler
        getattr(signals, name).connect(handler, weak=False)
    yield got
    for name, handler in handlers.items():
        getattr(signals, name).disconnect(handler)


# -- definition ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("ttl", "message"),
    [
        (None, "needs a TTL"),
        (0, "must be positive"),
        (-5, "must be positive"),
        (0.5, "at least 1 second"),
        ("60", "expected a number of seconds or a timedelta"),
        (True, "expected a number of seconds or a timedelta"),
        (float("nan"), "not a usable number"),
    ],
)
def test_a_missing_or_unusable_ttl_fails_when_the_task_is_defined(
    app: Celery, ttl: Any, message: str
) -> None:
    options = {} if ttl is None else {"singleton_ttl": ttl}
    with pytest.raises(ConfigurationError, match=message) as caught:

        @app.task(shared=False, base=SingletonTask, name="proj.bad", **options)
        def bad() -> None: ...

        bad.name  # noqa: B018 - a lazy app makes the class on first access
    assert "proj.bad" in str(caught.value)
    assert "singleton_ttl" in str(caught.value)


def test_a_timedelta_ttl_and_an_inherited_ttl_are_accepted(app: Celery) -> None:
    class Base(SingletonTask):
        singleton_ttl = timedelta(seconds=30)

    @app.task(shared=False, base=Base, name="proj.inherits")
    def inherits() -> None: ...

    assert inherits._singleton_ttl_us == 30_000_000


def test_an_intermediate_base_class_needs_no_ttl_until_it_has_a_body() -> None:
    class Keyed(SingletonTask):
        singleton_key = "args"

    with pytest.raises(ConfigurationError, match="needs a TTL"):

        class Concrete(Keyed):
            def run(self) -> None: ...


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("singleton_key", 42, "singleton_key=42"),
        ("singleton_key", "kwargs", "singleton_key='kwargs'"),
        ("singleton_busy", "wait", "singleton_busy='wait'"),
        ("singleton_retry_delay", -1, "singleton_retry_delay=-1"),
        ("singleton_broker_patience", -1, "singleton_broker_patience=-1"),
        ("singleton_broker_patience", "5", "singleton_broker_patience='5'"),
    ],
)
def test_bad_options_fail_when_the_task_is_defined(
    app: Celery, option: str, value: Any, message: str
) -> None:
    with pytest.raises(ConfigurationError, match=message):

        @app.task(
            shared=False, base=SingletonTask, singleton_ttl=10, name="proj.opt", **{option: value}
        )
        def opt() -> None: ...

        opt.name  # noqa: B018


# -- keys ---------------------------------------------------------------------


def test_keys_by_name_by_arguments_and_by_function() -> None:
    assert compute_key("proj.t", None, (1,), {}) == "proj.t"
    by_args = compute_key("proj.t", "args", (1, "a"), {"y": 2, "x": 1})
    assert by_args == compute_key("proj.t", "args", [1, "a"], {"x": 1, "y": 2})
    assert by_args != compute_key("proj.t", "args", (2, "a"), {"x": 1, "y": 2})
    assert compute_key("proj.t", lambda a, k: f"acct:{k['a']}", (), {"a": 7}) == "acct:7"


def test_a_long_key_is_shortened_to_the_column_and_stays_distinct() -> None:
    one = compute_key("proj.t", "args", ("x" * 1000,), {})
    two = compute_key("proj.t", "args", ("x" * 999 + "y",), {})
    assert len(one) <= MAX_KEY_LENGTH and len(two) <= MAX_KEY_LENGTH
    assert one != two and one.startswith("proj.t:")


@eager_exceptions
def test_a_key_function_that_raises_or_returns_a_non_string_fails_in_the_caller(
    app: Celery, store: MemoryStore
) -> None:
    @app.task(
        shared=False,
        base=SingletonTask,
        singleton_ttl=10,
        name="proj.keyed",
        singleton_key=lambda args, kwargs: kwargs["account"],
    )
    def keyed(account: Any = None) -> None: ...

    with pytest.raises(SingletonKeyError, match="raised KeyError"):
        keyed.apply_async(kwargs={})
    with pytest.raises(SingletonKeyError, match="returned 5"):
        keyed.apply_async(kwargs={"account": 5})
    with pytest.raises(SingletonKeyError, match="returned ''"):
        keyed.apply_async(kwargs={"account": ""})
    # and in the worker, for messages sent by name
    result = keyed.apply(kwargs={"account": 5})
    assert result.state == "FAILURE"
    assert isinstance(result.result, SingletonKeyError)


def test_a_static_key_function_on_a_subclass(app: Celery, store: MemoryStore) -> None:
    class Sync(SingletonTask):
        singleton_ttl = 10
        singleton_key = staticmethod(lambda args, kwargs: f"sync:{kwargs['account']}")

    @app.task(shared=False, base=Sync, bind=True, name="proj.sync")
    def sync(self: Any, account: str) -> str:
        return str(self.singleton.key)

    assert sync.apply(kwargs={"account": "a1"}).get() == "sync:a1"


# -- executions -----------------------------------------------------------------


def singleton_task(app: Celery, name: str, **options: Any) -> Any:
    """``@app.task`` for a bound SingletonTask named ``name`` (TTL 10 s unless
    given); ``shared=False`` keeps it out of the other tests' apps."""
    return app.task(
        shared=False, base=SingletonTask, bind=True, name=name, **{"singleton_ttl": 10, **options}
    )


def make_hold(app: Celery, **options: Any) -> Any:
    """A task that records what it saw and runs ``body`` if given."""

    @singleton_task(app, "proj.hold", **options)
    def hold(self: Any, body: Any = None) -> Any:
        seen = {"key": self.singleton.key, "token": self.singleton.token}
        if body is not None:
            body(self)
        return seen

    return hold


def test_an_execution_holds_the_key_and_releases_it_at_the_end(
    app: Celery, store: MemoryStore
) -> None:
    during: list[Any] = []
    hold = make_hold(app)
    first = hold.apply(args=(lambda t: during.append(store.acquire_lease("proj.hold", "x", 1)),))
    assert first.state == "SUCCESS"
    assert isinstance(during[0], Busy)
    after = store.acquire_lease("proj.hold", "other", 1_000_000)
    assert isinstance(after, Lease) and after.token > first.get()["token"]
    store.release_lease(after)
    second = hold.apply()
    assert second.get()["token"] > after.token


def test_a_direct_call_holds_no_lease(app: Celery, store: MemoryStore) -> None:
    @singleton_task(app, "proj.direct")
    def direct(self: Any) -> str:
        with pytest.raises(RuntimeError, match="direct call holds no lease"):
            self.singleton  # noqa: B018
        return "ran"

    holder = store.acquire_lease("proj.direct", "other", 60_000_000)
    assert isinstance(holder, Lease)
    assert direct() == "ran"


def test_busy_skip_succeeds_with_none_and_says_so(
    app: Celery, store: MemoryStore, received: list[Any], caplog: pytest.LogCaptureFixture
) -> None:
    ran: list[int] = []
    hold = make_hold(app)
    store.acquire_lease("proj.hold", "host:1:abc", 60_000_000)
    caplog.set_level("INFO", "celery_singlebeat.singleton")
    result = hold.apply(args=(lambda t: ran.append(1),))
    assert (result.state, result.result, ran) == ("SUCCESS", None, [])
    assert "held by host:1:abc" in caplog.text and "skipped" in caplog.text
    assert [name for name, _ in received] == ["singleton_skipped"]
    assert received[0][1]["holder"] == "host:1:abc"


@eager_exceptions
def test_busy_raise_fails_with_singleton_busy(app: Celery, store: MemoryStore) -> None:
    hold = make_hold(app, singleton_busy="raise")
    store.acquire_lease("proj.hold", "host:1:abc", 60_000_000)
    result = hold.apply()
    assert result.state == "FAILURE"
    assert isinstance(result.result, SingletonBusy)
    assert result.result.holder == "host:1:abc"


@eager_exceptions
def test_busy_retry_retries_then_fails_with_singleton_busy(app: Celery, store: MemoryStore) -> None:
    attempts: list[int] = []

    @singleton_task(app, "proj.retrying", singleton_busy="retry", max_retries=2)
    def retrying(self: Any) -> None:
        attempts.append(1)

    store.acquire_lease("proj.retrying", "host:1:abc", 60_000_000)
    result = retrying.apply()
    assert result.state == "FAILURE"
    assert isinstance(result.result, SingletonBusy)
    assert attempts == []


@eager_exceptions
def test_busy_retry_runs_once_the_key_is_free(app: Celery, store: MemoryStore) -> None:
    @singleton_task(app, "proj.retrying", singleton_busy="retry", max_retries=5)
    def retrying(self: Any) -> int:
        return int(self.request.retries)

    holder = store.acquire_lease("proj.retrying", "host:1:abc", 60_000_000)
    assert isinstance(holder, Lease)
    original = store.acquire_lease

    def release_on_second_try(key: str, owner: str, ttl_us: int) -> Any:
        got = original(key, owner, ttl_us)
        store.release_lease(holder)
        return got

    store.acquire_lease = release_on_second_try  # type: ignore[method-assign]
    assert retrying.apply().get() == 1


class BrokerDown(SingletonTask):  # type: ignore[misc]
    """A SingletonTask whose first ``failures`` publishes fail as kombu's do when
    the broker refuses the connection; ``published`` holds each try's countdown.
    (No body: a base for the tests' tasks.)"""

    failures = 0
    published: ClassVar[list[Any]] = []

    def apply_async(self, args: Any = None, kwargs: Any = None, *rest: Any, **options: Any) -> Any:
        self.published.append(options.get("countdown"))
        if len(self.published) <= self.failures:
            raise OperationalError("Error 111 connecting to 127.0.0.1:6379. Connection refused.")
        return super().apply_async(args, kwargs, *rest, **options)


def busy_in_a_worker(app: Celery, store: MemoryStore, failures: int, **options: Any) -> Any:
    """A call of a busy-retry task (delay 30 s) as a worker makes it, not
    eagerly: its retry is a message published through ``BrokerDown``."""

    class Flaky(BrokerDown):  # type: ignore[misc]
        published: ClassVar[list[Any]] = []

    Flaky.failures = failures

    @app.task(
        shared=False,
        base=Flaky,
        bind=True,
        name="proj.flaky",
        singleton_ttl=10,
        singleton_busy="retry",
        singleton_retry_delay=30,
        **options,
    )
    def flaky(self: Any) -> None:
        raise AssertionError("ran while its key was held")

    store.acquire_lease("proj.flaky", "host:1:abc", 60_000_000)
    flaky.push_request(
        id="t-flaky", args=(), kwargs={}, retries=0, called_directly=False, is_eager=False
    )
    return flaky


def test_a_retry_the_broker_refuses_is_published_again_not_dropped(
    app: Celery, store: MemoryStore, caplog: pytest.LogCaptureFixture
) -> None:
    """Celery's retry turns a failed publish into Reject(requeue=False), which
    drops the message (acked when the worker took it). SingletonTask publishes
    the retry again a second later, its countdown shortened by the wait."""
    caplog.set_level("INFO", "celery_singlebeat.singleton")
    flaky = busy_in_a_worker(app, store, failures=1)
    try:
        with pytest.raises(Retry):
            flaky()
    finally:
        flaky.pop_request()
    first, second = flaky.published
    assert first == 30 and 30 - REPUBLISH_INTERVAL - 0.5 < second <= 30 - REPUBLISH_INTERVAL
    [warned] = [r for r in caplog.records if getattr(r, "decision", None) == "retry_unpublished"]
    assert warned.levelname == "WARNING" and "Connection refused" in warned.getMessage()
    assert "the retry was published after 2 attempts" in caplog.text
    assert not [r for r in caplog.records if getattr(r, "decision", None) == "retry_dropped"]


def test_a_retry_the_broker_refuses_past_the_patience_is_dropped_as_celery_drops_it(
    app: Celery, store: MemoryStore, caplog: pytest.LogCaptureFixture
) -> None:
    """``singleton_broker_patience=0``: Celery's Reject(requeue=False) at the
    first failure, logged at ERROR as a dropped call."""
    flaky = busy_in_a_worker(app, store, failures=5, singleton_broker_patience=0)
    try:
        with pytest.raises(Reject) as rejected:
            flaky()
    finally:
        flaky.pop_request()
    assert rejected.value.requeue is False
    assert isinstance(rejected.value.reason, OperationalError)
    assert len(flaky.published) == 1
    [dropped] = [r for r in caplog.records if getattr(r, "decision", None) == "retry_dropped"]
    assert dropped.levelname == "ERROR"
    assert "the call is dropped" in dropped.getMessage()


def test_a_reject_that_is_no_failed_publish_is_not_retried(app: Celery, store: MemoryStore) -> None:
    """A Reject the caller passes as ``exc`` and Celery raises (retries used
    up) goes through at once: only a failed publish is tried again."""
    flaky = busy_in_a_worker(app, store, failures=0, max_retries=0)
    flaky.request.retries = 1
    mine = Reject("mine", requeue=False)
    try:
        with pytest.raises(Reject) as raised:
            flaky.retry(exc=mine, countdown=1)
    finally:
        flaky.pop_request()
    assert raised.value is mine and flaky.published == []


@eager_exceptions
def test_a_failing_body_releases_the_key(app: Celery, store: MemoryStore) -> None:
    def boom(task: Any) -> None:
        raise ValueError("boom")

    hold = make_hold(app)
    assert hold.apply(args=(boom,)).state == "FAILURE"
    assert isinstance(store.acquire_lease("proj.hold", "other", 1_000_000), Lease)


# -- slots ----------------------------------------------------------------------


def slot_apply(task: Any, *args: Any, slot_us: int = SLOT_US) -> Any:
    return task.apply(
        args=args,
        task_id=slot_task_id("every-minute", slot_us),
        headers={SLOT_HEADER: slot_header("every-minute", slot_us)},
    )


def test_a_slot_delivered_twice_executes_once(
    app: Celery, store: MemoryStore, received: list[Any]
) -> None:
    runs: list[Any] = []
    hold = make_hold(app)
    first = slot_apply(hold, lambda t: runs.append(t.singleton.slot))
    second = slot_apply(hold, lambda t: runs.append(t.singleton.slot))
    assert first.state == "SUCCESS"
    assert second.state == "IGNORED"  # no result stored over the first one's
    assert len(runs) == 1 and runs[0].entry == "every-minute" and runs[0].slot_us == SLOT_US
    row = store.run_rows()[SlotKey("every-minute", SLOT_US)]
    assert (row["state"], row["outcome"], row["repeats"]) == (1, "success", 1)
    assert [(n, kw["status"]) for n, kw in received] == [("singleton_duplicate", "finished")]
    # another slot of the same entry is a different run
    assert slot_apply(hold, slot_us=SLOT_US + 60_000_000).state == "SUCCESS"


def test_a_slot_running_elsewhere_is_dropped_not_skipped(
    app: Celery, store: MemoryStore, received: list[Any]
) -> None:
    store.begin_run(Run("every-minute", SLOT_US, "elsewhere"), "w2", "tid", 60_000_000)
    hold = make_hold(app)
    assert slot_apply(hold).state == "IGNORED"
    assert [(n, kw["status"]) for n, kw in received] == [("singleton_duplicate", "running")]


def test_a_skipped_slot_is_not_run_by_a_later_repeat(app: Celery, store: MemoryStore) -> None:
    hold = make_hold(app)
    holder = store.acquire_lease("proj.hold", "manual", 60_000_000)
    assert slot_apply(hold).state == "SUCCESS"  # skipped: the key was busy
    assert isinstance(holder, Lease) and store.release_lease(holder)
    assert slot_apply(hold).state == "IGNORED"
    assert store.run_rows()[SlotKey("every-minute", SLOT_US)]["outcome"] == "skipped"


@eager_exceptions
def test_self_retry_releases_the_key_and_lets_the_retry_run_the_slot(
    app: Celery, store: MemoryStore
) -> None:
    tokens: list[int] = []
    free_between: list[bool] = []

    @singleton_task(app, "proj.flaky", max_retries=3)
    def flaky(self: Any) -> int:
        tokens.append(self.singleton.token)
        if self.request.retries == 0:
            raise self.retry(countdown=0)
        return len(tokens)

    original = store.begin_run

    def watch(run: Run, owner: str, task_id: str, ttl_us: int) -> Any:
        if tokens:  # the retry: the first attempt's lease must be gone
            probe = store.acquire_lease("proj.flaky", "probe", 1)
            free_between.append(isinstance(probe, Lease))
            if isinstance(probe, Lease):
                store.release_lease(probe)
        return original(run, owner, task_id, ttl_us)

    store.begin_run = watch  # type: ignore[method-assign]
    result = slot_apply(flaky)
    assert result.get() == 2
    assert free_between == [True]
    assert tokens[1] > tokens[0]
    row = store.run_rows()[SlotKey("every-minute", SLOT_US)]
    assert (row["state"], row["outcome"], row["attempts"]) == (1, "success", 2)


def test_a_worker_process_offers_a_prune_once_per_period_and_logs_what_went(
    app: Celery, caplog: pytest.LogCaptureFixture
) -> None:
    """Each process offers at its first execution, then once per PRUNE_EVERY
    (monotonic); the fleet's turn in the database (PRUNE_TURN_US, on the
    store's clock) decides; rows finished more than singlebeat_run_retention
    ago go, and a process that deleted rows says so at INFO."""
    clock = FakeClock()
    store = MemoryStore(now_us=clock)
    store.prepare(create=True)
    app.conf.singlebeat_run_retention = 3600
    set_store(app, store)
    answers: list[int | None] = []
    prune = store.prune_singletons

    def counted(retention_us: int, every_us: int) -> int | None:
        assert (retention_us, every_us) == (3600 * US, PRUNE_TURN_US)
        answers.append(prune(retention_us, every_us))
        return answers[-1]

    store.prune_singletons = counted  # type: ignore[method-assign]
    caplog.set_level("INFO", "celery_singlebeat.singleton")
    hold = make_hold(app)
    hour = timedelta(hours=1)

    def execute(slot_us: int) -> str:
        state = str(slot_apply(hold, slot_us=slot_us).state)
        # a prune offered at the end runs on the heartbeat thread: let it finish
        wait_until(lambda: not heartbeat()._pending)
        return state

    assert execute(SLOT_US) == "SUCCESS"
    assert answers == [0]  # the first execution of the process offers; nothing is old yet
    clock.advance(2 * hour)
    assert execute(SLOT_US + 1) == "SUCCESS"
    assert answers == [0]  # within PRUNE_EVERY of the last offer: none
    runtime_for(app)._next_prune = 0.0  # PRUNE_EVERY has passed on the monotonic clock
    assert execute(SLOT_US + 2) == "SUCCESS"
    assert answers == [0, 1]  # the fleet's turn came round after an hour: SLOT_US went
    assert set(store.run_rows()) == {SlotKey("every-minute", SLOT_US + s) for s in (1, 2)}
    pruned = [r.getMessage() for r in caplog.records if "pruned" in r.getMessage()]
    assert pruned == ["singlebeat: pruned 1 SingletonTask run and key rows older than 1:00:00"]
    # the pruned slot runs again when it is delivered again; a kept one does not
    assert slot_apply(hold, slot_us=SLOT_US).state == "SUCCESS"
    assert slot_apply(hold, slot_us=SLOT_US + 1).state == "IGNORED"
    clock.advance(hour / 2)
    runtime_for(app)._next_prune = 0.0
    assert execute(SLOT_US + 3) == "SUCCESS"
    assert answers == [0, 1, None]  # offered, but not the fleet's turn: nothing logged
    assert len([r for r in caplog.records if "pruned" in r.getMessage()]) == 1


# -- heartbeat and lost leases ---------------------------------------------------


def test_a_run_longer_than_its_ttl_keeps_its_lease(app: Celery, store: MemoryStore) -> None:
    seen: list[Any] = []

    def long_body(task: Any) -> None:
        deadline = time.monotonic() + 2.5  # 2.5 x the TTL
        while time.monotonic() < deadline:
            seen.append(store.acquire_lease("proj.hold", "other", 1_000_000))
            time.sleep(0.1)
        seen.append(task.singleton.lost)

    hold = make_hold(app, singleton_ttl=1)
    result = slot_apply(hold, long_body)
    assert result.state == "SUCCESS"
    assert seen[-1] is False
    assert all(isinstance(x, Busy) for x in seen[:-1]) and len(seen) > 15
    assert store.run_rows()[SlotKey("every-minute", SLOT_US)]["attempts"] == 1


def test_a_lease_taken_over_is_reported_lost(
    app: Celery, store: MemoryStore, received: list[Any]
) -> None:
    outcome: dict[str, Any] = {}

    def stolen(task: Any) -> None:
        singleton = task.singleton
        # what a takeover after an expiry looks like: the row passes to another token
        with store.state.lock:
            store.state.leases["proj.hold"].expires_us = 0
        thief = store.acquire_lease("proj.hold", "thief", 60_000_000)
        assert isinstance(thief, Lease) and thief.token > singleton.token
        wait_until(lambda: singleton.lost, timeout=3)
        for method in (singleton.check, singleton.guard):
            with pytest.raises(LeaseLost, match="another execution took the key"):
                method()
        outcome["holds"] = singleton.holds()

    hold = make_hold(app, singleton_ttl=1)
    hold.apply(args=(stolen,)).get()
    assert outcome["holds"] is False
    assert [name for name, _ in received] == ["singleton_lease_lost"]
    # the thief's lease was not released by the loser's end
    assert isinstance(store.acquire_lease("proj.hold", "third", 1), Busy)


def test_guard_finds_a_lost_lease_before_the_heartbeat(app: Celery, store: MemoryStore) -> None:
    def stolen(task: Any) -> None:
        with store.state.lock:
            store.state.leases["proj.hold"].token += 1
        with pytest.raises(LeaseLost):
            task.singleton.guard()
        assert task.singleton.lost

    make_hold(app).apply(args=(stolen,)).get()


def test_an_unreachable_database_until_the_lease_ends_counts_as_lost(
    app: Celery, store: MemoryStore
) -> None:
    def outage(task: Any) -> None:
        store.available = False
        try:
            wait_until(lambda: task.singleton.lost, timeout=4)
        finally:
            store.available = True
        assert "unreachable" in (task.singleton.lost_reason or "")

    make_hold(app, singleton_ttl=1).apply(args=(outage,)).get()


# -- database outages ------------------------------------------------------------


@eager_exceptions
def test_an_unreachable_database_runs_nothing_and_retries(app: Celery, store: MemoryStore) -> None:
    ran: list[int] = []

    @singleton_task(app, "proj.down", max_retries=1)
    def down(self: Any) -> None:
        ran.append(1)

    store.available = False
    result = down.apply()
    assert result.state == "FAILURE"
    assert isinstance(result.result, StoreUnavailable)
    assert ran == []


def test_bookkeeping_lost_at_the_end_is_finished_when_the_database_returns(
    app: Celery, store: MemoryStore
) -> None:
    def cut(task: Any) -> None:
        store.available = False
        threading.Timer(0.3, setattr, (store, "available", True)).start()

    hold = make_hold(app)
    assert slot_apply(hold, cut).state == "SUCCESS"
    wait_until(lambda: store.run_rows()[SlotKey("every-minute", SLOT_US)]["state"] == 1, timeout=5)
    wait_until(lambda: isinstance(store.acquire_lease("proj.hold", "next", 1), Lease), timeout=5)


def test_a_worker_with_singleton_tasks_checks_the_settings_at_start(app: Celery) -> None:
    make_hold(app)
    app.conf.singlebeat_lease = 0
    # SystemExit: Celery's signal dispatch would swallow any Exception
    with pytest.raises(SystemExit, match="cannot start the worker: singlebeat_lease"):
        _check_settings_at_start(sender=SimpleNamespace(app=app))


def test_a_collected_apps_runtime_goes_with_it() -> None:
    # Keyed by id(), a dead app's runtime (settings, store) was handed to the
    # next app Python put at the same address: seen as a worker start check
    # that passed with singlebeat_lease = 0.
    app = Celery("gone", set_as_current=False)
    runtime = weakref.ref(runtime_for(app))
    assert runtime() is _runtimes[app]
    del app
    gc.collect()
    assert runtime() is None


def test_forgetting_an_app_closes_its_store_and_starts_afresh() -> None:
    app = Celery("forgotten", set_as_current=False)
    closed: list[int] = []
    store = MemoryStore()
    store.close = lambda: closed.append(1)  # type: ignore[method-assign]
    set_store(app, store)
    first = runtime_for(app)
    forget(app)
    assert closed == [1]
    assert app not in _runtimes
    assert runtime_for(app) is not first
    forget(Celery("never-used", set_as_current=False))  # nothing to drop: no error


def test_a_worker_without_singleton_tasks_is_not_checked(app: Celery) -> None:
    @app.task(shared=False, name="proj.plain")
    def plain() -> None: ...

    app.conf.singlebeat_lease = 0
    _check_settings_at_start(sender=SimpleNamespace(app=app))


def test_run_status_values_are_what_the_logs_say() -> None:
    assert {s.value for s in RunStatus} == {"started", "finished", "running"}
