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
left unfinished would let a repeated delivery of its slot run again.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from .. import decisions, signals
from ..clock import US
from ..decisions import run_fields
from ..exceptions import StoreUnavailable
from ..store.base import Lease, Run, Store
from .context import Singleton

logger = logging.getLogger("celery_singlebeat.singleton")

#: How often an unreachable database is asked again, and pending work retried.
RETRY_INTERVAL = 1.0
#: How long unfinished bookkeeping is retried before it is given up (and logged).
PENDING_LIMIT = 3600.0


@dataclass
class Held:
    """One running execution's lease, as the heartbeat tracks it."""

    singleton: Singleton
    store: Store
    lease: Lease
    run: Run | None
    ttl_us: int
    #: monotonic instant by which the lease surely ended unless renewed.
    deadline: float
    next_at: float = 0.0
    sender: object = None
    #: the worker's owner id (the ``replica`` field of its log records)
    owner: str = ""

    @property
    def interval(self) -> float:
        return self.ttl_us / US / 3


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
                pending = list(self._pending) if not due else []
                if not due and not pending:
                    wake = min((h.next_at for h in self._held), default=now + 60.0)
                    self._cond.wait(timeout=max(0.0, wake - now))
                    continue
            for held in due:
                self._renew(held)
            for item in pending:
                self._retry(item)
            if pending:
                with self._cond:
                    # not past the next renewal: a short TTL cannot wait a whole retry interval
                    wake = min((h.next_at for h in self._held), default=math.inf)
                    self._cond.wait(timeout=max(0.0, min(RETRY_INTERVAL, wake - time.monotonic())))

    def _renew(self, held: Held) -> None:
        sent = time.monotonic()
        try:
            renewed = held.store.renew_lease(held.lease, held.ttl_us)
            if (
                renewed is not None
                and held.run is not None
                and not held.store.renew_run(held.run, held.ttl_us)
            ):
                logger.warning(
                    "singlebeat: the run row of slot %s@%s (task %s) was taken by "
                    "another start; the slot may run twice",
                    held.run.entry,
                    held.run.slot_us,
                    held.singleton.task_id,
                    extra=run_fields(
                        decisions.RUN_TAKEN,
                        held.owner,
                        held.singleton.task_id,
                        held.lease.key,
                        (held.run.entry, held.run.slot_us),
                        held.lease.token,
                    ),
                )
                held.run = None
        except StoreUnavailable as exc:
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
        held.lease = renewed
        held.deadline = sent + held.ttl_us / US
        held.next_at = time.monotonic() + held.interval

    def _lost(self, held: Held, reason: str) -> None:
        self.drop(held)
        singleton = held.singleton
        singleton.mark_lost(reason)
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
