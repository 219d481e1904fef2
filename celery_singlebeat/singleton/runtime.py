"""What a worker process needs to run SingletonTasks: settings, a store, an id.

One of each per Celery app per process, made on first use. Prefork children
inherit the parent's objects through fork; a connection pool must never be
shared across processes, so a child that finds objects made under another
pid drops them (without closing the parent's sockets) and makes its own.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import weakref
from typing import Any

from ..config import Settings, default_replica_id
from ..observe.observers import for_worker
from ..observe.telemetry import SingletonTelemetry
from ..store.singleton_store import SingletonStore
from ..timeline.clock import US
from .heartbeat import heartbeat
from .writeback import PING_S, WriteBack

logger = logging.getLogger("celery_singlebeat.singleton")

#: How often one worker process offers to prune old run and key rows.
PRUNE_EVERY = 600.0
#: The fleet-wide turn in the database: at most one prune per hour among every
#: worker process sharing the database, whoever offers.
PRUNE_TURN_US = 3600 * US


class Runtime:
    """Settings, store and owner id of one app in this process."""

    def __init__(self, app: Any) -> None:
        self.settings = Settings.from_conf(app.conf)
        #: SingletonTask's metrics in this process (observers.for_worker)
        self.telemetry: SingletonTelemetry = for_worker(self.settings)
        self.owner = default_replica_id()
        self.pid = os.getpid()
        self._store: SingletonStore | None = None
        self._lock = threading.Lock()
        self._next_prune = 0.0
        window = self.settings.failover_window.total_seconds()
        #: the failover write-back of this process's run rows (None: turned off)
        self.writeback = WriteBack(window, self.owner, self.telemetry) if window > 0 else None

    def store(self) -> SingletonStore:
        """The store, schema checked (created when allowed) on first use.

        Raises StoreUnavailable while the database is down (nothing is cached
        then, so the next call tries again) and SchemaError when the tables
        are missing and may not be created."""
        with self._lock:
            if self._store is None:
                store = self._open()
                try:
                    store.prepare(self.settings.create_schema)
                except Exception:  # StoreUnavailable, SchemaError: nothing cached
                    store.close()
                    raise
                if self.writeback is not None:
                    # a reconnect raises ConnectionReplaced before the statement
                    # goes: a slot's start waits for the write-back first
                    store.stop_at_reconnect = True
                self._store = store
                logger.debug(
                    "singlebeat: singleton store %s ready (owner %s)",
                    self.settings.safe_url,
                    self.owner,
                )
            return self._store

    def _open(self) -> SingletonStore:
        from ..store.sql import SqlStore

        return SqlStore.from_settings(self.settings)

    def wrote_runs(self, store: SingletonStore) -> None:
        """This process wrote a run row: ping while it is remembered, so that
        a failover is met (and the row written back) even while idle."""
        writeback = self.writeback
        if writeback is not None:
            # keyed by the object the check holds: its id cannot be reused meanwhile
            heartbeat().watch(id(writeback), lambda: writeback.ping(store), PING_S)

    def prune_due(self) -> bool:
        """True at most once per PRUNE_EVERY in this process: time to offer a prune
        (the fleet-wide turn in the database decides whether it runs)."""
        now = time.monotonic()
        if now < self._next_prune:
            return False
        self._next_prune = now + PRUNE_EVERY
        return True

    def forget_after_fork(self) -> None:
        """Drop the parent's pool without touching its connections."""
        store, self._store = self._store, None
        engine = getattr(store, "engine", None)
        if engine is not None:
            engine.dispose(close=False)


# Keyed by the app object itself, weakly: an id() key outlives its app, and a
# later app given the same address would inherit the dead one's settings.
_runtimes: weakref.WeakKeyDictionary[Any, Runtime] = weakref.WeakKeyDictionary()
_guard = threading.Lock()


def runtime_for(app: Any) -> Runtime:
    """This process's runtime for ``app``; ConfigurationError for bad settings."""
    with _guard:
        runtime = _runtimes.get(app)
        if runtime is None or runtime.pid != os.getpid():
            if runtime is not None:
                runtime.forget_after_fork()
            runtime = _runtimes[app] = Runtime(app)
        return runtime


def set_store(app: Any, store: SingletonStore) -> None:
    """Use ``store`` for ``app``'s SingletonTasks in this process (tests)."""
    runtime = runtime_for(app)
    with runtime._lock:
        runtime._store = store


def forget(app: Any) -> None:
    """Drop ``app``'s runtime in this process and close its store (tests and
    benchmarks that make many apps: a collected app's runtime goes by itself,
    but its pooled connections only when the collector gets to them)."""
    with _guard:
        runtime = _runtimes.pop(app, None)
    if runtime is not None:
        with runtime._lock:
            store, runtime._store = runtime._store, None
        if store is not None:
            store.close()
