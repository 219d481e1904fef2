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


class ConnectionReplaced(StoreUnavailable):
    """A round trip found its connection broken, and the store connected again
    without sending the statement (:attr:`.StoreConnection.stop_at_reconnect`).

    The server answering now may be a promoted standby that lacks the last
    commits: the scheduler writes back what it sent before it decides anything
    (failover.py), then tries again at once. Not an outage.
    """


class SchemaError(SingleBeatError):
    """The database schema is missing, or newer than this release understands."""


class ScheduleError(SingleBeatError, ValueError):
    """A ``beat_schedule`` entry cannot be turned into shared slot instants."""


class InvalidEntry(ScheduleError):
    """A stored schedule entry was refused: a field of it is wrong, and nothing
    was written.

    The message names the entry and each wrong field, dotted for a part of one
    (``schedule entry 'x': crontab.hour: 25 is out of range 0-23``; several
    problems of one entry are listed in one error, separated by ``; ``).
    ``entry`` is the entry's name, ``field`` the first wrong field (a
    ``StoredEntry`` field name, or a dotted part of one: ``crontab.hour``,
    ``options.priority``, ``schedule.tz``), ``problems`` every
    ``(field, reason)`` found.
    """

    def __init__(self, entry: str, field: str, reason: str, *more: tuple[str, str]) -> None:
        # args are the constructor's, so that pickle rebuilds the same error
        super().__init__(entry, field, reason, *more)
        self.entry = entry
        self.field = field
        self.problems: tuple[tuple[str, str], ...] = ((field, reason), *more)

    def __str__(self) -> str:
        listed = "; ".join(f"{field}: {reason}" for field, reason in self.problems)
        # a name too long is itself a problem: show its start, not 10 KB of it
        shown = self.entry if len(self.entry) <= 60 else f"{self.entry[:60]}..."
        return f"schedule entry {shown!r}: {listed}"


class SingletonBusy(SingleBeatError):
    """A SingletonTask's key was held by another execution.

    Raised in the worker with ``singleton_busy = "raise"`` (the task's state is
    then FAILURE), and the exception of the final attempt when
    ``singleton_busy = "retry"`` ran out of retries.
    """

    def __init__(self, key: str, holder: str, until: str) -> None:
        # args are the constructor's arguments: pickle, and result backends
        # that store ``args`` as JSON and rebuild with ``cls(*args)``, get a
        # SingletonBusy back (not a stand-in Exception)
        super().__init__(key, holder, until)
        self.key = key
        self.holder = holder
        self.until = until

    def __str__(self) -> str:
        return f"singleton key {self.key!r} is held by {self.holder} until {self.until}"


class LeaseLost(SingleBeatError):
    """The running task no longer holds its singleton key.

    Raised by ``self.singleton.check()`` and ``self.singleton.guard()`` once the
    heartbeat found the lease taken over (or could not renew it before it
    expired): another execution may be running; stop before writing.
    """


class SingletonKeyError(SingleBeatError, ValueError):
    """A SingletonTask's key function raised, or returned something other than
    a non-empty string."""


class ControlError(SingleBeatError):
    """An operator's control (pause, resume, run now, a lease release) was refused,
    and nothing changed.

    The message says why: a named entry that no live replica has (with the
    known entries closest to it), an entry that is paused (by whom and why), a
    singleton key that has no lease row, or an input out of range (a pause that
    would end in the past, a reason longer than the column holds).
    """


class ScheduleStoreError(SingleBeatError):
    """A write of stored schedules was refused, and nothing of its batch was written.

    ``name`` is the entry the refused write named. (``args`` are the
    constructor's arguments, so pickle rebuilds the same error.)
    """

    def __init__(self, name: str, *details: object) -> None:
        super().__init__(name, *details)
        self.name = name

    def __str__(self) -> str:
        return f"schedule entry {self.name!r} refused"


class ScheduleExists(ScheduleStoreError):
    """A create named an entry that already has a live row (a tombstone does not
    count: a create over it revives the name)."""

    def __str__(self) -> str:
        return f"schedule entry {self.name!r} exists already"


class ScheduleNotFound(ScheduleStoreError):
    """An update or a delete named an entry that has no live row (never
    created, or deleted)."""

    def __str__(self) -> str:
        return f"no schedule entry named {self.name!r}"


class ScheduleConflict(ScheduleStoreError):
    """A write's ``if_revision`` differs from the stored live row's revision:
    someone else changed the entry since the writer read it. ``revision`` is
    the stored one (None: the entry has no live row), ``expected`` the writer's."""

    def __init__(self, name: str, revision: int | None, expected: int) -> None:
        super().__init__(name, revision, expected)
        self.revision = revision
        self.expected = expected

    def __str__(self) -> str:
        at = "has no live row" if self.revision is None else f"is at revision {self.revision}"
        return (
            f"schedule entry {self.name!r} {at}, not {self.expected}: reload it and apply "
            "the edit again"
        )
