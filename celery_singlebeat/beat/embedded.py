"""``celery worker -B``: a beat the worker runs, and does not watch.

With ``-B`` the worker starts beat in a child process of its own (Celery's
``celery.beat._Process``, named ``Beat``). When that child dies, of a bad
setting say, the worker logs the traceback and carries on: it consumes, it
answers every health probe, and no beat runs in the pod. Run in every pod, as
this scheduler is meant to be, a whole fleet could be left without beat and
nothing would look wrong.

So on an error that retrying cannot mend (a bad setting or beat_schedule
entry, a schema that does not match), a scheduler running as that child logs
the reason and asks the worker to shut down: SIGINT, Celery's warm shutdown
that ends with exit status 1 (tasks in progress finish first). The pod then
restarts, and keeps restarting, with the reason in its log, like a ``celery
beat`` process that refuses to start. A database that is merely unreachable
is not such an error: the scheduler waits for it and the worker is left alone.
"""

from __future__ import annotations

import logging
import os
import signal

from billiard.process import current_process
from celery.beat import _Process

logger = logging.getLogger("celery_singlebeat.embedded")


def in_worker_beat() -> bool:
    """True in the beat child process of a ``celery worker -B``."""
    # None where multiprocessing is unavailable: then -B runs no such child
    return _Process is not None and isinstance(current_process(), _Process)


def stop_worker(reason: BaseException) -> bool:
    """Shut down the worker this beat runs in, because of ``reason``.

    Returns False (and does nothing) outside a ``celery worker -B`` beat."""
    if not in_worker_beat():
        return False
    worker = os.getppid()
    logger.critical(
        "singlebeat: the beat of this worker (celery worker -B) cannot run: %s. "
        "Stopping the worker (pid %d), so that the pod does not run on without a beat",
        reason,
        worker,
    )
    try:
        os.kill(worker, signal.SIGINT)
    except OSError as exc:  # the worker is gone already, or not ours to signal
        logger.error("singlebeat: could not stop the worker (pid %d): %s", worker, exc)
        return False
    return True


__all__ = ["in_worker_beat", "stop_worker"]
