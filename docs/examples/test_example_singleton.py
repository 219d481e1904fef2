"""A SingletonTask executes a run once when it is delivered twice: docs/testing.md.

``celery_app`` is pytest-celery's in-process app (memory broker, in-memory
results); ``singlebeat_worker`` starts a worker on it whose SingletonTasks keep
their leases and run rows in a MemoryStore.
"""

import threading
from datetime import datetime, timezone

from celery_singlebeat import SingletonTask, signals
from celery_singlebeat.testing import send_slot


class Report(SingletonTask):
    singleton_ttl = 60


def test_a_run_delivered_twice_executes_once(celery_app, singlebeat_worker):
    executed = []

    @celery_app.task(base=Report, name="example.report", shared=False)
    def report(day):
        executed.append(day)
        return f"report for {day}"

    dropped = threading.Event()

    def on_duplicate(sender, **details):
        dropped.set()

    signals.singleton_duplicate.connect(on_duplicate, weak=False)
    try:
        worker = singlebeat_worker(celery_app)
        at = datetime(2026, 1, 1, 2, 0, tzinfo=timezone.utc)
        # what a replica that died between publishing and recording leaves: the
        # same run (task id, slot header) sent twice
        first = send_slot(report, "nightly-report", at, args=["2026-01-01"])
        again = send_slot(report, "nightly-report", at, args=["2026-01-01"])
        assert first.id == again.id
        assert first.get(timeout=10) == "report for 2026-01-01"
        assert dropped.wait(timeout=10), "the second delivery was not dropped"
    finally:
        signals.singleton_duplicate.disconnect(on_duplicate)
    assert executed == ["2026-01-01"]
    (row,) = worker.store.run_rows().values()
    assert (row["attempts"], row["repeats"], row["outcome"]) == (1, 1, "success")
