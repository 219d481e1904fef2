"""A SingletonTask's retry, published again while the broker does not take it.

A retry is a new message. When publishing it fails (the broker is
unreachable), Celery raises ``Reject(requeue=False)``: the message in hand is
dropped and, acknowledged when the worker took it (Celery's default), has no
copy left at the broker, so the call never runs. For a SingletonTask that is
never a duplicate: a busy key's retry (the slot's run row was abandoned for
it), a start the database could not decide, or the body's own
``self.retry()``. So :func:`retry_through_broker` publishes it again every
:data:`REPUBLISH_INTERVAL` for the task's ``singleton_broker_patience``, and
only then lets Celery drop it (docs/guarantees.md, "Broker unreachable").
"""

from __future__ import annotations

import contextlib
import logging
import time
from typing import Any, Callable

from celery.exceptions import Reject, Retry

from ..observe import decisions
from ..observe.decisions import run_fields
from ..timeline.clock import slot_text
from .context import SlotInfo, slot_of
from .runtime import runtime_for

logger = logging.getLogger("celery_singlebeat.singleton")

#: How often a retry whose message the broker did not take is published again
#: (seconds): the broker's return is met within about this, plus the
#: publish's own retries (``task_publish_retry_policy``).
REPUBLISH_INTERVAL = 1.0


def retry_through_broker(
    task: Any, publish: Callable[[float | None], Any], countdown: float | None
) -> Any:
    """Celery's retry of ``task`` through ``publish(countdown)``, tried again
    every :data:`REPUBLISH_INTERVAL` while the broker does not take it.

    ``publish`` is Celery's own ``Task.retry`` with every argument but the
    countdown bound; the countdown asked for is shortened by the time waited.
    Raises what Celery's retry raises: ``Retry`` once published, ``Reject``
    once the task's ``singleton_broker_patience`` is spent (logged at ERROR)."""
    began = time.monotonic()
    give_up_at = began + task.singleton_broker_patience
    attempts = 0
    while True:
        attempts += 1
        # as asked at the first try; then less the time waited for the broker
        left = countdown
        if countdown is not None and attempts > 1:
            left = max(0.0, countdown - (time.monotonic() - began))
        try:
            retried = publish(left)
        except Reject as rejected:
            # Celery's retry raises Reject(<publish error>, requeue=False)
            # from its except clause: anything else is not a failed publish
            failure = rejected.reason
            if rejected.requeue or failure is None or rejected.__context__ is not failure:
                raise
            if time.monotonic() + REPUBLISH_INTERVAL > give_up_at:
                _dropped(task, failure, attempts, time.monotonic() - began)
                raise
            if attempts == 1:
                _unpublished(task, failure)
            time.sleep(REPUBLISH_INTERVAL)
            continue
        except Retry:
            if attempts > 1:
                _published(task, attempts, time.monotonic() - began)
            raise
        if attempts > 1:
            _published(task, attempts, time.monotonic() - began)
        return retried


def _about(task: Any) -> tuple[str, str, SlotInfo | None, str]:
    """Task id, owner, slot and key of the request a retry is for."""
    request = task.request
    key = "?"
    with contextlib.suppress(Exception):  # a log line must not fail the retry
        key = task.singleton_key_for(request.args, request.kwargs)
    return str(request.id), runtime_for(task.app).owner, slot_of(request), key


def _unpublished(task: Any, failure: object) -> None:
    task_id, owner, slot, key = _about(task)
    logger.warning(
        "singlebeat: %s[%s]: the broker did not take the retry (%s); publishing it again "
        "every %gs for up to %gs rather than dropping the message",
        task.name,
        task_id,
        failure,
        REPUBLISH_INTERVAL,
        task.singleton_broker_patience,
        extra=run_fields(decisions.RETRY_UNPUBLISHED, owner, task_id, key, slot),
    )


def _published(task: Any, attempts: int, waited: float) -> None:
    logger.info(
        "singlebeat: %s[%s]: the retry was published after %d attempts (%.1fs)",
        task.name,
        task.request.id,
        attempts,
        waited,
    )


def _dropped(task: Any, failure: object, attempts: int, waited: float) -> None:
    task_id, owner, slot, key = _about(task)
    what = f"slot {slot.entry}@{slot_text(slot.slot_us)}" if slot else "the call"
    logger.error(
        "singlebeat: %s[%s]: the broker did not take the retry in %d attempts over "
        "%.1fs (%s): %s is dropped (Celery rejects the message without requeueing it)",
        task.name,
        task_id,
        attempts,
        waited,
        failure,
        what,
        extra=run_fields(decisions.RETRY_DROPPED, owner, task_id, key, slot),
    )
