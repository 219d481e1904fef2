"""Exceptions raised by celery-singlebeat.

Driver errors (psycopg, PyMySQL, sqlite3) are wrapped once, at the storage
boundary, into :class:`StoreUnavailable` or :class:`SchemaError`, so the
scheduler never has to know which database it talks to.
"""

from __future__ import annotations


class SingleBeatError(Exception):
    """Base class of every error this library raises on purpose."""


class ConfigurationError(SingleBeatError, ValueError):
    """A setting is missing, malformed or inconsistent.

    Raised at start-up, before any database connection is made; the message
    names the setting and says how to fix it.
    """


class StoreUnavailable(SingleBeatError):
    """The coordination database could not be reached or refused the statement.

    The scheduler treats this as "no coordination possible": it sends nothing
    until a later round trip succeeds.
    """


class SchemaError(SingleBeatError):
    """The database schema is missing, or newer than this release understands."""


class ScheduleError(SingleBeatError, ValueError):
    """A ``beat_schedule`` entry cannot be turned into shared slot instants."""
