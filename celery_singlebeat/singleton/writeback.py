"""SingletonTask's side of a database failover (``failover.py`` has beat's).

A run row is what drops a repeated delivery of a slot that already ran. A
failover to a standby that lagged behind can lose the rows written just
before it, and a repeat delivered afterwards would then run a second time.
So each worker process remembers the run rows it wrote during the last
``singlebeat_failover_window`` (:class:`RunJournal`), and after any broken
connection writes them again (:meth:`SingletonStore.reassert_runs
<celery_singlebeat.store.singleton_store.SingletonStore.reassert_runs>`) before it starts a slot.

The rows another process wrote are that process's to write back: while it
remembers runs, each process pings the database every :data:`PING_S` from
its heartbeat thread, so it meets a failover within about a second even
when idle. A start of a slot that fell due before this process's reconnect
waits :data:`HOLD_S` after it, for those write-backs to land; slots due
later cannot have run before the failover and start at once.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from ..exceptions import ConnectionReplaced, StoreUnavailable
from ..observe import decisions
from ..observe.decisions import batch_fields
from ..observe.telemetry import SingletonTelemetry
from ..store.journal import HOLD_MARGIN_S
from ..store.singleton_store import SingletonStore
from ..store.values import Run, RunRecord, SlotKey
from ..timeline.clock import slot_text

logger = logging.getLogger("celery_singlebeat.singleton")

#: how often a process that remembers runs pings the database, to meet a
#: failover soon enough when it is idle
PING_S = 1.0
#: how long a start of an old slot waits after this process's reconnect:
#: the others' next ping and their reconnect
HOLD_S = PING_S + HOLD_MARGIN_S


T = TypeVar("T")


def through_reconnect(call: Callable[[], T]) -> T:
    """``call()``, sent again once when it met a reconnect.

    The worker's store does not send a statement on a connection that
    replaced a broken one (``ConnectionReplaced``), so that a slot's start
    waits for the write-back. Renewals, ends and a task's ``guard()`` need no
    such wait: the write-back cannot make their answer wrong (a lost row
    only makes them say "not ours"), so they go at once on the new connection.
    """
    try:
        return call()
    except ConnectionReplaced:
        return call()


@dataclass
class _Entry:
    run: Run
    owner: str
    task_id: str
    started_us: int
    ttl_us: int
    outcome: str | None = None
    finished_us: int | None = None
    #: monotonic instant of this process's last write of the row
    written: float = 0.0


class RunJournal:
    """The run rows this process wrote within ``window_s`` seconds of its last
    write, oldest write first. Thread-safe (a thread pool runs tasks at once,
    the heartbeat thread reads it)."""

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self._entries: OrderedDict[SlotKey, _Entry] = OrderedDict()
        self._last = float("-inf")
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    def started(
        self, run: Run, owner: str, task_id: str, started_us: int, ttl_us: int, at: float
    ) -> None:
        self._write(
            SlotKey(run.entry, run.slot_us), _Entry(run, owner, task_id, started_us, ttl_us), at
        )

    def finished(self, run: Run, outcome: str, finished_us: int, at: float) -> None:
        with self._lock:
            entry = self._entries.get(SlotKey(run.entry, run.slot_us))
        if entry is None or entry.run != run:
            return
        entry.outcome, entry.finished_us = outcome, finished_us
        self._write(SlotKey(run.entry, run.slot_us), entry, at)

    def forget(self, run: Run) -> None:
        """The run was abandoned (its task retries): the slot may start again."""
        with self._lock:
            key = SlotKey(run.entry, run.slot_us)
            entry = self._entries.get(key)
            if entry is not None and entry.run == run:
                del self._entries[key]

    def active(self, now: float) -> bool:
        """True while the last write is within the window: a failover now could
        have lost something."""
        return now - self._last <= self.window_s and bool(self._entries)

    def recent(self, now_us: int) -> list[RunRecord]:
        """The rows to write again, a running one with its expiry renewed from
        ``now_us`` (database clock): it still runs here, its heartbeat keeps it."""
        with self._lock:
            self._trim()
            entries = list(self._entries.values())
        return [
            RunRecord(
                e.run,
                e.owner,
                e.task_id,
                e.started_us,
                now_us + e.ttl_us if e.outcome is None else e.started_us + e.ttl_us,
                e.outcome,
                e.finished_us,
            )
            for e in entries
        ]

    def _write(self, key: SlotKey, entry: _Entry, at: float) -> None:
        if self.window_s <= 0:
            return
        with self._lock:
            entry.written = at
            self._entries[key] = entry
            self._entries.move_to_end(key)
            self._last = max(self._last, at)
            self._trim()

    def _trim(self) -> None:
        # measured from the last write, not from now: a failover loses the
        # commits just before the old primary died, however long it took
        horizon = self._last - self.window_s
        while self._entries:
            key, entry = next(iter(self._entries.items()))
            if entry.written >= horizon:
                break
            del self._entries[key]


class WriteBack:
    """One worker process's journal and what it does after a broken connection."""

    def __init__(self, window_s: float, owner: str, telemetry: SingletonTelemetry) -> None:
        self.journal = RunJournal(window_s)
        self.owner = owner
        self.telemetry = telemetry
        self._seen: int | None = None
        self._hold_until = 0.0
        self._hold_before_us = 0
        self._lock = threading.Lock()

    def check(self, store: SingletonStore) -> None:
        """After a broken connection (``store.interruptions`` moved): write the
        journal again. Raises StoreUnavailable when the database cannot take it
        (the next call tries again)."""
        with self._lock:
            seen = store.interruptions
            if self._seen is None:
                # the first use in this process: nothing written yet
                self._seen = seen
                return
            if seen == self._seen:
                return
            records = self.journal.recent(store.clock.now_us())
            again = store.reassert_runs(records) if records else []
            self._seen = seen
            self._hold_until = time.monotonic() + HOLD_S
            self._hold_before_us = store.clock.now_us()
        if again:
            self.telemetry.lost_writes(len(again))
            first = again[0].run
            logger.error(
                "singlebeat: the database lost %d of the run rows worker %s wrote in the "
                "last %gs (first %s@%s): a failover to a standby that had not received "
                "them? Written again, so repeated deliveries of those slots are dropped",
                len(again),
                self.owner,
                self.journal.window_s,
                first.entry,
                slot_text(first.slot_us),
                extra=batch_fields(
                    decisions.LOST_WRITES,
                    self.owner,
                    len(again),
                    SlotKey(first.entry, first.slot_us),
                ),
            )

    def hold(self, slot_us: int) -> float:
        """Wait, when ``slot_us`` fell due before our last reconnect, until the
        other processes' write-backs have landed; returns the seconds waited."""
        wait = self._hold_until - time.monotonic()
        if wait <= 0 or slot_us > self._hold_before_us:
            return 0.0
        time.sleep(wait)
        return wait

    def ping(self, store: SingletonStore) -> bool:
        """The heartbeat's check while the journal is active: one round trip,
        then :meth:`check`. Returns whether to keep pinging."""
        if not self.journal.active(time.monotonic()):
            return False
        # ConnectionReplaced too: the counter moved, and check writes back;
        # an outage: the next ping tries again
        with contextlib.suppress(StoreUnavailable):
            store.ping()
        with contextlib.suppress(StoreUnavailable):
            self.check(store)
        return True
