"""django-celery-beat's periodic tasks as an entry source (:mod:`...sources`).

:class:`PeriodicTaskSource` reads django-celery-beat's tables
(``PeriodicTask`` and its interval, crontab, solar and clocked schedules) through
Django's ORM, in the beat process that runs :class:`.scheduler.DatabaseScheduler`,
and hands each enabled task to the engine as an
:class:`~celery_singlebeat.sources.EntryDefinition` named after
``PeriodicTask.name`` (unique in its table). Every replica computes the same
instants from the same rows: an interval's grid comes from the anchor the
engine registered for the entry (the entries table), crontab and solar
instants from the core's slot sequences (a crontab in its row's own time
zone), a clocked task is one run at its instant
(:class:`~celery_singlebeat.timeline.bounds.At`).

What maps to what (django-celery-beat's ``ModelEntry`` is the reference):

* ``start_time``: no slot before it (an interval runs at the start, then every
  period after it); ``expires``: no slot at or after it, *and* the message's
  ``expires`` option, as django-celery-beat sends it; ``expire_seconds``: the
  message's ``expires`` option only (seconds after the send);
* ``one_off``: at most one run, counted from the row's ``date_changed`` (or
  its ``start_time``), and the row is disabled after that send (below);
* ``args``/``kwargs``/``headers`` (JSON text; ``headers`` gains
  ``periodic_task_name``), ``queue``, ``exchange``, ``routing_key``,
  ``priority``: sent as django-celery-beat sends them; a row whose JSON does
  not parse is logged at ERROR and not sent (django-celery-beat disables it
  with a full-row save; this source writes nothing it did not send);
* ``enabled`` False: the entry is removed from the tick that sees it.

How changes are found, each tick, without reading every row
(:mod:`.periodic_digests` says what a chunk's digest holds and what it cannot
see):

1. ``PeriodicTasks.last_update`` (one row, which django-celery-beat bumps on
   every ``save()``/``delete()`` of a task or a schedule, and its admin after
   each bulk action): one primary-key read.
2. When it moved, and at the tick after (django-celery-beat bumps in
   ``pre_save``, committed before the row): every chunk's digest, computed
   in the database (one ``GROUP BY`` statement, one row per
   :data:`~.periodic_digests.CHUNK` ids), compared with the digests held;
   only the rows of the chunks that differ are read whole, and the rows of a
   chunk held but no longer there are removed. A ``save()`` moves its
   chunk's latest ``date_changed``; the admin's enable/disable/toggle
   actions (``QuerySet.update()`` then a bump) move its exact set of enabled
   ids. The schedule tables (interval, crontab, solar, clocked; few rows:
   tasks share them) are read whole and compared, and the tasks of a schedule
   row that changed or went are read whole (by their foreign key).
3. Otherwise: the digests of the next chunks (by id), so that every chunk is
   compared within :attr:`PeriodicTaskSource.rescan_period` (10 s by
   default), and the schedule tables once per period: a ``QuerySet.update()``
   that bumped nothing (a data migration, a script) is in force within that
   bound when the digests see it, reading only its chunk.
4. Always: the backstop reads the next slice of the table whole and compares
   each row with the one in force, so that what the digests cannot see (a
   bare ``update()`` of a text of the same length, of ``start_time`` from one
   instant to another) is in force within
   :attr:`PeriodicTaskSource.backstop_period` (600 s by default):
   ``rows x elapsed / backstop_period`` rows a tick, at least
   :attr:`~PeriodicTaskSource.backstop_min`.

``last_run_at``, ``total_run_count`` are in no digest, and never compared, so the source's own
write-back (:meth:`PeriodicTaskSource.sent`) is never taken for an edit.

The ORM runs in autocommit (Django's default; no ``atomic`` block is opened
here), so every read sees the latest commits, also on MySQL's REPEATABLE
READ; with ``AUTOCOMMIT`` off in ``DATABASES`` the source commits after its
reads and its write-back itself. Each tick starts with ``close_old_connections()``; a database error
closes the connection and raises
:class:`~celery_singlebeat.exceptions.StoreUnavailable`, which the engine
treats as an outage of the coordination database (it sends nothing, backs
off, and the next tick connects again).
"""

from __future__ import annotations

import bisect
import json
import logging
import math
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import suppress
from datetime import datetime, timedelta, timezone
from typing import Any, NamedTuple

from celery.schedules import crontab, schedule, solar

from ...exceptions import StoreUnavailable
from ...sources import Change, ChangeKind, EntryDefinition, EntrySource
from ...timeline.bounds import At, BoundedSchedule, Bounds
from ...timeline.clock import datetime_to_us, us_to_datetime
from .periodic_digests import CHUNK, Digest, differing, digests

logger = logging.getLogger("celery_singlebeat.scheduler")

#: the source's label, in every message about one of its entries
LABEL = "django-celery-beat"

#: rows of these names are not entries of this source: Celery adds
#: ``celery.backend_cleanup`` to ``beat_schedule`` (when ``result_expires`` is
#: set), and django-celery-beat copied it into its table; here it is sent from
#: ``beat_schedule`` alone, so the row it left is skipped rather than refused
#: as a second definition of one name every tick
IGNORED = frozenset({"celery.backend_cleanup"})

#: the columns of a row the definition is made of, in this order
FIELDS: tuple[str, ...] = (
    "id",
    "name",
    "task",
    "enabled",
    "one_off",
    "start_time",
    "expires",
    "expire_seconds",
    "args",
    "kwargs",
    "headers",
    "queue",
    "exchange",
    "routing_key",
    "priority",
    "date_changed",
    "interval__every",
    "interval__period",
    "crontab__minute",
    "crontab__hour",
    "crontab__day_of_week",
    "crontab__day_of_month",
    "crontab__month_of_year",
    "crontab__timezone",
    "solar__event",
    "solar__latitude",
    "solar__longitude",
    "clocked__clocked_time",
    "interval_id",
    "crontab_id",
    "solar_id",
    "clocked_id",
)
_F = {name: index for index, name in enumerate(FIELDS)}


class _Known(NamedTuple):
    """What the source last reported of one row."""

    name: str
    #: digest of every column the definition is made of
    full: int


class _Cursor(NamedTuple):
    """Where :meth:`PeriodicTaskSource.changes` goes on from."""

    #: ``PeriodicTasks.last_update`` as last read (None: not yet / no row)
    last_update: Any
    #: True: read every row again (the first read, after a reconnection)
    reread: bool = False


_FIRST = _Cursor(None, True)


def _full_digest(row: Sequence[Any]) -> int:
    return hash(tuple(row[1:]))


class PeriodicTaskSource(EntrySource):
    """The enabled rows of django-celery-beat's ``PeriodicTask`` table.

    ``written`` is this interface's default, None: the store keeps no write of
    these rows, so the claim cannot refuse a slot of a definition another
    replica already saw replaced (as it does for stored schedules). What
    bounds the window instead is how soon each replica sees an edit: the next
    tick (about a second) for a ``save()``, ``delete()`` or an admin action,
    :attr:`rescan_period` for a bare ``QuerySet.update()`` the digests see,
    :attr:`backstop_period` for one they cannot (the module's docstring).
    Within that window a replica may still send a slot under the definition
    it had, once (every slot is still sent once, under one definition or the
    other).

    ``now`` (the process's monotonic clock, in seconds) paces the rolling
    digest comparison and the backstop; tests pass their own.
    """

    label = LABEL
    writes_back = True

    #: every chunk's digest is compared again within this many seconds: the
    #: bound on a ``QuerySet.update()`` that bumped nothing, for what the
    #: digests see (:mod:`.periodic_digests`)
    rescan_period: float = 10.0
    #: every row is read whole again within this many seconds: the bound on a
    #: bare ``QuerySet.update()`` the digests cannot see (a same-length text)
    backstop_period: float = 600.0
    #: at least this many rows a tick are read by the backstop (a small table
    #: is then read again every few ticks)
    backstop_min: int = 20

    def __init__(
        self,
        default_tz: Any = None,
        *,
        rescan_period: float | None = None,
        backstop_period: float | None = None,
        now: Callable[[], float] = time.monotonic,
    ) -> None:
        self._default_tz = default_tz
        for name, value in (("rescan_period", rescan_period), ("backstop_period", backstop_period)):
            if value is not None:
                if not value > 0:
                    raise ValueError(f"{name}={value!r}: must be more than 0 seconds")
                setattr(self, name, value)
        self._now = now
        self._known: dict[int, _Known] = {}
        #: each chunk's digest as last compared, by the chunk's first id
        self._chunks: dict[int, Digest] = {}
        #: the chunks' first ids in order (None: to sort again)
        self._order: list[int] | None = None
        #: each schedule table's rows as last read: table -> id -> columns
        self._schedules: dict[str, dict[int, tuple[Any, ...]]] = {}
        #: True: the last tick saw a bump (:meth:`_changes`)
        self._echo = False
        #: the rolling comparison's position (the next chunk) and when it ran
        self._window_from = 0
        self._window_at: float | None = None
        #: when the schedule tables were last read
        self._schedules_at: float | None = None
        #: the backstop's position (the last id it read) and when it last ran
        self._scan_after = 0
        self._scan_at: float | None = None
        #: what the last :meth:`changes` read, for the benchmark and tests:
        #: statements; rows read whole because they changed (or the first
        #: read); digest rows (chunks); schedule rows; the backstop's rows
        self.reads = _reads()

    # -- the interface -----------------------------------------------------

    def load(self) -> tuple[Sequence[EntryDefinition], object]:
        """Nothing yet: the rows come with the first :meth:`changes`, read as
        any change is, so a row that cannot be scheduled is logged and skipped
        rather than stopping every replica at start-up."""
        return (), _FIRST

    def changes(self, cursor: object) -> tuple[Sequence[Change], object]:
        """What changed since ``cursor``: three small statements when nothing
        did (see the module's docstring)."""
        from django.db import Error

        if not isinstance(cursor, _Cursor):
            cursor = _FIRST
        try:
            return self._changes(cursor)
        except Error as exc:
            message = _without_password(f"{type(exc).__name__}: {exc}")
            _close_connection()
            raise StoreUnavailable(f"{LABEL} tables: {message}") from None

    def reconnected(self, cursor: object) -> object:
        """Read every row again: the database answering now may be a promoted
        standby that lacks the last commits."""
        return _FIRST

    def sent(self, definition: EntryDefinition, slot_us: Sequence[int]) -> None:
        """Record the sent slots in the row, as django-celery-beat does, but
        only its columns: ``last_run_at`` (the latest slot) and
        ``total_run_count`` (plus the number of slots), one ``UPDATE`` by
        name, never a full-row save that could overwrite an edit made since
        the row was read. A ``one_off`` task is also disabled (``enabled``
        False) and ``PeriodicTasks`` bumped, so django-celery-beat's admin and
        every replica see it at once.

        Called once per slot by the replica that sent it (the engine's
        confirm), so the count is the fleet's, not a replica's."""
        from django.db import Error
        from django.db.models import F
        from django_celery_beat.models import PeriodicTask, PeriodicTasks

        if not slot_us:
            return
        values: dict[str, Any] = {
            "last_run_at": _for_django(us_to_datetime(max(slot_us))),
            "total_run_count": F("total_run_count") + len(slot_us),
        }
        one_off = bool(getattr(definition.schedule, "one_off", False))
        if one_off:
            values["enabled"] = False
        try:
            PeriodicTask.objects.filter(name=definition.name).update(**values)
            if one_off:
                PeriodicTasks.update_changed()
            _end_transaction()
        except Error:
            _close_connection()
            raise

    # -- reading -------------------------------------------------------------

    def _changes(self, cursor: _Cursor) -> tuple[list[Change], _Cursor]:
        from django.db import close_old_connections, connection
        from django_celery_beat.models import PeriodicTask, PeriodicTasks

        if not connection.in_atomic_block:
            # beat's case: drop a connection past CONN_MAX_AGE or broken by an
            # error, as Django does between requests (a caller's transaction,
            # a test's, is left alone: it would be closed under it)
            close_old_connections()
            # a project with AUTOCOMMIT off: end the snapshot the last reads
            # opened, or MySQL's REPEATABLE READ would show this state forever
            _end_transaction()
        self.reads = _reads()
        self.reads["statements"] += 1
        last_update = (
            PeriodicTasks.objects.filter(ident=1).values_list("last_update", flat=True).first()
        )
        if cursor.reread:
            return self._read_all(PeriodicTask), _Cursor(last_update)
        changes = []
        if last_update != cursor.last_update or self._echo:
            # django-celery-beat bumps in pre_save, committed before the row
            # is: a tick between the two commits sees the bump, not the row.
            # The tick after a bump compares every chunk once more.
            self._echo = last_update != cursor.last_update
            changes.extend(self._bumped(PeriodicTask))
        else:
            changes.extend(self._window(PeriodicTask))
        changes.extend(self._backstop(PeriodicTask))
        return changes, _Cursor(last_update)

    def _read_all(self, model: Any) -> list[Change]:
        """Every row whole, every digest, every schedule row: the first read,
        and after a reconnection. The digests are read first: a row changed
        between the two reads makes its chunk differ at the next look, and is
        read again then."""
        chunks = self._digests(model.objects.all())
        self._schedule_changes(model, read_tasks=False)
        rows = list(model.objects.values_list(*FIELDS))
        self.reads["statements"] += 1
        self.reads["rows"] += len(rows)
        self._set_chunks(chunks, 0, math.inf)
        now = self._now()
        self._window_from, self._window_at = 0, now
        self._scan_after, self._scan_at = 0, now
        return self._apply(rows, whole=True)

    def _bumped(self, model: Any) -> list[Change]:
        """``PeriodicTasks.last_update`` moved: every chunk's digest (one
        statement, one row per chunk) and the schedule tables, then whole only
        the rows of the chunks that differ and the rows whose schedule row
        changed."""
        chunks = self._digests(model.objects.all())
        changes = self._schedule_changes(model)
        changes.extend(self._compare(model, chunks, 0, math.inf))
        # the whole table was just compared: the rolling comparison starts its
        # pace again from here
        self._window_at = self._now()
        return changes

    def _window(self, model: Any) -> list[Change]:
        """The next chunks' digests, so that every chunk is compared within
        :attr:`rescan_period` (a bare ``QuerySet.update()``); at the end of
        the table, the chunks beyond the last one held and the schedule
        tables too, and the comparison starts again from the first chunk."""
        now = self._now()
        elapsed = 0.0 if self._window_at is None else now - self._window_at
        self._window_at = now
        order = self._ordered()
        budget = max(1, math.ceil(len(order) * elapsed / self.rescan_period))
        low = self._window_from
        at = bisect.bisect_left(order, low)
        upto = order[at + budget] if at + budget < len(order) else math.inf
        query = model.objects.filter(id__gte=low)
        if upto != math.inf:
            query = query.filter(id__lt=upto)
        changes = self._compare(model, self._digests(query), low, upto)
        self._window_from = 0 if upto == math.inf else int(upto)
        if self._schedules_at is None or now - self._schedules_at >= self.rescan_period:
            # a bare update() of a shared schedule row: within the same bound
            changes.extend(self._schedule_changes(model))
        return changes

    def _compare(
        self, model: Any, chunks: dict[int, Digest], low: int, high: float
    ) -> list[Change]:
        """Read whole the chunks in ``[low, high)`` whose digest differs from
        the one held; hold the digests read."""
        changed = sorted(differing(self._chunks, chunks, low, high))
        self._set_chunks(chunks, low, high)
        changes: list[Change] = []
        for first, last in _runs(changed):
            rows = list(
                model.objects.filter(id__gte=first, id__lt=last + CHUNK).values_list(*FIELDS)
            )
            self.reads["statements"] += 1
            self.reads["rows"] += len(rows)
            changes.extend(self._apply(rows, whole=False))
            present = {row[0] for row in rows}
            gone = [pk for pk in self._known if first <= pk < last + CHUNK and pk not in present]
            changes.extend(self._removed(gone))
        return changes

    def _schedule_changes(self, model: Any, read_tasks: bool = True) -> list[Change]:
        """The schedule tables read whole (their rows are few: tasks share
        them), compared with the last read; the tasks of a schedule row that
        changed or went are read whole."""
        from django.db.models import Q

        self._schedules_at = self._now()
        touched = Q()
        for table, (schedule_model, columns) in _schedule_tables().items():
            now = {
                row[0]: row[1:] for row in schedule_model.objects.order_by().values_list(*columns)
            }
            self.reads["statements"] += 1
            self.reads["schedule_rows"] += len(now)
            before = self._schedules.get(table, {})
            moved = [pk for pk, values in before.items() if now.get(pk) != values]
            self._schedules[table] = now
            if moved:
                touched |= Q(**{f"{table}_id__in": moved})
        if not read_tasks or not touched:
            return []
        rows = list(model.objects.filter(touched).values_list(*FIELDS))
        self.reads["statements"] += 1
        self.reads["rows"] += len(rows)
        return self._apply(rows, whole=False)

    def _backstop(self, model: Any) -> list[Change]:
        """The next slice of the table, by id, read whole and compared with
        what is in force: every row within :attr:`backstop_period`, for the
        edits the digests cannot see."""
        now = self._now()
        elapsed = 0.0 if self._scan_at is None else now - self._scan_at
        self._scan_at = now
        budget = max(
            self.backstop_min, math.ceil(len(self._known) * elapsed / self.backstop_period)
        )
        after = self._scan_after
        rows = list(model.objects.filter(id__gt=after).order_by("id").values_list(*FIELDS)[:budget])
        self.reads["statements"] += 1
        self.reads["backstop_rows"] += len(rows)
        wrapped = len(rows) < budget
        high = math.inf if wrapped else rows[-1][0]
        self._scan_after = 0 if wrapped else int(high)
        # rows of the slice that vanished: deleted without a bump (raw SQL)
        gone = [pk for pk in self._known if after < pk <= high] if rows or wrapped else []
        seen = {row[0] for row in rows}
        changes = self._apply(rows, whole=False)
        changes.extend(self._removed(pk for pk in gone if pk not in seen))
        return changes

    def _digests(self, query: Any) -> dict[int, Digest]:
        chunks = digests(query)
        self.reads["statements"] += 1
        self.reads["chunks"] += len(chunks)
        return chunks

    def _set_chunks(self, chunks: dict[int, Digest], low: int, high: float) -> None:
        """Hold ``chunks``, read over ``[low, high)``: a chunk held there but not
        read is empty now."""
        held = self._chunks
        emptied = [c for c in held if low <= c < high and c not in chunks]
        for first in emptied:
            del held[first]
        if emptied or any(c not in held for c in chunks):
            self._order = None
        held.update(chunks)

    def _ordered(self) -> list[int]:
        if self._order is None:
            self._order = sorted(self._chunks)
        return self._order

    # -- reporting -------------------------------------------------------------

    def _apply(self, rows: Iterable[Sequence[Any]], whole: bool) -> list[Change]:
        """Changes for the rows that differ from what is in force; ``whole``:
        the rows are the whole table (the names not among them are removed)."""
        known = self._known
        changes: list[Change] = []
        present: set[int] = set()
        for row in rows:
            pk = row[0]
            present.add(pk)
            full = _full_digest(row)
            before = known.get(pk)
            if before is not None and before.full == full:
                continue
            name = row[_F["name"]]
            if before is not None and before.name != name:
                # renamed: the old name's entry goes, the new one comes
                changes.append(Change(ChangeKind.REMOVED, before.name, None))
            wanted = row[_F["enabled"]] and name not in IGNORED
            definition = self._definition(row) if wanted else None
            known[pk] = _Known(name, full)
            if definition is None:
                if before is not None or whole:
                    changes.append(Change(ChangeKind.REMOVED, name, None))
                continue
            changes.append(Change(ChangeKind.CHANGED, name, definition))
        if whole:
            changes.extend(self._removed([pk for pk in known if pk not in present]))
        return changes

    def _removed(self, ids: Iterable[int]) -> list[Change]:
        changes = []
        for pk in list(ids):
            before = self._known.pop(pk, None)
            if before is not None:
                changes.append(Change(ChangeKind.REMOVED, before.name, None))
        return changes

    def _definition(self, row: Sequence[Any]) -> EntryDefinition | None:
        try:
            return definition_of(row, self._default_tz)
        except (ValueError, TypeError) as exc:
            logger.error(
                "singlebeat: %s task %r cannot be scheduled (%s); it is not sent",
                LABEL,
                row[_F["name"]],
                exc,
            )
            return None


def _reads() -> dict[str, int]:
    return {"statements": 0, "rows": 0, "chunks": 0, "schedule_rows": 0, "backstop_rows": 0}


def _runs(chunks: Sequence[int]) -> Iterator[tuple[int, int]]:
    """Sorted chunk starts as runs of consecutive chunks: (first, last)."""
    run: list[int] = []
    for first in chunks:
        if run and first != run[-1] + CHUNK:
            yield run[0], run[-1]
            run = []
        run.append(first)
    if run:
        yield run[0], run[-1]


def _schedule_tables() -> dict[str, tuple[Any, tuple[str, ...]]]:
    """Each schedule table (by the task's foreign key's name): its model and
    the columns a definition is made of, its id first."""
    from django_celery_beat.models import (
        ClockedSchedule,
        CrontabSchedule,
        IntervalSchedule,
        SolarSchedule,
    )

    return {
        "interval": (IntervalSchedule, ("id", "every", "period")),
        "crontab": (
            CrontabSchedule,
            ("id", "minute", "hour", "day_of_week", "day_of_month", "month_of_year", "timezone"),
        ),
        "solar": (SolarSchedule, ("id", "event", "latitude", "longitude")),
        "clocked": (ClockedSchedule, ("id", "clocked_time")),
    }


class OneOffSchedule(BoundedSchedule):
    """A ``one_off`` task's schedule: its :class:`BoundedSchedule` (at most one
    run) marked so that :meth:`PeriodicTaskSource.sent` disables the row."""

    one_off = True


def definition_of(row: Sequence[Any], default_tz: Any) -> EntryDefinition:
    """The definition of one row of :data:`FIELDS` (enabled or not); ValueError
    naming the column for one that cannot be scheduled."""
    name = row[_F["name"]]
    inner, tz = _schedule_of(row, default_tz)
    changed_us = _us(row[_F["date_changed"]])
    start_us = _us(row[_F["start_time"]])
    expires = _aware(row[_F["expires"]])
    end_us = None if expires is None else datetime_to_us(expires) - 1
    one_off = bool(row[_F["one_off"]])
    bounds = Bounds(
        start_us=start_us,
        end_us=end_us,
        # a one_off runs once from its last save (or its start): saved again
        # (the admin re-enabling it), it runs once more, as with django-celery-beat
        runs_from_us=changed_us if one_off else None,
        max_runs=1 if one_off else None,
    )
    scheduled: object = inner
    if one_off:
        scheduled = OneOffSchedule(inner, bounds)
    elif bounds.bounded:
        scheduled = BoundedSchedule(inner, bounds)
    return EntryDefinition(
        name=name,
        task=row[_F["task"]],
        schedule=scheduled,
        args=tuple(_json(row, "args", "[]", list)),
        kwargs=_json(row, "kwargs", "{}", dict),
        options=_options(row, expires),
        policy=None,
        tz=tz,
        revision=f"{_full_digest(row) & 0xFFFFFFFFFFFFFFFF:016x}",
        source=LABEL,
        since_us=changed_us,
    )


def _schedule_of(row: Sequence[Any], default_tz: Any) -> tuple[object, Any]:
    if row[_F["interval_id"]] is not None:
        every, period = row[_F["interval__every"]], row[_F["interval__period"]]
        if period not in ("days", "hours", "minutes", "seconds", "microseconds"):
            raise ValueError(f"interval.period {period!r} is not a period")
        return schedule(timedelta(**{period: every})), default_tz
    if row[_F["crontab_id"]] is not None:
        cron = crontab(
            minute=row[_F["crontab__minute"]],
            hour=row[_F["crontab__hour"]],
            day_of_week=row[_F["crontab__day_of_week"]],
            day_of_month=row[_F["crontab__day_of_month"]],
            month_of_year=row[_F["crontab__month_of_year"]],
        )
        return cron, _crontab_zone(row[_F["crontab__timezone"]], default_tz)
    if row[_F["solar_id"]] is not None:
        latitude, longitude = row[_F["solar__latitude"]], row[_F["solar__longitude"]]
        return solar(row[_F["solar__event"]], float(latitude), float(longitude)), default_tz
    if row[_F["clocked_id"]] is not None:
        at = _aware(row[_F["clocked__clocked_time"]])
        assert at is not None  # the column is NOT NULL
        return At(at), default_tz
    raise ValueError("no schedule: one of interval, crontab, solar or clocked must be set")


def _crontab_zone(zone: Any, default_tz: Any) -> Any:
    """The crontab's own zone, unless ``DJANGO_CELERY_BEAT_TZ_AWARE`` is off
    (django-celery-beat then runs it in the app's zone)."""
    from django.conf import settings

    if zone is None or not getattr(settings, "DJANGO_CELERY_BEAT_TZ_AWARE", True):
        return default_tz
    if isinstance(zone, str):
        from zoneinfo import ZoneInfo

        return ZoneInfo(zone)
    return zone


def _json(row: Sequence[Any], column: str, empty: str, kind: type) -> Any:
    text = row[_F[column]] or empty
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"{column} is not JSON: {exc}") from None
    if not isinstance(value, kind):
        raise ValueError(f"{column} is JSON {type(value).__name__}, expected {kind.__name__}")
    return value


def _options(row: Sequence[Any], expires: datetime | None) -> Mapping[str, Any]:
    """The ``apply_async`` options django-celery-beat's ``ModelEntry`` sends."""
    options: dict[str, Any] = {}
    for column in ("queue", "exchange", "routing_key", "priority"):
        value = row[_F[column]]
        if value is not None:
            options[column] = value
    expire_seconds = row[_F["expire_seconds"]]
    if expires is not None:
        options["expires"] = expires
    elif expire_seconds:
        options["expires"] = expire_seconds
    headers = _json(row, "headers", "{}", dict)
    headers["periodic_task_name"] = row[_F["name"]]
    options["headers"] = headers
    return options


def _aware(value: datetime | None) -> datetime | None:
    """A column's datetime, aware (Django's ``TIME_ZONE`` for a naive one, as
    with ``USE_TZ = False``), in UTC."""
    if value is None:
        return None
    if value.tzinfo is None or value.utcoffset() is None:
        from django.utils import timezone as django_tz

        value = django_tz.make_aware(value, django_tz.get_default_timezone())
    return value.astimezone(timezone.utc)


def _us(value: datetime | None) -> int | None:
    aware = _aware(value)
    return None if aware is None else datetime_to_us(aware)


def _for_django(value: datetime) -> datetime:
    """An aware UTC instant as Django stores it: naive in ``TIME_ZONE`` when
    ``USE_TZ`` is off."""
    from django.conf import settings

    if getattr(settings, "USE_TZ", True):
        return value
    from django.utils import timezone as django_tz

    return django_tz.make_naive(value, django_tz.get_default_timezone())


def _end_transaction() -> None:
    """Commit when Django's connection is not in autocommit (``AUTOCOMMIT``
    False in ``DATABASES``) and no caller's ``atomic`` block is open; nothing
    otherwise (Django's default: every statement commits by itself)."""
    from django.db import connection

    if connection.connection is None or connection.in_atomic_block:
        return
    if not connection.get_autocommit():
        connection.commit()


def _without_password(text: str) -> str:
    """``text`` with the database password of Django's connection masked."""
    from django.db import connection

    password = connection.settings_dict.get("PASSWORD")
    return text.replace(password, "***") if password else text


def _close_connection() -> None:
    """Drop this thread's Django connection after an error, so the next tick
    opens a new one (a restarted server, a broken socket)."""
    from django.db import Error, connection

    if connection.in_atomic_block:
        return  # a caller's transaction (a test's): its owner rolls it back
    with suppress(Error):
        connection.close()


__all__ = [
    "FIELDS",
    "IGNORED",
    "LABEL",
    "OneOffSchedule",
    "PeriodicTaskSource",
    "definition_of",
]
