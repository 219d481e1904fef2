"""celery-singlebeat: run ``celery beat`` in every pod; each run is sent once.

Set ``beat_scheduler = "celery_singlebeat.SingleBeatScheduler"`` and
``singlebeat_url`` to the application's database; give tasks that must not
overlap (or run a slot twice) ``base=SingletonTask``. See the docs for the
algorithm and its guarantees.
"""

from __future__ import annotations

from .exceptions import (
    ConfigurationError,
    LeaseLost,
    ScheduleError,
    SchemaError,
    SingleBeatError,
    SingletonBusy,
    SingletonKeyError,
    StoreUnavailable,
)
from .scheduler import SingleBeatScheduler
from .schema_admin import create_schema
from .singleton import Singleton, SingletonTask

__version__ = "0.1.0"

__all__ = [
    "ConfigurationError",
    "LeaseLost",
    "ScheduleError",
    "SchemaError",
    "SingleBeatError",
    "SingleBeatScheduler",
    "Singleton",
    "SingletonBusy",
    "SingletonKeyError",
    "SingletonTask",
    "StoreUnavailable",
    "__version__",
    "create_schema",
]
