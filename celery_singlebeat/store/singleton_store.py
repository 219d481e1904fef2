"""SingletonTask's leases and runs: the contract of :class:`SingletonStore`.

What a worker needs so that a task runs once at a time (a lease on a
singleton key, with a token that proves which hand-over it won) and each slot
of a periodic task runs once (a run row per slot), the write-back of run rows
a failover lost, and their prune. The vocabulary (lease, token, free, run,
running, finished) is :mod:`.base`'s. The suites:
``tests/integration/test_singleton_store_contract.py`` and, for
:meth:`SingletonStore.reassert_runs`, ``test_failover_contract.py``. A worker
holds a store by this contract alone (``celery_singlebeat/singleton/``).
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Sequence

from .connection import StoreConnection
from .values import Busy, Lease, Run, RunBegin, RunRecord, RunStatus

__all__ = ["SingletonStore"]


class SingletonStore(StoreConnection):
    """The lease rows of singleton keys and the run rows of slots, for workers."""

    @abstractmethod
    def acquire_lease(self, key: str, owner: str, ttl_us: int) -> Lease | Busy:
        """Take the lease on ``key`` for ``ttl_us`` if it is free; one atomic decision.

        Won when the key has no row, or its lease has expired or was released:
        the row passes to ``owner`` with ``token = max(previous token + 1, now)``
        (``now`` for a new row) and ``expires_us = now + ttl_us``. Otherwise
        nothing changes and the answer is the current holder (:class:`.Busy`).
        Of concurrent callers on a free key exactly one wins. A holder asking
        again does not renew: it gets :class:`.Busy` like anyone else.
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
        for longer than the ttl: the row is retaken with the new ``run_id``,
        ``attempts`` + 1), or running and let go for a retry by
        :meth:`abandon_run` (retaken the same way).
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
    def abandon_run(self, run: Run, *, ran: bool = True) -> bool:
        """Let the slot be started again at once (the task will be retried).

        Only a running row with ``run.run_id`` changes: its expiry is set in the
        past (0), so the next :meth:`begin_run` of the slot gets STARTED.
        ``ran=False`` says the body never ran under this start (the key was
        busy, the database was lost before it): ``attempts`` takes back the
        start's count, so it counts the body's starts, which the cap of the
        stalled runs' re-sends (:meth:`.SlotStore.take_over`) counts. Called
        again after a lost answer it changes nothing more."""

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
        under another run that started before the record's and had expired by
        then (the row as it was before the record's start retook it: the
        failover lost the retake) is written as recorded, ``attempts`` + 1;
        a row still running with the record's ``run_id`` while the record is
        finished is finished as recorded. Any other row is left alone: a later
        start retook the slot, or the row says all the record says.
        Idempotent. Without the retake's rule the worker that ran the slot
        could not finish it, and the fleet sent the slot again as a stalled
        run (the explorer's seed 79: executed twice). A store that
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
