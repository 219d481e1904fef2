"""The in-memory store, importable as ``celery_singlebeat.testing.memory`` as before.

Its code is in :mod:`.store` until it is split by contract; this package
keeps every name the module had at the import path the module had (the
pytest plugin and :mod:`..simulation` import from here).
"""

from __future__ import annotations

# the clock left for a module of its own (testing/clock.py); named here too,
# where the pytest plugin imports it from
from ..clock import DEFAULT_START, FakeClock
from .store import (
    MemoryScheduler,
    MemorySource,
    MemoryStore,
    SlotRow,
    send_slot,
)

__all__ = [
    "DEFAULT_START",
    "FakeClock",
    "MemoryScheduler",
    "MemorySource",
    "MemoryStore",
    "SlotRow",
    "send_slot",
]
