"""The admin's forms: a stored schedule's (add and change), and the inputs of
the pause and run-now confirmations.

:class:`StoredScheduleForm` checks its input with the API's own checks
(:func:`~celery_singlebeat.stored_entry` and
:func:`~celery_singlebeat.schedules.with_changes`), so the admin refuses what
``Schedules`` refuses, and puts each problem the API names
(:class:`~celery_singlebeat.exceptions.InvalidEntry`'s ``(field, reason)``
pairs: ``task``, ``schedule.tz``, ``crontab.hour``, ``options.queue``...)
on the form field that holds it. The write itself goes through the API too
(:meth:`StoredScheduleForm.write`), never an ORM ``save()``.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from django import forms
from django.core.exceptions import ValidationError

from ...exceptions import InvalidEntry
from ...schedules.entry import StoredEntry, stored_entry, with_changes
from ...schedules.kinds import schedule_to_data
from ...widths import MAX_ENTRY_NAME, MAX_REASON, MAX_SCHEDULE_WHY, MAX_TASK

#: the schedule's fields on the form, one of which an entry has
SCHEDULE_FIELDS = ("every", "cron", "at")


def field_of(problem: str, kind: str | None) -> str | None:
    """The form field that holds a field the API names (None: the form has
    none, the problem is the form's as a whole). ``kind`` is the schedule
    field the input used (every, cron, at), for a problem of the schedule as
    a whole."""
    if problem in ("name", "task", "args", "kwargs", "start", "end", "description", "enabled"):
        return problem
    if problem == "options.queue":
        return "queue"
    if problem == "schedule.tz":
        return "tz"
    if problem == "schedule.every":
        return "every"
    if problem == "schedule.at":
        return "at"
    if problem in ("crontab", "schedule.crontab") or problem.startswith("crontab."):
        return "cron"
    if problem == "schedule" or problem.startswith("schedule."):
        return kind
    return None


class StoredScheduleForm(forms.Form):
    """A stored entry's fields as the admin edits them; ``instance`` (a
    :class:`~.models.StoredSchedule` row) and ``entry`` (its
    :class:`StoredEntry`, read through the API) for a change.

    Valid once the API's checks pass: ``self.entry`` is then the checked entry
    (for a change, the stored one with the form's changes: the fields the form
    does not show, such as ``max_runs`` or ``jitter``, are kept), and
    ``self.changes`` the fields the form sets, as ``Schedules.update`` takes
    them.
    """

    name = forms.CharField(max_length=MAX_ENTRY_NAME, help_text="Unique; renaming is not an edit.")
    task = forms.CharField(max_length=MAX_TASK, help_text="The Celery task's registered name.")
    every = forms.FloatField(
        required=False, label="Every (seconds)", help_text="An interval, in seconds."
    )
    cron = forms.CharField(
        required=False,
        label="Crontab",
        help_text="Five fields: minute hour day-of-month month day-of-week (0 3 * * *).",
    )
    tz = forms.CharField(
        required=False,
        label="Time zone",
        help_text="The crontab's IANA zone (Europe/Paris); empty: the project's.",
    )
    at = forms.CharField(
        required=False, help_text="One run at this ISO 8601 instant (2026-12-24T17:00:00+00:00)."
    )
    args = forms.CharField(
        required=False,
        initial="[]",
        widget=forms.Textarea(attrs={"rows": 2}),
        help_text="Positional arguments, a JSON list.",
    )
    kwargs = forms.CharField(
        required=False,
        initial="{}",
        widget=forms.Textarea(attrs={"rows": 2}),
        help_text="Keyword arguments, a JSON object.",
    )
    queue = forms.CharField(required=False, help_text="The queue to send to; empty: the default.")
    start = forms.CharField(
        required=False, help_text="No run before this ISO 8601 instant (with its UTC offset)."
    )
    end = forms.CharField(
        required=False, help_text="No run after this ISO 8601 instant (with its UTC offset)."
    )
    description = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 3}))
    enabled = forms.BooleanField(required=False, initial=True)
    why = forms.CharField(
        required=False,
        max_length=MAX_SCHEDULE_WHY,
        help_text="Why this change, as the history records it.",
    )
    revision = forms.IntegerField(required=False, widget=forms.HiddenInput)

    def __init__(
        self,
        data: Any = None,
        files: Any = None,
        *,
        instance: Any = None,
        entry: StoredEntry | None = None,
        **kwargs: Any,
    ) -> None:
        if entry is not None:
            # a bound form too: its disabled name takes the initial value
            kwargs["initial"] = {**initial_of(entry), **(kwargs.get("initial") or {})}
        super().__init__(data, files, **kwargs)
        self.instance = instance
        self.current = entry
        self.entry: StoredEntry | None = None
        self.changes: dict[str, Any] = {}
        if entry is not None:
            # a rename is a delete and an add: the name of a stored entry is fixed
            self.fields["name"].disabled = True
            self.fields["name"].help_text = "Fixed: a rename is a delete and an add."
        else:
            del self.fields["revision"]

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if self.errors:
            return data
        fields: dict[str, Any] = {}
        given = [f for f in SCHEDULE_FIELDS if data.get(f) not in (None, "")]
        kind = given[0] if len(given) == 1 else None
        if len(given) > 1:
            for f in given:
                self.add_error(f, f"give one schedule: {' or '.join(given)}, not several")
        elif not given and self.current is None:
            self.add_error("every", "give a schedule: every, crontab or at")
        if data.get("tz") and kind != "cron":
            self.add_error("tz", "a time zone goes with a crontab")
        for key in ("args", "kwargs"):
            text = (data.get(key) or "").strip() or ("[]" if key == "args" else "{}")
            try:
                fields[key] = json.loads(text)
            except ValueError as exc:
                self.add_error(key, f"not JSON: {exc}")
        if self.errors:
            return data
        if kind == "every":
            fields["schedule"] = {"every": data["every"]}
        elif kind == "cron":
            fields["schedule"] = {"crontab": data["cron"].strip(), "tz": data.get("tz") or None}
        elif kind == "at":
            fields["schedule"] = {"at": data["at"].strip()}
        fields.update(
            task=data["task"].strip(),
            queue=(data.get("queue") or "").strip() or None,
            start=(data.get("start") or "").strip() or None,
            end=(data.get("end") or "").strip() or None,
            description=data.get("description") or "",
            enabled=bool(data.get("enabled")),
        )
        try:
            if self.current is None:
                schedule = fields.pop("schedule")
                self.entry = stored_entry(data["name"], fields.pop("task"), schedule, **fields)
            else:
                self.entry = with_changes(self.current, **fields)
        except InvalidEntry as exc:
            self.add_problems(exc, kind)
            return data
        self.changes = fields
        if self.current is not None and data.get("revision") is None:
            raise ValidationError("the form lost its revision: reload the entry and edit again")
        return data

    def add_problems(self, error: InvalidEntry, kind: str | None = None) -> None:
        """Each problem the API names, on the field that holds it (on the
        form as a whole when it has no such field)."""
        if kind is None:
            given = [f for f in SCHEDULE_FIELDS if self.data.get(f)]
            kind = given[0] if given else None
        for problem, reason in error.problems:
            where = field_of(problem, kind)
            if where is not None and where in self.fields and not self.fields[where].disabled:
                self.add_error(where, reason)
            else:
                self.add_error(None, f"{problem}: {reason}")


def initial_of(entry: StoredEntry) -> dict[str, Any]:
    """The form's values of a stored entry."""
    data = schedule_to_data(entry.schedule)
    return {
        "name": entry.name,
        "task": entry.task,
        "every": data.get("every"),
        "cron": data.get("crontab"),
        "tz": data.get("tz"),
        "at": data.get("at"),
        "args": json.dumps(list(entry.args)),
        "kwargs": json.dumps(entry.kwargs, sort_keys=True),
        "queue": entry.options.get("queue"),
        "start": _iso(entry.start),
        "end": _iso(entry.end),
        "description": entry.description,
        "enabled": entry.enabled,
        "revision": entry.revision,
    }


def _iso(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()


class PauseForm(forms.Form):
    """A pause's inputs: until when (empty: until resumed), and why."""

    until = forms.DateTimeField(
        required=False,
        help_text="The pause ends by itself then (UTC, 2026-12-24 17:00); empty: until resumed.",
    )
    reason = forms.CharField(
        required=False, max_length=MAX_REASON, help_text="Shown with the pause."
    )


class RunNowForm(forms.Form):
    """A run-now request's input: why."""

    reason = forms.CharField(
        required=False, max_length=MAX_REASON, help_text="Recorded with the request."
    )


__all__ = [
    "SCHEDULE_FIELDS",
    "PauseForm",
    "RunNowForm",
    "StoredScheduleForm",
    "field_of",
    "initial_of",
]
