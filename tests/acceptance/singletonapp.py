"""The worker app of the SingletonTask acceptance tests, run as real
``celery -A singletonapp worker`` processes. Configured through environment
variables (one module serves every database, broker and pool):

* ``SB_BROKER``, ``SB_URL``, ``SB_PREFIX``, ``SB_QUEUE``: as in ``beatapp``; the
  worker consumes ``SB_QUEUE``
* ``SB_TTL``: ``singleton_ttl`` of every task here but ``soft_limited`` (seconds)
* ``SB_RECORD``: a file every execution appends JSON lines to (one ``start``
  and one ``end`` line each, written with O_APPEND so concurrent processes do
  not interleave): what ran, where, when (wall clock of this host), with which
  fencing token, key and slot. Tests judge overlaps and counts from this file.
* ``SB_SLOW_SECONDS``: how long ``slow_probe`` runs (seconds, 3 by default)
* ``SB_BACKEND``: a result backend URL (for the tests that judge result states)
* ``SB_LEASE_SETTING``: ``singlebeat_lease`` as given (a start-up check test)
  fencing token and slot. Tests judge overlaps and counts from this file.
* ``SB_ENGINE_OPTIONS``: singlebeat_engine_options, as JSON
* ``SB_VISIBILITY``: the Redis transport's ``visibility_timeout`` (seconds),
  with kombu's check for messages to deliver again every second
* ``SB_RUN_RETENTION``: ``singlebeat_run_retention`` (seconds; the package's
  default, 7 days, when unset)
* ``SB_FAILOVER_WINDOW``: ``singlebeat_failover_window`` (seconds; ``0`` turns
  the run rows' write-back off, to see what it prevents)
* ``SB_WORKER_METRICS``: ``1`` runs the worker block of docs/operations.md
  ("Metrics", prefork workers) as written: the main process serves every pool
  child's series on ``SINGLETON_METRICS_PORT`` (``PROMETHEUS_MULTIPROC_DIR``
  must be set, to an empty directory)

The ``singletonapp.*`` SingletonTasks hold the key a call passes as the ``key``
keyword argument, or their task name when it passes none; so tasks of
different busy policies, time limits and acks can contend for one key:

* ``hold_once`` is ``hold`` with ``max_retries=0``: a start the database
  cannot decide fails at once (its traceback logged) instead of retrying
* ``hold``, ``hold_raise``, ``hold_retry``, ``hold_retry_few``, ``hold_late``
  and ``hard_limited`` hold their key for ``seconds`` and return ``tag``; they
  differ in their options only (busy policy, retries, acks_late, time limit)
* ``retry_once`` calls ``self.retry()`` once; ``soft_limited`` records the soft
  time limit it hits
* ``gated_retry`` (busy policy retry) waits, before it looks at its key, until
  the file its ``enter`` argument names exists, and before it returns until
  ``leave`` exists: a test decides when a start meets a busy key, and when the
  holder lets it go (a broker cut off in between, say)

Task ``beatapp.probe`` (default key: its name) has the name the beat replicas
of ``beatapp`` send by, so a worker of this app executes what those beats send
while the beats never import this module (they only know a plain task of that
name); ``singletonapp.slow_probe`` is a slow one for them to send
(``SB_TASK``). ``singletonapp.where`` records which celery_singlebeat the worker runs.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from typing import Any

from celery import Celery
from celery.exceptions import SoftTimeLimitExceeded

from celery_singlebeat import SingletonTask

app = Celery("singletonapp", broker=os.environ.get("SB_BROKER", "memory://"))
queue = os.environ.get("SB_QUEUE", "celery")
TTL = float(os.environ.get("SB_TTL", "3"))
RECORD = os.environ.get("SB_RECORD", "")
#: ``soft_limited``'s TTL: long, so a key freed at once and one freed by expiry
#: cannot be confused
SOFT_TTL = 30.0

app.conf.update(
    singlebeat_url=os.environ.get("SB_URL"),
    singlebeat_table_prefix=os.environ.get("SB_PREFIX", "singlebeat_"),
    singlebeat_engine_options=json.loads(os.environ.get("SB_ENGINE_OPTIONS", "{}")),
    broker_connection_retry_on_startup=True,
    task_default_queue=queue,
    task_default_exchange=queue,
    task_default_routing_key=queue,
    # one message at a time per process: a test sees what it sent, in order
    worker_prefetch_multiplier=1,
)
if os.environ.get("SB_BACKEND"):
    app.conf.result_backend = os.environ["SB_BACKEND"]
    app.conf.result_expires = 600
if os.environ.get("SB_LEASE_SETTING") is not None:
    app.conf.singlebeat_lease = float(os.environ["SB_LEASE_SETTING"])
if os.environ.get("SB_RUN_RETENTION"):
    app.conf.singlebeat_run_retention = float(os.environ["SB_RUN_RETENTION"])
if os.environ.get("SB_FAILOVER_WINDOW"):
    app.conf.singlebeat_failover_window = float(os.environ["SB_FAILOVER_WINDOW"])
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

if os.environ.get("SB_WORKER_METRICS") == "1":
    import re
    from pathlib import Path

    # The documented set-up itself, not a copy of it (as beatapp's SB_JSON_LOG)
    _doc = (Path(__file__).resolve().parents[2] / "docs" / "operations.md").read_text()
    _block = next(
        b for b in re.findall(r"```python\n(.*?)```", _doc, re.S) if "serve_multiprocess" in b
    )
    #: the block's namespace, kept: Celery's signals hold their receivers weakly
    _worker_metrics: dict[str, Any] = {"__name__": "singletonapp_worker_metrics"}
    exec(compile(_block, "docs/operations.md", "exec"), _worker_metrics)


def record(event: str, task: Any, **extra: Any) -> None:
    """Append one JSON line to SB_RECORD (one write() call: atomic with O_APPEND).
    Token, key and slot are None outside a lease (and for a plain task)."""
    if not RECORD:
        return
    request = task.request
    singleton = None
    with contextlib.suppress(RuntimeError, AttributeError):
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


def singleton(name: str, **options: Any) -> Any:
    """``@app.task`` of a bound SingletonTask ``name`` (``singleton_ttl`` SB_TTL
    unless given) whose key is the call's ``key`` keyword argument, or ``name``."""

    def key_or_name(args: Any, kwargs: Any) -> str:
        return str(kwargs.get("key") or name)

    options.setdefault("singleton_ttl", TTL)
    return app.task(bind=True, base=SingletonTask, name=name, singleton_key=key_or_name, **options)


@singleton("singletonapp.hold")
def hold(self: Any, seconds: float, tag: str = "", *, key: str | None = None) -> str:
    """Holds its key for ``seconds`` (busy policy: skip)."""
    return _body(self, seconds, tag)


@singleton("singletonapp.hold_once", max_retries=0)
def hold_once(self: Any, seconds: float, tag: str = "", *, key: str | None = None) -> str:
    """Like hold, but a start the database cannot decide fails at once."""
    return _body(self, seconds, tag)


@singleton("singletonapp.hold_raise", singleton_busy="raise")
def hold_raise(self: Any, seconds: float, tag: str = "", *, key: str | None = None) -> str:
    """Like hold, but a call finding the key busy fails with SingletonBusy."""
    return _body(self, seconds, tag)


@singleton(
    "singletonapp.hold_retry", singleton_busy="retry", singleton_retry_delay=0.2, max_retries=200
)
def hold_retry(self: Any, seconds: float, tag: str = "", *, key: str | None = None) -> str:
    """Like hold, but a call finding the key busy retries every 0.2 s until it runs."""
    return _body(self, seconds, tag)


@singleton(
    "singletonapp.hold_retry_few", singleton_busy="retry", singleton_retry_delay=0.2, max_retries=2
)
def hold_retry_few(self: Any, seconds: float, tag: str = "", *, key: str | None = None) -> str:
    """Busy policy retry with max_retries=2: a long enough holder exhausts it."""
    return _body(self, seconds, tag)


@singleton(
    "singletonapp.hold_late",
    singleton_busy="retry",
    singleton_retry_delay=0.1,
    max_retries=500,
    acks_late=True,
    reject_on_worker_lost=True,
)
def hold_late(self: Any, seconds: float, tag: str = "", *, key: str | None = None) -> str:
    """acks_late: a worker that dies mid-run leaves the message to be redelivered;
    busy policy retry, so the redelivery waits for the dead holder's lease."""
    return _body(self, seconds, tag)


@singleton("singletonapp.hard_limited", time_limit=1.5)
def hard_limited(self: Any, seconds: float, tag: str = "", *, key: str | None = None) -> str:
    """A hard time limit (1.5 s) shorter than ``seconds``: the pool kills the child."""
    return _body(self, seconds, tag)


@singleton(
    "singletonapp.retry_once", singleton_busy="retry", singleton_retry_delay=0.1, max_retries=50
)
def retry_once(self: Any, countdown: float, tag: str = "", *, key: str | None = None) -> str:
    """Calls ``self.retry(countdown=...)`` on its first attempt (recorded as
    ``retrying``, no ``end``), holding its key; the second attempt returns.
    (Busy policy retry: an attempt that finds the key busy waits for it rather
    than being skipped.)"""
    record("start", self, tag=tag)
    if self.request.retries == 0:
        record("retrying", self, tag=tag)
        raise self.retry(countdown=countdown)
    record("end", self, tag=tag, lost=self.singleton.lost)
    return tag


def _wait_for_file(path: str, what: str) -> None:
    """Until ``path`` exists (a test creates it); a minute at most."""
    deadline = time.monotonic() + 60
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: {path} never appeared")
        time.sleep(0.02)


def _gated_key(args: Any, kwargs: Any) -> str:
    # the key function runs at the start of an execution, before the key is
    # looked at: a start held here meets the key as it is once the gate opens
    enter = kwargs.get("enter")
    if enter and not os.path.exists(enter):
        with open(f"{enter}.waiting", "w"):
            pass
        _wait_for_file(enter, "gated_retry's enter gate")
    return str(kwargs.get("key") or "singletonapp.gated_retry")


@app.task(
    bind=True,
    base=SingletonTask,
    singleton_ttl=TTL,
    singleton_key=_gated_key,
    singleton_busy="retry",
    singleton_retry_delay=0.2,
    max_retries=500,
    name="singletonapp.gated_retry",
)
def gated_retry(
    self: Any,
    tag: str = "",
    *,
    key: str | None = None,
    enter: str | None = None,
    leave: str | None = None,
) -> str:
    """Busy policy retry, its start held at ``enter`` and its end at ``leave``."""
    record("start", self, tag=tag)
    if leave:
        _wait_for_file(leave, "gated_retry's leave gate")
    record("end", self, tag=tag, lost=self.singleton.lost)
    return tag


@singleton("singletonapp.soft_limited", singleton_ttl=SOFT_TTL, soft_time_limit=1.0)
def soft_limited(self: Any, seconds: float, tag: str = "", *, key: str | None = None) -> str:
    """A soft time limit (1 s): SoftTimeLimitExceeded is raised in the body,
    recorded as ``soft`` and re-raised (the task fails)."""
    record("start", self, tag=tag)
    try:
        time.sleep(seconds)
    except SoftTimeLimitExceeded:
        record("soft", self, tag=tag)
        raise
    record("end", self, tag=tag, lost=self.singleton.lost)
    return tag


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
def slot_probe(self: Any, i: int, v: int | None = None) -> int:
    """What the chaos run's beats send (``SB_TASK``): one key per entry (its
    argument), so entries falling due together all run; a slot whose key is
    busy (its previous slot still running) retries rather than being skipped.
    A stored entry the chaos run edits passes ``v``, the version of its
    definition the message was sent under: recorded, so that the judge can
    tell a slot sent under an outdated definition."""
    record("start", self, tag=str(i), v=v)
    record("end", self, tag=str(i), lost=self.singleton.lost, v=v)
    return i


@app.task(bind=True, base=SingletonTask, singleton_ttl=TTL, name="singletonapp.slow_probe")
def slow_probe(self: Any, i: int) -> int:
    """A beat entry's slow task (``SB_TASK``): runs ``SB_SLOW_SECONDS`` (3 by
    default), long enough for a test to SIGKILL its worker mid-run."""
    record("start", self, tag=str(i))
    time.sleep(float(os.environ.get("SB_SLOW_SECONDS", "3")))
    record("end", self, tag=str(i), lost=self.singleton.lost)
    return i


@app.task(bind=True, name="singletonapp.where")
def where(self: Any) -> str:
    """Records (event ``where``, field ``file``) which copy of celery_singlebeat
    this worker imported, so a test can check the workers run the checkout under test."""
    import celery_singlebeat

    path = str(celery_singlebeat.__file__)
    record("where", self, file=path)
    return path
