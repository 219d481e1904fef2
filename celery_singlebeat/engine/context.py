"""What every step of one replica's engine shares: its settings, clocks,
store, hooks and counters.

One object, built by the engine and handed to each step, so that a step's
interface names only what is its own. The store is None until the first
connect and after :meth:`Engine.close`.
"""

from __future__ import annotations

from typing import Any

from ..config import Settings
from ..observe.telemetry import Telemetry
from ..store.base import Store
from ..timeline.timing import sweep_period_s
from .environment import Environment


class ReplicaContext:
    """The shared state of one replica's steps."""

    def __init__(
        self,
        settings: Settings,
        env: Environment,
        telemetry: Telemetry,
        signal_sender: Any,
    ) -> None:
        self.settings = settings
        self.replica_id = settings.replica_id
        self.env = env
        self.telemetry = telemetry
        #: the ``sender`` of the signals (signals.py): the Celery scheduler
        self.signal_sender = signal_sender
        self.store: Store | None = None
        #: how often this replica sweeps and writes its heartbeat (seconds)
        self.sweep_every = sweep_period_s(settings.lease.total_seconds())
        #: per-tick figures, read by benchmarks and tests.
        self.stats: dict[str, int] = {
            "claimed": 0,
            "lost": 0,
            "sent": 0,
            "taken_over": 0,
            "skipped": 0,
            "outages": 0,
            "paused": 0,
            "lost_writes": 0,
            "recovered": 0,
        }

    @property
    def connected_store(self) -> Store:
        """The store, for a step that runs only while connected."""
        store = self.store
        assert store is not None, "a step ran before the engine connected"
        return store
