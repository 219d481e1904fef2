"""What every storage contract shares: a store's connection to its database.

Each audience's contract (:mod:`.slot_store`, :mod:`.fleet_store`,
:mod:`.singleton_store`) extends :class:`StoreConnection`: whoever holds a
store, beat or a worker, checks the schema first, reads the database's clock
the round trips taught it, hears of every round trip, learns when the
connection broke (after which the server answering may be a promoted standby
that lacks the last commits) and closes the store at the end.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable

from ..timeline.clock import DatabaseClock


class StoreConnection(ABC):
    """The schema, the clock and the connection of a store, for every audience.

    Methods raise :class:`~celery_singlebeat.exceptions.StoreUnavailable` when the
    database cannot take the decision; they never return a partial answer.
    """

    #: the database's clock, updated by every successful round trip.
    clock: DatabaseClock

    #: called with (seconds, ok) after each statement, from the thread that ran
    #: it (the scheduler's metrics and readiness); None: nobody listens
    on_round_trip: Callable[[float, bool], None] | None = None

    #: how many times a round trip found its connection broken (dead pooled
    #: connection, refused or silent server, session ended). After one, the
    #: database answering may be another server (a promoted standby behind a
    #: moved address) that lacks the last commits this process saw: the
    #: scheduler then calls :meth:`.SlotStore.reassert` before it proposes
    #: anything old, and a worker :meth:`.SingletonStore.reassert_runs` before
    #: it starts a slot.
    interruptions: int = 0

    #: What a round trip does when it finds its connection broken and connects
    #: again. False (the default): it sends its statement on the new connection
    #: (each statement decides alone, so sending it again is what every contract
    #: allows). True: it raises
    #: :class:`~celery_singlebeat.exceptions.ConnectionReplaced` without sending
    #: anything, and the next call runs on the new connection: the caller first
    #: writes back what it sent (:meth:`.SlotStore.reassert`,
    #: :meth:`.SingletonStore.reassert_runs`), so that the statement cannot win
    #: on a lagging standby what it lost there. Either way
    #: :attr:`interruptions` counts the break. Set by the scheduler, and by
    #: SingletonTask's runtime when its failover window is on, on the stores
    #: they open; a refused connection is an outage
    #: (:class:`~celery_singlebeat.exceptions.StoreUnavailable`) whatever it says.
    stop_at_reconnect: bool = False

    @abstractmethod
    def prepare(self, create: bool) -> None:
        """Check the schema, creating it first when ``create`` is true.

        Safe to run from many processes at the same instant on an empty
        database. Raises :class:`~celery_singlebeat.exceptions.SchemaError` when
        the schema is missing (and ``create`` is false) or newer than supported.
        """

    @abstractmethod
    def ping(self) -> int:
        """One round trip that only reads the database's clock; returns it."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections. The store may not be used afterwards."""
