"""The explorer's connections: each replica's and worker's own link to the one
in-memory database, and the broker every replica publishes to.

A :class:`Link` is a :class:`~celery_singlebeat.testing.MemoryStore` over the
world's shared :class:`~celery_singlebeat.testing.memory.state.MemoryState`,
so that, as in production, each process has a connection of its own: its own
estimate of the database's clock (a replica's skewed clock skews only its
estimate), its own breaks (a failover breaks every link; a lost answer, one)
and its own outage flag. Every round trip of a replica's link is two step
boundaries of the explorer (:meth:`World.point`): before the statement and
after its answer, where the scheduler may run another replica, stop this one
(SIGSTOP), kill it, or lose the answer of a statement that was applied.

The broker is kombu's in-memory transport with a private state whose channel
hands each message to the world instead of a queue: the world drops it while
the broker is down (a connection error, as a real transport raises), loses it
after accepting it when a fault says so, and otherwise queues it for the
workers. Nothing of Celery's publishing path is bypassed: the message is the
one ``apply_async`` built, with the slot header and task id the engine wrote.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Protocol

from kombu.transport import memory, virtual

from ...exceptions import StoreUnavailable
from ...store.base import Claim, SlotKey, Written
from ...timeline.clock import DatabaseClock
from ..memory import MemoryStore
from ..memory.state import MemoryState


class World(Protocol):
    """What a link and the broker ask of the world (:class:`.world.World`)."""

    now_us: int

    def clock(self) -> int: ...

    def point(self, link: Link, where: str) -> None: ...

    def answer_lost(self, link: Link, what: str) -> bool: ...

    def publish(self, queue: str, message: Any) -> None: ...

    def claimed(self, owner: str, won: list[Claim], revisions: Any, at_us: int) -> None: ...

    def taken(self, owner: str, taken: list[Claim], at_us: int) -> None: ...


__all__ = ["BROKER_ERROR", "Link", "SkewedClock", "transport_for"]

#: what kombu's memory transport counts as a connection error (the engine asks
#: the producer's connection which errors mean "the broker, not this message")
BROKER_ERROR: type[Exception] = memory.Transport.connection_errors[0]


class SkewedClock(DatabaseClock):
    """The database clock as one process estimates it, from a local clock
    ``skew_us`` off the world's (the database's) time; the skew may step."""

    def __init__(self, world: World, skew_us: int = 0) -> None:
        super().__init__()
        self._world = world
        self.skew_us = skew_us

    def local_us(self) -> int:
        return self._world.now_us + self.skew_us


class Link(MemoryStore):
    """One process's connection to the world's database (module docstring)."""

    def __init__(self, world: World, owner: str, state: MemoryState, skew_us: int = 0) -> None:
        self.world = world
        #: the replica (or worker) this link belongs to
        self.owner = owner
        self.skewed = SkewedClock(world, skew_us)
        super().__init__(world.clock, clock=self.skewed, state=state)
        # as the SQL store of a replica (scheduler.py's _open_store): after a
        # break, the first statement on the new connection is not sent
        self.stop_at_reconnect = True
        #: when the last statement ran (a stop after it returns later)
        self.ran_at_us = 0

    @contextmanager
    def round_trip(self, what: str, *, schema: bool = True) -> Iterator[int]:
        world = self.world
        world.point(self, "before " + what)
        with super().round_trip(what, schema=schema) as now:
            self.ran_at_us = world.now_us
            yield now
        if world.answer_lost(self, what):
            # applied, but the answer never came back: the connection broke
            # between the statement and its answer
            self.interruptions += 1
            self._broken = True
            raise StoreUnavailable(f"{what}: the connection broke before the answer came")
        world.point(self, "after " + what)

    def claim(
        self,
        owner: str,
        slots: Sequence[SlotKey],
        lease_us: int,
        revisions: Any = None,
    ) -> list[Claim]:
        won = super().claim(owner, slots, lease_us, revisions)
        self.world.claimed(owner, won, revisions, self.ran_at_us)
        return won

    def take_over(
        self, owner: str, lease_us: int, limit: int, *args: Any, **kwargs: Any
    ) -> list[Claim]:
        taken = super().take_over(owner, lease_us, limit, *args, **kwargs)
        self.world.taken(owner, taken, self.ran_at_us)
        return taken

    def written_of(self, entry: str) -> Written | None:
        """The write an entry's stored row names now (not a round trip)."""
        row = self.state.schedules.get(entry)
        return None if row is None else Written(row.revision, row.updated_us)


def transport_for(world: World) -> type[memory.Transport]:
    """A memory transport whose messages go to ``world`` (module docstring)."""

    class Channel(memory.Channel):  # type: ignore[misc]
        events: Any = {}
        queues: dict[str, Any] = {}

        def _put(self, queue: str, message: Any, **kwargs: Any) -> None:
            world.publish(queue, message)

    class Transport(memory.Transport):  # type: ignore[misc]
        global_state = virtual.BrokerState()  # type: ignore[no-untyped-call]

    Transport.Channel = Channel
    return Transport
