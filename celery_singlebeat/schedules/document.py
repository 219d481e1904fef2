"""A stored entry as a document: what a person reads and writes in a YAML or
JSON file (``schedules import``/``export``) and sees with ``--json``.

The **document** (:func:`entry_to_document`, :func:`entry_from_document`) has
instants in ISO 8601, durations in seconds, the schedule in its data form
(:mod:`.kinds`: ``{"every": 30.0}``,
``{"crontab": "*/5 * * * *", "tz": "Europe/Paris"}``,
``{"solar": "sunset", "lat": 48.85, "lon": 2.35}``, ``{"at": "..."}``), and
its keys at their default left out. The store's columns are
:mod:`.columns`'.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from ..exceptions import InvalidEntry
from ..timeline.clock import US
from .checks import compact_json, policy_to_data
from .entry import StoredEntry, stored_entry
from .kinds import schedule_to_data

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


__all__ = ["DOCUMENT_DEFAULTS", "entry_from_document", "entry_to_document", "schedule_text"]
