"""When a stored entry runs: its definition for the engine, and its next runs.

:func:`definition_of` turns a :class:`~.entry.StoredEntry` into the
:class:`~celery_singlebeat.sources.EntryDefinition` the engine tracks. Its
``schedule`` is a :class:`StoredSchedule`, which gives the engine (through
``slots.sequence_for``'s ``slot_sequence`` hook), the catalog (through
``catalog_form.spec_of``) and the operator's status (through the spec) one sequence of
instants: the entry's schedule within its start and end, its first
``max_runs`` runs, each moved by its jitter (:mod:`celery_singlebeat.timeline.bounds`).

:func:`next_runs` computes the same instants for a person: of a stored entry,
saved or not, or of a bare schedule (a ``beat_schedule`` entry's), so that
what ``schedules show --next`` prints is what the replicas send.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone, tzinfo
from typing import Any

from celery.schedules import crontab

from ..sources import EntryDefinition
from ..store.values import EDITABLE, ScheduleRow
from ..timeline.bounds import UNBOUNDED, At, BoundedSchedule, Bounds, bounded_sequence
from ..timeline.clock import datetime_to_us, us_to_datetime
from ..timeline.slots import MissedPolicy, SlotSequence, sequence_for
from .entry import StoredEntry
from .kinds import own_zone, schedule_from_data
from .rows import NO_OPTIONS, checked_row

#: the source label of stored entries, in every message about one
LABEL = "stored schedules"


@dataclass(frozen=True)
class StoredSchedule(BoundedSchedule):
    """A stored entry's schedule as the engine runs it: the Celery schedule (or
    :class:`~celery_singlebeat.timeline.bounds.At`) and the entry's
    :class:`~celery_singlebeat.timeline.bounds.Bounds`.

    ``slot_sequence(anchor_us, tz)`` gives its slots: an interval with a start
    runs at the start and every period after it (else from the anchor the
    store registered); start and end bound the runs; ``max_runs`` keeps the
    first so many at or after the start, else after the entry's creation;
    each run is moved later by the jitter, drawn from the entry's name.
    """

    #: an interval's grid without a start: the entry's creation on the
    #: database's clock, the same on every replica and for ``next_runs``,
    #: whenever a replica first saw the entry (None: the registered anchor)
    anchor_us: int | None = None

    def slot_sequence(self, anchor_us: int, tz: tzinfo) -> SlotSequence:
        return bounded_sequence(
            self.inner, anchor_us if self.anchor_us is None else self.anchor_us, tz, self.bounds
        )

    def __repr__(self) -> str:
        return f"StoredSchedule({self.inner!r}, {self.bounds!r})"


def _us(value: datetime | None) -> int | None:
    return None if value is None else datetime_to_us(value)


def bounds_of(entry: StoredEntry, runs_from_us: int | None = None) -> Bounds:
    """The bounds of an entry's runs. ``max_runs`` counts from its start, else
    its creation, else ``runs_from_us`` (an entry not saved yet)."""
    created = _us(entry.created)
    return _bounds(
        entry.name,
        _us(entry.start),
        _us(entry.end),
        entry.max_runs,
        entry.jitter // timedelta(microseconds=1),
        created if created is not None else runs_from_us,
    )


def _bounds(
    name: str,
    start_us: int | None,
    end_us: int | None,
    max_runs: int | None,
    jitter_us: int,
    runs_from_us: int | None,
) -> Bounds:
    if start_us is None and end_us is None and max_runs is None and not jitter_us:
        # one shared object for the entries that have no bounds (nearly all):
        # the count's origin and the jitter's key mean nothing without them
        return UNBOUNDED
    return Bounds(
        start_us=start_us,
        end_us=end_us,
        runs_from_us=runs_from_us,
        max_runs=max_runs,
        jitter_us=jitter_us,
        jitter_key=name,
    )


def zone_of(entry: StoredEntry, default_tz: Any) -> Any:
    """The time zone of an entry's runs: its crontab's own, else ``default_tz``."""
    return _zone(entry.schedule, default_tz)


def _zone(schedule: object, default_tz: Any) -> Any:
    own = own_zone(schedule) if isinstance(schedule, crontab) else None
    return own or default_tz


def definition_of(
    entry: StoredEntry,
    default_policy: MissedPolicy,
    default_tz: Any,
    *,
    label: str = LABEL,
) -> EntryDefinition:
    """The definition the engine tracks for an enabled stored entry.

    ``policy``: the entry's override, or ``default_policy`` itself when it has
    none or an equal one (one object for 100,000 entries). ``tz``: the
    crontab's own zone, else ``default_tz``. ``revision``: the store's, as
    text. ``since_us``: when this version was written (the database's clock):
    no slot at or before it is sent under it, so an edit never sends a burst
    of past slots. A disabled entry is never given to the engine (its source
    drops it), so this does not look at ``enabled``.
    """
    return _definition(
        entry.name,
        entry.task,
        entry.schedule,
        entry.args,
        entry.kwargs,
        entry.options,
        entry.missed,
        bounds_of(entry),
        _us(entry.created),
        _us(entry.updated),
        entry.revision,
        default_policy,
        default_tz,
        label,
    )


def definition_of_row(
    row: ScheduleRow,
    default_policy: MissedPolicy,
    default_tz: Any,
    *,
    label: str = LABEL,
) -> EntryDefinition:
    """:func:`definition_of` the entry of a row as the store keeps it, the
    same definition, without the :class:`~.entry.StoredEntry` between:
    a replica reads every row at start-up (100,000 took 2.7 s that way, 0.8 s
    this one). InvalidEntry as ``columns.entry_from_fields`` for a row that is
    not a valid entry."""
    values = checked_row(*row[:_WRITTEN])
    created = row.created_us
    return _definition(
        row.name,
        row.task,
        values.schedule,
        values.args,
        values.kwargs,
        values.options,
        values.missed,
        _bounds(row.name, row.start_us, row.end_us, row.max_runs, row.jitter_us or 0, created),
        created,
        row.updated_us,
        row.revision,
        default_policy,
        default_tz,
        label,
    )


#: the written columns lead a ScheduleRow, in checked_row's order
_WRITTEN = len(EDITABLE)


def _definition(
    name: str,
    task: str,
    schedule: object,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    options: Mapping[str, Any],
    missed: MissedPolicy | None,
    bounds: Bounds,
    created_us: int | None,
    updated_us: int | None,
    revision: int | None,
    default_policy: MissedPolicy,
    default_tz: Any,
    label: str,
) -> EntryDefinition:
    policy = missed
    if policy is None or policy == default_policy:
        policy = default_policy
    return EntryDefinition(
        name=name,
        task=task,
        schedule=StoredSchedule(schedule, bounds, created_us),
        args=args,
        kwargs=kwargs,
        options=options or NO_OPTIONS,
        policy=policy,
        tz=_zone(schedule, default_tz),
        revision="" if revision is None else str(revision),
        source=label,
        since_us=updated_us,
    )


def _bare(schedule: Any) -> Any:
    if isinstance(schedule, datetime):
        return At(schedule)
    if isinstance(schedule, Mapping):
        return schedule_from_data(schedule, "(not saved)")
    return schedule


def sequence_of_entry(
    entry: StoredEntry, anchor_us: int, tz: tzinfo, runs_from_us: int | None = None
) -> SlotSequence:
    """The slots of a stored entry, as the engine computes them (with the
    interval anchor ``anchor_us``, and ``tz`` for a crontab without its own)."""
    zone = zone_of(entry, tz)
    created = _us(entry.created)
    return bounded_sequence(
        entry.schedule,
        anchor_us if created is None else created,
        zone,
        bounds_of(entry, runs_from_us),
    )


def next_runs(
    schedule_or_entry: Any,
    n: int,
    *,
    now: datetime | None = None,
    tz: tzinfo = timezone.utc,
    anchor: datetime | None = None,
) -> list[datetime]:
    """The next ``n`` runs after ``now`` (aware, UTC; ``now`` defaults to the
    process's clock), as the replicas compute them.

    Of a :class:`~.entry.StoredEntry` (its start, end, ``max_runs`` and
    jitter; none when disabled; ``max_runs`` of an entry not saved yet counts
    from ``now``), or of a bare schedule: Celery's ``crontab``, ``schedule``,
    ``solar``, a ``timedelta``, an aware ``datetime`` (one run), the data form.
    ``tz`` is the zone of a crontab without its own (the app's). An interval
    runs every period after ``anchor`` (the entry's registered anchor; default
    ``now``): one not saved yet has none.
    """
    if n < 0:
        raise ValueError(f"n={n}: must be 0 or more")
    now_us = datetime_to_us(now if now is not None else datetime.now(timezone.utc))
    anchor_us = now_us if anchor is None else datetime_to_us(anchor)
    sequence: SlotSequence
    if isinstance(schedule_or_entry, StoredEntry):
        if not schedule_or_entry.enabled:
            return []
        sequence = sequence_of_entry(schedule_or_entry, anchor_us, tz, runs_from_us=now_us)
    else:
        schedule = _bare(schedule_or_entry)
        zone = tz
        if isinstance(schedule, crontab):
            zone = own_zone(schedule) or tz
        sequence = sequence_for(schedule, anchor_us, zone)
    runs: list[datetime] = []
    at: int | None = now_us
    while len(runs) < n:
        assert at is not None
        at = sequence.next_after(at)
        if at is None:
            break
        runs.append(us_to_datetime(at))
    return runs


__all__ = [
    "LABEL",
    "StoredSchedule",
    "bounds_of",
    "definition_of",
    "definition_of_row",
    "next_runs",
    "sequence_of_entry",
    "zone_of",
]
