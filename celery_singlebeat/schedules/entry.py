"""A stored schedule entry as a value: :class:`StoredEntry`, made by
:func:`stored_entry` and changed by :func:`with_changes`.

:func:`~celery_singlebeat.stored_entry` is the one way in, for users, the
``Schedules`` API, the CLI and import files: it normalises every field (a
schedule to its canonical object, arguments to what JSON gives back, instants
to UTC) and checks them (:mod:`.checks`), so that an entry that exists is one
the replicas can run and the store can keep. A refused entry raises
:class:`~celery_singlebeat.exceptions.InvalidEntry` listing *every* wrong
field of that entry at once.

Pure: no store, no engine; the process clock only where a check needs "now"
(the jitter's bound, for a crontab or solar schedule), and passable.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields
from datetime import datetime, timedelta
from typing import Any

from ..exceptions import InvalidEntry
from ..timeline.slots import MissedPolicy
from ..widths import MAX_MANAGED_BY
from .checks import (
    MAX_DESCRIPTION,
    OPTION_NAMES,
    Problems,
    check_jitter_gap,
    check_max_runs,
    check_name,
    check_order,
    check_task,
    checked_arguments,
    checked_instant,
    checked_jitter,
    checked_missed,
    checked_options,
    checked_text,
)
from .kinds import make_schedule, schedule_to_data

#: the store-kept fields, read only: None or "" until the entry is saved
STORE_FIELDS = ("revision", "created", "updated", "created_by", "updated_by")


@dataclass(frozen=True)
class StoredEntry:
    """One schedule entry kept in the database: what to send, and when.

    Build one with :func:`~celery_singlebeat.stored_entry` (which checks it),
    change one with :func:`~celery_singlebeat.schedules.with_changes`. Two
    entries are equal when every field is, the schedule compared by its data
    form (so a crontab's own time zone counts, which Celery's
    ``crontab.__eq__`` ignores). Treat the mappings as frozen.
    """

    #: unique; 1 to 255 bytes of UTF-8, no control characters
    name: str
    #: the Celery task's registered name: 1 to 255 characters, no whitespace
    task: str
    #: ``celery.schedules.crontab`` (its own zone or none: the app's),
    #: ``celery.schedules.schedule`` (an interval, >= 1 ms), ``solar``, or
    #: :class:`~celery_singlebeat.timeline.bounds.At` (one run)
    schedule: object
    #: positional arguments, as JSON gives them back (lists inside)
    args: tuple[Any, ...] = ()
    #: keyword arguments, as JSON gives them back; args and kwargs together at
    #: most ``MAX_ARGUMENTS_BYTES`` of compact JSON
    kwargs: dict[str, Any] = field(default_factory=dict)
    #: ``apply_async`` options: ``queue``, ``exchange``, ``routing_key`` (str),
    #: ``priority`` (0-255), ``expires`` (seconds > 0), ``headers`` (a JSON
    #: object of at most ``MAX_HEADERS_BYTES``)
    options: Mapping[str, Any] = field(default_factory=dict)
    #: a disabled entry is kept but not run (no replica is given it)
    enabled: bool = True
    #: no run before this instant (UTC); an interval with a start runs at it,
    #: then every period after it
    start: datetime | None = None
    #: no run after this instant (UTC); after ``start``
    end: datetime | None = None
    #: at most this many runs (>= 1), counted from ``start``, else from ``created``
    max_runs: int | None = None
    #: this entry's missed-run policy; None: the app's ``singlebeat_missed_*``
    missed: MissedPolicy | None = None
    #: each run moved later by up to this (0 or more, less than the shortest
    #: gap between two runs), the same on every replica
    jitter: timedelta = timedelta(0)
    #: free text for people, at most ``MAX_DESCRIPTION`` characters
    description: str = ""
    #: the import file that manages the entry (set by the import); None for one
    #: made by hand, which an import's prune never removes
    managed_by: str | None = None
    #: the store's revision of this version (commit-ordered); None before saving
    revision: int | None = None
    #: when the entry was first written (the database's clock)
    created: datetime | None = None
    #: when this version was written (the database's clock); the version is in
    #: force from then on
    updated: datetime | None = None
    #: who created it ("" before saving)
    created_by: str = ""
    #: who wrote this version ("" before saving)
    updated_by: str = ""

    def _key(self) -> tuple[Any, ...]:
        return tuple(
            schedule_to_data(self.schedule) if f.name == "schedule" else getattr(self, f.name)
            for f in fields(self)
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, StoredEntry):
            return NotImplemented
        return self._key() == other._key()

    __hash__ = None  # type: ignore[assignment]  # holds dicts: not hashable

    @property
    def saved(self) -> bool:
        """Whether the store has written this version (it has a revision)."""
        return self.revision is not None


def stored_entry(
    name: str,
    task: str,
    schedule: Any,
    *,
    args: Iterable[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    options: Mapping[str, Any] | None = None,
    queue: str | None = None,
    exchange: str | None = None,
    routing_key: str | None = None,
    priority: int | None = None,
    expires: float | timedelta | None = None,
    headers: Mapping[str, Any] | None = None,
    enabled: bool = True,
    start: datetime | str | None = None,
    end: datetime | str | None = None,
    max_runs: int | None = None,
    missed: MissedPolicy | Mapping[str, Any] | str | None = None,
    jitter: timedelta | float = timedelta(0),
    description: str = "",
    managed_by: str | None = None,
    now: datetime | None = None,
    check_jitter: bool = True,
) -> StoredEntry:
    """A checked, normalised :class:`StoredEntry`, or
    :class:`~celery_singlebeat.exceptions.InvalidEntry` listing every wrong
    field of it.

    ``schedule``: anything ``kinds.make_schedule``
    accepts (Celery's ``crontab``, ``schedule``, ``solar``; a ``timedelta`` or
    seconds; an aware ``datetime``; the data form ``{"every": 30}``,
    ``{"crontab": "*/5 * * * *", "tz": "Europe/Paris"}``, ...). ``options``
    and the options given one by one (``queue=``, ``priority=``, ...) are
    merged; one given both ways with two values is an error. ``start``/``end``:
    aware datetimes or ISO 8601 text. ``missed``: see ``checks.parse_missed``.
    ``jitter``: a timedelta or seconds, below the shortest gap between two runs
    (checked against the next ``JITTER_CHECKED_RUNS`` runs after ``now``, the
    process's clock unless given; ``check_jitter=False`` skips that walk for
    an entry read back from the store, which checked it when it was written).

    The store-kept fields (``revision``, ``created``, ...) are left unset: the
    store fills them (``schedules.columns.entry_from_fields``).
    """
    problems = Problems(name if isinstance(name, str) else repr(name))
    check_name(problems, name)
    check_task(problems, task)
    canonical: object | None = None
    try:
        canonical = make_schedule(problems.entry, schedule)
    except InvalidEntry as exc:
        problems.take(exc)
    good_args, good_kwargs = checked_arguments(problems, args, kwargs)
    good_options = checked_options(
        problems,
        options,
        {
            "queue": queue,
            "exchange": exchange,
            "routing_key": routing_key,
            "priority": priority,
            "expires": expires,
            "headers": headers,
        },
    )
    if not isinstance(enabled, bool):
        problems.add("enabled", f"{enabled!r} is not True or False")
    good_start = checked_instant(problems, "start", start)
    good_end = checked_instant(problems, "end", end)
    check_order(problems, good_start, good_end)
    check_max_runs(problems, max_runs)
    policy = checked_missed(problems, missed)
    good_jitter = checked_jitter(problems, jitter)
    if good_jitter and canonical is not None and check_jitter:
        check_jitter_gap(problems, good_jitter, canonical, now)
    good_description = checked_text(
        problems, "description", description, MAX_DESCRIPTION, empty=True
    )
    if managed_by is not None:
        checked_text(problems, "managed_by", managed_by, MAX_MANAGED_BY, empty=False)
    problems.raise_any()
    assert canonical is not None and good_jitter is not None and good_description is not None
    return StoredEntry(
        name=name,
        task=task,
        schedule=canonical,
        args=good_args,
        kwargs=good_kwargs,
        options=good_options,
        enabled=enabled,
        start=good_start,
        end=good_end,
        max_runs=max_runs,
        missed=policy,
        jitter=good_jitter,
        description=good_description,
        managed_by=managed_by,
    )


def with_changes(entry: StoredEntry, **changes: Any) -> StoredEntry:
    """``entry`` with some fields changed, checked whole (InvalidEntry as
    :func:`~celery_singlebeat.stored_entry`); the store-kept fields are kept as they are.

    Takes :func:`~celery_singlebeat.stored_entry`'s keywords. An option given one by one
    (``queue=``, ``priority=``, ...) changes that option alone, and None
    removes it; ``options=`` replaces them all. Renaming is not an edit
    (``name=`` is refused): a rename is a delete and an add.
    """
    read_only = sorted(set(changes) & {"name", *STORE_FIELDS})
    if read_only:
        raise TypeError(f"with_changes cannot change {', '.join(read_only)}")
    options = dict(changes.pop("options", entry.options))
    for key in OPTION_NAMES:
        if key in changes:
            value = changes.pop(key)
            if value is None:
                options.pop(key, None)
            else:
                options[key] = value
    current: dict[str, Any] = {
        "args": entry.args,
        "kwargs": entry.kwargs,
        "enabled": entry.enabled,
        "start": entry.start,
        "end": entry.end,
        "max_runs": entry.max_runs,
        "missed": entry.missed,
        "jitter": entry.jitter,
        "description": entry.description,
        "managed_by": entry.managed_by,
    }
    current.update(changes)
    task = current.pop("task", entry.task)
    schedule = current.pop("schedule", entry.schedule)
    changed = stored_entry(entry.name, task, schedule, options=options, **current)
    return _with_store_fields(changed, entry)


def _with_store_fields(entry: StoredEntry, source: StoredEntry) -> StoredEntry:
    from dataclasses import replace

    return replace(entry, **{name: getattr(source, name) for name in STORE_FIELDS})


__all__ = ["STORE_FIELDS", "StoredEntry", "stored_entry", "with_changes"]
