"""Copy celery-redbeat's dynamic entries into celery-singlebeat's stored schedules.

Run once while moving from celery-redbeat (docs/migrate-from-redbeat.md), with
the Celery app still configured for redbeat's Redis (``redbeat_redis_url``,
``redbeat_key_prefix``)::

    python docs/examples/redbeat_to_singlebeat.py proj.celery:app --dry-run
    python docs/examples/redbeat_to_singlebeat.py proj.celery:app

Entries that came from ``beat_schedule`` (redbeat's "statics") are left out:
celery-singlebeat reads those from the app's ``beat_schedule`` as they are.
Each copied entry keeps its name, task, schedule, arguments, options and
enabled flag; it is written through :class:`celery_singlebeat.Schedules`, so
the API validates it, and an entry already stored under the same name is left
as it is (``if_exists="keep"``). Redbeat's keys are not touched: rolling back
is starting redbeat's beat again.
"""

from __future__ import annotations

import argparse
import importlib
from typing import Any, NamedTuple

#: the apply_async options a stored entry keeps (docs/schedules.md)
OPTIONS = ("queue", "exchange", "routing_key", "priority", "expires", "headers")


class Copied(NamedTuple):
    """What the copy did: names written, names already stored, names refused
    (with the API's message)."""

    written: list[str]
    kept: list[str]
    refused: list[tuple[str, str]]


def redbeat_dynamic_entries(app: Any) -> list[Any]:
    """redbeat's entries in Redis that did not come from ``beat_schedule``."""
    from redbeat.schedulers import RedBeatSchedulerEntry, ensure_conf, get_redis

    conf = ensure_conf(app)
    client = get_redis(app)
    statics = {_text(key) for key in client.smembers(conf.statics_key)}
    entries = []
    for key in client.zrange(conf.schedule_key, 0, -1):
        key = _text(key)
        entry = RedBeatSchedulerEntry.from_key(key, app=app)
        if entry.name in statics:
            continue
        entries.append(entry)
    return entries


def copy_entries(app: Any, schedules: Any, *, dry_run: bool = False, why: str = "") -> Copied:
    """Write each dynamic redbeat entry as a stored schedule (``schedules``: a
    :class:`celery_singlebeat.Schedules`); ``dry_run`` checks each one through
    the API's validation and writes nothing."""
    from celery_singlebeat import stored_entry
    from celery_singlebeat.exceptions import ScheduleError

    written: list[str] = []
    kept: list[str] = []
    refused: list[tuple[str, str]] = []
    stored = {entry.name for entry in schedules.list()}
    for entry in redbeat_dynamic_entries(app):
        options = {k: v for k, v in (entry.options or {}).items() if k in OPTIONS}
        try:
            value = stored_entry(
                entry.name,
                entry.task,
                entry.schedule,
                args=list(entry.args or ()),
                kwargs=dict(entry.kwargs or {}),
                enabled=bool(getattr(entry, "enabled", True)),
                **options,
            )
        except (ScheduleError, ValueError, TypeError) as exc:
            refused.append((entry.name, str(exc)))
            continue
        if entry.name in stored:
            kept.append(entry.name)
            continue
        if not dry_run:
            schedules.upsert(value, if_exists="keep", why=why or "copied from celery-redbeat")
        written.append(entry.name)
    return Copied(written, kept, refused)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("app", help="the Celery app, module:attribute (proj.celery:app)")
    parser.add_argument("--dry-run", action="store_true", help="check every entry, write none")
    options = parser.parse_args(argv)
    module, _, attribute = options.app.partition(":")
    app = getattr(importlib.import_module(module), attribute or "app")
    from celery_singlebeat import Schedules

    with Schedules(app) as schedules:
        copied = copy_entries(app, schedules, dry_run=options.dry_run)
    verb = "would copy" if options.dry_run else "copied"
    print(f"{verb} {len(copied.written)}: {', '.join(copied.written) or '-'}")
    print(f"already stored, left as they are {len(copied.kept)}: {', '.join(copied.kept) or '-'}")
    for name, why in copied.refused:
        print(f"refused {name}: {why}")
    return 1 if copied.refused else 0


if __name__ == "__main__":
    raise SystemExit(main())
