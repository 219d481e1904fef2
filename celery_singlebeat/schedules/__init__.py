"""Schedules stored in the database and edited at run time: the model.

A stored entry is a value (:class:`StoredEntry`), checked whole when it is
made (:func:`~celery_singlebeat.stored_entry`,
:func:`~celery_singlebeat.schedules.with_changes`; a wrong field raises
:class:`~celery_singlebeat.exceptions.InvalidEntry` naming the entry and the
field). Modules, one concept each:

* ``kinds.py``: the kinds of schedule (interval, crontab, solar, one run at an
  instant), checked, and their data form;
* ``entry.py``: the value, :class:`StoredEntry`, made by
  :func:`~celery_singlebeat.stored_entry` and changed by :func:`with_changes`;
* ``checks.py``: the check of each field, each problem named;
* ``rows.py``: a row read back from the store, checked as cheaply as
  start-up needs;
* ``columns.py``: the entry as the store's columns;
* ``document.py``: the entry as a document (files, ``--json``);
* ``runs.py``: the entry as the engine's definition (:func:`definition_of`)
  and its next runs (:func:`next_runs`).

Nothing here touches a store or the engine.
"""

from __future__ import annotations

from ..timeline.bounds import At
from .columns import entry_from_fields, entry_to_fields
from .document import entry_from_document, entry_to_document
from .entry import StoredEntry, stored_entry, with_changes
from .kinds import schedule_from_data, schedule_to_data
from .runs import StoredSchedule, definition_of, next_runs

__all__ = [
    "At",
    "StoredEntry",
    "StoredSchedule",
    "definition_of",
    "entry_from_document",
    "entry_from_fields",
    "entry_to_document",
    "entry_to_fields",
    "next_runs",
    "schedule_from_data",
    "schedule_to_data",
    "stored_entry",
    "with_changes",
]
