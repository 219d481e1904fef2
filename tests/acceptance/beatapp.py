"""The Celery app every acceptance test runs in real ``celery beat``/``worker``
processes. Configured through environment variables so one module serves every
database and broker:

* ``SB_BROKER``: broker URL; ``SB_URL``: singlebeat_url; ``SB_PREFIX``: table prefix
* ``SB_QUEUE``: queue (and exchange, routing key) the tasks go to, so each test
  reads only its own messages off a shared broker
* ``SB_ENTRIES``/``SB_EVERY``: that many interval entries, every SB_EVERY seconds
* ``SB_SLOW``: ``"period:grace"`` adds one more entry, ``slow-0``, every ``period``
  seconds with its own missed-run grace (per-entry ``options``), so an outage
  can leave it without any on-time slot: the case where policies differ
* ``SB_CREATE_SCHEMA``: ``0`` turns singlebeat_create_schema off
* ``SB_LEASE``: singlebeat_lease seconds; ``SB_POLICY``: missed-run policy;
  ``SB_GRACE``: missed-run grace seconds; ``SB_MISSED_MAX``: singlebeat_missed_max;
  ``SB_LOOP``: beat_max_loop_interval; ``SB_TAKEOVER_BATCH``:
  singlebeat_takeover_batch (default: the setting's own)
* ``SB_STOP_ON``: ``claimed`` or ``published``: stop this process (SIGSTOP) at
  that point of the first slot it wins, so a test can resume (or kill) it later.
  With ``SB_STOP_ARM=usr2`` that is the first slot won after the process gets
  SIGUSR2, so a test can pick the replica when it is already running; each
  SIGUSR2 arms it again (once resumed, the next SIGUSR2 stops it once more),
  and SIGUSR1 disarms it.
* ``SB_TASK``: the task name every entry sends (default ``beatapp.probe``); the
  chaos run sends ``singletonapp.slot_probe``, one singleton key per entry
* ``SB_CRON``: ``1`` adds three crontab entries: ``cron-0`` every minute,
  ``cron-1`` every 2 minutes, ``cron-2`` at minutes ``*/7`` of Asia/Kolkata
  (UTC+5:30, so not the UTC minutes ``*/7``: the crontab's own ``tz``)
* ``SB_ROLL``: ``1`` or ``2`` adds entry ``roll-0``, every 2 s (version 1) or
  every 1 s (version 2) of the same entry: replicas with different values run
  two versions of one ``beat_schedule`` side by side, as in a rolling deploy
* ``SB_RARE``: ``1`` adds entry ``rare-0``, every hour, with ``priority`` 7 in
  its options: the entry a test runs now (``singlebeat run``), whose scheduled
  slots never get in the way
* ``SB_LISTEN``: ``0`` turns singlebeat_listen off
* ``SB_ENGINE_OPTIONS``: singlebeat_engine_options, as JSON (a password in
  ``connect_args``, to prove it is never printed)
* ``SB_STORE_DEBUG``: ``1`` logs the store's DEBUG lines (``stale connection,
  reconnecting``, deadlock retries) while the rest stays at INFO
* ``SB_JSON_LOG``: ``1`` runs the JSON formatter block of docs/operations.md
  ("Log records") as written: every log line becomes one JSON object
* ``SB_HTTP_PORT``, ``SB_HTTP_BIND``: singlebeat_http_port and _bind (the
  listener of /livez, /readyz, /metrics); ``SB_STATUS_FILE``:
  singlebeat_status_file; ``SB_LIVENESS``/``SB_READINESS``:
  singlebeat_liveness_timeout/_readiness_timeout seconds; ``SB_METRICS``:
  ``1``/``0`` singlebeat_metrics (unset: the setting's default)
* ``SB_FAILOVER_WINDOW``: singlebeat_failover_window seconds (``0``: the
  replica writes nothing back after a failover, to see what that prevents)
* ``SB_VIA_EXCHANGE``: ``1`` sends every entry through the exchange named
  ``SB_QUEUE`` with that routing key (entry ``options``), so every queue bound
  so receives a copy. Without it Celery publishes straight to the queue (the
  default exchange) and only that queue gets the message; a benchmark whose
  worker consumes the queue binds a second one to read every message from.
* ``SB_HANG_FILE``: while that file exists, the first slot this replica
  claims blocks its loop (in a ``slot_claimed`` receiver) until the file is
  removed: a hung tick in a living process, whose HTTP listener still answers
"""

from __future__ import annotations

import json
import os
import signal
import time
from datetime import timedelta
from typing import Any

from celery import Celery

from celery_singlebeat import signals

app = Celery("beatapp", broker=os.environ.get("SB_BROKER", "memory://"))
entries = int(os.environ.get("SB_ENTRIES", "5"))
every = float(os.environ.get("SB_EVERY", "1"))
queue = os.environ.get("SB_QUEUE", "celery")
task_name = os.environ.get("SB_TASK", "beatapp.probe")

schedule: dict[str, dict[str, Any]] = {
    f"probe-{i}": {
        "task": task_name,
        "schedule": timedelta(seconds=every),
        "args": (i,),
    }
    for i in range(entries)
}
if os.environ.get("SB_SLOW"):
    slow_every, slow_grace = (float(part) for part in os.environ["SB_SLOW"].split(":"))
    schedule["slow-0"] = {
        "task": task_name,
        "schedule": timedelta(seconds=slow_every),
        "args": (-1,),
        "options": {"singlebeat_missed_grace": slow_grace},
    }
if os.environ.get("SB_CRON") == "1":
    from zoneinfo import ZoneInfo

    from celery.schedules import crontab

    kolkata = crontab(minute="*/7")
    kolkata.tz = ZoneInfo("Asia/Kolkata")
    for j, cron in enumerate((crontab(minute="*"), crontab(minute="*/2"), kolkata)):
        schedule[f"cron-{j}"] = {"task": task_name, "schedule": cron, "args": (1000 + j,)}
if os.environ.get("SB_ROLL"):
    roll_every = {"1": 2.0, "2": 1.0}[os.environ["SB_ROLL"]]
    schedule["roll-0"] = {
        "task": task_name,
        "schedule": timedelta(seconds=roll_every),
        "args": (2000,),
    }
if os.environ.get("SB_RARE") == "1":
    schedule["rare-0"] = {
        "task": task_name,
        "schedule": timedelta(hours=1),
        "args": (3000,),
        "options": {"priority": 7},
    }

if os.environ.get("SB_VIA_EXCHANGE") == "1":
    for _entry in schedule.values():
        _entry["options"] = {**_entry.get("options", {}), "exchange": queue, "routing_key": queue}

app.conf.update(
    beat_scheduler="celery_singlebeat.SingleBeatScheduler",
    singlebeat_listen=os.environ.get("SB_LISTEN", "1") != "0",
    singlebeat_url=os.environ.get("SB_URL"),
    singlebeat_table_prefix=os.environ.get("SB_PREFIX", "singlebeat_"),
    singlebeat_engine_options=json.loads(os.environ.get("SB_ENGINE_OPTIONS", "{}")),
    singlebeat_lease=float(os.environ.get("SB_LEASE", "15")),
    singlebeat_create_schema=os.environ.get("SB_CREATE_SCHEMA", "1") != "0",
    singlebeat_missed_policy=os.environ.get("SB_POLICY", "coalesce"),
    singlebeat_missed_grace=float(os.environ.get("SB_GRACE", "5")),
    singlebeat_missed_max=int(os.environ.get("SB_MISSED_MAX", "100")),
    beat_max_loop_interval=float(os.environ.get("SB_LOOP", "1")),
    **(
        {"singlebeat_takeover_batch": int(os.environ["SB_TAKEOVER_BATCH"])}
        if os.environ.get("SB_TAKEOVER_BATCH")
        else {}
    ),
    **{
        setting: cast(os.environ[variable])
        for variable, setting, cast in (
            ("SB_HTTP_PORT", "singlebeat_http_port", int),
            ("SB_HTTP_BIND", "singlebeat_http_bind", str),
            ("SB_STATUS_FILE", "singlebeat_status_file", str),
            ("SB_LIVENESS", "singlebeat_liveness_timeout", float),
            ("SB_READINESS", "singlebeat_readiness_timeout", float),
            ("SB_METRICS", "singlebeat_metrics", lambda v: v == "1"),
            ("SB_FAILOVER_WINDOW", "singlebeat_failover_window", float),
            ("SB_REPLICA_ID", "singlebeat_replica_id", str),
        )
        if os.environ.get(variable)
    },
    broker_connection_retry_on_startup=True,
    task_default_queue=queue,
    task_default_exchange=queue,
    task_default_routing_key=queue,
    beat_schedule=schedule,
)


if os.environ.get("SB_STORE_DEBUG") == "1":
    import logging

    from celery.signals import after_setup_logger

    @after_setup_logger.connect(weak=False)
    def _store_debug(**_kwargs: object) -> None:
        logging.getLogger("celery_singlebeat.store").setLevel(logging.DEBUG)


if os.environ.get("SB_JSON_LOG") == "1":
    import re
    from pathlib import Path

    # The documented configuration itself, not a copy of it: the acceptance test
    # proves that what docs/operations.md shows works in a real celery beat.
    _doc = (Path(__file__).resolve().parents[2] / "docs" / "operations.md").read_text()
    _block = next(b for b in re.findall(r"```python\n(.*?)```", _doc, re.S) if "JsonLines" in b)
    #: the block's namespace, kept: Celery's signal holds its receiver weakly
    _json_log: dict[str, Any] = {"__name__": "beatapp_json_log"}
    exec(compile(_block, "docs/operations.md", "exec"), _json_log)


@app.task(name="beatapp.probe")
def probe(i: int) -> int:
    return i


_stop_on = os.environ.get("SB_STOP_ON")
_stopped = False
_armed = os.environ.get("SB_STOP_ARM") != "usr2"


def _arm(signum: int, frame: object) -> None:
    global _armed, _stopped
    _armed = True
    _stopped = False


def _disarm(signum: int, frame: object) -> None:
    global _armed
    _armed = False


if not _armed:
    signal.signal(signal.SIGUSR2, _arm)
    signal.signal(signal.SIGUSR1, _disarm)


def _stop(**details: object) -> None:
    global _stopped
    if _armed and not _stopped:
        _stopped = True
        print(f"SB-STOPPING {details['entry']} {details['task_id']}", flush=True)
        os.kill(os.getpid(), signal.SIGSTOP)


if _stop_on == "claimed":
    signals.slot_claimed.connect(_stop, weak=False)
elif _stop_on == "published":
    signals.slot_published.connect(_stop, weak=False)


_hang_file = os.environ.get("SB_HANG_FILE")


def _hang(**details: object) -> None:
    if _hang_file and os.path.exists(_hang_file):
        print(f"SB-HANGING {details['entry']} {details['task_id']}", flush=True)
        while os.path.exists(_hang_file):
            time.sleep(0.05)
        print("SB-HANG-OVER", flush=True)


if _hang_file:
    signals.slot_claimed.connect(_hang, weak=False)
