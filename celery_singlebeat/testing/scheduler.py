"""The real scheduler on the in-memory store: replicas of your app without a database.

:class:`MemoryScheduler` is :class:`~celery_singlebeat.SingleBeatScheduler`
with one change, the store it opens: a
:class:`~celery_singlebeat.testing.MemoryStore`. Several schedulers given the
same store act as replicas sharing one database (the store's docstring shows
two of them sharing a slot), and entries besides ``beat_schedule`` come from
a :class:`~celery_singlebeat.testing.MemorySource` given as
``MemoryScheduler(app, store=store, sources=[source])``.

To run a real ``celery beat`` process against it (one process only, since
memory is not shared between processes), set
``beat_scheduler = "celery_singlebeat.testing.MemoryScheduler"``; put a store in
``app.conf.singlebeat_memory_store`` to choose it, otherwise each scheduler
gets a fresh one.
"""

from __future__ import annotations

from typing import Any

from ..config import read_setting
from ..engine import Environment
from ..observe.telemetry import NOTHING, Telemetry
from ..scheduler import SingleBeatScheduler
from ..store.base import Store
from .memory import MemoryStore

__all__ = ["FleetReplica", "MemoryScheduler"]


class MemoryScheduler(SingleBeatScheduler):
    """A :class:`~celery_singlebeat.SingleBeatScheduler` that coordinates through a
    :class:`~celery_singlebeat.testing.MemoryStore` instead of a SQL database.

    The store is the ``store`` argument, else ``app.conf.singlebeat_memory_store``,
    else a new private one. Schedulers given the same store act as replicas
    sharing one database. Everything else (settings, policies, publishing) is
    the real scheduler's; its log lines still name ``singlebeat_url``, which is
    never opened.
    """

    def __init__(
        self, app: Any, *args: Any, store: MemoryStore | None = None, **kwargs: Any
    ) -> None:
        configured = read_setting(app.conf, "singlebeat_memory_store")
        #: the store this scheduler coordinates through.
        self.memory_store: MemoryStore = store or configured or MemoryStore()
        super().__init__(app, *args, **kwargs)

    @property
    def info(self) -> str:
        """The banner line ``celery beat`` prints."""
        return f"    . singlebeat -> in-memory store\n    . replica -> {self.settings.replica_id}"

    def _open_store(self) -> Store:
        return self.memory_store


class FleetReplica(MemoryScheduler):
    """One of several real schedulers in one process (the simulation's and
    the explorer's fleets): its own store (or connection to a shared one),
    broker connection, replica id and environment, and no telemetry."""

    def __init__(
        self, app: Any, *, store: MemoryStore, connection: Any, name: str, env: Environment
    ) -> None:
        self._fleet_connection = connection
        # replica ids must differ between processes (docs/configuration.md); a
        # fixed id in the app's settings would make every simulated replica one
        super().__init__(app, store=store, env=env, replica_id=name)

    @property
    def connection(self) -> Any:
        return self._fleet_connection

    def _make_telemetry(self, lazy: bool) -> Telemetry:
        # No HTTP listener, status file or metrics: N replicas of an app that
        # sets singlebeat_http_port would each bind the port.
        return NOTHING
