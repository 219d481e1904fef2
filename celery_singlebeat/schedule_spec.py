"""A schedule as a *spec*: JSON from which a reader without the application
rebuilds the slot sequence the replicas compute.

The replicas publish each entry's spec in their catalog (:mod:`.catalog`); the
fleet (``singlebeat status``, the health probe, an admin page) reads it back to
show an entry's next slot. Both directions live here, so the format is one
fact in one module; it imports no store, so the store's fleet can read specs
without a circle. The spec holds what the slot instants depend on and nothing
else: never the arguments, which may carry secrets.

Kinds of spec (``{"kind": ...}``):

* ``interval``: ``every_us``; slots are the entry's anchor plus multiples of it;
* ``crontab``: the five fields as written, and the time zone name;
* ``solar``: event, latitude, longitude;
* ``other``: a custom schedule; its next slot is known only to the replicas.
"""

from __future__ import annotations

import json
from datetime import timedelta, tzinfo
from typing import Any

from celery.schedules import crontab, solar

from .clock import US
from .exceptions import ScheduleError
from .slots import SlotSequence, period_of, sequence_for


def _zone_name(tz: Any) -> str:
    return str(getattr(tz, "key", None) or getattr(tz, "zone", None) or tz or "UTC")


def _every_text(period_us: int) -> str:
    seconds = period_us / US
    for unit, size in (("d", 86_400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"every {seconds / size:g}{unit}"
    return f"every {seconds:g}s"


def spec_of(schedule: object, tz: tzinfo) -> tuple[str, str]:
    """The schedule as a person reads it, and its spec (compact JSON, sorted keys)."""
    spec: dict[str, Any]
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
        zone = _zone_name(getattr(schedule, "tz", None) or tz)
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
    return text, json.dumps(spec, sort_keys=True, separators=(",", ":"))


def sequence_of(spec: str, anchor_us: int) -> SlotSequence | None:
    """The slot sequence a catalog spec describes; None when only the replicas
    can compute it (a custom schedule) or the spec is not understood (written
    by a newer release)."""
    try:
        fields = json.loads(spec)
        kind = fields.get("kind")
        if kind == "interval":
            return sequence_for(timedelta(microseconds=int(fields["every_us"])), anchor_us, _utc())
        if kind == "crontab":
            zone = _zone(fields["tz"])
            schedule = crontab(
                minute=fields["minute"],
                hour=fields["hour"],
                day_of_month=fields["day_of_month"],
                month_of_year=fields["month_of_year"],
                day_of_week=fields["day_of_week"],
            )
            return sequence_for(schedule, anchor_us, zone)
        if kind == "solar":
            return sequence_for(
                solar(fields["event"], fields["lat"], fields["lon"]), anchor_us, _utc()
            )
    except (ValueError, KeyError, TypeError, LookupError, ScheduleError):
        return None
    return None


def _utc() -> tzinfo:
    from datetime import timezone

    return timezone.utc


def _zone(name: str) -> tzinfo:
    if name.upper() == "UTC":
        return _utc()
    from zoneinfo import ZoneInfo

    return ZoneInfo(name)
