"""The in-memory store: the whole storage contract in process memory, one part per contract.

:class:`MemoryStore` (:mod:`.store`) composes :mod:`.slots`, :mod:`.fleet`,
:mod:`.singletons`, :mod:`.schedules` and :mod:`.operator`, which decide over
the tables of :mod:`.state` in round trips of :mod:`.connection`.
``celery_singlebeat.testing`` names the store for users; the pytest plugin
and :mod:`..simulation` import it from here, with the clock the module had
before it moved to :mod:`..clock`.
"""

from __future__ import annotations

# the clock has a module of its own (testing/clock.py); named here too, where
# the pytest plugin imports it from
from ..clock import DEFAULT_START, FakeClock
from .store import MemoryStore, SlotRow

__all__ = [
    "DEFAULT_START",
    "FakeClock",
    "MemoryStore",
    "SlotRow",
]
