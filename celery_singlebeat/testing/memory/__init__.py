"""The in-memory store: the whole storage contract in process memory, one part per contract.

:class:`MemoryStore` (:mod:`.store`) composes :mod:`.slots`, :mod:`.fleet`,
:mod:`.singletons`, :mod:`.schedules` and :mod:`.operator`, which decide over
the tables of :mod:`.state` in round trips of :mod:`.connection`.
``celery_singlebeat.testing`` names the store for users; the pytest plugin
and :mod:`..simulation` import it from here.
"""

from __future__ import annotations

from .store import MemoryStore, SlotRow

__all__ = [
    "MemoryStore",
    "SlotRow",
]
