"""What each replica tells the database about the entries it has.

A replica publishes one catalog row per entry at start-up (and after an
outage): the task, a human description of the schedule, and its *spec*, the
schedule's JSON in its catalog form
(:mod:`~celery_singlebeat.timeline.catalog_form` says the format), from which
a reader without the application (the CLI, the health probe, an admin page)
rebuilds the same slot sequence the replicas compute, so that it can show an
entry's next slot.
"""

from __future__ import annotations

from datetime import tzinfo

from ..store.base import CatalogEntry
from ..timeline.catalog_form import sequence_of, spec_of
from ..widths import MAX_SCHEDULE_TEXT, MAX_TASK


def describe(name: str, task: str, schedule: object, tz: tzinfo) -> CatalogEntry:
    """The catalog row of one entry: its task, schedule text and spec."""
    text, spec = spec_of(schedule, tz)
    return CatalogEntry(
        entry=name,
        task=task[:MAX_TASK],
        schedule=text[:MAX_SCHEDULE_TEXT],
        spec=spec,
    )


__all__ = ["describe", "sequence_of"]
