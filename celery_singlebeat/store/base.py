"""The storage boundary: the few atomic operations the scheduler needs.

Every method is one atomic decision taken by the database (a constant number
of round trips, whatever the number of slots), and every instant is in
microseconds since the Unix epoch, UTC, **on the database's clock**: stores
learn that clock from each round trip into :attr:`Store.clock`.

Vocabulary, used by every contract below:

* a **slot row** exists once a slot has been claimed; its key is
  ``(entry, slot_us)`` and it is unique, so at most one replica holds a slot;
* a row is **claimed** (``state = 0``) while its owner publishes the task, and
  **sent** (``state = 1``) once the owner confirmed the publish;
* a claim's **lease** ends at ``lease_until_us``; a claimed row whose lease has
  ended is **abandoned** and may be taken over;
* the **fence** of a row starts at 1 and grows by one each time the row changes
  hands, so an owner can prove it still holds the claim it won;
* an entry's **high-water mark** is the latest slot that may have been deleted
  by :meth:`Store.prune`; a slot at or below it is never won, so a deleted row
  can never be won a second time, whatever a lagging replica proposes.

Workers (:class:`~celery_singlebeat.SingletonTask`) use two more kinds of row:

* a **lease** on a singleton key (a string naming what may run once at a
  time) is held until ``expires_us``; its **token** grows every time the lease
  changes hands, never otherwise, and is never smaller than the database's
  time of the hand-over, so it keeps growing even after an idle lease row was
  pruned. A lease whose ``expires_us`` has passed is **free**; a released
  lease is free at once;
* a **run** row records the execution of one slot (``entry``, ``slot_us``) by
  a worker: **running** (``finished`` false) until ``expires_us``, which the
  worker renews while it runs, then **finished**. Each start of a run has its
  own ``run_id``, so a worker can only finish or renew the start it made.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from enum import Enum
from typing import NamedTuple

from .. import timing
from ..clock import DatabaseClock

#: How far ahead of the database's clock a slot may be claimed. Replicas
#: estimate that clock to within half a round trip; this absorbs the estimate's
#: error while refusing a replica whose clock stepped forward.
EARLY_TOLERANCE_US = 250_000


class SlotKey(NamedTuple):
    """One run of one entry: the entry's name and the slot instant."""

    entry: str
    slot_us: int


class Claim(NamedTuple):
    """A slot this replica holds; ``fence`` proves which hand-over it won."""

    entry: str
    slot_us: int
    fence: int

    @property
    def key(self) -> SlotKey:
        return SlotKey(self.entry, self.slot_us)

    @property
    def taken_over(self) -> bool:
        """True when the row changed hands before this claim (``fence > 1``).

        That is a takeover from another replica (it died, stalled or released
        the slot), or the same owner winning its own claim again: a retry after
        the answer to its claim was lost, or a slot it had released. Stores do
        not record previous owners, so this cannot tell the two apart; the
        scheduler does, from the claims it knows it may still hold.
        """
        return self.fence > 1


class EntryState(NamedTuple):
    """What the database knows about an entry."""

    name: str
    #: instant the entry was first registered: interval slots count from here.
    anchor_us: int
    #: latest slot any replica claimed (None: never run).
    last_slot_us: int | None


class ReplicaInfo(NamedTuple):
    """What a replica records about itself with each heartbeat."""

    id: str
    host: str
    pid: int
    #: the celery-singlebeat release it runs
    version: str
    #: when the process started (database clock)
    started_us: int
    #: its estimate of the database clock at its last loop
    loop_us: int
    #: how far its own clock runs from the database's (database minus local)
    offset_us: int
    #: entries it tracks, and how many of those it proposes first (sharing.py)
    tracked: int
    proposes_first: int
    #: how often it sends a heartbeat (its sweep period)
    heartbeat_us: int
    #: slots it had sent that the database lacked after a broken connection
    #: (a failover lost them), written again; since the process started
    lost_writes: int = 0


class CatalogEntry(NamedTuple):
    """One entry as a replica has it (see :mod:`celery_singlebeat.catalog`)."""

    entry: str
    task: str
    #: the schedule as a person reads it
    schedule: str
    #: JSON from which a reader rebuilds the slot sequence
    spec: str


class Pause(NamedTuple):
    """A paused entry (``"*"``: every entry), and who paused it, when and why."""

    entry: str
    #: the pause ends by itself at this instant (None: until resumed)
    until_us: int | None
    by: str
    reason: str
    at_us: int


#: the ``entry`` of a pause of every entry
PAUSE_ALL = "*"

#: a replica is live while its row is not stopped and was seen within
#: LIVE_HEARTBEATS heartbeat periods plus LIVE_SLACK_US (timing.py, which the
#: health probes' readiness bound shares; the rule: membership.replica_live)
LIVE_HEARTBEATS = timing.LIVE_HEARTBEATS
LIVE_SLACK_US = timing.LIVE_SLACK_US

#: the meta row whose value every control change raises by one
CONTROLS_KEY = "controls"


def controls_channel(prefix: str) -> str:
    """The PostgreSQL NOTIFY channel of a control change, for a table prefix."""
    return f"{prefix}controls"


class Lease(NamedTuple):
    """A singleton key this process holds, and the proof of which hand-over it won."""

    key: str
    token: int
    #: the lease's end on the database's clock (renewals move it).
    expires_us: int


class Busy(NamedTuple):
    """Who holds a key that could not be acquired (for logs and errors)."""

    owner: str
    expires_us: int


class RunStatus(Enum):
    """What :meth:`Store.begin_run` found for a slot."""

    #: this worker starts the slot's execution (first delivery, or a retake).
    STARTED = "started"
    #: the slot already ran to the end: this delivery is a repeat.
    FINISHED = "finished"
    #: another worker is running the slot right now (its row is live).
    RUNNING = "running"


class Run(NamedTuple):
    """One start of one slot's execution, as :meth:`Store.begin_run` made it."""

    entry: str
    slot_us: int
    run_id: str


class RunBegin(NamedTuple):
    """The answer of :meth:`Store.begin_run`."""

    status: RunStatus
    #: the worker that holds (or last held) the run row.
    owner: str
    #: the outcome recorded when the run finished (``None`` while running).
    outcome: str | None


class RunRecord(NamedTuple):
    """What a worker process wrote about one run, as :meth:`Store.reassert_runs`
    writes it again: the run row as ``begin_run`` made it and, once the run
    finished, as ``finish_run`` left it."""

    run: Run
    owner: str
    task_id: str
    #: database clock of the start, and the row's expiry as last written
    started_us: int
    expires_us: int
    #: ``None`` while it runs (or when it was abandoned for a retry)
    outcome: str | None = None
    finished_us: int | None = None


class Store(ABC):
    """Shared state of all replicas. Implementations: SQL (``store.sql``) and
    in-memory (``celery_singlebeat.testing``); both pass the same contract suite.

    Methods raise :class:`~celery_singlebeat.exceptions.StoreUnavailable` when the
    database cannot take the decision; they never return a partial answer.
    """

    #: the database's clock, updated by every successful round trip.
    clock: DatabaseClock

    #: called with (seconds, ok) after each statement, from the thread that ran
    #: it (the scheduler's metrics and readiness); None: nobody listens
    on_round_trip: Callable[[float, bool], None] | None = None

    @abstractmethod
    def prepare(self, create: bool) -> None:
        """Check the schema, creating it first when ``create`` is true.

        Safe to run from many processes at the same instant on an empty
        database. Raises :class:`~celery_singlebeat.exceptions.SchemaError` when
        the schema is missing (and ``create`` is false) or newer than supported.
        """

    @abstractmethod
    def register(self, names: Sequence[str], owner: str = "") -> dict[str, EntryState]:
        """Make sure every entry has a row and return the state of each.

        ``owner`` (the replica id) is recorded on the rows it creates, so an
        operator can tell which replica first saw an entry.

        A new entry gets ``anchor_us`` = the database's current time; an existing
        entry keeps its anchor (so restarts never reset interval countdowns).
        ``last_slot_us`` is the maximum of the high-water mark and every
        existing slot row of the entry.
        """

    @abstractmethod
    def claim(self, owner: str, slots: Sequence[SlotKey], lease_us: int) -> list[Claim]:
        """Atomically claim the given slots for ``owner``; return those won.

        A slot is won when either (a) it has no row and it is newer than its
        entry's high-water mark (a row is inserted: claimed, fence 1); or (b) its
        row is abandoned (the row passes to ``owner`` and its fence grows); or (c)
        it is claimed by ``owner`` itself and not yet sent (its fence grows): a
        claim whose answer was lost with the connection is won again by its
        owner's retry instead of waiting for its lease to run out.
        Rows that are sent, or claimed with a live lease, are not touched, and
        neither is a slot of an entry paused now (:meth:`pauses`). Every
        won row gets ``lease_until_us = now + lease_us``. Duplicates in ``slots``
        count once; slots of unregistered entries are never won, and neither is
        a slot more than :data:`EARLY_TOLERANCE_US` after the database's now (a
        replica whose clock estimate runs ahead must not send early: it proposes
        such a slot again when it is due). Rows are locked in
        ``(entry, slot_us)`` order so concurrent claims cannot deadlock.
        """

    @abstractmethod
    def confirm(self, owner: str, claims: Sequence[Claim]) -> list[Claim]:
        """Mark claims as sent; return those that were still ours.

        Only rows with this ``owner``, the same fence and ``state = 0`` change;
        a claim missing from the result was taken over (its lease ran out
        before we confirmed), and the taker publishes it again with the same
        task id. A claim this owner already confirmed is returned again, so a
        confirm retried after its answer was lost reports it as ours.
        Duplicates in ``claims`` count once.
        """

    #: how many times a round trip found its connection broken (dead pooled
    #: connection, refused or silent server, session ended). After one, the
    #: database answering may be another server (a promoted standby behind a
    #: moved address) that lacks the last commits this process saw: the
    #: scheduler then calls :meth:`reassert` before it proposes anything old.
    interruptions: int = 0

    def reassert(self, owner: str, sent: Sequence[Claim]) -> list[Claim]:
        """Write again that ``owner`` sent ``sent``; return those written.

        For each claim: a missing row is inserted as sent by ``owner`` at the
        claim's fence; a row of ``owner`` at that fence still claimed (its
        confirm lost) is marked sent. Any other row is left alone: another
        replica holds the slot, or it is sent already. Idempotent. Of those
        returned, a claim whose confirm the database had acknowledged is a
        write it lost (a failover to a lagging standby); one whose confirm
        the break cut off is that confirm's retry: the caller tells them
        apart. An empty answer means nothing needed writing. A store that
        cannot lose committed writes returns ``[]`` (the default).
        """
        return []

    @abstractmethod
    def release(self, owner: str, claims: Sequence[Claim], retry_in_us: int = 0) -> None:
        """Give up claims we could not publish, so another replica takes them over.

        With ``retry_in_us = 0`` the lease ends now and the next sweep of any
        replica takes them over; otherwise the lease ends ``retry_in_us`` from
        now (a slot this replica cannot publish at all, e.g. of an entry its
        schedule does not have, should not bounce between sweeps). Rows not
        owned (owner and fence) are untouched."""

    @abstractmethod
    def take_over(self, owner: str, lease_us: int, limit: int) -> list[Claim]:
        """Claim up to ``limit`` abandoned rows (oldest slots first) for ``owner``.

        "Oldest" orders by ``slot_us`` across all entries (ties by entry name),
        and the result comes in that order.

        Each row passes to ``owner`` with its fence grown by one and a new lease.
        Concurrent callers never receive the same row. Rows of an entry paused
        now are left alone, and so is a run-now request (a row at fence 0, made
        by an operator, not a replica) of an entry that ``owner``'s catalog
        (:meth:`publish_catalog`) does not list: only a replica that can send it
        takes it.
        """

    @abstractmethod
    def prune(self, retention_us: int, every_us: int) -> int | None:
        """Delete sent rows older than the retention window; return how many.

        At most one replica prunes per ``every_us`` (returns None when another
        replica's turn). Before deleting, each entry's high-water mark is raised
        to the latest row being deleted. Claimed rows are never deleted.
        """

    def recent_owners(self, window_us: int) -> list[str]:
        """Replicas holding a slot row whose instant is less than ``window_us`` old.

        The replicas that won a slot lately. Sharing no longer reads it (it
        shares among the live replicas of :meth:`heartbeat`: a replica with
        nothing due lately is still live); kept for callers of earlier
        releases. A store that cannot tell returns ``[]``.
        """
        return []

    # -- operating the fleet ----------------------------------------------

    #: the control version the last statement that read it returned (or None).
    #: Every control change (pause, resume, run now) raises it in the same
    #: transaction; :meth:`heartbeat` reads it on every store, the claim on
    #: stores that can fold it in, so a replica notices a change without a
    #: statement of its own.
    controls_version: int | None = None

    #: claimed-but-unsent rows in the whole store, as the last :meth:`heartbeat`
    #: counted them (None: not counted; a sweep then always tries a takeover)
    open_claims: int | None = None

    def heartbeat(self, info: ReplicaInfo) -> list[str]:
        """Record ``info`` in the replica's row and return the live replicas.

        Upserts the row with ``seen_us`` = the database's now and clears its
        ``stopped_us``; reads the control version into :attr:`controls_version`
        and the claimed-but-unsent rows into :attr:`open_claims`. Returns the
        ids, sorted, of the replica rows that are live by
        :func:`~celery_singlebeat.membership.replica_live` at the database's
        now of this call, ``info.id`` always among them (its row was just
        written: live by definition, whether or not the statement's read sees
        its own write). One round trip where the store can (PostgreSQL,
        SQLite). The scheduler shares its entries among these replicas.
        This default keeps no replica rows and returns ``[]``: each replica
        then counts itself alone and proposes every slot at once, as without
        sharing (still each slot once).
        """
        return []

    def stopped(self, replica_id: str) -> None:  # noqa: B027 - optional hook
        """Mark the replica's row as gone (a graceful stop): ``stopped_us`` = now.

        From this commit on, the row is no longer live (:meth:`heartbeat`
        leaves it out), so the other replicas take over its share of the
        entries at their next heartbeat, not after its row ages."""

    def publish_catalog(  # noqa: B027 - optional hook
        self, replica_id: str, entries: Sequence[CatalogEntry]
    ) -> None:
        """Record that ``replica_id`` has exactly ``entries`` (rows of other
        entries of that replica are deleted). Idempotent."""

    def pauses(self) -> list[Pause]:
        """The pauses in force now (``until_us`` NULL or after now), by entry;
        reads :attr:`controls_version` too (the version these pauses are of)."""
        return []

    def prune_fleet(self, retention_us: int) -> int:
        """Delete the fleet's rows that say nothing any more; return how many.

        Those are: replica rows stopped, or not seen, for longer than
        ``retention_us``; the catalog rows of replicas that have no row; the
        run-now request rows whose slot row is gone (pruned once sent). Never a
        live replica's rows (the retention is at least four leases, a live
        replica heartbeats every few seconds). Safe from several replicas at
        once; a periodic prune calls it after :meth:`prune`.
        """
        return 0

    # -- singleton keys (SingletonTask) -------------------------------------

    @abstractmethod
    def acquire_lease(self, key: str, owner: str, ttl_us: int) -> Lease | Busy:
        """Take the lease on ``key`` for ``ttl_us`` if it is free; one atomic decision.

        Won when the key has no row, or its lease has expired or was released:
        the row passes to ``owner`` with ``token = max(previous token + 1, now)``
        (``now`` for a new row) and ``expires_us = now + ttl_us``. Otherwise
        nothing changes and the answer is the current holder (:class:`Busy`).
        Of concurrent callers on a free key exactly one wins. A holder asking
        again does not renew: it gets :class:`Busy` like anyone else.
        """

    @abstractmethod
    def renew_lease(self, lease: Lease, ttl_us: int) -> Lease | None:
        """Extend a held lease to ``now + ttl_us``; ``None`` when it is lost.

        Changes the row only when its token is ``lease.token`` and it was not
        released; the token never changes. A lease that expired but that no one
        took since is renewed (nobody else held the key in between, so the
        token still proves exclusive possession). ``None`` means another
        holder took the key (or the lease was released): it cannot be won back
        by renewing.
        """

    @abstractmethod
    def release_lease(self, lease: Lease) -> bool:
        """Free the key at once if ``lease`` still holds it; True when it did.

        Only the row with ``lease.token`` is touched (never a blind delete): a
        holder whose lease was taken over releases nothing. Releasing twice is
        harmless (the second answer is False).
        """

    @abstractmethod
    def lease_holds(self, key: str, token: int) -> bool:
        """True when ``token`` holds ``key`` now (not released, not expired).

        One round trip; the guard a task runs before a write that must not
        come from a stale holder.
        """

    @abstractmethod
    def begin_run(self, run: Run, owner: str, task_id: str, ttl_us: int) -> RunBegin:
        """Record that ``owner`` starts executing slot ``(run.entry, run.slot_us)``.

        STARTED when the slot has no run row (one is inserted: running, with
        ``run.run_id`` and ``expires_us = now + ttl_us``), or when its row is
        running but expired (the worker that ran it died or lost the database
        for longer than the ttl: the row is retaken with the new ``run_id``).
        Otherwise nothing is started: FINISHED when the row is finished, RUNNING
        when it is running and live; both count one more repeat on the row
        (``repeats``, ``last_repeat_us``), so duplicate deliveries are recorded.
        Of concurrent callers for one slot, exactly one gets STARTED.
        """

    @abstractmethod
    def renew_run(self, run: Run, ttl_us: int) -> bool:
        """Extend a running row started by ``run.run_id`` to ``now + ttl_us``.

        False when the row is finished or was retaken by another start."""

    @abstractmethod
    def finish_run(self, run: Run, outcome: str) -> bool:
        """Mark the run finished with ``outcome``; True when ``run.run_id`` still
        owned it. A finished run is never started again (see :meth:`begin_run`)."""

    @abstractmethod
    def abandon_run(self, run: Run) -> bool:
        """Let the slot be started again at once (the task will be retried).

        Only a running row with ``run.run_id`` changes: its expiry is set in the
        past, so the next :meth:`begin_run` of the slot gets STARTED."""

    def begin_slot(
        self, run: Run, key: str, owner: str, task_id: str, ttl_us: int
    ) -> tuple[RunBegin, Lease | Busy | None]:
        """:meth:`begin_run`, then :meth:`acquire_lease` of ``key`` when the run
        STARTED (``None`` for a repeat, which takes no lease).

        The rows change exactly as the two calls would change them; a store may
        answer both in one round trip (PostgreSQL does). After
        ``StoreUnavailable`` the caller cannot tell whether the run started.
        """
        begin = self.begin_run(run, owner, task_id, ttl_us)
        if begin.status is not RunStatus.STARTED:
            return begin, None
        return begin, self.acquire_lease(key, owner, ttl_us)

    def end_slot(self, run: Run, outcome: str | None, lease: Lease) -> tuple[bool, bool]:
        """:meth:`finish_run` with ``outcome`` (:meth:`abandon_run` when it is
        ``None``), then :meth:`release_lease`; returns both answers.

        One round trip where the store can; both writes are idempotent, so a
        call retried after a lost answer changes nothing more.
        """
        done = self.abandon_run(run) if outcome is None else self.finish_run(run, outcome)
        return done, self.release_lease(lease)

    def reassert_runs(self, records: Sequence[RunRecord]) -> list[RunRecord]:
        """Write again the run rows a worker process wrote lately; return those
        the database had lost (a failover to a standby that lagged behind).

        For each record: a missing row is inserted as recorded (finished with
        its outcome, or running until its ``expires_us``); a row still running
        with the record's ``run_id`` while the record is finished is finished
        as recorded. Any other row is left alone: a later start retook the
        slot, or the row says all the record says. Idempotent. A store that
        cannot lose committed writes returns ``[]`` (the default).
        """
        return []

    @abstractmethod
    def prune_singletons(self, retention_us: int, every_us: int) -> int | None:
        """Delete run rows finished, or started and expired, more than
        ``retention_us`` ago, and idle lease rows; return how many rows went.

        At most one caller per ``every_us`` across all processes (``None`` when
        it is not this caller's turn). A lease row is idle when it is free and
        was acquired more than ``retention_us`` ago, and its token is also more
        than ``retention_us`` behind now (hand-overs within one microsecond, or
        a clock stepped back, leave a token ahead of the clock); the token rule
        of :meth:`acquire_lease` then keeps tokens growing after such a row is
        gone.
        """

    @abstractmethod
    def ping(self) -> int:
        """One round trip that only reads the database's clock; returns it."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections. The store may not be used afterwards."""
