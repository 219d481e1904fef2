"""celery-singlebeat: run ``celery beat`` in every pod; each run is sent once.

Set ``beat_scheduler = "celery_singlebeat.SingleBeatScheduler"`` and
``singlebeat_url`` to the application's database. See the docs for the
algorithm and its guarantees.
"""

from __future__ import annotations

from .exceptions import (
    ConfigurationError,
    ScheduleError,
    SchemaError,
    SingleBeatError,
    StoreUnavailable,
)
from .scheduler import SingleBeatScheduler
from .schema_admin import create_schema

__version__ = "0.1.0"

__all__ = [
    "ConfigurationError",
    "ScheduleError",
    "SchemaError",
    "SingleBeatError",
    "SingleBeatScheduler",
    "StoreUnavailable",
    "__version__",
    "create_schema",
]
