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

How changes are found, each tick, without reading every row:

1. ``PeriodicTasks.last_update`` (one row, which django-celery-beat bumps on
   every ``save()``/``delete()`` of a task or a schedule, and its admin after
   each bulk action): one primary-key read, the whole cost of an idle tick.
2. When it moved: the rows whose ``date_changed`` (``auto_now``) is at or after
   the highest one read before, less :data:`CHANGED_SLACK` (the writers'
   clocks and late commits), read whole; then one narrow projection of every
   row (its id, ``enabled`` and its schedule's columns, joined), whose
   digest per row finds what ``save()`` did not stamp: the admin's
   enable/disable/toggle actions (``QuerySet.update()`` then a bump), an edited
   interval or crontab row shared by many tasks, and deletions.
3. Always: a rolling rescan reads the next slice of the table (by id) whole
   and compares each row's digest with the one in force, so a
   ``QuerySet.update()`` that bumped nothing (a data migration, a script) is in
   force within :attr:`PeriodicTaskSource.rescan_period` (60 s by default):
   each tick reads ``rows x elapsed / rescan_period`` rows.

``last_run_at``, ``total_run_count`` are not in any digest, so the source's own
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

import json
import logging
import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import suppress
from datetime import datetime, timedelta, timezone
from typing import Any, NamedTuple

from celery.schedules import crontab, schedule, solar

from ...exceptions import StoreUnavailable
from ...sources import Change, ChangeKind, EntryDefinition, EntrySource
from ...timeline.bounds import At, BoundedSchedule, Bounds
from ...timeline.clock import datetime_to_us, us_to_datetime

logger = logging.getLogger("celery_singlebeat.scheduler")

#: the source's label, in every message about one of its entries
LABEL = "django-celery-beat"

#: how far before the highest ``date_changed`` already read a change read
#: again looks: ``date_changed`` is the writing process's clock, stamped
#: before its commit, so a row committed late, or by a process whose clock is
#: behind, carries an older stamp than one read earlier. Rows read twice are
#: compared by digest and reported only if they differ. Beyond this, the
#: rolling rescan finds it.
CHANGED_SLACK = timedelta(seconds=10)

#: rows of these names are not entries of this source: Celery adds
#: ``celery.backend_cleanup`` to ``beat_schedule`` (when ``result_expires`` is
#: set), and django-celery-beat copied it into its table; here it is sent from
#: ``beat_schedule`` alone, so the row it left is skipped rather than refused
#: as a second definition of one name every tick
IGNORED = frozenset({"celery.backend_cleanup"})

#: a read by id list is cut into chunks of this many ids (SQLite allows 999
#: parameters a statement in old builds)
_ID_CHUNK = 500

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

#: the narrow projection read when ``last_update`` moved: what an update() of
#: the admin's actions or an edit of a shared schedule row changes
SHAPE: tuple[str, ...] = ("id", "enabled", *FIELDS[16:])


class _Known(NamedTuple):
    """What the source last reported of one row."""

    name: str
    #: digest of every column the definition is made of
    full: int
    #: digest of the :data:`SHAPE` columns
    shape: int


class _Cursor(NamedTuple):
    """Where :meth:`PeriodicTaskSource.changes` goes on from."""

    #: ``PeriodicTasks.last_update`` as last read (None: not yet / no row)
    last_update: Any
    #: True: read every row again (the first read, after a reconnection)
    reread: bool = False


_FIRST = _Cursor(None, True)


def _shape_digest(row: Sequence[Any]) -> int:
    """Digest of a whole row's :data:`SHAPE` columns (the same value as
    :func:`_projected_digest` of that row's projection)."""
    return hash((row[_F["enabled"]], *row[_F["interval__every"] :]))


def _projected_digest(shape: Sequence[Any]) -> int:
    """Digest of a row of the :data:`SHAPE` projection (its id left out)."""
    return hash(tuple(shape[1:]))


def _full_digest(row: Sequence[Any]) -> int:
    return hash(tuple(row[1:]))


class PeriodicTaskSource(EntrySource):
    """The enabled rows of django-celery-beat's ``PeriodicTask`` table.

    ``written`` is this interface's default, None: the store keeps no write of
    these rows, so the claim cannot refuse a slot of a definition another
    replica already saw replaced (as it does for stored schedules). What
    bounds the window instead is how soon each replica sees an edit: the next
    tick (about a second) for a ``save()``, ``delete()`` or an admin action,
    :attr:`rescan_period` for a bare ``QuerySet.update()``. Within that window
    a replica may still send a slot under the definition it had, once (every
    slot is still sent once, under one definition or the other).

    ``now`` (the process's monotonic clock, in seconds) paces the rolling
    rescan; tests pass their own.
    """

    label = LABEL
    writes_back = True

    #: every row is read whole again within this many seconds (the bound on a
    #: ``QuerySet.update()`` that bumped nothing)
    rescan_period: float = 60.0
    #: at least this many rows a tick are rescanned (a small table is then
    #: rescanned every few ticks)
    rescan_min: int = 200

    def __init__(
        self,
        default_tz: Any = None,
        *,
        rescan_period: float | None = None,
        now: Callable[[], float] = time.monotonic,
    ) -> None:
        self._default_tz = default_tz
        if rescan_period is not None:
            if not rescan_period > 0:
                raise ValueError(f"rescan_period={rescan_period!r}: must be more than 0 seconds")
            self.rescan_period = rescan_period
        self._now = now
        self._known: dict[int, _Known] = {}
        #: the highest ``date_changed`` read so far
        self._high: datetime | None = None
        #: the rescan's position (the last id it read) and when it last ran
        self._scan_after = 0
        self._scan_at: float | None = None
        #: what each part of the last :meth:`changes` read, for the benchmark
        #: and tests: statements and rows
        self.reads = {"statements": 0, "rows": 0}

    # -- the interface -----------------------------------------------------

    def load(self) -> tuple[Sequence[EntryDefinition], object]:
        """Nothing yet: the rows come with the first :meth:`changes`, read as
        any change is, so a row that cannot be scheduled is logged and skipped
        rather than stopping every replica at start-up."""
        return (), _FIRST

    def changes(self, cursor: object) -> tuple[Sequence[Change], object]:
        """What changed since ``cursor``: one statement when nothing did,
        besides the rescan's slice (see the module's docstring)."""
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
        reads = self.reads = {"statements": 1, "rows": 0}
        last_update = (
            PeriodicTasks.objects.filter(ident=1).values_list("last_update", flat=True).first()
        )
        if cursor.reread:
            rows = list(PeriodicTask.objects.values_list(*FIELDS))
            reads["statements"] += 1
            reads["rows"] += len(rows)
            changes = self._apply(rows, whole=True)
            self._scan_after, self._scan_at = 0, self._now()
            return changes, _Cursor(last_update)
        changes = []
        if last_update != cursor.last_update:
            changes.extend(self._changed(PeriodicTask))
        changes.extend(self._rescan(PeriodicTask))
        return changes, _Cursor(last_update)

    def _changed(self, model: Any) -> list[Change]:
        """The rows stamped since the highest ``date_changed`` read, then the
        rows whose :data:`SHAPE` differs, new ones, and deletions."""
        reads = self.reads
        query = model.objects.all()
        if self._high is not None:
            query = query.filter(date_changed__gte=self._high - CHANGED_SLACK)
        rows = list(query.values_list(*FIELDS))
        changes = self._apply(rows, whole=False)
        shapes = list(model.objects.values_list(*SHAPE))
        reads["statements"] += 2
        reads["rows"] += len(rows) + len(shapes)
        known = self._known
        again = [
            row[0]
            for row in shapes
            if (k := known.get(row[0])) is None or k.shape != _projected_digest(row)
        ]
        present = {row[0] for row in shapes}
        gone = [pk for pk in known if pk not in present]
        changes.extend(self._removed(gone))
        if again:
            whole = self._read_ids(model, again)
            changes.extend(self._apply(whole, whole=False))
        return changes

    def _rescan(self, model: Any) -> list[Change]:
        """The next slice of the table, by id, compared with what is in force."""
        now = self._now()
        elapsed = 0.0 if self._scan_at is None else now - self._scan_at
        self._scan_at = now
        budget = max(self.rescan_min, math.ceil(len(self._known) * elapsed / self.rescan_period))
        after = self._scan_after
        rows = list(model.objects.filter(id__gt=after).order_by("id").values_list(*FIELDS)[:budget])
        self.reads["statements"] += 1
        self.reads["rows"] += len(rows)
        wrapped = len(rows) < budget
        high = math.inf if wrapped else rows[-1][0]
        self._scan_after = 0 if wrapped else int(high)
        # rows of the slice that vanished: deleted without a bump (raw SQL)
        gone = [pk for pk in self._known if after < pk <= high] if rows or wrapped else []
        seen = {row[0] for row in rows}
        changes = self._apply(rows, whole=False)
        changes.extend(self._removed(pk for pk in gone if pk not in seen))
        return changes

    def _read_ids(self, model: Any, ids: Sequence[int]) -> list[tuple[Any, ...]]:
        rows: list[tuple[Any, ...]] = []
        for start in range(0, len(ids), _ID_CHUNK):
            chunk = ids[start : start + _ID_CHUNK]
            rows.extend(model.objects.filter(id__in=chunk).values_list(*FIELDS))
            self.reads["statements"] += 1
        self.reads["rows"] += len(rows)
        return rows

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
            stamp = row[_F["date_changed"]]
            if stamp is not None and (self._high is None or stamp > self._high):
                self._high = stamp
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
            known[pk] = _Known(name, full, _shape_digest(row))
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
    "CHANGED_SLACK",
    "FIELDS",
    "IGNORED",
    "LABEL",
    "OneOffSchedule",
    "PeriodicTaskSource",
    "definition_of",
]
