"""The app the examples of docs/testing.md test: yours would be ``proj/celery.py``.

Its broker is never contacted: the singlebeat_* fixtures publish to a private
in-memory broker.
"""

from datetime import timedelta

from celery import Celery
from celery.schedules import crontab

app = Celery("example", broker="redis://redis.invalid:6379/0")
app.conf.timezone = "Europe/Berlin"
app.conf.beat_schedule = {
    # 02:30 does not exist on the last Sunday of March and happens twice on the
    # last Sunday of October (Europe/Berlin)
    "nightly-report": {"task": "example.nightly_report", "schedule": crontab(hour=2, minute=30)},
    # the default policy (coalesce): after a gap, the latest missed run, once
    "refresh-rates": {"task": "example.refresh_rates", "schedule": timedelta(minutes=5)},
    # every missed run is sent (a meter must not lose an interval)
    "meter-usage": {
        "task": "example.meter_usage",
        "schedule": timedelta(minutes=5),
        "options": {"singlebeat_missed_policy": "all"},
    },
    # a missed poll is useless: none is sent
    "poll-partner": {
        "task": "example.poll_partner",
        "schedule": timedelta(minutes=1),
        "options": {"singlebeat_missed_policy": "skip"},
    },
}


@app.task(name="example.nightly_report")
def nightly_report() -> None:
    """Beat sends it by name; the worker's body does not matter here."""
