"""The beat engine: what decides when each slot is sent and by whom.

One module per step of the tick (CONTRIBUTING.md has the map);
:class:`~.loop.Engine` orders them. The Celery adapter
(:mod:`celery_singlebeat.scheduler`) hosts one engine per process.
"""

from .environment import SYSTEM, Environment
from .loop import Engine

__all__ = ["SYSTEM", "Engine", "Environment"]
