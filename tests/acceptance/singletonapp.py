"""The worker app of the SingletonTask acceptance tests, run as real
``celery -A singletonapp worker`` processes. Configured through environment
variables (one module serves every database, broker and pool):

* ``SB_BROKER``, ``SB_URL``, ``SB_PREFIX``, ``SB_QUEUE``: as in ``beatapp``; the
  worker consumes ``SB_QUEUE``
* ``SB_TTL``: ``singleton_ttl`` of every task here (seconds)
* ``SB_RECORD``: a file every execution appends JSON lines to (one ``start``
  and one ``end`` line each, written with O_APPEND so concurrent processes do
  not interleave): what ran, where, when (wall clock of this host), with which
  fencing token and slot. Tests judge overlaps and counts from this file.
* ``SB_VISIBILITY``: the Redis transport's ``visibility_timeout`` (seconds),
  with kombu's check for messages to deliver again every second

Task ``beatapp.probe`` has the name the beat replicas of ``beatapp`` send by,
so a worker of this app executes what those beats send while the beats never
import this module (they only know a plain task of that name).
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from typing import Any

from celery import Celery

from celery_singlebeat import SingletonTask

app = Celery("singletonapp", broker=os.environ.get("SB_BROKER", "memory://"))
queue = os.environ.get("SB_QUEUE", "celery")
TTL = float(os.environ.get("SB_TTL", "3"))
RECORD = os.environ.get("SB_RECORD", "")

app.conf.update(
    singlebeat_url=os.environ.get("SB_URL"),
    singlebeat_table_prefix=os.environ.get("SB_PREFIX", "singlebeat_"),
    broker_connection_retry_on_startup=True,
    task_default_queue=queue,
    task_default_exchange=queue,
    task_default_routing_key=queue,
    # one message at a time per process: a test sees what it sent, in order
    worker_prefetch_multiplier=1,
)
if os.environ.get("SB_VISIBILITY"):
    # Redis broker: a message a worker had taken but not acknowledged when its
    # connection dropped (a broker restart) waits in the broker's unacked set
    # until this many seconds have passed, then is delivered again; kombu looks
    # for such messages every second. SingletonTask drops a second delivery of
    # a slot, so a short timeout is safe here.
    app.conf.broker_transport_options = {
        "visibility_timeout": float(os.environ["SB_VISIBILITY"]),
        "unacked_restore_interval": 1,
        "unacked_restore_throttle": 1,
    }


def record(event: str, task: Any, **extra: Any) -> None:
    """Append one JSON line to SB_RECORD (one write() call: atomic with O_APPEND)."""
    if not RECORD:
        return
    request = task.request
    singleton = None
    with contextlib.suppress(RuntimeError):  # outside a lease: no singleton
        singleton = task.singleton
    line = {
        "event": event,
        "task": task.name,
        "task_id": request.id,
        "pid": os.getpid(),
        "at": time.time(),
        "token": singleton.token if singleton else None,
        "key": singleton.key if singleton else None,
        "slot": list(singleton.slot) if singleton and singleton.slot else None,
        "retries": request.retries,
        **extra,
    }
    data = (json.dumps(line) + "\n").encode()
    fd = os.open(RECORD, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def _body(task: Any, seconds: float, tag: str) -> str:
    record("start", task, tag=tag)
    time.sleep(seconds)
    lost = task.singleton.lost
    record("end", task, tag=tag, lost=lost)
    return tag


@app.task(bind=True, base=SingletonTask, singleton_ttl=TTL, name="singletonapp.hold")
def hold(self: Any, seconds: float, tag: str = "") -> str:
    """Holds the task-name key for ``seconds`` (busy policy: skip)."""
    return _body(self, seconds, tag)


@app.task(
    bind=True,
    base=SingletonTask,
    singleton_ttl=TTL,
    singleton_busy="retry",
    singleton_retry_delay=0.5,
    max_retries=100,
    name="singletonapp.hold_retry",
)
def hold_retry(self: Any, seconds: float, tag: str = "") -> str:
    """Like hold, but a call finding the key busy retries until it runs."""
    return _body(self, seconds, tag)


@app.task(
    bind=True,
    base=SingletonTask,
    singleton_ttl=TTL,
    singleton_busy="raise",
    name="singletonapp.hold_raise",
)
def hold_raise(self: Any, seconds: float, tag: str = "") -> str:
    """Like hold, but a call finding the key busy fails with SingletonBusy."""
    return _body(self, seconds, tag)


@app.task(
    bind=True,
    base=SingletonTask,
    singleton_ttl=TTL,
    singleton_key=lambda args, kwargs: f"account:{kwargs['account']}",
    name="singletonapp.per_account",
)
def per_account(self: Any, seconds: float, account: str) -> str:
    """One execution at a time per account (a key function)."""
    return _body(self, seconds, account)


@app.task(bind=True, base=SingletonTask, singleton_ttl=TTL, name="beatapp.probe")
def probe(self: Any, i: int) -> int:
    """What the beatapp replicas send every slot (they do not import this module)."""
    record("start", self, tag=str(i))
    record("end", self, tag=str(i), lost=self.singleton.lost)
    return i


@app.task(
    bind=True,
    base=SingletonTask,
    singleton_ttl=TTL,
    singleton_key="args",
    singleton_busy="retry",
    singleton_retry_delay=0.2,
    # retried (busy key, or the database away) for as long as it takes: the
    # chaos run counts every slot that never executed as lost
    max_retries=None,
    name="singletonapp.slot_probe",
)
def slot_probe(self: Any, i: int) -> int:
    """What the chaos run's beats send (``SB_TASK``): one key per entry (its
    argument), so entries falling due together all run; a slot whose key is
    busy (its previous slot still running) retries rather than being skipped."""
    record("start", self, tag=str(i))
    record("end", self, tag=str(i), lost=self.singleton.lost)
    return i


@app.task(bind=True, name="singletonapp.where")
def where(self: Any) -> str:
    """Records (event ``where``) which copy of celery_singlebeat this worker imported,
    so a test can check the workers run the checkout under test."""
    import celery_singlebeat

    path = str(celery_singlebeat.__file__)
    if RECORD:
        line = {"event": "where", "task_id": self.request.id, "pid": os.getpid(), "file": path}
        fd = os.open(RECORD, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, (json.dumps(line) + "\n").encode())
        finally:
            os.close(fd)
    return path
