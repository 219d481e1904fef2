"""The Celery app every acceptance test runs in real ``celery beat``/``worker``
processes. Configured through environment variables so one module serves every
database and broker:

* ``SB_BROKER``: broker URL; ``SB_URL``: singlebeat_url; ``SB_PREFIX``: table prefix
* ``SB_ENTRIES``/``SB_EVERY``: that many interval entries, every SB_EVERY seconds
* ``SB_LEASE``: singlebeat_lease seconds; ``SB_POLICY``: missed-run policy
* ``SB_STOP_ON``: ``claimed`` or ``published``: stop this process (SIGSTOP) at
  that point of the first slot it wins, so a test can resume it later.
"""

from __future__ import annotations

import os
import signal
from datetime import timedelta

from celery import Celery

from celery_singlebeat import signals

app = Celery("beatapp", broker=os.environ.get("SB_BROKER", "memory://"))
entries = int(os.environ.get("SB_ENTRIES", "5"))
every = float(os.environ.get("SB_EVERY", "1"))
app.conf.update(
    beat_scheduler="celery_singlebeat.SingleBeatScheduler",
    singlebeat_url=os.environ.get("SB_URL"),
    singlebeat_table_prefix=os.environ.get("SB_PREFIX", "singlebeat_"),
    singlebeat_lease=float(os.environ.get("SB_LEASE", "15")),
    singlebeat_missed_policy=os.environ.get("SB_POLICY", "coalesce"),
    beat_max_loop_interval=float(os.environ.get("SB_LOOP", "1")),
    broker_connection_retry_on_startup=True,
    beat_schedule={
        f"probe-{i}": {
            "task": "beatapp.probe",
            "schedule": timedelta(seconds=every),
            "args": (i,),
        }
        for i in range(entries)
    },
)


@app.task(name="beatapp.probe")
def probe(i: int) -> int:
    return i


_stop_on = os.environ.get("SB_STOP_ON")
_stopped = False


def _stop(**details: object) -> None:
    global _stopped
    if not _stopped:
        _stopped = True
        print(f"SB-STOPPING {details['entry']} {details['task_id']}", flush=True)
        os.kill(os.getpid(), signal.SIGSTOP)


if _stop_on == "claimed":
    signals.slot_claimed.connect(_stop, weak=False)
elif _stop_on == "published":
    signals.slot_published.connect(_stop, weak=False)
