"""The explorer's world: real replicas on simulated time, one step at a time.

Each replica is the real Celery adapter and engine
(:class:`~celery_singlebeat.testing.MemoryScheduler`: its sources, steps,
outage backoff and failover hold), with its own :class:`.links.Link` to the
one in-memory database and its own clocks. Each runs in a thread of its own,
but only one thread runs at any moment: the world hands a baton to one
replica, which runs until its next step boundary (a statement sent, its
answer back, a message handed to the broker) and hands it back. At each
boundary a seeded generator decides whether the replica goes on, another
runs first (at the same instant: the statements of two replicas in every
order), or a fault strikes. Time moves only between steps, from one event to
the next, so a run is a function of its seed and fault plan: replayed, it
gives the same history, statement for statement.

A killed replica's thread is unwound by :class:`Killed` (a ``BaseException``
the engine cannot swallow) at its next boundary; a stopped one (SIGSTOP)
simply is not handed the baton until it resumes, mid-tick if that is where
it stopped.
"""

from __future__ import annotations

import heapq
import random
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ...engine import Environment
from ...store.base import Claim, Written
from ...timeline.clock import US
from ..memory.state import MemoryState
from ..scheduler import FleetReplica
from .links import BROKER_ERROR, Link

__all__ = ["Killed", "Node", "World"]


class Killed(BaseException):
    """The replica's process was killed (SIGKILL): unwinds its thread."""


@dataclass
class Node:
    """One replica process as the world runs it."""

    number: int
    name: str
    link: Link
    scheduler: Any = None
    thread: threading.Thread | None = None
    go: threading.Semaphore = field(default_factory=lambda: threading.Semaphore(0))
    #: idle (sleeping until ``wake_us``), suspended (mid-tick, runnable),
    #: stopped (SIGSTOP until ``until_us``), dead
    state: str = "idle"
    mid_tick: bool = False
    wake_us: int = 0
    until_us: int = 0
    killed: bool = False
    #: a stop armed for the next boundary whose name starts with ``arm[0]``
    arm: tuple[str, int] | None = None
    monotonic_offset: float = 0.0


class World:
    """The database, the broker, the clock and the baton (module docstring)."""

    def __init__(self, seed: int, start_us: int, switch: float = 0.2) -> None:
        self.rng = random.Random(f"{seed}-interleave")
        self.now_us = start_us
        self.state = MemoryState()
        self.switch = switch
        self.nodes: dict[int, Node] = {}
        self._back = threading.Semaphore(0)
        self._local = threading.local()
        self._events: list[tuple[int, int, Callable[[], None]]] = []
        self._seq = 0
        #: what the scheduler decided at each boundary, for a replay's check
        self.trace: list[str] = []
        self.trace_on = False
        self.broker_down = False
        #: publishes to lose after the broker took them (counted down)
        self.lose_next_publish = 0
        self.queue: list[Any] = []
        self.broker_lost: set[str] = set()
        #: every claim and takeover a replica won: (claimed at, entry, slot, fence, by)
        self.claims: list[tuple[int, str, int, int, str]] = []
        #: the write each claim named, per (entry, slot, fence)
        self.claim_revisions: dict[tuple[str, int, int], Written | None] = {}
        #: (link owner, statement) whose answer the next round trip loses
        self.lose_answer: tuple[str, str] | None = None
        self.errors: list[str] = []

    # -- the clock ---------------------------------------------------------------

    def clock(self) -> int:
        return self.now_us

    def at(self, at_us: int, action: Callable[[], None]) -> None:
        self._seq += 1
        heapq.heappush(self._events, (at_us, self._seq, action))

    def next_event_us(self) -> int | None:
        return self._events[0][0] if self._events else None

    def fire_due(self) -> None:
        while self._events and self._events[0][0] <= self.now_us:
            _, _, action = heapq.heappop(self._events)
            action()

    # -- replicas ------------------------------------------------------------------

    def spawn(self, node: Node, app: Any, connection: Any, env: Environment) -> None:
        node.scheduler = FleetReplica(
            app, store=node.link, connection=connection, name=node.name, env=env
        )
        node.wake_us = self.now_us
        node.state = "idle"
        thread = threading.Thread(target=self._main, args=(node,), name=node.name, daemon=True)
        node.thread = thread
        thread.start()

    def _main(self, node: Node) -> None:
        self._local.node = node
        node.go.acquire()
        while not node.killed:
            node.mid_tick = True
            try:
                delay = node.scheduler.tick()
            except Killed:
                break
            except BaseException as exc:  # a crash of the engine is a finding
                self.errors.append(f"{node.name} raised {type(exc).__name__}: {exc}")
                node.killed = True
                break
            node.mid_tick = False
            node.wake_us = self.now_us + max(1, int(delay * US))
            node.state = "idle"
            self._back.release()
            node.go.acquire()
        node.mid_tick = False
        node.state = "dead"
        self._back.release()

    def run(self, node: Node) -> None:
        """Hand the baton to ``node`` until its next boundary (or tick's end)."""
        if self.trace_on:
            self.trace.append(f"{self.now_us} run {node.name}")
        node.state = "running"
        node.go.release()
        self._back.acquire()

    def point(self, link: Link, where: str) -> None:
        """A step boundary in a replica's thread (links.py); elsewhere nothing."""
        node: Node | None = getattr(self._local, "node", None)
        if node is None or (node.link is not link and where != "publish"):
            return
        if node.killed:
            raise Killed
        arm = node.arm
        if arm is not None and where.startswith(arm[0]):
            node.arm = None
            node.state = "stopped"
            node.until_us = self.now_us + arm[1]
            self._hand_back(node)
        elif self.rng.random() < self.switch:
            node.state = "suspended"
            self._hand_back(node)

    def _hand_back(self, node: Node) -> None:
        self._back.release()
        node.go.acquire()
        if node.killed:
            raise Killed

    def current(self) -> Node | None:
        node: Node | None = getattr(self._local, "node", None)
        return node

    def kill(self, node: Node) -> None:
        """SIGKILL: the thread unwinds at once; its rows stay as they are."""
        if node.state == "dead":
            return
        node.killed = True
        self.run(node)
        assert node.state == "dead"

    def close(self) -> None:
        for node in self.nodes.values():
            if node.state != "dead":
                self.kill(node)

    # -- faults the links and the broker ask about -------------------------------

    def answer_lost(self, link: Link, what: str) -> bool:
        lose = self.lose_answer
        if lose is not None and lose[0] == link.owner and what.startswith(lose[1]):
            self.lose_answer = None
            return True
        return False

    def publish(self, queue: str, message: Any) -> None:
        node = self.current()
        if node is not None:
            self.point(node.link, "publish")
        if self.broker_down:
            raise BROKER_ERROR("the broker is down")
        if self.lose_next_publish > 0:
            self.lose_next_publish -= 1
            self.broker_lost.add(message["headers"]["id"])
            return
        self.queue.append(message)

    def claimed(self, owner: str, won: list[Claim], revisions: Any, at_us: int) -> None:
        """Claims won by a statement that ran at ``at_us`` (a stop right after
        it returns them later: the claim is the statement's)."""
        for c in won:
            self.claims.append((at_us, c.entry, c.slot_us, c.fence, owner))
            self.claim_revisions[(c.entry, c.slot_us, c.fence)] = (
                revisions.get(c.entry) if revisions else None
            )

    def taken(self, owner: str, taken: list[Claim], at_us: int) -> None:
        for c in taken:
            self.claims.append((at_us, c.entry, c.slot_us, c.fence, owner))
