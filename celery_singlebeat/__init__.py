"""celery-singlebeat: run ``celery beat`` in every pod; each run is sent once.

Set ``beat_scheduler = "celery_singlebeat.SingleBeatScheduler"`` and
``singlebeat_url`` to the application's database; give tasks that must not
overlap (or run a slot twice) ``base=SingletonTask``. See the docs for the
algorithm and its guarantees.
"""

from __future__ import annotations

from ._version import __version__

# The public names are imported on first use (PEP 562), not here: importing
# the package used to import Celery and SQLAlchemy (about half a second of
# CPU), and the exec health probe (``python -m celery_singlebeat health``),
# which a kubelet runs every few seconds, needs neither (nor typing: mypy
# reads any name TYPE_CHECKING as typing's).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from .exceptions import (
        ConfigurationError,
        ControlError,
        InvalidEntry,
        LeaseLost,
        ScheduleConflict,
        ScheduleError,
        ScheduleExists,
        ScheduleNotFound,
        SchemaError,
        SingleBeatError,
        SingletonBusy,
        SingletonKeyError,
        StoreUnavailable,
    )
    from .scheduler import SingleBeatScheduler
    from .schedules.api import Schedules
    from .schedules.entry import StoredEntry, stored_entry
    from .singleton import Singleton, SingletonTask
    from .store.admin import create_schema


#: public name -> the module (relative to this package) that defines it
_LAZY = {
    "ConfigurationError": ".exceptions",
    "ControlError": ".exceptions",
    "InvalidEntry": ".exceptions",
    "LeaseLost": ".exceptions",
    "ScheduleConflict": ".exceptions",
    "ScheduleError": ".exceptions",
    "ScheduleExists": ".exceptions",
    "ScheduleNotFound": ".exceptions",
    "SchemaError": ".exceptions",
    "SingleBeatError": ".exceptions",
    "SingletonBusy": ".exceptions",
    "SingletonKeyError": ".exceptions",
    "StoreUnavailable": ".exceptions",
    "SingleBeatScheduler": ".scheduler",
    "Schedules": ".schedules.api",
    "StoredEntry": ".schedules.entry",
    "stored_entry": ".schedules.entry",
    "create_schema": ".store.admin",
    "Singleton": ".singleton",
    "SingletonTask": ".singleton",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from importlib import import_module

    value = getattr(import_module(module, __name__), name)
    # cached: the next access is a plain attribute, not another call
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


__all__ = [
    "ConfigurationError",
    "ControlError",
    "InvalidEntry",
    "LeaseLost",
    "ScheduleConflict",
    "ScheduleError",
    "ScheduleExists",
    "ScheduleNotFound",
    "Schedules",
    "SchemaError",
    "SingleBeatError",
    "SingleBeatScheduler",
    "Singleton",
    "SingletonBusy",
    "SingletonKeyError",
    "SingletonTask",
    "StoreUnavailable",
    "StoredEntry",
    "__version__",
    "create_schema",
    "stored_entry",
]
