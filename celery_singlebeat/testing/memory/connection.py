"""The memory store's connection: the round trip every operation of every part goes through.

:class:`MemoryConnection` is the memory form of
:class:`~celery_singlebeat.store.connection.StoreConnection`: the schema
check, the database's clock, the round trip hook, and the faults a test
injects (an outage, a connection broken by a failover). Each operation of a
part (:mod:`.slots`, :mod:`.fleet`, :mod:`.singletons`, :mod:`.schedules`,
:mod:`.operator`) is one :meth:`MemoryConnection.round_trip`: the state's
one lock held for the whole decision, so replicas sharing the store see the
atomicity a database gives.

:class:`~.store.MemoryStore` is a ``MemoryConnection`` rather than holding
one, so that the attributes a test or the scheduler sets on the store
(``available``, ``schema_version``, ``stop_at_reconnect``, ``on_round_trip``)
stay plain attributes of it; composed, each would need a forwarding property.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from ...exceptions import ConnectionReplaced, SchemaError, StoreUnavailable
from ...store.base import StalledRuns, StoreConnection
from ...store.sql.schema import SCHEMA_VERSION
from ...timeline.clock import DatabaseClock
from ..clock import wall_us
from .state import MemoryState

__all__ = ["MemoryConnection"]


class _FollowingClock(DatabaseClock):
    """A DatabaseClock whose "local wall clock" is the store's own time source,
    so between round trips the scheduler sees exactly the time the test set."""

    def __init__(self, source: Callable[[], int]) -> None:
        super().__init__()
        self._source = source

    def local_us(self) -> int:
        return self._source()


class MemoryConnection(StoreConnection):
    """The schema, the clock and the faults of the memory store; see :class:`~.store.MemoryStore`.

    ``now_us`` is the "database" clock (default: this host's); ``clock`` the
    :class:`~celery_singlebeat.timeline.clock.DatabaseClock` kept in sync
    (default: one that follows ``now_us`` exactly). ``state``: the "database"
    of another connection, so that several connections (each with its own
    clock estimate, breaks and faults, as each replica has its own) share one
    database; by default a new, empty one.
    """

    def __init__(
        self,
        now_us: Callable[[], int] | None = None,
        *,
        clock: DatabaseClock | None = None,
        state: MemoryState | None = None,
    ) -> None:
        self._now_us: Callable[[], int] = now_us or wall_us
        self.clock = clock if clock is not None else _FollowingClock(self._now_us)
        #: what the "database" holds: every table, under one lock
        self.state = state if state is not None else MemoryState()
        #: claimed-but-unsent rows, as the last heartbeat counted them
        self.open_claims: int | None = None
        #: the highest schedule revision the last feed read or heartbeat saw
        #: (:attr:`.ScheduleStore.schedule_revision`)
        self.schedule_revision: int | None = None
        #: False simulates an outage: every operation raises StoreUnavailable.
        self.available = True
        #: operations that reached the "database" (one round trip each).
        self.round_trips = 0
        #: operations refused while unavailable, and lose_writes() calls
        self.interruptions = 0
        #: True: the round trip after :meth:`~.store.MemoryStore.lose_writes`
        #: raises ConnectionReplaced and does nothing, as the SQL store's does
        #: on the connection that replaced a broken one
        #: (:attr:`.StoreConnection.stop_at_reconnect`)
        self.stop_at_reconnect = False
        #: lose_writes() broke the connection; the next round trip finds it so
        self._broken = False

    @property
    def controls_version(self) -> int | None:
        """The control version (:attr:`.FleetStore.controls_version`): here the
        "database's" counter itself, which the operator's controls raise."""
        return self.state.controls_version

    @controls_version.setter
    def controls_version(self, value: int | None) -> None:
        self.state.controls_version = value

    @property
    def schema_version(self) -> int | None:
        """The schema version "in the database"; None until prepare(create=True).
        Set it above the supported version to test the upgrade refusal."""
        return self.state.schema_version

    @schema_version.setter
    def schema_version(self, value: int | None) -> None:
        self.state.schema_version = value

    @contextmanager
    def outage(self) -> Iterator[None]:
        """Make the store unavailable inside the ``with`` block."""
        self.available = False
        try:
            yield
        finally:
            self.available = True

    def break_connection(self) -> None:
        """Break the connection once, as a failover does: counted in
        :attr:`interruptions` now, found by the next round trip. The caller
        holds the state's lock."""
        self.interruptions += 1
        self._broken = True

    @contextmanager
    def round_trip(self, what: str, *, schema: bool = True) -> Iterator[int]:
        """Hold the lock for one atomic decision and yield the store's ``now``.

        Raises :class:`~celery_singlebeat.exceptions.StoreUnavailable` while
        the store is unavailable or (unless ``schema`` is false) has no
        schema, and :class:`~celery_singlebeat.exceptions.ConnectionReplaced`
        at the first round trip after a break when :attr:`stop_at_reconnect`
        is set; ``what`` names the operation in their messages."""
        hook = self.on_round_trip
        with self.state.lock:
            if not self.available or (schema and self.schema_version is None):
                if hook is not None:
                    hook(0.0, False)
                if not self.available:
                    self.interruptions += 1
                    raise StoreUnavailable(f"{what} failed: the memory store is unavailable")
                # what a SQL database answers for a missing table
                raise StoreUnavailable(f"{what} failed: no schema (call prepare first)")
            if self._broken:
                # connected again (lose_writes counted the break); the SQL
                # store's executor sends nothing on the new connection when asked
                self._broken = False
                if self.stop_at_reconnect:
                    if hook is not None:
                        hook(0.0, False)
                    raise ConnectionReplaced(
                        f"{what}: the connection to the database broke; reconnected"
                    )
            self.round_trips += 1
            now = self._now_us()
            local = self.clock.local_us()
            self.clock.observe(now, local, local)
            yield now
        if hook is not None:
            # as the SQL store reports it: once the answer is in (no time passes here)
            hook(0.0, True)

    def prepare(self, create: bool) -> None:
        """See :meth:`.StoreConnection.prepare`; ``create`` sets :attr:`schema_version`."""
        with self.round_trip("schema check", schema=False):
            if self.schema_version is None:
                if not create:
                    raise SchemaError(
                        "tables missing (memory store) and singlebeat_create_schema is False: "
                        "create them with `celery -A proj singlebeat create-schema` "
                        "(or celery_singlebeat.create_schema(app)) using a privileged user"
                    )
                self.schema_version = SCHEMA_VERSION
            if self.schema_version > SCHEMA_VERSION:
                raise SchemaError(
                    f"the database schema is version {self.schema_version}, newer than this "
                    f"celery-singlebeat understands ({SCHEMA_VERSION}): upgrade the package "
                    "on every replica"
                )

    def ping(self) -> int:
        """See :meth:`.StoreConnection.ping`."""
        with self.round_trip("ping", schema=False) as now:
            return now

    def close(self) -> None:
        """Nothing to release; the data stays, for other replicas sharing the store."""

    #: :attr:`.SlotStore.stalled_runs`, which the slots' takeover and the
    #: fleet's heartbeat read (the store is this connection); a test or a
    #: scheduler sets it on the store like the SQL store's ``stalled_runs=``
    stalled_runs: StalledRuns = StalledRuns()
