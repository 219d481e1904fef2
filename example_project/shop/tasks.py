"""The shop's periodic tasks.

``refresh_prices`` runs from ``CELERY_BEAT_SCHEDULE`` (settings.py) and is a
:class:`~celery_singlebeat.SingletonTask`: at most one execution at a time
across every worker, and a slot delivered twice (a broker redelivery, a replica
that died between publishing and recording) runs once. ``send_digest`` is the
task of the schedule an operator adds in the admin at run time.
"""

from __future__ import annotations

import socket
import time
from typing import Any

from celery import Task, shared_task

from celery_singlebeat import SingletonTask

from .models import TaskRun


def record(task: Task) -> None:
    """One ``TaskRun`` row for this execution, with the slot beat sent it for."""
    request = task.request
    headers = request.headers or {}
    # the scheduler stamps each message with its entry and slot
    slot: dict[str, Any] = (
        headers.get("singlebeat_slot") or getattr(request, "singlebeat_slot", None) or {}
    )
    TaskRun.objects.create(
        task=task.name,
        entry=slot.get("entry") or "",
        slot_us=slot.get("at_us"),
        task_id=request.id or "",
        worker=request.hostname or socket.gethostname(),
        started_us=time.time_ns() // 1000,
    )


@shared_task(base=SingletonTask, singleton_ttl=60, bind=True, name="shop.tasks.refresh_prices")
def refresh_prices(self: Task) -> None:
    """Refresh the catalogue's prices (here: record the run)."""
    record(self)


@shared_task(bind=True, name="shop.tasks.send_digest")
def send_digest(self: Task, *args: Any, **kwargs: Any) -> None:
    """Mail the shop's digest (here: record the run); takes whatever
    arguments the admin's schedule gives."""
    record(self)
