"""The explorer's workers: SingletonTask's per-slot dedupe over the store.

A worker takes the broker's messages in order and, for each, makes the
decisions :class:`~celery_singlebeat.SingletonTask` makes through the
:class:`~celery_singlebeat.store.singleton_store.SingletonStore` contract:
``begin_slot`` (a slot's run row, then its key's lease); a repeat (the row
finished, or running and live) is dropped; a database it cannot reach puts
the message back for after the run's ttl (the task's retry); a run that
starts runs for a drawn time, then ``end_slot`` records its outcome (retried
through outages, as ``through_reconnect`` does). A worker that dies in the
middle of a run (the chaos run's seed 10: a Celery worker exiting after a
broker restart) leaves its run row running until its expiry; its message was
acknowledged on receipt and is gone.

Each run that reached its end is recorded as the chaos run's worker records
it (a ``start`` record: the slot, the task id, the process, the lease token,
when it started, the version in its kwargs), so the one judge reads both.
"""

from __future__ import annotations

import base64
import contextlib
import json
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ...exceptions import ConnectionReplaced, StoreUnavailable
from ...singleton.writeback import HOLD_S
from ...store.base import Busy, Lease, Run, RunRecord, RunStatus
from ...timeline.clock import US
from ...timeline.slots import SLOT_HEADER
from ..memory.state import MemoryState
from .links import Link

if TYPE_CHECKING:
    from .world import World

__all__ = ["Message", "Workers"]

#: singlebeat_failover_window's default: how long the journal keeps a run
WINDOW_US = 10 * US
#: a busy key's retry, as the chaos run's task has it (singletonapp.slot_probe:
#: singleton_retry_delay 0.2 s). At 1 s, the retries of a backlog of one
#: entry's slots fell each time inside the run of the slot due that second,
#: and never ran (seed 196): the task's configuration, not the scheduler's
BUSY_RETRY_US = US // 5


@dataclass
class Message:
    task_id: str
    task: str
    entry: str
    slot_us: int
    args: list[Any]
    kwargs: dict[str, Any]

    @classmethod
    def decode(cls, raw: dict[str, Any]) -> Message:
        headers = raw["headers"]
        body = raw["body"]
        if raw.get("properties", {}).get("body_encoding") == "base64":
            body = base64.b64decode(body)
        args, kwargs, _ = json.loads(body)
        slot = headers[SLOT_HEADER]
        return cls(headers["id"], headers["task"], slot["entry"], slot["at_us"], args, kwargs)


@dataclass
class _Worker:
    name: str
    link: Link
    generation: int = 1
    alive: bool = True
    #: the run in progress: (message, run, lease, started at)
    running: tuple[Message, Run, Lease, int] | None = None
    die_next: bool = False
    #: the write-back's journal (singleton/writeback.py): the run rows written
    #: lately, by slot, with when (the world's clock) each was last written
    journal: dict[tuple[str, int], tuple[RunRecord, int]] = field(default_factory=dict)
    seen: int = 0
    hold_until_us: int = 0
    hold_before_us: int = 0


class Workers:
    """``count`` workers of the world's queue (module docstring)."""

    def __init__(self, world: World, state: MemoryState, count: int, ttl_us: int, rng: Any) -> None:
        self.world = world
        self.state = state
        self.ttl_us = ttl_us
        self.rng = rng
        self.workers = [
            _Worker(f"worker-{i}", Link(world, f"worker-{i}", state)) for i in range(count)
        ]
        #: every run that reached its end, as the chaos run's records
        self.records: list[dict[str, Any]] = []
        #: runs a worker died in: (slot, task id, when)
        #: worker process (name#generation) -> when it died
        self.deaths: dict[str, int] = {}
        #: (slot, task id, death, start of the run) of each death mid-run
        self.died_in: list[tuple[tuple[str, int], str, int, int]] = []
        self.repeats = 0

    def arm_death(self) -> None:
        """The next run a worker starts, it dies in the middle of."""
        alive = [w for w in self.workers if w.alive]
        if alive:
            self.rng.choice(alive).die_next = True

    def write_back(self, worker: _Worker) -> bool:
        """After a broken connection, the journal's run rows written again
        (WriteBack.check, which the heartbeat's ping runs while the journal is
        active); False when the database cannot take them yet."""
        link = worker.link
        if link.interruptions == worker.seen:
            return True
        now = self.world.now_us
        last = max((at for _, at in worker.journal.values()), default=now)
        records = [r for r, at in worker.journal.values() if at >= last - WINDOW_US]
        try:
            if records:
                link.reassert_runs(records)
            else:
                link.ping()
        except (StoreUnavailable, ConnectionReplaced):
            return False
        worker.seen = link.interruptions
        worker.hold_until_us = now + int(HOLD_S * US)
        worker.hold_before_us = now
        return True

    def service(self) -> None:
        """Start what the free workers can take now."""
        world = self.world
        for worker in self.workers:
            if worker.alive and worker.journal:
                self.write_back(worker)
        for worker in self.workers:
            if world.broker_down or not world.queue:
                return
            if worker.alive and worker.running is None:
                self._take(worker, Message.decode(world.queue.pop(0)))

    def _take(self, worker: _Worker, message: Message) -> None:
        world = self.world
        run = Run(message.entry, message.slot_us, uuid.UUID(int=self.rng.getrandbits(128)).hex)
        key = f"{message.task}:{message.args!r}"
        owner = f"{worker.name}#{worker.generation}"
        if not self.write_back(worker):
            self._later(message, self.ttl_us + US)
            return
        if message.slot_us <= worker.hold_before_us and world.now_us < worker.hold_until_us:
            # fell due before our last reconnect: the others' write-backs first
            self._later(message, worker.hold_until_us - world.now_us)
            return
        for _ in range(3):
            try:
                begin, got = worker.link.begin_slot(run, key, owner, message.task_id, self.ttl_us)
            except ConnectionReplaced:
                continue
            except StoreUnavailable:
                with contextlib.suppress(StoreUnavailable):
                    worker.link.abandon_run(run, ran=False)
                # SingletonTask's retry: after the ttl, when a run row may be left
                self._later(message, self.ttl_us + US)
                return
            break
        else:
            self._later(message, self.ttl_us + US)
            return
        if begin.status is not RunStatus.STARTED:
            self.repeats += 1
            return
        if isinstance(got, Busy) or got is None:
            # the key is held (a run of this entry's key still in progress):
            # the run row is let go and the message retried (singleton_busy)
            with contextlib.suppress(StoreUnavailable):
                worker.link.abandon_run(run, ran=False)
            self._later(message, BUSY_RETRY_US)
            return
        started = world.now_us
        worker.running = (message, run, got, started)
        record = RunRecord(run, owner, message.task_id, started, started + self.ttl_us)
        worker.journal[(message.entry, message.slot_us)] = (record, started)
        duration = int(self.rng.uniform(0.01, 0.3) * US)
        if worker.die_next:
            worker.die_next = False
            generation = worker.generation
            world.at(started + duration // 2, lambda: self._die(worker, generation))
        else:
            generation = worker.generation
            world.at(started + duration, lambda: self._finish(worker, generation))

    def _later(self, message: Message, delay_us: int) -> None:
        raw = {"again": message}
        self.world.at(self.world.now_us + delay_us, lambda: self._requeue(raw))

    def _requeue(self, raw: dict[str, Any]) -> None:
        message: Message = raw["again"]
        free = [w for w in self.workers if w.alive and w.running is None]
        if free and not self.world.broker_down:
            self._take(free[0], message)
        else:
            self.world.at(self.world.now_us + US // 10, lambda: self._requeue(raw))

    def _die(self, worker: _Worker, generation: int) -> None:
        if worker.generation != generation or worker.running is None:
            return
        message, _, _, started = worker.running
        self.deaths[f"{worker.name}#{worker.generation}"] = self.world.now_us
        self.died_in.append(
            ((message.entry, message.slot_us), message.task_id, self.world.now_us, started)
        )
        worker.running = None
        worker.alive = False
        # the process is gone, and its memory with it: its restart writes
        # back nothing of this one's runs (their rows say what they say)
        worker.journal.clear()

        def restart() -> None:
            worker.generation += 1
            worker.alive = True

        self.world.at(self.world.now_us + US, restart)

    def _finish(self, worker: _Worker, generation: int) -> None:
        if worker.generation != generation or worker.running is None:
            return
        message, run, lease, started = worker.running
        worker.running = None
        self.records.append(
            {
                "event": "start",
                "task": message.task,
                "slot": [message.entry, message.slot_us],
                "task_id": message.task_id,
                "pid": f"{worker.name}#{worker.generation}",
                "token": lease.token,
                "at": started / US,
                "v": message.kwargs.get("v"),
                "finished": self.world.now_us / US,
            }
        )
        key = (message.entry, message.slot_us)
        entry = worker.journal.get(key)
        if entry is not None and entry[0].run == run:
            done = entry[0]._replace(outcome="success", finished_us=self.world.now_us)
            worker.journal[key] = (done, self.world.now_us)
        self._end(worker.link, run, lease, 0, self.records[-1])

    def _end(self, link: Link, run: Run, lease: Lease, tries: int, rec: dict[str, Any]) -> None:
        try:
            link.end_slot(run, "success", lease)
        except (StoreUnavailable, ConnectionReplaced):
            if tries < 60:
                self.world.at(
                    self.world.now_us + US // 2,
                    lambda: self._end(link, run, lease, tries + 1, rec),
                )
            return
        # when the finish reached the database (a failover after it may lose it)
        rec["finished"] = self.world.now_us / US
