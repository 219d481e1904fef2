"""Keeps the leases of running SingletonTasks alive, and finishes what could not be.

One daemon thread per process renews every held lease (and its slot's run
row) every third of its TTL: a task longer than its TTL keeps its key, and a
process that dies stops renewing, so its key frees itself when the TTL runs
out. A renewal that finds the token replaced marks the execution lost at
once; a database that stays unreachable until the lease's end (measured on
this process's monotonic clock from *before* the acquiring round trip, so it
can only err early) marks it lost too.

The same thread retries the bookkeeping that a task's end could not write
(finishing a run row, releasing a key) while the database was away: a run
left unfinished would let a repeated delivery of its slot run again. And it
runs the checks a process asks for while it has reason to (:meth:`Heartbeat.watch`:
the failover write-back's ping, singleton/writeback.py).
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from .. import signals
from ..exceptions import StoreUnavailable
from ..observe import decisions
from ..observe.decisions import run_fields
from ..observe.telemetry import SINGLETON_NOTHING, SingletonTelemetry
from ..store.singleton_store import SingletonStore
from ..store.values import Lease, Run
from ..timeline.clock import US
from .context import Singleton
from .writeback import through_reconnect

logger = logging.getLogger("celery_singlebeat.singleton")

#: How often an unreachable database is asked again, and pending work retried.
RETRY_INTERVAL = 1.0
#: How long unfinished bookkeeping is retried before it is given up (and logged).
PENDING_LIMIT = 3600.0


@dataclass
class Held:
    """One running execution's lease, as the heartbeat tracks it."""

    singleton: Singleton
    store: SingletonStore
    lease: Lease
    run: Run | None
    ttl_us: int
    #: monotonic instant by which the lease surely ended unless renewed.
    deadline: float
    next_at: float = 0.0
    sender: object = None
    #: the worker's owner id (the ``replica`` field of its log records)
    owner: str = ""
    #: where renewals and losses are counted (metrics)
    telemetry: SingletonTelemetry = SINGLETON_NOTHING
    #: run before each renewal: the failover write-back's check (writeback.py),
    #: so that a renewal after a reconnect finds the rows written back
    before: Callable[[], None] | None = None

    @property
    def interval(self) -> float:
        return self.ttl_us / US / 3


@dataclass
class Watch:
    """A check run every ``interval`` seconds until it returns False."""

    check: Callable[[], bool]
    interval: float
    next_at: float = 0.0


@dataclass
class Pending:
    """Bookkeeping a task's end could not write; retried until it is."""

    what: str
    work: Callable[[], object]
    give_up_at: float
    attempts: int = field(default=0)


class Heartbeat:
    """The per-process renewal thread (see the module docstring)."""

    def __init__(self) -> None:
        self._held: list[Held] = []
        self._pending: list[Pending] = []
        self._watches: dict[int, Watch] = {}
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self.pid = os.getpid()

    def hold(self, held: Held) -> None:
        held.next_at = time.monotonic() + held.interval
        with self._cond:
            self._held.append(held)
            self._ensure_thread()
            self._cond.notify()

    def drop(self, held: Held) -> None:
        with self._cond:
            if held in self._held:
                self._held.remove(held)

    def defer(self, what: str, work: Callable[[], object]) -> None:
        """Retry ``work`` in the background until it stops raising StoreUnavailable."""
        with self._cond:
            self._pending.append(Pending(what, work, time.monotonic() + PENDING_LIMIT))
            self._ensure_thread()
            self._cond.notify()

    def watch(self, key: int, check: Callable[[], bool], interval: float) -> None:
        """Run ``check`` every ``interval`` seconds from this thread until it
        returns False; one watch per ``key`` (a second call keeps the first)."""
        with self._cond:
            if key in self._watches:
                return
            self._watches[key] = Watch(check, interval, time.monotonic() + interval)
            self._ensure_thread()
            self._cond.notify()

    def _ensure_thread(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(
                target=self._loop, name="singlebeat-heartbeat", daemon=True
            )
            self._thread.start()

    def _loop(self) -> None:
        while True:
            with self._cond:
                now = time.monotonic()
                due = [h for h in self._held if h.next_at <= now]
                watches = [(k, w) for k, w in self._watches.items() if w.next_at <= now]
                pending = list(self._pending) if not due else []
                if not due and not pending and not watches:
                    wake = min(
                        [h.next_at for h in self._held]
                        + [w.next_at for w in self._watches.values()],
                        default=now + 60.0,
                    )
                    self._cond.wait(timeout=max(0.0, wake - now))
                    continue
            for held in due:
                self._renew(held)
            for key, watch in watches:
                self._check(key, watch)
            for item in pending:
                self._retry(item)
            if pending:
                with self._cond:
                    # not past the next renewal or check: a short TTL cannot wait a
                    # whole retry interval
                    wake = min(
                        [h.next_at for h in self._held]
                        + [w.next_at for w in self._watches.values()],
                        default=math.inf,
                    )
                    self._cond.wait(timeout=max(0.0, min(RETRY_INTERVAL, wake - time.monotonic())))

    def _check(self, key: int, watch: Watch) -> None:
        try:
            again = watch.check()
        except Exception:  # never let the thread die: the leases need it
            logger.exception("singlebeat: a background check failed")
            again = True
        with self._cond:
            if again:
                watch.next_at = time.monotonic() + watch.interval
            else:
                self._watches.pop(key, None)

    def _renew(self, held: Held) -> None:
        sent = time.monotonic()
        try:

            def renew() -> Lease | None:
                if held.before is not None:
                    held.before()
                return held.store.renew_lease(held.lease, held.ttl_us)

            renewed = through_reconnect(renew)
            run = held.run
            if (
                renewed is not None
                and run is not None
                and not held.store.renew_run(run, held.ttl_us)
            ):
                logger.warning(
                    "singlebeat: the run row of slot %s@%s (task %s) was taken by "
                    "another start; the slot may run twice",
                    run.entry,
                    run.slot_us,
                    held.singleton.task_id,
                    extra=run_fields(
                        decisions.RUN_TAKEN,
                        held.owner,
                        held.singleton.task_id,
                        held.lease.key,
                        (run.entry, run.slot_us),
                        held.lease.token,
                    ),
                )
                held.run = None
        except StoreUnavailable as exc:
            held.telemetry.renew_failed(held.singleton.task_name)
            if time.monotonic() >= held.deadline:
                self._lost(held, f"the database was unreachable until the lease ended ({exc})")
            else:
                held.next_at = time.monotonic() + min(held.interval, RETRY_INTERVAL)
            return
        except Exception:  # never let the thread die: the other leases need it
            logger.exception("singlebeat: renewing singleton key %r failed", held.lease.key)
            held.next_at = time.monotonic() + min(held.interval, RETRY_INTERVAL)
            return
        if renewed is None:
            self._lost(held, "another execution took the key (the lease had expired)")
            return
        held.telemetry.renewed(held.singleton.task_name, time.monotonic() - sent)
        held.lease = renewed
        held.deadline = sent + held.ttl_us / US
        held.next_at = time.monotonic() + held.interval

    def _lost(self, held: Held, reason: str) -> None:
        self.drop(held)
        singleton = held.singleton
        singleton.mark_lost(reason)
        held.telemetry.lease_lost(singleton.task_name)
        logger.warning(
            "singlebeat: task %s lost its singleton key %r (token %d): %s",
            singleton.task_id,
            singleton.key,
            singleton.token,
            reason,
            extra=run_fields(
                decisions.LEASE_LOST,
                held.owner,
                singleton.task_id,
                singleton.key,
                singleton.slot,
                singleton.token,
            ),
        )
        if signals.singleton_lease_lost.receivers:
            signals.singleton_lease_lost.send(
                sender=held.sender,
                key=singleton.key,
                token=singleton.token,
                task_id=singleton.task_id,
                reason=reason,
            )

    def _retry(self, item: Pending) -> None:
        item.attempts += 1
        try:
            item.work()
        except StoreUnavailable:
            if time.monotonic() < item.give_up_at:
                return
            logger.error("singlebeat: gave up %s after %d attempts", item.what, item.attempts)
        except Exception:
            logger.exception("singlebeat: %s failed", item.what)
        else:
            if item.attempts > 1:
                logger.info("singlebeat: %s done after the database came back", item.what)
        with self._cond:
            self._pending.remove(item)


_heartbeat: Heartbeat | None = None
_guard = threading.Lock()


def heartbeat() -> Heartbeat:
    """This process's heartbeat (a forked child gets a fresh one)."""
    global _heartbeat
    with _guard:
        if _heartbeat is None or _heartbeat.pid != os.getpid():
            _heartbeat = Heartbeat()
        return _heartbeat
