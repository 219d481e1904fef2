"""The demo's Celery app: three periodic entries every 2 s, one every 5 s.

Everything a real project needs is the two ``singlebeat`` lines in
``app.conf.update`` below; the rest makes the demo self-contained (no broker
server: kombu's filesystem transport; no database server: the embedded SQLite
default) and lets the worker report which beat replica sent each run.

Environment (set by ``demo.py``; usable by hand too, see README.md here):

* ``DEMO_DIR``: folder for the broker's message files, the SQLite file and the
  run log (default: ``./demo-broker``);
* ``DEMO_REPLICA``: a readable name for this beat replica (default: the host,
  pid and a random suffix, celery-singlebeat's own default).
"""

from __future__ import annotations

import json
import os
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from celery import Celery, Task
from celery.schedules import schedule
from celery.signals import before_task_publish

DEMO_DIR = Path(os.environ.get("DEMO_DIR") or "demo-broker").resolve()
MESSAGES = DEMO_DIR / "messages"
PROCESSED = DEMO_DIR / "processed"
CONTROL = DEMO_DIR / "control"
#: one JSON line per task execution, appended by the worker, read by demo.py.
RUNS = DEMO_DIR / "runs.jsonl"
for folder in (MESSAGES, PROCESSED, CONTROL):
    folder.mkdir(parents=True, exist_ok=True)

app = Celery("proj")
app.conf.update(
    # --- the celery-singlebeat set-up: these two lines --------------------
    beat_scheduler="celery_singlebeat.SingleBeatScheduler",
    singlebeat_url=f"sqlite:///{DEMO_DIR / 'singlebeat.sqlite'}",
    # --- demo tuning ------------------------------------------------------
    # Short loop and lease so a demo of a few seconds shows everything; the
    # lease must stay longer than the loop interval (checked at start-up).
    beat_max_loop_interval=1,
    singlebeat_lease=4,
    # Readable replica names in the output; the default (host:pid:random)
    # is what a real deployment wants.
    singlebeat_replica_id=os.environ.get("DEMO_REPLICA") or None,
    # --- a broker without a server: message files in one folder -----------
    broker_url="filesystem://",
    # the stock filesystem transport with one fix: messages written atomically
    # (see filebroker.py)
    broker_transport="filebroker:Transport",
    broker_transport_options={
        "data_folder_in": str(MESSAGES),
        "data_folder_out": str(MESSAGES),
        "processed_folder": str(PROCESSED),
        "store_processed": True,
        "control_folder": str(CONTROL),
        # poll the folder 10 times a second so runs show up promptly
        "polling_interval": 0.1,
    },
    broker_connection_retry_on_startup=True,
    # the filesystem transport is for one worker on one machine: no remote
    # control, events or result backend are needed
    worker_enable_remote_control=False,
    task_ignore_result=True,
    beat_schedule={
        **{
            f"report-{name}": {
                "task": "proj.record",
                "schedule": timedelta(seconds=2),
                "args": (name,),
            }
            for name in ("sales", "stock", "billing")
        },
        "cleanup": {
            "task": "proj.record",
            "schedule": schedule(run_every=timedelta(seconds=5)),
            "args": ("cleanup",),
            # per-entry celery-singlebeat options go into "options"
            "options": {"singlebeat_missed_policy": "skip"},
        },
    },
)


@before_task_publish.connect
def _stamp_replica(headers: dict[str, Any] | None = None, **_: Any) -> None:
    """Beat side: put this replica's id in the message, for the demo's report.

    celery-singlebeat already puts the slot in the ``singlebeat_slot`` header;
    which replica won it is only interesting to a demo (and to the logs).
    """
    if headers is not None and headers.get("singlebeat_slot"):
        headers["demo_replica"] = app.conf.singlebeat_replica_id or os.environ.get(
            "DEMO_REPLICA", "?"
        )


@app.task(name="proj.record", bind=True)
def record(self: Task, what: str) -> None:
    """Worker side: append one line per execution, with the slot it is for."""
    request = self.request
    headers = request.headers or {}
    slot = headers.get("singlebeat_slot") or getattr(request, "singlebeat_slot", None) or {}
    replica = headers.get("demo_replica") or getattr(request, "demo_replica", None)
    line = {
        "what": what,
        "entry": slot.get("entry"),
        "at": slot.get("at"),
        "at_us": slot.get("at_us"),
        "replica": replica,
        "task_id": request.id,
        "pid": os.getpid(),
        # when the worker ran it, on this machine's clock (the SQLite clock too)
        "ran_us": time.time_ns() // 1000,
    }
    # One write() of one short line on an O_APPEND file: lines never interleave.
    with RUNS.open("a", encoding="utf-8") as out:
        out.write(json.dumps(line) + "\n")
