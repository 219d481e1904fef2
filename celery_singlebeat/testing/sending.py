"""Sending a task as beat sends one slot's run, without beat: for tests of SingletonTask.

A worker's :class:`~celery_singlebeat.SingletonTask` knows a beat run by its
task id and its ``singlebeat_slot`` header; :func:`send_slot` writes both as
the scheduler does, so a test can deliver a slot's run (once, or twice, as a
replica that died between publishing and recording would) with no beat and
no store at all.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from ..timeline.clock import datetime_to_us
from ..timeline.slots import SLOT_HEADER, slot_header, slot_task_id

__all__ = ["send_slot"]


def send_slot(
    task: Any,
    entry: str,
    at: datetime,
    args: Sequence[Any] = (),
    kwargs: dict[str, Any] | None = None,
    **options: Any,
) -> Any:
    """Send ``task`` as beat sends the run of ``entry`` at ``at``: the same task id
    and ``singlebeat_slot`` header the scheduler writes (timeline/slots.py), so that a
    :class:`~celery_singlebeat.SingletonTask` treats it as that slot. Call it twice
    to deliver one run twice, as a replica that died between publishing and
    recording does. Returns ``task.apply_async``'s result."""
    if at.utcoffset() is None:
        raise ValueError(f"at={at!r}: expected an aware datetime")
    slot_us = datetime_to_us(at)
    headers = dict(options.pop("headers", None) or {})
    headers["celery_beat_task"] = True
    headers[SLOT_HEADER] = slot_header(entry, slot_us)
    return task.apply_async(
        tuple(args), kwargs or {}, task_id=slot_task_id(entry, slot_us), headers=headers, **options
    )
