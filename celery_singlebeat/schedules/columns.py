"""A stored entry as the store's columns: the plain values of each, both ways.

The **fields** (:func:`entry_to_fields`, :func:`entry_from_fields`) are the
plain values the store keeps in its columns: the schedule's data form
(:mod:`.kinds`) as the ``spec`` column's JSON text, the arguments, options and
missed-run policy as JSON texts too. JSON texts are compact with sorted keys,
so an unchanged entry encodes to the same texts and the store can skip a write
that changes nothing by comparing them. Instants are microseconds since the
epoch (UTC), as everywhere in the store. The document a person writes is
:mod:`.document`'s.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from ..timeline.clock import datetime_to_us, us_to_datetime
from .checks import compact_json, policy_to_data
from .entry import StoredEntry
from .kinds import schedule_to_data
from .rows import checked_row

#: the columns :func:`entry_to_fields` gives, written by the store
WRITTEN_FIELDS = (
    "name",
    "task",
    "spec",
    "args",
    "kwargs",
    "options",
    "enabled",
    "start_us",
    "end_us",
    "max_runs",
    "policy",
    "jitter_us",
    "description",
    "managed_by",
)

#: the columns the store keeps itself, read back by :func:`entry_from_fields`
STORE_KEPT_FIELDS = ("revision", "created_us", "updated_us", "created_by", "updated_by")


def _us(value: Any) -> int | None:
    return None if value is None else datetime_to_us(value)


def _jitter_us(entry: StoredEntry) -> int:
    return entry.jitter // timedelta(microseconds=1)


def entry_to_fields(entry: StoredEntry) -> dict[str, Any]:
    """The plain values of the columns the store writes (:data:`WRITTEN_FIELDS`).

    The store-kept fields (revision, created, updated, by whom) are not in it:
    the store sets them as it writes.
    """
    return {
        "name": entry.name,
        "task": entry.task,
        "spec": compact_json(schedule_to_data(entry.schedule)),
        "args": compact_json(list(entry.args)),
        "kwargs": compact_json(entry.kwargs),
        "options": compact_json(dict(entry.options)),
        "enabled": entry.enabled,
        "start_us": _us(entry.start),
        "end_us": _us(entry.end),
        "max_runs": entry.max_runs,
        "policy": None if entry.missed is None else compact_json(policy_to_data(entry.missed)),
        "jitter_us": _jitter_us(entry),
        "description": entry.description,
        "managed_by": entry.managed_by,
    }


def entry_from_fields(fields: Mapping[str, Any]) -> StoredEntry:
    """The entry of a row's plain values (:data:`WRITTEN_FIELDS`, and the
    :data:`STORE_KEPT_FIELDS` when present); InvalidEntry naming the entry and
    every wrong field for a row that is not a valid entry (written by hand, or
    by a newer release): checked as ``rows.checked_row`` checks a row,
    which is as :func:`~celery_singlebeat.stored_entry` checks a write, but
    for the jitter's bound (checked when the row was written).
    """
    row = [fields.get(key, _ROW_DEFAULTS.get(key)) for key in WRITTEN_FIELDS]
    values = checked_row(*row)
    revision = fields.get("revision")
    return StoredEntry(
        name=fields["name"],
        task=fields["task"],
        schedule=values.schedule,
        args=values.args,
        kwargs=values.kwargs,
        options=dict(values.options),
        enabled=bool(fields.get("enabled", True)),
        start=_instant(fields.get("start_us")),
        end=_instant(fields.get("end_us")),
        max_runs=fields.get("max_runs"),
        missed=values.missed,
        jitter=timedelta(microseconds=fields.get("jitter_us") or 0),
        description=fields.get("description") or "",
        managed_by=fields.get("managed_by"),
        revision=None if revision is None else int(revision),
        created=_instant(fields.get("created_us")),
        updated=_instant(fields.get("updated_us")),
        created_by=fields.get("created_by") or "",
        updated_by=fields.get("updated_by") or "",
    )


#: what a row's written column holds when the fields leave it out
_ROW_DEFAULTS: dict[str, Any] = {
    "args": "[]",
    "kwargs": "{}",
    "options": "{}",
    "enabled": True,
    "jitter_us": 0,
    "description": "",
}


def _instant(value: Any) -> Any:
    return None if value is None else us_to_datetime(int(value))


__all__ = [
    "STORE_KEPT_FIELDS",
    "WRITTEN_FIELDS",
    "entry_from_fields",
    "entry_to_fields",
]
