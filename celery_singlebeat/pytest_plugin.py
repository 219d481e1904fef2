"""pytest fixtures for testing your own ``beat_schedule`` and SingletonTasks.

Registered through the ``pytest11`` entry point, so installing
celery-singlebeat makes them available in every project; see
``docs/testing.md``. Loading this module imports pytest only: Celery, kombu,
SQLAlchemy and the scheduler are imported by the fixtures that need them, when
a test asks for one, so a project that never uses them pays nothing.

* ``singlebeat_app``: your Celery app, from ``@pytest.mark.singlebeat(app=...)``,
  the ``singlebeat_app`` ini option (``module:attribute``), or your own fixture
  of that name;
* ``singlebeat_clock``, ``singlebeat_store``: a FakeClock and a MemoryStore on it;
* ``singlebeat_fleet(replicas, ...)``: N replicas of the app on them
  (:class:`celery_singlebeat.testing.simulation.Fleet`), closed after the test;
* ``singlebeat_simulate(start, end, replicas, events=...)``: which runs the
  schedule sends (:func:`celery_singlebeat.testing.simulation.simulate`);
* ``singlebeat_worker(app)``: an in-process worker whose SingletonTasks use a
  MemoryStore (with pytest-celery's ``celery_app``, or any app).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Callable

import pytest

if TYPE_CHECKING:
    from datetime import datetime, timedelta

    from .testing.clock import FakeClock
    from .testing.memory import MemoryStore
    from .testing.simulation import Event, Fleet, Simulation

MARKER = "singlebeat"
INI_APP = "singlebeat_app"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini(
        INI_APP,
        "the Celery app the singlebeat_* fixtures test, as module:attribute (e.g. proj.celery:app)",
        default=None,
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{MARKER}(app=None, start=None): the Celery app (an object or 'module:attribute') "
        "and the start instant (an aware datetime) of the singlebeat_* fixtures",
    )


def _marker_kwargs(request: pytest.FixtureRequest) -> dict[str, Any]:
    # the closest marker wins per argument: a test's start, its module's app
    out: dict[str, Any] = {}
    for mark in reversed(list(request.node.iter_markers(MARKER))):
        out.update(mark.kwargs)
    unknown = sorted(set(out) - {"app", "start"})
    if unknown:
        raise pytest.UsageError(
            f"@pytest.mark.{MARKER}({', '.join(unknown)}=...): unknown argument(s); "
            "expected app and start"
        )
    return out


def _load_app(spec: str, source: str) -> Any:
    from importlib import import_module

    module_name, _, attribute = spec.partition(":")
    try:
        module = import_module(module_name)
    except ImportError as exc:
        raise pytest.UsageError(
            f"{source} = {spec!r}: cannot import {module_name!r}: {exc}"
        ) from None
    names = [attribute] if attribute else ["app", "celery"]
    for name in names:
        app = getattr(module, name, None)
        if app is not None:
            return app
    raise pytest.UsageError(
        f"{source} = {spec!r}: module {module_name!r} has no attribute "
        f"{' or '.join(repr(n) for n in names)} (expected module:attribute)"
    )


@pytest.fixture
def singlebeat_app(request: pytest.FixtureRequest) -> Any:
    """Your Celery app: ``@pytest.mark.singlebeat(app=...)``, else the
    ``singlebeat_app`` ini option; override this fixture to build it yourself."""
    app = _marker_kwargs(request).get("app")
    if isinstance(app, str):
        return _load_app(app, f"@pytest.mark.{MARKER}(app=...)")
    if app is not None:
        return app
    spec = request.config.getini(INI_APP)
    if spec:
        return _load_app(str(spec), f"ini option {INI_APP}")
    raise pytest.UsageError(
        "the singlebeat_* fixtures need your Celery app: set the ini option "
        f"{INI_APP} = proj.celery:app, mark the test @pytest.mark.{MARKER}(app=...), "
        "or define a fixture named singlebeat_app"
    )


@pytest.fixture
def singlebeat_clock(request: pytest.FixtureRequest) -> FakeClock:
    """A :class:`~celery_singlebeat.testing.FakeClock`, at the marker's ``start``
    (default 2024-01-10 12:00 UTC); it moves only when the test moves it."""
    from .testing.clock import DEFAULT_START, FakeClock

    start = _marker_kwargs(request).get("start") or DEFAULT_START
    if start.utcoffset() is None:
        raise pytest.UsageError(
            f"@pytest.mark.{MARKER}(start={start!r}): expected an aware datetime"
        )
    return FakeClock(start)


@pytest.fixture
def singlebeat_store(singlebeat_clock: FakeClock) -> MemoryStore:
    """A :class:`~celery_singlebeat.testing.MemoryStore` on ``singlebeat_clock``:
    the "database" the fleet fixtures share; look at its rows afterwards."""
    from .testing.memory import MemoryStore

    return MemoryStore(now_us=singlebeat_clock)


@pytest.fixture
def singlebeat_fleet(
    request: pytest.FixtureRequest, singlebeat_clock: FakeClock, singlebeat_store: MemoryStore
) -> Iterator[Callable[..., Fleet]]:
    """``singlebeat_fleet(replicas=1, *, app=None, seed=0)``: a
    :class:`~celery_singlebeat.testing.simulation.Fleet` of ``app`` (default:
    ``singlebeat_app``) on ``singlebeat_clock`` and ``singlebeat_store``."""
    from .testing.simulation import Fleet

    opened: list[Fleet] = []

    def build(replicas: int = 1, *, app: Any = None, seed: int = 0) -> Fleet:
        if opened:
            raise RuntimeError("singlebeat_fleet: one fleet per test (it owns the clock)")
        fleet = Fleet(
            app if app is not None else request.getfixturevalue("singlebeat_app"),
            replicas,
            clock=singlebeat_clock,
            store=singlebeat_store,
            seed=seed,
        )
        opened.append(fleet)
        return fleet

    yield build
    for fleet in opened:
        fleet.close()


@pytest.fixture
def singlebeat_simulate(
    request: pytest.FixtureRequest, singlebeat_clock: FakeClock, singlebeat_store: MemoryStore
) -> Callable[..., Simulation]:
    """``singlebeat_simulate(start, end, replicas=1, *, events=(), app=None,
    settle=None, seed=0)``: :func:`~celery_singlebeat.testing.simulation.simulate` on
    ``singlebeat_clock`` and ``singlebeat_store``."""

    def run(
        start: datetime,
        end: datetime,
        replicas: int = 1,
        *,
        events: tuple[Event, ...] | list[Event] = (),
        app: Any = None,
        settle: timedelta | None = None,
        seed: int = 0,
    ) -> Simulation:
        from .testing.simulation import simulate

        return simulate(
            app if app is not None else request.getfixturevalue("singlebeat_app"),
            start,
            end,
            replicas,
            events=events,
            settle=settle,
            seed=seed,
            clock=singlebeat_clock,
            store=singlebeat_store,
        )

    return run


class SingletonWorker:
    """An in-process worker of ``app`` and the MemoryStore its SingletonTasks use."""

    def __init__(self, app: Any, store: MemoryStore, controller: Any) -> None:
        self.app = app
        #: the leases and run rows (``store.run_rows()``) the worker wrote
        self.store = store
        #: Celery's WorkController, running in a thread
        self.controller = controller


@pytest.fixture
def singlebeat_worker() -> Iterator[Callable[..., SingletonWorker]]:
    """``singlebeat_worker(app, *, pool="threads", concurrency=2, store=None)``:
    start an in-process worker (Celery's ``start_worker``) whose SingletonTasks
    keep their leases and run rows in ``store`` (default: a new MemoryStore on
    the real clock). Register the tasks first: a worker knows the tasks its app
    had when it started. Stopped, and the app's singleton store forgotten, after
    the test."""
    from contextlib import ExitStack

    stack = ExitStack()
    apps: list[Any] = []

    def start(
        app: Any,
        *,
        pool: str = "threads",
        concurrency: int = 2,
        store: MemoryStore | None = None,
        **worker_options: Any,
    ) -> SingletonWorker:
        from celery.contrib.testing.worker import start_worker

        from .singleton.runtime import set_store
        from .testing.memory import MemoryStore

        store = store if store is not None else MemoryStore()
        store.prepare(create=True)
        set_store(app, store)
        apps.append(app)
        controller = stack.enter_context(
            start_worker(
                app,
                pool=pool,
                concurrency=concurrency,
                perform_ping_check=False,
                **worker_options,
            )
        )
        return SingletonWorker(app, store, controller)

    yield start
    try:
        stack.close()
    finally:
        if apps:
            from .singleton.runtime import forget

            for app in apps:
                forget(app)
