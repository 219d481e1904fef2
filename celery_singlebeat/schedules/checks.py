"""The checks of a stored entry's fields: every field checked, each problem named.

:func:`~celery_singlebeat.stored_entry` (:mod:`.entry`) checks a new entry
with these, field by field; a row read back from the database goes through
:func:`.rows.checked_row`, the same checks of each field in its stored form
(microseconds, JSON texts), made cheap for the 100,000 rows a replica reads at
start-up. The problems of one entry are gathered in a :class:`Problems` and
raised together as one :class:`~celery_singlebeat.exceptions.InvalidEntry`
listing *every* wrong field of that entry at once (a person fixing a file
fixes them in one go), each named as the ``StoredEntry`` field it is, dotted
for a part of one (``crontab.hour``, ``options.priority``, ``schedule.tz``).
A ``check_*`` function adds the problems it finds; a ``checked_*`` one also
returns the value checked and normalised (None after a problem).

Pure: no store, no engine; the process clock only where a check needs "now"
(the jitter's bound, for a crontab or solar schedule), and passable.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta, timezone
from typing import Any

from celery.schedules import crontab

from ..config import (
    BUILTIN_MISSED_POLICY,
    MISSED_KEYS,
    MissedPolicyError,
    check_missed_policy,
    parse_missed_policy,
)
from ..exceptions import InvalidEntry
from ..timeline.bounds import At
from ..timeline.clock import US, datetime_to_us, parse_instant
from ..timeline.slots import MissedPolicy, period_of, sequence_for
from ..widths import MAX_ENTRY_NAME, MAX_TASK
from .kinds import own_zone

#: the longest description, in characters (a rule for people: its column
#: holds far more)
MAX_DESCRIPTION = 1000
#: ``args`` and ``kwargs`` together, as compact JSON, in UTF-8 bytes at most:
#: each replica keeps every entry's arguments, and each run sends them
MAX_ARGUMENTS_BYTES = 64 * 1024
#: ``options.headers`` as compact JSON, in UTF-8 bytes at most
MAX_HEADERS_BYTES = 16 * 1024
#: how many of a crontab's or solar schedule's next runs the jitter is checked
#: against (its shortest gap among them bounds the jitter)
JITTER_CHECKED_RUNS = 1000

#: the ``apply_async`` options Celery's beat passes, and so a stored entry keeps
OPTION_NAMES = ("queue", "exchange", "routing_key", "priority", "expires", "headers")

#: a control character (Unicode category Cc is exactly these two ranges): one
#: regular expression instead of a category lookup per character, for 100,000
#: names read at start-up
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")
#: whitespace as ``str.isspace`` tells it (the regular expression engine uses
#: the same table)
_SPACE = re.compile(r"\s")


def compact_json(value: Any) -> str:
    """The one text of a JSON value: compact, sorted keys, non-ASCII kept (so an
    unchanged entry encodes to the same text and the store can compare)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


class Problems:
    """The problems found in one entry, in the order of its fields (raised
    together as one :class:`~celery_singlebeat.exceptions.InvalidEntry`)."""

    def __init__(self, entry: str) -> None:
        self.entry = entry
        self.found: list[tuple[str, str]] = []

    def add(self, field_name: str, reason: str) -> None:
        self.found.append((field_name, reason))

    def take(self, error: InvalidEntry) -> None:
        self.found.extend(error.problems)

    def raise_any(self) -> None:
        if self.found:
            raise InvalidEntry(self.entry, *self.found[0], *self.found[1:])


# -- field checks ----------------------------------------------------------------


def _json_problem(value: Any, path: str) -> str | None:
    """Why ``value`` is no JSON value (naming where in it), or None."""
    if value is None or isinstance(value, (bool, int, str)):
        return None
    if isinstance(value, float):
        return (
            None
            if value == value and value not in (float("inf"), float("-inf"))
            else (f"{path} is {value!r}, which JSON cannot hold")
        )
    if isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            problem = _json_problem(item, f"{path}[{i}]")
            if problem:
                return problem
        return None
    if isinstance(value, Mapping):
        for key, item in value.items():
            if not isinstance(key, str):
                return f"{path} has the key {key!r}: JSON object keys are strings"
            problem = _json_problem(item, f"{path}[{key!r}]")
            if problem:
                return problem
        return None
    return f"{path} is a {type(value).__name__}, not JSON (use a string, number, list or object)"


def _as_json(value: Any) -> Any:
    """``value`` as JSON gives it back (tuples become lists)."""
    return json.loads(json.dumps(value))


def _size(value: Any) -> int:
    return len(compact_json(value).encode("utf-8"))


def check_name(problems: Problems, name: Any) -> None:
    if not isinstance(name, str) or not name:
        problems.add("name", f"{name!r} is not a non-empty string")
    elif len(name.encode("utf-8")) > MAX_ENTRY_NAME:
        problems.add("name", f"is {len(name.encode())} bytes long; at most {MAX_ENTRY_NAME}")
    elif _CONTROL.search(name):
        problems.add("name", "has a control character (a newline, a tab)")


def check_task(problems: Problems, task: Any) -> None:
    if not isinstance(task, str) or not task:
        problems.add("task", f"{task!r} is not a task name")
    elif len(task) > MAX_TASK:
        problems.add("task", f"is {len(task)} characters long; at most {MAX_TASK}")
    elif _SPACE.search(task):
        problems.add("task", f"{task!r} has whitespace; a task name has none")


def checked_arguments(
    problems: Problems, args: Any, kwargs: Any
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    good_args: tuple[Any, ...] = ()
    good_kwargs: dict[str, Any] = {}
    if isinstance(args, (str, bytes, Mapping)) or not isinstance(args, Iterable):
        problems.add("args", f"{args!r} is not a list of arguments")
        args_ok = False
    else:
        listed = list(args)
        problem = _json_problem(listed, "args")
        if problem:
            problems.add("args", problem)
        args_ok = problem is None
        if args_ok:
            good_args = tuple(_as_json(listed))
    if kwargs is None:
        kwargs = {}
    if not isinstance(kwargs, Mapping):
        problems.add("kwargs", f"{kwargs!r} is not a mapping of keyword arguments")
        kwargs_ok = False
    else:
        problem = _json_problem(kwargs, "kwargs")
        if problem:
            problems.add("kwargs", problem)
        kwargs_ok = problem is None
        if kwargs_ok:
            good_kwargs = _as_json(dict(kwargs))
    if args_ok and kwargs_ok:
        check_arguments_size(problems, list(good_args), good_kwargs)
    return good_args, good_kwargs


def checked_options(problems: Problems, options: Any, given: Mapping[str, Any]) -> dict[str, Any]:
    """The checked options: ``options`` merged with the ones given one by one."""
    merged: dict[str, Any] = {}
    if options is not None:
        if not isinstance(options, Mapping):
            problems.add("options", f"{options!r} is not a mapping of options")
            options = {}
        merged.update(options)
    for key, value in given.items():
        if value is None:
            continue
        if key in merged and merged[key] != value:
            problems.add(f"options.{key}", f"given twice: {merged[key]!r} and {value!r}")
        merged[key] = value
    checked: dict[str, Any] = {}
    for key, value in merged.items():
        where = f"options.{key}"
        if key not in OPTION_NAMES:
            problems.add(
                where if isinstance(key, str) else "options",
                f"unknown option {key!r}; expected {', '.join(OPTION_NAMES)}",
            )
        elif key in ("queue", "exchange", "routing_key"):
            if not isinstance(value, str) or not value or len(value) > 255:
                problems.add(where, f"{value!r} is not a name (1 to 255 characters)")
            else:
                checked[key] = value
        elif key == "priority":
            if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= 255:
                problems.add(where, f"{value!r} is not an integer from 0 to 255")
            else:
                checked[key] = value
        elif key == "expires":
            seconds = value.total_seconds() if isinstance(value, timedelta) else value
            if (
                not isinstance(seconds, (int, float))
                or isinstance(seconds, bool)
                or not 0 < seconds < float("inf")
            ):
                problems.add(where, f"{value!r} is not a number of seconds > 0")
            else:
                checked[key] = seconds
        elif key == "headers":
            problem = (
                f"{value!r} is not a mapping"
                if not isinstance(value, Mapping)
                else _json_problem(value, "headers")
            )
            if problem:
                problems.add(where, problem)
            elif _size(value) > MAX_HEADERS_BYTES:
                problems.add(
                    where, f"takes {_size(value):,} bytes as JSON; at most {MAX_HEADERS_BYTES:,}"
                )
            else:
                checked[key] = _as_json(dict(value))
    return checked


def checked_instant(problems: Problems, name: str, value: Any) -> datetime | None:
    if value is None:
        return None
    if isinstance(value, str):
        try:
            value = parse_instant(value)
        except ValueError:
            problems.add(name, f"{value!r} is not an ISO 8601 instant with a UTC offset")
            return None
    if not isinstance(value, datetime):
        problems.add(name, f"{value!r} is not an instant")
        return None
    if value.tzinfo is None or value.utcoffset() is None:
        problems.add(name, f"{value.isoformat()} is naive; give its UTC offset or time zone")
        return None
    return value.astimezone(timezone.utc)


def parse_missed(value: Any) -> MissedPolicy | None:
    """A missed-run policy override from any accepted form, read by the one
    parser of a policy (:func:`~celery_singlebeat.config.parse_missed_policy`):
    a :class:`~celery_singlebeat.config.MissedPolicyError` naming the part that
    is wrong (``policy``, ``grace`` or ``max``), ValueError for a value that is
    no policy at all.

    Accepted: None (the app's); a :class:`~celery_singlebeat.timeline.slots.MissedPolicy`;
    a mode (``"skip"``); a mapping of the document form (``policy``,
    ``grace`` in seconds or a timedelta, ``max``) or of a beat_schedule
    entry's options (``singlebeat_missed_policy``, ``_grace``, ``_max``).
    What it leaves unsaid takes the built-in defaults
    (:data:`~celery_singlebeat.config.BUILTIN_MISSED_POLICY`).
    """
    if value is None:
        return None
    if isinstance(value, MissedPolicy):
        return check_missed_policy(value)
    if isinstance(value, str):
        value = {"policy": value}
    if not isinstance(value, Mapping):
        raise ValueError(f"{value!r} is not a missed-run policy")
    keys = set(value)
    prefixed = {k for k in keys if isinstance(k, str) and k.startswith("singlebeat_")}
    if prefixed:
        prefix, allowed = "singlebeat_", {f"singlebeat_{v}" for v in MISSED_KEYS.values()}
        options = dict(value)
    else:
        prefix, allowed = "", set(MISSED_KEYS)
        options = {MISSED_KEYS[k]: v for k, v in value.items() if k in MISSED_KEYS}
    unknown = sorted(str(k) for k in keys - allowed)
    if unknown:
        raise ValueError(
            f"unknown key(s) {', '.join(unknown)}; expected {', '.join(sorted(allowed))}"
        )
    return parse_missed_policy(prefix, options, BUILTIN_MISSED_POLICY)


def policy_to_data(policy: MissedPolicy) -> dict[str, Any]:
    """The document form of a policy: ``{"policy", "grace" (seconds), "max"}``."""
    return {"policy": policy.mode, "grace": policy.grace_us / US, "max": policy.max_missed}


def checked_jitter(problems: Problems, value: Any) -> timedelta | None:
    if isinstance(value, timedelta):
        jitter = value
    elif isinstance(value, (int, float)) and not isinstance(value, bool) and value == value:
        try:
            jitter = timedelta(seconds=value)
        except OverflowError:
            problems.add("jitter", f"{value!r} is not a usable number of seconds")
            return None
    else:
        problems.add("jitter", f"{value!r} is not a timedelta or a number of seconds")
        return None
    if jitter < timedelta(0):
        problems.add("jitter", f"{jitter.total_seconds():g} s: must be 0 or more")
        return None
    return jitter


def shortest_gap_us(schedule: object, now_us: int, runs: int = JITTER_CHECKED_RUNS) -> int | None:
    """The shortest gap between two runs of ``schedule``: an interval's period;
    for a crontab or solar schedule, the shortest among its next ``runs`` runs
    after ``now_us`` (a crontab in its own zone, else in UTC); None for one run
    (no gap)."""
    if isinstance(schedule, At):
        return None
    period = period_of(schedule)
    if period is not None:
        return period // timedelta(microseconds=1)
    tz = (own_zone(schedule) if isinstance(schedule, crontab) else None) or timezone.utc
    sequence = sequence_for(schedule, now_us, tz)
    shortest: int | None = None
    at = sequence.next_after(now_us)
    for _ in range(runs):
        if at is None:
            break
        following = sequence.next_after(at)
        if following is None:
            break
        gap = following - at
        shortest = gap if shortest is None else min(shortest, gap)
        at = following
    return shortest


def check_jitter_gap(problems: Problems, jitter: timedelta, schedule: object, now: Any) -> None:
    """The jitter is shorter than the shortest gap between two runs of
    ``schedule`` (:func:`shortest_gap_us` after ``now``, the process's clock
    when None)."""
    now_us = datetime_to_us(now) if now is not None else datetime_to_us(datetime.now(timezone.utc))
    gap = shortest_gap_us(schedule, now_us)
    jitter_us = jitter // timedelta(microseconds=1)
    if gap is not None and jitter_us >= gap:
        problems.add(
            "jitter",
            f"{jitter_us / US:g} s is not shorter than the shortest gap between two "
            f"runs ({gap / US:g} s)",
        )


def checked_text(problems: Problems, name: str, value: Any, limit: int, empty: bool) -> str | None:
    if not isinstance(value, str) or (not empty and not value):
        problems.add(name, f"{value!r} is not {'a' if empty else 'a non-empty'} string")
        return None
    if len(value) > limit:
        problems.add(name, f"is {len(value):,} characters long; at most {limit:,}")
        return None
    return value


def check_order(problems: Problems, start: datetime | None, end: datetime | None) -> None:
    if start is not None and end is not None and end <= start:
        problems.add("end", f"{end.isoformat()} is not after start {start.isoformat()}")


def check_max_runs(problems: Problems, max_runs: Any) -> None:
    if max_runs is not None and (
        not isinstance(max_runs, int) or isinstance(max_runs, bool) or max_runs < 1
    ):
        problems.add("max_runs", f"{max_runs!r} is not an integer >= 1")


def checked_missed(problems: Problems, missed: Any) -> MissedPolicy | None:
    """:func:`parse_missed`, its error a problem named ``missed.<part>`` (a
    wrong part) or ``missed`` (no policy at all)."""
    try:
        return parse_missed(missed)
    except MissedPolicyError as exc:
        problems.add(f"missed.{exc.part}", exc.reason)
    except ValueError as exc:
        problems.add("missed", str(exc))
    return None


def check_arguments_size(problems: Problems, args: list[Any], kwargs: dict[str, Any]) -> None:
    sizes = _size(args), _size(kwargs)
    if sum(sizes) > MAX_ARGUMENTS_BYTES:
        problems.add(
            "args" if sizes[0] >= sizes[1] else "kwargs",
            f"args and kwargs take {sum(sizes):,} bytes as JSON; at most "
            f"{MAX_ARGUMENTS_BYTES:,} together",
        )


__all__ = [
    "JITTER_CHECKED_RUNS",
    "MAX_ARGUMENTS_BYTES",
    "MAX_DESCRIPTION",
    "MAX_HEADERS_BYTES",
    "OPTION_NAMES",
    "Problems",
    "check_arguments_size",
    "check_jitter_gap",
    "check_max_runs",
    "check_name",
    "check_order",
    "check_task",
    "checked_arguments",
    "checked_instant",
    "checked_jitter",
    "checked_missed",
    "checked_options",
    "checked_text",
    "compact_json",
    "parse_missed",
    "policy_to_data",
    "shortest_gap_us",
]
