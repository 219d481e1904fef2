"""A fleet of beat replicas of your own Celery app, run offline on simulated time.

:class:`Fleet` runs N real :class:`~celery_singlebeat.SingleBeatScheduler`
replicas (as :class:`~celery_singlebeat.testing.MemoryScheduler`) of your app,
sharing one :class:`~celery_singlebeat.testing.MemoryStore` on a
:class:`~celery_singlebeat.testing.FakeClock`. Their messages go through
kombu's in-memory transport, to a broker private to the fleet, and are read
back from it after every tick: what the result holds is what reached the
broker, with the slot header and the task id the real scheduler wrote. No
schedule arithmetic happens here: which instants are due, what the missed-run
policy sends, who wins a slot and who takes it over are the scheduler's own
decisions.

:func:`simulate` answers "which runs does this ``beat_schedule`` send between
A and B with N replicas", with replicas stopped, killed and restarted or the
database down on the way (:class:`ReplicaStopped`, :class:`ReplicaKilled`,
:class:`DatabaseDown`). :func:`assert_runs` compares the answer with what you
expect and says which run is missing, doubled or unexpected.

Every replica of a fleet is given the fleet's clocks and random generator
(an :class:`~celery_singlebeat.engine.Environment`: its fake clock, a seeded
generator), so that sweeps, takeovers and prunes happen on simulated time and
every run gives the same answer. Nothing of the process is patched; one fleet
is open per process at a time all the same, since it switches the app's
``task_always_eager`` off while it runs.
"""

from __future__ import annotations

import heapq
import random
import threading
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta, timezone, tzinfo
from typing import Any, NamedTuple, Union

from kombu.connection import Connection
from kombu.simple import SimpleQueue
from kombu.transport import memory, virtual

from .. import signals
from ..engine import Environment
from ..timeline.clock import US, datetime_to_us, us_to_datetime
from ..timeline.slots import SLOT_HEADER
from .clock import DEFAULT_START, FakeClock
from .memory import MemoryStore
from .scheduler import FleetReplica

__all__ = [
    "DatabaseDown",
    "Fleet",
    "ReplicaKilled",
    "ReplicaStopped",
    "SentRun",
    "Simulation",
    "Skipped",
    "assert_runs",
    "simulate",
]

UTC = timezone.utc


class SentRun(NamedTuple):
    """One message that reached the broker: a run of an entry."""

    entry: str
    #: the slot's instant (aware, UTC): the run's scheduled time
    at: datetime
    #: when it was sent, on the fleet's clock (aware, UTC)
    sent_at: datetime
    #: the replica that sent it (``replica-1``; ``replica-1#2`` after a restart)
    replica: str
    task_id: str
    #: the task name and the message's routing key, as published
    task: str
    routing_key: str


class Skipped(NamedTuple):
    """Slots the missed-run policy dropped (the ``slots_skipped`` signal)."""

    entry: str
    #: how many slots were dropped
    slots: int
    first: datetime | None
    last: datetime | None
    replica: str


@dataclass(frozen=True)
class ReplicaStopped:
    """Replica ``replica`` (1-based) is frozen from ``start`` until ``end`` (a
    SIGSTOP and a SIGCONT, a stop-the-world pause): it keeps its state and
    ticks again at ``end``; ``None``: not before the simulation ends."""

    replica: int
    start: datetime
    end: datetime | None = None


@dataclass(frozen=True)
class ReplicaKilled:
    """Replica ``replica`` (1-based) is killed at ``at`` (SIGKILL: no goodbye,
    its claims are left to expire) and, at ``restart_at``, a new process takes
    its place (``replica-N#2``), as Kubernetes restarts a pod."""

    replica: int
    at: datetime
    restart_at: datetime | None = None


@dataclass(frozen=True)
class DatabaseDown:
    """Every statement fails from ``start`` until ``end`` (an outage)."""

    start: datetime
    end: datetime


Event = Union[ReplicaStopped, ReplicaKilled, DatabaseDown]


# -- the private broker ------------------------------------------------------------


def _private_transport() -> type[memory.Transport]:
    """kombu's memory transport with state of its own: the stock one is shared by
    every connection in the process, so a fleet would otherwise see (and steal)
    other tests' messages, and theirs its own."""

    class Channel(memory.Channel):  # type: ignore[misc]
        events: defaultdict[str, set[Any]] = defaultdict(set)
        queues: dict[str, Any] = {}

    class Transport(memory.Transport):  # type: ignore[misc]
        global_state = virtual.BrokerState()  # type: ignore[no-untyped-call]

    Transport.Channel = Channel
    return Transport


_open_fleet: list[Fleet] = []
_open_guard = threading.Lock()


# -- the replicas ------------------------------------------------------------------


class Fleet:
    """``replicas`` beat replicas of ``app``, on a fake clock and a memory store.

    ``start`` sets the clock (default: the clock's own time, or
    ``testing.clock.DEFAULT_START`` for a new clock). Move
    time with :meth:`run_until` (every replica ticks when it would wake, as
    ``celery beat`` does) or by hand with :meth:`advance` and :meth:`tick`.
    :attr:`sent` lists every run that reached the broker, in order.

    The app's broker and result backend are never contacted; its
    ``task_always_eager`` is turned off while the fleet is open (beat never
    runs tasks itself) and restored by :meth:`close`. Use it as a context
    manager, or call :meth:`close`.
    """

    def __init__(
        self,
        app: Any,
        replicas: int = 1,
        *,
        start: datetime | None = None,
        clock: FakeClock | None = None,
        store: MemoryStore | None = None,
        seed: int = 0,
    ) -> None:
        if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 1:
            raise ValueError(f"replicas={replicas!r}: expected an integer of at least 1")
        self.app = app
        self.clock = clock if clock is not None else FakeClock(start or DEFAULT_START)
        if start is not None:
            _aware("start", start)
            self.clock.set(start)
        #: the "database" the replicas share (``store.slot_rows()`` and more)
        self.store = store if store is not None else MemoryStore(now_us=self.clock)
        #: every run that reached the broker, in the order it did
        self.sent: list[SentRun] = []
        #: every drop the missed-run policy reported
        self.skipped: list[Skipped] = []
        self._seed = seed
        self._order = random.Random(seed)
        self._ticking: FleetReplica | None = None
        self._closed = False
        with _open_guard:
            if _open_fleet:
                raise RuntimeError(
                    "another celery_singlebeat.testing.simulation.Fleet is open in this process: "
                    "close it first (a fleet switches its app's task_always_eager off)"
                )
            _open_fleet.append(self)
        # every replica's clocks: the fleet's, and one seeded generator for all
        clock = self.clock
        self._env = Environment(
            monotonic=lambda: clock() / US,
            time=lambda: clock() / US,
            random=random.Random(seed),
        )
        self._eager = app.conf.task_always_eager
        app.conf.task_always_eager = False
        self._connection = Connection(transport=_private_transport())  # type: ignore[no-untyped-call]
        self._channel_cls: Any = self._connection.transport.Channel
        self._queues: dict[str, SimpleQueue] = {}
        signals.slots_skipped.connect(self._on_skipped, weak=False)
        #: the replicas by number (1-based); None while killed
        self.replicas: dict[int, FleetReplica | None] = {}
        self._restarts: Counter[int] = Counter()
        self._stopped: set[int] = set()
        self._wake: dict[int, int] = {}
        try:
            for number in range(1, replicas + 1):
                self._spawn(number)
        except BaseException:
            self.close()
            raise

    # -- replicas ------------------------------------------------------------

    def _spawn(self, number: int) -> FleetReplica:
        self._restarts[number] += 1
        name = f"replica-{number}"
        if self._restarts[number] > 1:
            name += f"#{self._restarts[number]}"
        replica = FleetReplica(
            self.app, store=self.store, connection=self._connection, name=name, env=self._env
        )
        self.replicas[number] = replica
        self._wake[number] = self.clock()
        return replica

    def _replica(self, number: int) -> FleetReplica | None:
        if number not in self.replicas:
            raise ValueError(f"replica {number}: this fleet has replicas 1 to {len(self.replicas)}")
        return self.replicas[number]

    def stop(self, number: int) -> None:
        """Freeze replica ``number`` (SIGSTOP): it does not tick until :meth:`resume`."""
        self._replica(number)
        self._stopped.add(number)

    def resume(self, number: int) -> None:
        """Let a frozen replica go on (SIGCONT): its sleep is over, it ticks now."""
        self._replica(number)
        self._stopped.discard(number)
        self._wake[number] = self.clock()

    def kill(self, number: int) -> None:
        """Kill replica ``number`` (SIGKILL): gone without marking itself stopped."""
        if self._replica(number) is not None:
            self.replicas[number] = None
            self._stopped.discard(number)

    def restart(self, number: int) -> None:
        """Start a new process in place of replica ``number`` (killing the old one)."""
        self.kill(number)
        self._spawn(number)

    def database_down(self) -> None:
        """Make every statement fail (as ``MemoryStore.outage``)."""
        self.store.available = False

    def database_up(self) -> None:
        self.store.available = True

    @property
    def running(self) -> list[int]:
        """Numbers of the replicas that are alive and not frozen."""
        return [n for n, r in self.replicas.items() if r is not None and n not in self._stopped]

    # -- time ---------------------------------------------------------------

    def now(self) -> datetime:
        """The fleet's clock (aware, UTC)."""
        return self.clock.now()

    def advance(self, delta: timedelta) -> datetime:
        """Move the clock without ticking anyone."""
        return self.clock.advance(delta)

    def tick(self) -> None:
        """Every running replica ticks once, now, in a (seeded) random order."""
        for number in self._order.sample(self.running, len(self.running)):
            self._tick(number)

    def _tick(self, number: int) -> None:
        replica = self.replicas[number]
        assert replica is not None
        self._ticking = replica
        try:
            delay = replica.tick()
        finally:
            self._ticking = None
        self._drain(replica)
        self._wake[number] = self.clock() + max(1, int(delay * US))

    def run_until(self, until: datetime, events: Sequence[Event] = ()) -> None:
        """Run to ``until``: each replica sleeps what its tick returns and ticks
        when it wakes, as under ``celery beat``; the clock jumps from one wake-up
        to the next. ``events`` happen at their instants on the way."""
        end_us = datetime_to_us(_aware("until", until))
        actions = _timeline(events)
        while True:
            now = self.clock()
            while actions and actions[0][0] <= now:
                _, _, act = heapq.heappop(actions)
                act(self)
            due = [n for n in self.running if self._wake[n] <= now]
            for number in self._order.sample(due, len(due)):
                self._tick(number)
            if now >= end_us:
                return
            wakes = [self._wake[n] for n in self.running]
            if actions:
                wakes.append(actions[0][0])
            self.clock.set(us_to_datetime(min([end_us, *wakes])))

    # -- the broker ----------------------------------------------------------

    def _drain(self, replica: FleetReplica) -> None:
        sent_at = self.now()
        for name in list(self._channel_cls.queues):
            queue = self._queues.get(name)
            if queue is None:
                queue = self._queues[name] = self._connection.SimpleQueue(  # type: ignore[no-untyped-call]
                    name, no_ack=True
                )
            while True:
                try:
                    message = queue.get(block=False)  # type: ignore[no-untyped-call]
                except queue.Empty:
                    break
                headers = message.headers
                slot = headers.get(SLOT_HEADER)
                if slot is None:  # not a run (nothing else publishes here)
                    continue
                self.sent.append(
                    SentRun(
                        slot["entry"],
                        us_to_datetime(slot["at_us"]),
                        sent_at,
                        replica.settings.replica_id,
                        headers["id"],
                        headers.get("task", ""),
                        message.delivery_info.get("routing_key") or name,
                    )
                )

    def _on_skipped(self, sender: Any = None, **kwargs: Any) -> None:
        replica = self._ticking
        if replica is None or sender is not replica:
            return  # another scheduler's, not this fleet's
        self.skipped.append(
            Skipped(
                kwargs["entry"],
                kwargs["count"],
                kwargs.get("first"),
                kwargs.get("last"),
                replica.settings.replica_id,
            )
        )

    def zones(self) -> dict[str, tzinfo]:
        """Each entry's time zone (its crontab's ``tz``, else the app's)."""
        for replica in self.replicas.values():
            if replica is not None:
                agenda = replica.engine.agenda
                return {name: agenda.tz_of(d) for name, d in replica.entries.items()}
        return {}

    # -- closing -------------------------------------------------------------

    def close(self) -> None:
        """Stop every replica gracefully and give the process its clock back."""
        if self._closed:
            return
        self._closed = True
        try:
            for replica in self.replicas.values():
                if replica is not None and self.store.available:
                    replica.close()
        finally:
            signals.slots_skipped.disconnect(self._on_skipped)
            for queue in self._queues.values():
                queue.close()  # type: ignore[no-untyped-call]
            self._connection.release()  # type: ignore[no-untyped-call]
            self.app.conf.task_always_eager = self._eager
            with _open_guard:
                if self in _open_fleet:
                    _open_fleet.remove(self)

    def __enter__(self) -> Fleet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _aware(name: str, value: datetime) -> datetime:
    if not isinstance(value, datetime) or value.utcoffset() is None:
        raise ValueError(
            f"{name}={value!r}: expected an aware datetime (a wall time in a zone: "
            "datetime(..., tzinfo=ZoneInfo('Europe/Berlin')))"
        )
    return value


def _timeline(events: Sequence[Event]) -> list[tuple[int, int, Any]]:
    """The events as a heap of (instant µs, order, action on the fleet)."""
    out: list[tuple[int, int, Any]] = []

    def add(at: datetime, act: Any) -> None:
        heapq.heappush(out, (datetime_to_us(_aware("event instant", at)), len(out), act))

    for event in events:
        if isinstance(event, ReplicaStopped):
            add(event.start, lambda f, n=event.replica: f.stop(n))
            if event.end is not None:
                add(event.end, lambda f, n=event.replica: f.resume(n))
        elif isinstance(event, ReplicaKilled):
            add(event.at, lambda f, n=event.replica: f.kill(n))
            if event.restart_at is not None:
                add(event.restart_at, lambda f, n=event.replica: f.restart(n))
        elif isinstance(event, DatabaseDown):
            add(event.start, Fleet.database_down)
            add(event.end, Fleet.database_up)
        else:
            raise TypeError(f"{event!r}: expected ReplicaStopped, ReplicaKilled or DatabaseDown")
    return out


# -- the answer --------------------------------------------------------------------


@dataclass(frozen=True)
class Simulation:
    """What :func:`simulate` found: the runs whose instant is in ``(start, end]``."""

    start: datetime
    end: datetime
    replicas: int
    #: each run sent, ordered by instant then entry (a doubled run appears twice)
    runs: tuple[SentRun, ...]
    #: what the missed-run policy dropped, as the replicas reported it
    skipped: tuple[Skipped, ...]
    #: each entry's time zone, for messages
    zones: Mapping[str, tzinfo]

    def of(self, entry: str) -> list[datetime]:
        """The instants of ``entry``'s runs, in order (repeats included)."""
        return [run.at for run in self.runs if run.entry == entry]

    def only(self, *entries: str) -> Simulation:
        """The same answer restricted to ``entries``, for a test about some of
        the schedule's entries."""
        wanted = set(entries)
        return replace(
            self,
            runs=tuple(r for r in self.runs if r.entry in wanted),
            skipped=tuple(s for s in self.skipped if s.entry in wanted),
        )

    def doubled(self) -> dict[tuple[str, datetime], list[SentRun]]:
        """Runs sent more than once, each with every time it was sent."""
        seen: dict[tuple[str, datetime], list[SentRun]] = defaultdict(list)
        for run in self.runs:
            seen[(run.entry, run.at)].append(run)
        return {key: sent for key, sent in seen.items() if len(sent) > 1}

    def describe(self, entry: str, at: datetime) -> str:
        """``entry @ local time (UTC time)``, in the entry's zone."""
        zone = self.zones.get(entry, UTC)
        local = at.astimezone(zone)
        text = f"{entry} @ {local:%Y-%m-%d %H:%M:%S} {local.tzname() or zone}"
        if local.utcoffset() != timedelta(0):
            text += f" ({at.astimezone(UTC):%Y-%m-%d %H:%M:%S} UTC)"
        return text


def simulate(
    app: Any,
    start: datetime,
    end: datetime,
    replicas: int = 1,
    *,
    events: Sequence[Event] = (),
    settle: timedelta | None = None,
    seed: int = 0,
    clock: FakeClock | None = None,
    store: MemoryStore | None = None,
) -> Simulation:
    """Run ``replicas`` replicas of ``app``'s beat from ``start`` to ``end``.

    Every replica starts at ``start`` (interval entries are anchored there:
    their first run is one period later) and runs as ``celery beat`` would,
    ``events`` happening on the way. The clock runs on ``settle`` past ``end``
    (default: twice the lease) so that a run due at ``end``, or held by a
    replica killed just before, has had its chance to be sent. Returns the runs
    whose instant is in ``(start, end]``. ``clock`` and ``store``: the ones to
    use (the ``singlebeat_clock`` and ``singlebeat_store`` fixtures), e.g. to
    look at the slot rows afterwards.
    """
    _aware("start", start)
    _aware("end", end)
    if end <= start:
        raise ValueError(f"end={end.isoformat()} is not after start={start.isoformat()}")
    with Fleet(app, replicas, start=start, clock=clock, store=store, seed=seed) as fleet:
        first = next(r for r in fleet.replicas.values() if r is not None)
        if settle is None:
            settle = 2 * first.settings.lease
        fleet.run_until(end + settle, events)
        zones = fleet.zones()
        sent, skipped = list(fleet.sent), list(fleet.skipped)
    runs = sorted((r for r in sent if start < r.at <= end), key=lambda r: (r.at, r.entry))
    return Simulation(start, end, replicas, tuple(runs), tuple(skipped), zones)


Expected = Union[Mapping[str, Iterable[datetime]], Iterable[tuple[str, datetime]]]


def _expected_pairs(expected: Expected) -> Iterator[tuple[str, datetime]]:
    if isinstance(expected, Mapping):
        for entry, instants in expected.items():
            if isinstance(instants, datetime):
                raise TypeError(f"expected[{entry!r}]: a list of datetimes, not one datetime")
            for at in instants:
                yield entry, at
    else:
        yield from expected


def assert_runs(result: Simulation, expected: Expected) -> None:
    """Assert that ``result`` holds exactly the ``expected`` runs, each once.

    ``expected``: ``{entry: [instant, ...]}`` or ``[(entry, instant), ...]``,
    aware datetimes in any zone. Every entry of the result is compared; use
    :meth:`Simulation.only` to look at some. The failure message lists each
    run missing, sent twice (by whom, when) or not expected.
    """
    want: set[tuple[str, datetime]] = set()
    for entry, at in _expected_pairs(expected):
        want.add((entry, _aware(f"expected run of {entry!r}", at).astimezone(UTC)))
    counts = Counter((run.entry, run.at) for run in result.runs)
    missing = sorted(want - set(counts), key=lambda k: (k[1], k[0]))
    unexpected = sorted(set(counts) - want, key=lambda k: (k[1], k[0]))
    doubled = result.doubled()
    if not (missing or unexpected or doubled):
        return
    lines = [
        f"runs sent between {result.start.isoformat()} and {result.end.isoformat()} "
        f"by {result.replicas} replica(s) differ from the expected: "
        f"{len(missing)} missing, {len(doubled)} doubled, {len(unexpected)} unexpected"
    ]
    lines += [f"  missing    {result.describe(e, at)}" for e, at in missing]
    for (entry, at), sent in sorted(doubled.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        who = ", ".join(f"by {r.replica} at {r.sent_at:%H:%M:%S.%f} UTC" for r in sent)
        lines.append(f"  doubled    {result.describe(entry, at)}: sent {len(sent)} times ({who})")
    lines += [f"  unexpected {result.describe(e, at)}" for e, at in unexpected]
    if result.skipped:
        lines.append("  (the missed-run policy dropped: ")
        lines[-1] += "; ".join(
            f"{s.entry} x{s.slots} {s.first:%Y-%m-%d %H:%M:%S}..{s.last:%H:%M:%S} UTC"
            if s.first and s.last
            else f"{s.entry} x{s.slots}"
            for s in result.skipped
        )
        lines[-1] += ")"
    raise AssertionError("\n".join(lines))
