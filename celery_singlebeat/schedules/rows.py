"""A stored row read back: the checks of :mod:`.checks` on a row's stored form,
made cheap for the 100,000 rows a replica reads at start-up.

:func:`checked_row` takes the texts and numbers of a row's written columns
(microseconds, JSON texts) and gives their values, parsed and checked as
:func:`~celery_singlebeat.stored_entry` checks a new entry, or raises
:class:`~celery_singlebeat.exceptions.InvalidEntry` naming every wrong field
of a row written by hand or by a newer release. Both the entry of a row
(``entry_from_fields``) and the engine's definition of one
(:func:`.runs.definition_of_row`, which skips the :class:`.entry.StoredEntry`
between) read rows through it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import timedelta
from types import MappingProxyType
from typing import Any, NamedTuple

from ..exceptions import InvalidEntry
from ..timeline.clock import us_to_datetime
from ..timeline.slots import MissedPolicy
from ..widths import MAX_MANAGED_BY
from .checks import (
    MAX_ARGUMENTS_BYTES,
    MAX_DESCRIPTION,
    Problems,
    check_arguments_size,
    check_max_runs,
    check_name,
    check_order,
    check_task,
    checked_jitter,
    checked_missed,
    checked_options,
    checked_text,
)
from .kinds import make_schedule


class RowValues(NamedTuple):
    """What the texts of a stored row hold, parsed and checked (:func:`checked_row`)."""

    schedule: object
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    #: an empty one shared by every row without options (treat as frozen)
    options: Mapping[str, Any]
    missed: MissedPolicy | None


#: the options of a row that has none: one shared mapping (a replica keeps
#: every entry's definition)
NO_OPTIONS: Mapping[str, Any] = MappingProxyType({})

#: the schedules of the schedule texts read lately: 100,000 rows read at
#: start-up hold a few thousand distinct texts, and the text itself is the key
#: (no parse to find it). Only schedules that passed are kept, each shared by
#: the rows that have it (nothing changes one).
_SCHEDULE_OF: dict[str, object] = {}
_SCHEDULE_OF_MAX = 8192


def _schedule_of_text(problems: Problems, text: Any) -> object | None:
    known = _SCHEDULE_OF.get(text) if isinstance(text, str) else None
    if known is not None:
        return known
    data = _json_text(problems, "schedule", text)
    if data is None:
        return None
    try:
        made = make_schedule(problems.entry, data)
    except InvalidEntry as exc:
        problems.take(exc)
        return None
    if len(_SCHEDULE_OF) >= _SCHEDULE_OF_MAX:
        _SCHEDULE_OF.clear()  # a few thousand parses again, rarely
    _SCHEDULE_OF[text] = made
    return made


def checked_row(
    name: Any,
    task: Any,
    spec: Any,
    args: Any,
    kwargs: Any,
    options: Any,
    enabled: Any,
    start_us: Any,
    end_us: Any,
    max_runs: Any,
    policy: Any,
    jitter_us: Any,
    description: Any,
    managed_by: Any,
) -> RowValues:
    """The parsed parts of a stored row's written columns, in the store's
    order (``ScheduleRow``'s first 14 fields); InvalidEntry naming the entry
    and every wrong field, for a row written by hand or by a newer release.

    Each field is checked as :func:`stored_entry` checks it, in its stored
    form (instants and the jitter as microseconds, the rest as JSON texts),
    but the jitter's bound (a walk of a thousand runs, checked when the row
    was written), and for less (a replica reads 100,000 rows at start-up):
    each distinct schedule text is parsed once, the arguments are taken as
    their JSON texts give them, and the fields at their default are not
    looked into.
    """
    problems = Problems(name if isinstance(name, str) else repr(name))
    check_name(problems, name)
    check_task(problems, task)
    schedule = _schedule_of_text(problems, spec)
    good_args, good_kwargs = argument_texts(problems, args, kwargs)
    good_options: Mapping[str, Any] = NO_OPTIONS
    if options != "{}":
        value = _json_text(problems, "options", options)
        if value is not None:
            good_options = checked_options(problems, value, {})
    start = _stored_instant(problems, "start", start_us)
    end = _stored_instant(problems, "end", end_us)
    if start is not None and end is not None:
        check_order(problems, us_to_datetime(start), us_to_datetime(end))
    check_max_runs(problems, max_runs)
    missed = None
    if policy is not None:
        value = _json_text(problems, "missed", policy)
        if value is not None:
            missed = checked_missed(problems, value)
    if jitter_us:
        if not isinstance(jitter_us, int):
            problems.add("jitter", f"{jitter_us!r} is not a number of microseconds")
        else:
            checked_jitter(problems, timedelta(microseconds=jitter_us))
    if description:
        checked_text(problems, "description", description, MAX_DESCRIPTION, empty=True)
    if managed_by is not None:
        checked_text(problems, "managed_by", managed_by, MAX_MANAGED_BY, empty=False)
    problems.raise_any()
    return RowValues(schedule, good_args, good_kwargs, good_options, missed)


def _stored_instant(problems: Problems, name: str, value: Any) -> int | None:
    if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
        problems.add(name, f"{value!r} is not an instant in microseconds since the epoch")
        return None
    return value  # type: ignore[no-any-return]


def argument_texts(
    problems: Problems, args_text: Any, kwargs_text: Any
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The arguments of their stored JSON texts, checked as :func:`stored_entry`
    checks given ones, without walking them: what JSON text gives back is
    JSON already (NaN and Infinity, which Python's parser takes, are refused),
    and the compact text is never longer than the text read, so only texts
    over the cap are measured again."""
    if args_text == "[]":
        args: Any = []
    else:
        args = _json_text(problems, "args", args_text)
    kwargs = {} if kwargs_text == "{}" else _json_text(problems, "kwargs", kwargs_text)
    args_ok = isinstance(args, list)
    if args is not None and not args_ok:
        problems.add("args", f"{args!r} is not a list of arguments")
    kwargs_ok = isinstance(kwargs, dict)
    if kwargs is not None and not kwargs_ok:
        problems.add("kwargs", f"{kwargs!r} is not a mapping of keyword arguments")
    if not (args_ok and kwargs_ok):
        return (), {}
    assert isinstance(args, list) and isinstance(kwargs, dict)
    if _text_bytes(args_text) + _text_bytes(kwargs_text) > MAX_ARGUMENTS_BYTES:
        check_arguments_size(problems, args, kwargs)
    return tuple(args), kwargs


def _refuse_constant(text: str) -> Any:
    raise ValueError(f"{text} is not a JSON number")


#: one decoder for every row (``json.loads`` with a keyword builds one a call)
_DECODER = json.JSONDecoder(parse_constant=_refuse_constant)


def _json_text(problems: Problems, field_name: str, text: Any) -> Any:
    """The value of a JSON text, or None after adding the problem."""
    if not isinstance(text, str):
        problems.add(field_name, f"{text!r} is not JSON text")
        return None
    try:
        return _DECODER.decode(text)
    except ValueError as exc:
        problems.add(field_name, f"not JSON: {exc}")
        return None


def _text_bytes(text: str) -> int:
    return len(text) if text.isascii() else len(text.encode("utf-8"))


__all__ = ["NO_OPTIONS", "RowValues", "argument_texts", "checked_row"]
