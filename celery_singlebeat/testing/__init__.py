"""What your own tests use: an in-memory store and scheduler, a fake clock, the simulation.

``testing.memory`` holds the in-memory store (the whole storage contract in
process memory), ``testing.scheduler`` the scheduler that runs on it,
``testing.source`` an entry source a test edits while replicas run,
``testing.clock`` the clock a test moves by hand, and ``testing.sending`` the
send of one slot's run without beat;
:mod:`~celery_singlebeat.testing.simulation` runs a fleet of such replicas
against scripted faults. All are imported from here as they always were
(``from celery_singlebeat.testing import MemoryStore``); the pytest plugin's
fixtures build them for you (docs/testing.md).
"""

from __future__ import annotations

from .clock import DEFAULT_START, FakeClock
from .memory import MemoryStore, SlotRow
from .scheduler import MemoryScheduler
from .sending import send_slot
from .source import MemorySource

__all__ = [
    "DEFAULT_START",
    "FakeClock",
    "MemoryScheduler",
    "MemorySource",
    "MemoryStore",
    "SlotRow",
    "send_slot",
]
