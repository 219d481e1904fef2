"""The kinds of schedule a stored entry has, checked, and their data form.

A stored entry runs on one of four kinds of schedule, each kept as the object
the rest of the library computes slots from:

* an interval: ``celery.schedules.schedule`` (from a ``timedelta``, a number of
  seconds, or Celery's own), at least 1 ms;
* a crontab: ``celery.schedules.crontab``, with its own time zone or none (the
  app's time zone, at run time);
* a solar event: ``celery.schedules.solar``;
* one run at an instant: :class:`~celery_singlebeat.timeline.bounds.At`.

Its *data form* is one JSON object, the same in files, on the command line
and in the database's ``spec`` column (:mod:`.columns`)::

    {"every": 30.0}                                  seconds, a float allowed
    {"crontab": "*/5 * * * *", "tz": "Europe/Paris"}  tz null: the app's zone
    {"solar": "sunset", "lat": 48.85, "lon": 2.35}
    {"at": "2026-12-24T17:00:00+00:00"}              kept in UTC

Every schedule object this module returns is its own canonical one, built
from the data form (a crontab is rebuilt from its fields, an instant moved to
UTC), so that two equal schedules encode to the same text. Crontabs are
shared between entries with the same fields and zone (a replica may hold
100,000 entries with a handful of distinct crontabs): treat them as frozen.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from datetime import datetime, timedelta, timezone, tzinfo
from functools import lru_cache
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from celery.schedules import crontab, solar
from celery.schedules import schedule as interval_schedule

from ..exceptions import InvalidEntry
from ..timeline.bounds import At
from ..timeline.clock import US, parse_instant
from ..timeline.slots import period_of

#: the shortest interval: slots closer than this are not told apart by people
MIN_INTERVAL = timedelta(milliseconds=1)

#: a crontab's fields, in the order of its text form ("m h dom mon dow"):
#: (name, Celery's max_, min_, the range people read)
CRON_FIELDS: tuple[tuple[str, int, int, str], ...] = (
    ("minute", 60, 0, "0-59"),
    ("hour", 24, 0, "0-23"),
    ("day_of_month", 31, 1, "1-31"),
    ("month_of_year", 12, 1, "1-12"),
    ("day_of_week", 7, 0, "0-6"),
)

#: the keys of each kind's data form: the kind's own key first
DATA_KEYS: dict[str, tuple[str, ...]] = {
    "every": ("every",),
    "crontab": ("crontab", "tz"),
    "solar": ("solar", "lat", "lon"),
    "at": ("at",),
}

#: the attribute that marks a crontab of ours with its own zone (None: the
#: app's); a crontab of a user's is read by its ``tz`` instead
_ZONE_MARK = "_singlebeat_zone"
_MISSING = object()
# a number in a crontab field that is not a step ("*/90" is a valid minute)
_FIELD_NUMBER = re.compile(r"\d+")


def _fail(entry: str, field: str, reason: str) -> InvalidEntry:
    return InvalidEntry(entry, field, reason)


# -- time zones ------------------------------------------------------------------


def zone_name(tz: object) -> str | None:
    """The IANA name of a zone (``UTC`` for UTC), or None if it has none (a
    fixed offset)."""
    if tz is timezone.utc:
        return "UTC"
    name = getattr(tz, "key", None) or getattr(tz, "zone", None)
    return name if isinstance(name, str) and name else None


def load_zone(name: str) -> tzinfo:
    """The zone of an IANA name (``UTC`` without the tz database); raises
    ``LookupError`` for an unknown one."""
    if name.upper() == "UTC":
        return timezone.utc
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise LookupError(name) from exc


def own_zone(schedule: crontab) -> tzinfo | None:
    """A crontab's own time zone, or None for the app's.

    Ours carry it in a mark. A user's crontab has one when its ``tz`` was set
    on it (django-celery-beat's crontabs, or ``c.tz = ZoneInfo(...)``); read
    from its ``__dict__``, never through the ``tz`` property, which would ask
    Celery's current app and keep the answer in the crontab.
    """
    marked = getattr(schedule, _ZONE_MARK, _MISSING)
    if marked is not _MISSING:
        return marked  # type: ignore[return-value]
    zone = getattr(schedule, "__dict__", {}).get("tz")
    return zone if isinstance(zone, tzinfo) else None


# -- crontab ---------------------------------------------------------------------


def _field_text(value: Any) -> str | None:
    """A crontab field as the text of its data form, None if it has none."""
    if isinstance(value, str):
        return value.strip()
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    try:
        numbers = sorted(value)
    except TypeError:
        return None
    if not numbers or not all(isinstance(n, int) and not isinstance(n, bool) for n in numbers):
        return None
    return ",".join(str(n) for n in numbers)


def _check_field(name: str, max_: int, min_: int, span: str, text: str) -> str | None:
    """Why ``text`` is no valid crontab field ``name``, or None."""
    if not text or " " in text:
        return f"{text!r} is not a crontab {name} field"
    for part in text.split(","):
        for number in _FIELD_NUMBER.findall(part.split("/")[0]):
            if not min_ <= int(number) <= max_ + min_ - 1:
                return f"{number} is out of range {span}"
    try:
        crontab._expand_cronspec(text, max_, min_)
    except (ValueError, TypeError) as exc:
        # Celery's parser says what it found ("Invalid weekday literal 'x'.")
        return f"{text!r} is not a valid {name}: {str(exc).strip() or type(exc).__name__}"
    return None


@lru_cache(maxsize=4096)
def _crontab(texts: tuple[str, ...], zone: str | None) -> crontab:
    """The one crontab of these fields and zone (checked before)."""
    minute, hour, day_of_month, month_of_year, day_of_week = texts
    built = crontab(
        minute=minute,
        hour=hour,
        day_of_month=day_of_month,
        month_of_year=month_of_year,
        day_of_week=day_of_week,
    )
    tz = None if zone is None else load_zone(zone)
    if tz is not None:
        built.tz = tz  # what Celery and the catalog read as its zone
    setattr(built, _ZONE_MARK, tz)
    return built


def make_crontab(entry: str, texts: tuple[str, ...], zone: str | None) -> crontab:
    """A checked crontab of five field texts ("m h dom mon dow") and a zone name
    (None: the app's); InvalidEntry naming ``crontab.<field>`` or
    ``schedule.tz``, every wrong field at once."""
    problems = [
        (f"crontab.{name}", reason)
        for (name, max_, min_, span), text in zip(CRON_FIELDS, texts)
        for reason in [_check_field(name, max_, min_, span, text)]
        if reason is not None
    ]
    if zone is not None:
        if not isinstance(zone, str) or not zone:
            problems.append(("schedule.tz", f"{zone!r} is not a time zone name"))
        else:
            try:
                load_zone(zone)
            except LookupError:
                problems.append(("schedule.tz", f"unknown time zone {zone!r}"))
    if problems:
        raise InvalidEntry(entry, *problems[0], *problems[1:])
    never = _never_occurs(texts[2], texts[3])
    if never is not None:
        # Celery 5.7 refuses it too, earlier releases build a crontab that never
        # runs: the same error whichever Celery is installed
        raise _fail(entry, "crontab", never)
    try:
        return _crontab(texts, zone if zone is None or zone.upper() != "UTC" else "UTC")
    except ValueError as exc:  # "31 February": fields right, no day ever matches
        raise _fail(entry, "crontab", str(exc).strip()) from None


#: the most days each month has (February: in a leap year)
_MONTH_DAYS = (31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)


def _never_occurs(day_of_month: str, month_of_year: str) -> str | None:
    """Why no day matches (``31 2``: the 31st of February), or None. The day of
    the week cannot make it worse: a date that exists falls on every weekday
    in some year."""
    days = crontab._expand_cronspec(day_of_month, 31, 1)
    months = crontab._expand_cronspec(month_of_year, 12, 1)
    if any(day <= _MONTH_DAYS[month - 1] for month in months for day in days):
        return None
    return f"day_of_month {day_of_month!r} never occurs in month_of_year {month_of_year!r}"


def crontab_texts(schedule: crontab) -> tuple[str, ...]:
    """A crontab's five fields as texts, in the order of its text form."""
    texts = []
    for name, *_ in CRON_FIELDS:
        text = _field_text(getattr(schedule, f"_orig_{name}", "*"))
        if text is None:  # a field given as something else: its expanded set
            text = _field_text(getattr(schedule, name))
        texts.append(text or "*")
    return tuple(texts)


def _crontab_from_text(entry: str, text: Any, zone: Any) -> crontab:
    if not isinstance(text, str):
        raise _fail(entry, "schedule.crontab", f"{text!r} is not a crontab text")
    fields = tuple(text.split())
    if len(fields) != 5:
        raise _fail(
            entry,
            "schedule.crontab",
            f"{text!r} has {len(fields)} fields; expected 5 (minute hour day-of-month "
            "month day-of-week)",
        )
    return make_crontab(entry, fields, zone)


# -- the other kinds -------------------------------------------------------------


def _number(value: Any) -> float | None:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def make_interval(entry: str, period: Any, field: str = "schedule") -> interval_schedule:
    """A checked interval of ``period`` (a timedelta or seconds)."""
    if not isinstance(period, timedelta):
        seconds = _number(period)
        if seconds is None:
            raise _fail(entry, field, f"{period!r} is not a number of seconds")
        try:
            period = timedelta(seconds=seconds)
        except OverflowError:
            raise _fail(entry, field, f"{seconds:g} s is too long an interval") from None
    if period < MIN_INTERVAL:
        raise _fail(
            entry, field, f"an interval of {period.total_seconds():g} s is shorter than 1 ms"
        )
    return interval_schedule(run_every=period)


def make_solar(entry: str, event: Any, lat: Any, lon: Any) -> solar:
    """A checked solar schedule."""
    problems = []
    if not isinstance(event, str) or event not in solar._all_events:
        events = ", ".join(sorted(solar._all_events))
        problems.append(("schedule.solar", f"{event!r} is not a solar event; expected {events}"))
    latitude, longitude = _number(lat), _number(lon)
    if latitude is None or not -90 <= latitude <= 90:
        problems.append(("schedule.lat", f"{lat!r} is not a latitude (-90 to 90)"))
    if longitude is None or not -180 <= longitude <= 180:
        problems.append(("schedule.lon", f"{lon!r} is not a longitude (-180 to 180)"))
    if problems:
        raise InvalidEntry(entry, *problems[0], *problems[1:])
    try:
        return solar(event, lat, lon)
    except Exception as exc:  # ImproperlyConfigured: the ephem package is missing
        raise _fail(entry, "schedule.solar", str(exc)) from None


def make_at(entry: str, value: Any, field: str = "schedule") -> At:
    """A checked single run at an aware datetime (or ISO 8601 text)."""
    if isinstance(value, str):
        try:
            value = parse_instant(value)
        except ValueError:
            raise _fail(
                entry, field, f"{value!r} is not an ISO 8601 instant with a UTC offset"
            ) from None
    if not isinstance(value, datetime):
        raise _fail(entry, field, f"{value!r} is not an instant")
    if value.tzinfo is None or value.utcoffset() is None:
        raise _fail(entry, field, f"{value.isoformat()} is naive; give its time zone or UTC offset")
    return At(value)


# -- any accepted form -----------------------------------------------------------


def make_schedule(entry: str, value: Any) -> object:
    """The canonical schedule of any accepted form; InvalidEntry naming the field.

    Accepted: a Celery ``crontab`` (its own ``tz`` kept), ``schedule`` (an
    interval) or ``solar``; a ``timedelta`` or a number of seconds (an
    interval); an aware ``datetime`` or :class:`At` (one run); the data form (a
    mapping, see the module's docstring); a text of five crontab fields, or an
    ISO 8601 instant.
    """
    if isinstance(value, At):
        return value
    if isinstance(value, datetime):
        return make_at(entry, value)
    if isinstance(value, (timedelta, int, float)) and not isinstance(value, bool):
        return make_interval(entry, value)
    if type(value) is interval_schedule:
        return make_interval(entry, value.run_every)
    if isinstance(value, crontab):
        zone = own_zone(value)
        name = None if zone is None else zone_name(zone)
        if zone is not None and name is None:
            raise _fail(
                entry,
                "schedule.tz",
                f"{zone!r} has no time zone name; give an IANA name (Europe/Paris) or UTC",
            )
        return make_crontab(entry, crontab_texts(value), name)
    if isinstance(value, solar):
        return make_solar(entry, value.event, value.lat, value.lon)
    if isinstance(value, Mapping):
        return schedule_from_data(value, entry)
    if isinstance(value, str):
        if len(value.split()) == 5:
            return _crontab_from_text(entry, value, None)
        try:
            return At(parse_instant(value))
        except ValueError:
            pass
        raise _fail(
            entry,
            "schedule",
            f"{value!r} is neither a crontab (5 fields) nor an ISO 8601 instant with a UTC offset",
        )
    raise _fail(
        entry,
        "schedule",
        f"unsupported schedule type {type(value).__name__}; expected a crontab, schedule "
        "(interval), solar, timedelta, aware datetime or the data form",
    )


def schedule_to_data(schedule: object) -> dict[str, Any]:
    """The data form of a schedule (see the module's docstring); ValueError for
    a schedule of no stored kind."""
    if isinstance(schedule, At):
        return {"at": schedule.at.isoformat()}
    period = period_of(schedule)
    if period is not None:
        return {"every": (period // timedelta(microseconds=1)) / US}
    if isinstance(schedule, crontab):
        zone = own_zone(schedule)
        return {
            "crontab": " ".join(crontab_texts(schedule)),
            "tz": None if zone is None else zone_name(zone),
        }
    if isinstance(schedule, solar):
        return {"solar": schedule.event, "lat": schedule.lat, "lon": schedule.lon}
    raise ValueError(f"{schedule!r} is no kind of stored schedule")


#: the schedules of the data forms checked lately, by their JSON text: a
#: replica loads every stored entry at start-up, 100,000 of them with a few
#: thousand distinct schedules, and checking a crontab (Celery's parse, our
#: field checks, whether it ever occurs) is most of what a row costs. Only
#: schedules that passed are kept; each is shared by the entries that have it,
#: which nothing changes (a solar one is copied before its ``nowfun`` is set).
_CHECKED: dict[str, object] = {}
_CHECKED_MAX = 8192


def schedule_from_data(data: Any, entry_name: str) -> object:
    """The schedule of a data form; InvalidEntry naming ``schedule`` or
    ``schedule.<key>`` for anything wrong in it."""
    try:
        key = json.dumps(data, sort_keys=True)
    except (TypeError, ValueError):
        key = None
    if key is not None:
        known = _CHECKED.get(key)
        if known is not None:
            return known
    made = _schedule_from_data(data, entry_name)
    if key is not None:
        if len(_CHECKED) >= _CHECKED_MAX:
            _CHECKED.clear()  # a few thousand parses again, rarely
        _CHECKED[key] = made
    return made


def _schedule_from_data(data: Any, entry_name: str) -> object:
    if not isinstance(data, Mapping):
        raise _fail(entry_name, "schedule", f"{data!r} is not a schedule object")
    kinds = [kind for kind in DATA_KEYS if kind in data]
    if len(kinds) != 1:
        raise _fail(
            entry_name,
            "schedule",
            "expected exactly one of "
            + ", ".join(repr(k) for k in DATA_KEYS)
            + (f", got {', '.join(repr(k) for k in kinds)}" if kinds else ""),
        )
    kind = kinds[0]
    unknown = sorted(str(k) for k in data if k not in DATA_KEYS[kind])
    if unknown:
        raise _fail(
            entry_name,
            f"schedule.{unknown[0]}",
            f"unknown key(s) {', '.join(repr(k) for k in unknown)} for a {kind!r} schedule; "
            f"expected {', '.join(repr(k) for k in DATA_KEYS[kind])}",
        )
    if kind == "every":
        return make_interval(entry_name, data["every"], "schedule.every")
    if kind == "crontab":
        return _crontab_from_text(entry_name, data["crontab"], data.get("tz"))
    if kind == "solar":
        return make_solar(entry_name, data["solar"], data.get("lat"), data.get("lon"))
    return make_at(entry_name, data["at"], "schedule.at")


__all__ = [
    "CRON_FIELDS",
    "MIN_INTERVAL",
    "crontab_texts",
    "load_zone",
    "make_schedule",
    "own_zone",
    "schedule_from_data",
    "schedule_to_data",
    "zone_name",
]
