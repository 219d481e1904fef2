"""A stored entry as data: the store's columns, and the document of files and ``--json``.

Three forms, each the one text of its entry:

* the **schedule's data form** (:func:`schedule_to_data`,
  :func:`schedule_from_data`; defined in :mod:`.kinds`): one JSON object,
  ``{"every": 30.0}``, ``{"crontab": "*/5 * * * *", "tz": "Europe/Paris"}``,
  ``{"solar": "sunset", "lat": 48.85, "lon": 2.35}``, ``{"at": "..."}``;
* the **fields** (:func:`entry_to_fields`, :func:`entry_from_fields`): the
  plain values the store keeps in its columns. JSON texts are compact with
  sorted keys, so an unchanged entry encodes to the same texts and the store
  can skip a write that changes nothing by comparing them. Instants are
  microseconds since the epoch (UTC), as everywhere in the store;
* the **document** (:func:`entry_to_document`, :func:`entry_from_document`):
  what a person reads and writes in a YAML or JSON file and sees with
  ``--json``: instants in ISO 8601, durations in seconds, keys at their
  default left out.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from ..exceptions import InvalidEntry
from ..timeline.clock import US, datetime_to_us, us_to_datetime
from .checks import compact_json, policy_to_data
from .entry import StoredEntry, stored_entry
from .kinds import schedule_from_data, schedule_to_data
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

#: the keys of the document form (besides the entry's name, which is its key
#: in a file), and their values at the default, which a document leaves out
DOCUMENT_DEFAULTS: dict[str, Any] = {
    "task": None,
    "schedule": None,
    "args": [],
    "kwargs": {},
    "options": {},
    "enabled": True,
    "start": None,
    "end": None,
    "max_runs": None,
    "missed": None,
    "jitter": 0,
    "description": "",
}


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


def _seconds(value: timedelta) -> float | int:
    us = value // timedelta(microseconds=1)
    return us // US if us % US == 0 else us / US


def entry_to_document(entry: StoredEntry) -> dict[str, Any]:
    """The document of an entry (keys of :data:`DOCUMENT_DEFAULTS`; those at
    their default left out, ``task`` and ``schedule`` always in).

    Neither its name (a file's key, or given beside it), nor ``managed_by``
    (the import sets it), nor the store-kept fields: a document is what a
    person writes.
    """
    document: dict[str, Any] = {
        "task": entry.task,
        "schedule": schedule_to_data(entry.schedule),
        "args": list(entry.args),
        "kwargs": dict(entry.kwargs),
        "options": dict(entry.options),
        "enabled": entry.enabled,
        "start": None if entry.start is None else entry.start.isoformat(),
        "end": None if entry.end is None else entry.end.isoformat(),
        "max_runs": entry.max_runs,
        "missed": None if entry.missed is None else policy_to_data(entry.missed),
        "jitter": _seconds(entry.jitter),
        "description": entry.description,
    }
    return {
        key: value
        for key, value in document.items()
        if key in ("task", "schedule") or value != DOCUMENT_DEFAULTS[key]
    }


def entry_from_document(
    name: str, doc: Any, *, managed_by: str | None = None, **checks: Any
) -> StoredEntry:
    """The entry a document describes (see :func:`entry_to_document`);
    InvalidEntry naming the entry and the field for anything wrong, an unknown
    key included. ``managed_by``: the import file that manages it. ``checks``:
    :func:`~celery_singlebeat.stored_entry`'s ``now`` and ``check_jitter``.
    """
    if not isinstance(doc, Mapping):
        raise InvalidEntry(name, "task", f"the entry is {doc!r}, not a mapping of its fields")
    unknown = sorted(str(k) for k in doc if k not in DOCUMENT_DEFAULTS)
    missing = [k for k in ("task", "schedule") if doc.get(k) is None]
    problems = [
        (key, f"unknown key; expected {', '.join(DOCUMENT_DEFAULTS)}") for key in unknown
    ] + [(key, "missing") for key in missing]
    if problems:
        raise InvalidEntry(name, *problems[0], *problems[1:])
    values = {key: doc.get(key, DOCUMENT_DEFAULTS[key]) for key in DOCUMENT_DEFAULTS}
    return stored_entry(
        name,
        values["task"],
        values["schedule"],
        args=values["args"] if values["args"] is not None else (),
        kwargs=values["kwargs"],
        options=values["options"],
        enabled=values["enabled"],
        start=values["start"],
        end=values["end"],
        max_runs=values["max_runs"],
        missed=values["missed"],
        jitter=values["jitter"] if values["jitter"] is not None else 0,
        description=values["description"] if values["description"] is not None else "",
        managed_by=managed_by,
        **checks,
    )


def schedule_text(entry: StoredEntry) -> str:
    """The entry's schedule as a person reads it: ``every 30s``,
    ``0 3 * * * (Europe/Paris)``, ``at 2026-12-24T17:00:00+00:00``."""
    data = schedule_to_data(entry.schedule)
    if "every" in data:
        return f"every {data['every']:g}s"
    if "crontab" in data:
        return f"{data['crontab']}" + (f" ({data['tz']})" if data.get("tz") else "")
    if "at" in data:
        return f"at {data['at']}"
    return compact_json(data)


__all__ = [
    "DOCUMENT_DEFAULTS",
    "STORE_KEPT_FIELDS",
    "WRITTEN_FIELDS",
    "entry_from_document",
    "entry_from_fields",
    "entry_to_document",
    "entry_to_fields",
    "schedule_from_data",
    "schedule_text",
    "schedule_to_data",
]
