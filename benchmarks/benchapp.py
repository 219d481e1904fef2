"""The Celery app the benchmark runs in real ``celery beat`` processes.

One module serves every scheduler under test, configured through environment
variables so that the harness (``bench_scheduler.py``) starts each replica with
the same code and only the scheduler differs:

* ``BENCH_SCHEDULER``: ``singlebeat``, ``default`` (Celery's
  ``PersistentScheduler``), ``redbeat`` or ``django`` (django-celery-beat's
  ``DatabaseScheduler``, with Django set up from ``compare_django_settings``,
  its database at ``BENCH_DJANGO_DB``)
* ``BENCH_BROKER``/``BENCH_QUEUE``: the Redis broker and the queue messages land in
* ``BENCH_ENTRIES``/``BENCH_EVERY``: that many interval entries, every BENCH_EVERY s
* ``BENCH_DB_URL``/``BENCH_PREFIX``: singlebeat's database and table prefix
* ``BENCH_REDBEAT_URL``/``BENCH_REDBEAT_PREFIX``: redbeat's Redis and key prefix;
  ``BENCH_REDBEAT_LOCK_TIMEOUT``: its lock timeout in seconds (300);
  ``BENCH_REDBEAT_RETRY_PERIOD``: its ``redbeat_redis_options["retry_period"]``
  (unset: redbeat does not retry Redis calls)
* ``BENCH_STAMP=1``: stamp each message with the instant it was published
  (header ``bench_sent_us``, on the publishing process's clock) and the pid
  that published it (``bench_sent_pid``), so the harness can count a time
  window exactly and tell which replica sent what.
* ``BENCH_CRON=1``: one more entry, ``cron-0``, a crontab every minute (args ``(-1,)``).

* ``BENCH_BURST=N`` and ``BENCH_BURST_EVERY=P``: of the BENCH_ENTRIES entries,
  the first N run every P seconds and the rest once a day (all registered at
  the same instant, so the N fall due in the same second).
* ``BENCH_CRONTABS=N`` and ``BENCH_PERIODS=5,10,...``: of the BENCH_ENTRIES
  entries, the first N are ``crontab()`` (every minute, at :00), named
  ``cron-<i>``; the rest are intervals taking the periods (seconds) in turn,
  named ``every<P>s-<i>`` (``bench_load.py`` reads the schedule from the names).
* ``BENCH_STATS=1``: write ``BENCH-STATS <unix µs> <statements>`` every 0.5 s,
  the SQL statements the process sent so far (all of them the store's); with
  ``BENCH_REPLICA=<i>`` (set by the harness) the database sessions are named
  ``bench-replica-<i>`` (``application_name``). Under ``BENCH_SCHEDULER=django``
  the statements are the ones Django's connection runs (an execute wrapper).
* ``BENCH_MAX_LOOP``: ``beat_max_loop_interval`` in seconds (1 unless set);
  empty leaves it unset, so each scheduler sleeps as long as its own default
  allows (5 s for singlebeat and for django-celery-beat).

``bench_singleton.py`` runs it as a ``celery worker -P solo`` instead: tasks
``benchapp.empty`` (a plain task) and ``benchapp.singleton_empty`` (a
``SingletonTask``, TTL ``BENCH_SINGLETON_TTL``, keyed by its name, its leases
and run rows in ``BENCH_DB_URL`` under ``BENCH_PREFIX``) do nothing;
``benchapp.mark`` writes ``BENCH-MARK <tag> <monotonic s> <round trips>`` to
stdout, the round trips being the worker's ``SqlStore.round_trips`` so far
without the write-back's pings (``statements.py``).

Run as a script it is a baseline instead of a beat:

* ``python benchapp.py sendloop SECONDS``: a plain ``app.send_task`` loop on one
  reused producer;
* ``python benchapp.py batchbeat SECONDS``: the uncoordinated batch sender, a beat
  that sends every entry each second (whole seconds of this host's clock) with
  no database at all, publishing the way celery-singlebeat does (each message
  with a task id and headers, through kombu's pipelined ``Producer.batch`` in
  groups of 100 where the broker allows it). It is the ceiling for a scheduler
  that has to coordinate.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from datetime import timedelta
from typing import Any

from celery import Celery
from celery.schedules import crontab
from celery.signals import beat_init, before_task_publish

from celery_singlebeat import SingletonTask

SCHEDULERS = {
    "singlebeat": "celery_singlebeat.SingleBeatScheduler",
    "default": "celery.beat:PersistentScheduler",
    "redbeat": "redbeat.RedBeatScheduler",
    "django": "django_celery_beat.schedulers:DatabaseScheduler",
}

TASK = "benchapp.probe"

kind = os.environ.get("BENCH_SCHEDULER", "singlebeat")
entries = int(os.environ.get("BENCH_ENTRIES", "5"))
every = float(os.environ.get("BENCH_EVERY", "1"))
queue = os.environ.get("BENCH_QUEUE", "bench")

if kind == "django":
    # DatabaseScheduler reads its entries through the Django ORM: Django must be
    # set up before Celery instantiates the scheduler.
    import django

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "compare_django_settings")
    django.setup()

app = Celery("benchapp", broker=os.environ.get("BENCH_BROKER", "redis://127.0.0.1:6379/9"))
app.conf.update(
    beat_scheduler=SCHEDULERS.get(kind, SCHEDULERS["default"]),
    task_default_queue=queue,
    broker_connection_retry_on_startup=True,
    singlebeat_url=os.environ.get("BENCH_DB_URL"),
    singlebeat_table_prefix=os.environ.get("BENCH_PREFIX", "singlebeat_"),
    redbeat_redis_url=os.environ.get("BENCH_REDBEAT_URL", "redis://127.0.0.1:6379/10"),
    redbeat_key_prefix=os.environ.get("BENCH_REDBEAT_PREFIX", "redbeat:"),
    # By default a lock far longer than the run: standbys must stay standbys while
    # the benchmarks measure; compare_failures.py sets a short one to see failover.
    redbeat_lock_timeout=float(os.environ.get("BENCH_REDBEAT_LOCK_TIMEOUT", "300")),
    beat_schedule={},
)
# Every scheduler loops at least once a second unless BENCH_MAX_LOOP says
# otherwise: singlebeat needs a lease longer than the loop, and the others then
# wake up as often. bench_stored.py measures each at its own default instead.
_max_loop = os.environ.get("BENCH_MAX_LOOP", "1")
if _max_loop:
    app.conf.beat_max_loop_interval = float(_max_loop)
if os.environ.get("BENCH_REDBEAT_RETRY_PERIOD"):
    app.conf.redbeat_redis_options = {
        "retry_period": float(os.environ["BENCH_REDBEAT_RETRY_PERIOD"])
    }
if "BENCH_REPLICA" in os.environ:
    app.conf.singlebeat_engine_options = {
        "connect_args": {"application_name": f"bench-replica-{os.environ['BENCH_REPLICA']}"}
    }
burst = int(os.environ.get("BENCH_BURST", "0"))
burst_every = float(os.environ.get("BENCH_BURST_EVERY", "10"))
crontabs = int(os.environ.get("BENCH_CRONTABS", "0"))
periods = [float(p) for p in os.environ.get("BENCH_PERIODS", "").split(",") if p]


def _entry(i: int) -> tuple[str, Any]:
    """Entry ``i``'s name and schedule."""
    if i < crontabs:
        return f"cron-{i}", crontab()
    if periods:
        period = periods[(i - crontabs) % len(periods)]
        return f"every{period:g}s-{i}", timedelta(seconds=period)
    if burst:
        return f"probe-{i}", timedelta(seconds=burst_every if i < burst else 86400)
    return f"probe-{i}", timedelta(seconds=every)


app.conf.beat_schedule = {
    name: {"task": TASK, "schedule": schedule, "args": (i,)}
    for i, (name, schedule) in ((i, _entry(i)) for i in range(entries))
}
if os.environ.get("BENCH_CRON") == "1":
    from celery.schedules import crontab

    app.conf.beat_schedule["cron-0"] = {"task": TASK, "schedule": crontab(), "args": (-1,)}


@app.task(name=TASK)
def probe(i: int) -> int:
    return i


@app.task(name="benchapp.stored")
def stored(probe: int | None = None, bulk: int | None = None, edit: int = 0) -> None:
    """bench_stored.py's entries: which one, and the edit it was sent under."""


@app.task(name="benchapp.empty")
def empty() -> None:
    """The baseline of bench_singleton.py: a plain task that does nothing."""


@app.task(
    base=SingletonTask,
    singleton_ttl=float(os.environ.get("BENCH_SINGLETON_TTL", "60")),
    name="benchapp.singleton_empty",
)
def singleton_empty() -> None:
    """The same, as a SingletonTask: what it costs more is the lease (and run row)."""


_statements: Any = None
#: context managers entered for the life of the process (_count_statements)
_entered = contextlib.ExitStack()


@app.task(name="benchapp.mark")
def mark(tag: str) -> None:
    """Say when the worker got here (and the statements its store sent so far)."""
    from celery_singlebeat.singleton.runtime import runtime_for

    global _statements
    from statements import Statements  # benchmarks/, on the worker's path

    store = runtime_for(app).store()
    if not hasattr(store, "round_trips"):
        trips = -1
    else:
        # installed at the first mark, before any measured batch: the marks'
        # differences leave out the heartbeat thread's pings
        if _statements is None or _statements.store is not store:
            _statements = Statements(store)
        trips = _statements.sent()
    # fd 1 itself: the worker redirects sys.stdout to its logger
    os.write(1, f"BENCH-MARK {tag} {time.monotonic():.6f} {trips}\n".encode())


if os.environ.get("BENCH_STAMP") == "1":

    @before_task_publish.connect(weak=False)
    def _stamp(headers: dict[str, Any] | None = None, **_: Any) -> None:
        # Measured on this host's clock, like the harness's window bounds.
        if headers is not None:
            headers["bench_sent_us"] = time.time_ns() // 1000
            headers["bench_sent_pid"] = os.getpid()


def _count_statements() -> None:
    """Report the statements this process sends, every 0.5 s, from a thread."""
    import threading

    from sqlalchemy import event
    from sqlalchemy.engine import Engine

    sent = [0]

    if kind == "django":
        from django.db import connection

        def _wrapped(execute: Any, sql: Any, params: Any, many: Any, context: Any) -> Any:
            sent[0] += 1
            return execute(sql, params, many, context)

        # Django's connections are per thread, and DatabaseScheduler queries from
        # beat's (this one); the wrapper stays on the connection object across
        # the reconnections close_old_connections makes, so it is never exited
        # (and kept referenced: a collected context manager would remove it).
        _entered.enter_context(connection.execute_wrapper(_wrapped))
    else:
        # Every engine's: the store's is the only one in a beat process. Counted
        # where SqlStore.round_trips counts, before each cursor execute.
        @event.listens_for(Engine, "before_cursor_execute")
        def _count(*_: Any) -> None:
            sent[0] += 1

    def report() -> None:
        while True:
            # fd 1 itself: beat redirects sys.stdout to its logger
            os.write(1, f"BENCH-STATS {time.time_ns() // 1000} {sent[0]}\n".encode())
            time.sleep(0.5)

    threading.Thread(target=report, name="bench-stats", daemon=True).start()


@beat_init.connect(weak=False)
def _ready(**_: Any) -> None:
    # Connected at import, before redbeat's own beat_init receiver (which blocks a
    # standby until it gets the lock), so every replica reports that it started.
    if os.environ.get("BENCH_STATS") == "1":
        _count_statements()  # before the scheduler's first tick sends any
    print(f"BENCH-READY {os.getpid()}", flush=True)


def send_loop(seconds: float) -> None:
    """Publish as fast as one process can for ``seconds``: the ceiling baseline."""
    deadline = time.monotonic() + seconds
    sent = 0
    with app.producer_or_acquire() as producer:
        print("BENCH-READY sendloop", flush=True)
        while time.monotonic() < deadline:
            app.send_task(TASK, (sent % entries,), producer=producer)
            sent += 1
    print(f"BENCH-SENT {sent}", flush=True)


def batch_beat(seconds: float) -> None:
    """Every whole second, send every entry: a beat with no coordination at all."""
    import uuid

    from celery_singlebeat.engine.publishing import PublishGroup

    deadline = time.monotonic() + seconds
    sent = 0
    with app.producer_or_acquire() as producer:
        print("BENCH-READY batchbeat", flush=True)
        second = int(time.time()) + 1
        while time.monotonic() < deadline:
            time.sleep(max(0.0, second - time.time()))
            group: PublishGroup[int] = PublishGroup(producer)
            try:
                for i in range(entries):
                    probe.apply_async(
                        (i,),
                        producer=producer,
                        task_id=str(uuid.uuid4()),
                        headers={"celery_beat_task": True, "bench_slot": second},
                    )
                    group.added(i)
                    if group.full:
                        group.flush()
                group.flush()
            finally:
                group.close()
            sent += entries
            # behind: the next second's batch is due already, send it at once
            second += 1
    print(f"BENCH-SENT {sent}", flush=True)


if __name__ == "__main__":
    modes = {"sendloop": send_loop, "batchbeat": batch_beat}
    if len(sys.argv) != 3 or sys.argv[1] not in modes:
        sys.exit("usage: benchapp.py sendloop|batchbeat SECONDS")
    modes[sys.argv[1]](float(sys.argv[2]))
