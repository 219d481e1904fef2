"""A schedule in its *catalog form*: JSON from which a reader without the
application rebuilds the slot sequence the replicas compute.

A *spec* is a schedule's JSON form as a ``spec`` column keeps it: the catalog's
rows keep this catalog form, the stored schedules' rows the data form of
:mod:`celery_singlebeat.schedules.kinds` (what a person writes; this one is
what the slot instants depend on, in microseconds). The replicas publish each
entry's spec in their catalog (:mod:`celery_singlebeat.engine.catalog`); the
operator's status (``singlebeat status``, the health probe, an admin page)
reads it back to show an entry's next slot. Both directions live here, so the
format is one fact in one module; it imports no store, so the store can read
specs without a circle. The spec holds what the slot instants depend on and
nothing else: never the arguments, which may carry secrets.

Kinds of spec (``{"kind": ...}``):

* ``interval``: ``every_us``; slots are the entry's anchor plus multiples of it;
* ``crontab``: the five fields as written, and the time zone name;
* ``solar``: event, latitude, longitude;
* ``at``: ``at_us``, one run at that instant (:class:`.bounds.At`);
* ``other``: a custom schedule; its next slot is known only to the replicas.

A schedule within bounds (a stored entry's start, end, number of runs and
jitter: :class:`.bounds.BoundedSchedule`) is its inner schedule's spec
plus ``bounds``: ``start_us``, ``end_us``, ``runs_from_us``, ``max_runs``,
``jitter_us``, ``jitter_key`` (those set). Without any bound it is exactly its
inner schedule's spec, so the operator's status treats it as that.
"""

from __future__ import annotations

import json
from datetime import timedelta, tzinfo
from typing import Any

from celery.schedules import crontab, solar

from ..exceptions import ScheduleError
from .bounds import At, BoundedSchedule, Bounds, bounded_sequence
from .clock import US, us_to_datetime
from .slots import SlotSequence, period_of, sequence_for

#: the keys of a spec's ``bounds``, each an int (``jitter_key``: a str)
_BOUND_KEYS = ("start_us", "end_us", "runs_from_us", "max_runs", "jitter_us", "jitter_key")


def _zone_name(tz: Any) -> str:
    return str(getattr(tz, "key", None) or getattr(tz, "zone", None) or tz or "UTC")


def _every_text(period_us: int) -> str:
    seconds = period_us / US
    for unit, size in (("d", 86_400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"every {seconds / size:g}{unit}"
    return f"every {seconds:g}s"


def _instant_text(instant_us: int) -> str:
    return us_to_datetime(instant_us).isoformat().replace("+00:00", "Z")


def bounds_text(bounds: Bounds) -> str:
    """The bounds as a person reads them: ``from ..., until ..., at most 3 runs,
    jitter 10s`` (empty without any)."""
    parts = []
    if bounds.start_us is not None:
        parts.append(f"from {_instant_text(bounds.start_us)}")
    if bounds.end_us is not None:
        parts.append(f"until {_instant_text(bounds.end_us)}")
    if bounds.max_runs is not None:
        parts.append(f"at most {bounds.max_runs} run{'s' if bounds.max_runs != 1 else ''}")
    if bounds.jitter_us > 0:
        parts.append(f"jitter {bounds.jitter_us / US:g}s")
    return ", ".join(parts)


def spec_of(schedule: object, tz: tzinfo) -> tuple[str, str]:
    """The schedule as a person reads it, and its spec (compact JSON, sorted keys)."""
    text, spec = _spec_of(schedule, tz)
    return text, json.dumps(spec, sort_keys=True, separators=(",", ":"))


def _spec_of(schedule: object, tz: tzinfo) -> tuple[str, dict[str, Any]]:
    spec: dict[str, Any]
    if isinstance(schedule, BoundedSchedule):
        text, spec = _spec_of(schedule.inner, tz)
        bounds = schedule.bounds
        if bounds.bounded:
            spec["bounds"] = {
                key: getattr(bounds, key)
                for key in _BOUND_KEYS
                if getattr(bounds, key) not in (None, 0, "")
            }
            text = f"{text}, {bounds_text(bounds)}"
        return text, spec
    if isinstance(schedule, At):
        return f"at {_instant_text(schedule.at_us)}", {"kind": "at", "at_us": schedule.at_us}
    period = period_of(schedule)
    if period is not None:
        period_us = int(period / timedelta(microseconds=1))
        spec = {"kind": "interval", "every_us": period_us}
        text = _every_text(period_us)
    elif isinstance(schedule, crontab):
        fields = [
            str(getattr(schedule, f"_orig_{field}"))
            for field in ("minute", "hour", "day_of_month", "month_of_year", "day_of_week")
        ]
        # the crontab's own zone, read from its __dict__: the ``tz`` property
        # would ask Celery's current app and keep its answer in the crontab (a
        # stored entry's crontab has no zone of its own but the app's, ``tz``)
        own = getattr(schedule, "__dict__", {}).get("tz")
        zone = _zone_name(own or tz)
        spec = {
            "kind": "crontab",
            "minute": fields[0],
            "hour": fields[1],
            "day_of_month": fields[2],
            "month_of_year": fields[3],
            "day_of_week": fields[4],
            "tz": zone,
        }
        text = f"crontab({' '.join(fields)}) {zone}"
    elif isinstance(schedule, solar):
        spec = {
            "kind": "solar",
            "event": schedule.event,
            "lat": schedule.lat,
            "lon": schedule.lon,
            "tz": _zone_name(tz),
        }
        text = f"solar({schedule.event}, {schedule.lat:g}, {schedule.lon:g})"
    else:
        spec = {"kind": "other", "type": type(schedule).__name__}
        text = type(schedule).__name__
    return text, spec


def sequence_of(spec: str, anchor_us: int) -> SlotSequence | None:
    """The slot sequence a catalog spec describes; None when only the replicas
    can compute it (a custom schedule) or the spec is not understood (written
    by a newer release)."""
    try:
        fields = json.loads(spec)
        kind = fields.get("kind")
        schedule: object
        zone = _utc()
        if kind == "interval":
            schedule = timedelta(microseconds=int(fields["every_us"]))
        elif kind == "crontab":
            zone = _zone(fields["tz"])
            schedule = crontab(
                minute=fields["minute"],
                hour=fields["hour"],
                day_of_month=fields["day_of_month"],
                month_of_year=fields["month_of_year"],
                day_of_week=fields["day_of_week"],
            )
        elif kind == "solar":
            schedule = solar(fields["event"], fields["lat"], fields["lon"])
        elif kind == "at":
            schedule = At(us_to_datetime(int(fields["at_us"])))
        else:
            return None
        bounds = fields.get("bounds")
        if bounds is None:
            return sequence_for(schedule, anchor_us, zone)
        unknown = set(bounds) - set(_BOUND_KEYS)
        if unknown:  # a bound of a newer release: better no answer than a wrong one
            return None
        return bounded_sequence(schedule, anchor_us, zone, Bounds(**bounds))
    except (ValueError, KeyError, TypeError, LookupError, ScheduleError):
        return None


def _utc() -> tzinfo:
    from datetime import timezone

    return timezone.utc


def _zone(name: str) -> tzinfo:
    if name.upper() == "UTC":
        return _utc()
    from zoneinfo import ZoneInfo

    return ZoneInfo(name)
