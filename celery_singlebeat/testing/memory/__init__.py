"""The in-memory store, importable as ``celery_singlebeat.testing.memory`` as before.

Its code is in :mod:`.store` until it is split by contract. The pytest
plugin and :mod:`..simulation` import the store and the clock from here; the
scheduler and the entry source, which run on the store, are in
:mod:`..scheduler` and :mod:`..source`, and :func:`..sending.send_slot` in a
module of its own (``celery_singlebeat.testing`` names them all).
"""

from __future__ import annotations

# the clock left for a module of its own (testing/clock.py); named here too,
# where the pytest plugin imports it from
from ..clock import DEFAULT_START, FakeClock
from .store import MemoryStore, SlotRow

__all__ = [
    "DEFAULT_START",
    "FakeClock",
    "MemoryStore",
    "SlotRow",
]
