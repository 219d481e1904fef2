"""A Celery app for the start-up acceptance tests (``test_startup.py``), run by
real ``celery -A startapp beat`` processes and configured through environment
variables, so each test can break exactly one thing:

* ``SB_BROKER``: broker URL (default ``memory://``: nothing to connect to)
* ``SB_QUEUE``: the queue the probe task is routed to
* ``SB_URL``/``SB_PREFIX``: singlebeat_url and table prefix (unset: the defaults)
* ``SB_LOOP``/``SB_LEASE``: beat_max_loop_interval and singlebeat_lease, seconds
* ``SB_POLICY``: singlebeat_missed_policy; ``SB_CREATE_SCHEMA``: ``0`` turns
  singlebeat_create_schema off
* ``SB_ENTRY``: the one schedule entry: ``ok`` (every ``SB_EVERY`` seconds),
  ``bad-policy`` (an unknown per-entry missed-run policy), ``long-name`` (a name
  longer than 255 bytes) or ``opaque`` (a schedule object we cannot coordinate)
* ``SB_ENGINE_OPTIONS``: singlebeat_engine_options, as JSON
* ``SB_GATE``: a folder; after start-up and before its first tick, beat leaves a
  file ``arrived-<pid>`` in it and waits for ``release`` to appear there, then
  until the Unix time that file holds, so processes started together reach the
  database together however long each took to start
"""

from __future__ import annotations

import json
import os
import time
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from celery import Celery, signals
from celery.schedules import BaseSchedule


class OpaqueSchedule(BaseSchedule):  # type: ignore[misc]
    """A schedule that only says "due or not": no instants replicas could agree on."""

    def is_due(self, last_run_at: datetime) -> tuple[bool, float]:
        return False, 60.0


app = Celery("startapp", broker=os.environ.get("SB_BROKER", "memory://"))

_kind = os.environ.get("SB_ENTRY", "ok")
_entry: dict[str, Any] = {
    "task": "startapp.probe",
    "schedule": timedelta(seconds=float(os.environ.get("SB_EVERY", "1"))),
    "options": {"queue": os.environ.get("SB_QUEUE", "startup")},
}
_name = "probe"
if _kind == "bad-policy":
    _entry["options"]["singlebeat_missed_policy"] = "bogus"
elif _kind == "long-name":
    _name = "n" * 256
elif _kind == "opaque":
    _entry["schedule"] = OpaqueSchedule()

_conf: dict[str, Any] = {
    "beat_scheduler": "celery_singlebeat.SingleBeatScheduler",
    "beat_max_loop_interval": float(os.environ.get("SB_LOOP", "1")),
    "beat_schedule": {_name: _entry},
    "broker_connection_retry_on_startup": True,
    "singlebeat_lease": float(os.environ.get("SB_LEASE", "15")),
    "singlebeat_create_schema": os.environ.get("SB_CREATE_SCHEMA", "1") != "0",
    "singlebeat_engine_options": json.loads(os.environ.get("SB_ENGINE_OPTIONS", "{}")),
}
for _setting, _var in (
    ("singlebeat_url", "SB_URL"),
    ("singlebeat_table_prefix", "SB_PREFIX"),
    ("singlebeat_missed_policy", "SB_POLICY"),
):
    if _var in os.environ:
        _conf[_setting] = os.environ[_var]
app.conf.update(_conf)


@app.task(name="startapp.probe")
def probe() -> None:
    """What beat sends; the tests read the broker's queue, no worker runs it."""


@signals.beat_init.connect
def _start_together(**_: object) -> None:
    # beat_init comes after the scheduler is built and before its first tick,
    # which is when it creates the schema: the moment the race test aims at.
    # A barrier rather than an instant fixed before the start: on a loaded
    # machine (the suite runs tests side by side) three interpreters may take
    # longer than any fixed lead to start, and then they did not race at all.
    gate = os.environ.get("SB_GATE")
    if not gate:
        return
    folder = Path(gate)
    (folder / f"arrived-{os.getpid()}").touch()
    release = folder / "release"
    deadline = time.monotonic() + 60
    while not release.exists():
        if time.monotonic() > deadline:
            print("SB-LATE: the gate did not open in 60 s", flush=True)
            return
        time.sleep(0.01)
    # the instant, ahead of the release by more than this poll's 10 ms: the
    # processes leave the gate within a millisecond or so of each other
    late = time.time() - float(release.read_text())
    if late < 0:
        time.sleep(-late)
    else:
        print(f"SB-LATE {late:.3f}s", flush=True)
