"""The beat's slots: the contract of :class:`SlotStore`.

What a beat replica needs to send each slot once: its entries' rows, the claim
of due slots, their confirm once published, the release of what it cannot
publish, the takeover of abandoned claims (and of sent slots whose
SingletonTask run stalled), the prune of old rows, and after a
broken connection (a failover), writing again what it sent. The vocabulary
(slot row, claimed, sent, lease, abandoned, fence, high-water mark) is
:mod:`.base`'s. The suites: ``tests/integration/test_store_contract.py`` and,
for :meth:`SlotStore.reassert`, ``test_failover_contract.py``.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Mapping, Sequence

from .connection import StoreConnection
from .values import Claim, EntryState, SlotKey, StalledRuns, Written

__all__ = ["SlotStore"]


class SlotStore(StoreConnection):
    """The slot rows of every beat replica sharing the database.

    Every method is one atomic decision taken by the database (a constant
    number of round trips, whatever the number of slots).
    """

    #: which sent slots :meth:`take_over` sends again because their
    #: SingletonTask run stalled (a worker died mid-run): the settings'
    #: ``singlebeat_stalled_run_resends`` and ``singlebeat_retention``
    #: (``SqlStore.from_settings``); the heartbeat counts those slots among
    #: :attr:`.FleetStore.open_claims`, so that a sweep looks for them
    stalled_runs: StalledRuns = StalledRuns()

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
    def claim(
        self,
        owner: str,
        slots: Sequence[SlotKey],
        lease_us: int,
        revisions: Mapping[str, Written] | None = None,
    ) -> list[Claim]:
        """Atomically claim the given slots for ``owner``; return those won.

        A slot is won when either (a) it has no row and it is newer than its
        entry's high-water mark (a row is inserted: claimed, fence 1); or (b) its
        row is abandoned (the row passes to ``owner`` and its fence grows); or (c)
        it is claimed by ``owner`` itself and not yet sent (its fence grows): a
        claim whose answer was lost with the connection is won again by its
        owner's retry instead of waiting for its lease to run out.
        Rows that are sent, or claimed with a live lease, are not touched, and
        neither is a slot of an entry paused now (:meth:`.FleetStore.pauses`). Every
        won row gets ``lease_until_us = now + lease_us``. Duplicates in ``slots``
        count once; slots of unregistered entries are never won, and neither is
        a slot more than :data:`.EARLY_TOLERANCE_US` after the database's now (a
        replica whose clock estimate runs ahead must not send early: it proposes
        such a slot again when it is due). ``revisions`` names, for stored
        entries, the write of the definition the claimer proposes under (its
        revision and the instant of that write, :class:`.Written`): a slot of
        such an entry is not won when its row in the stored schedules
        (:class:`.ScheduleStore`) is another write (another revision, or the
        same number written at another instant: a promoted standby reuses the
        numbers of the writes it lacked), made (or deleted)
        more than :data:`.STALE_DEFINITION_US` before the later of the
        database's now and the slot's instant, so no slot whose instant is
        more than a second after a definition was replaced goes out under it,
        whatever the claimer knows (an early claim included). Rows are locked
        in ``(entry, slot_us)`` order so concurrent claims cannot deadlock.
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
    def take_over(
        self, owner: str, lease_us: int, limit: int, seen: int | None = None
    ) -> list[Claim]:
        """Claim up to ``limit`` abandoned or stalled rows (oldest slots first) for ``owner``.

        "Oldest" orders by ``slot_us`` across all entries (ties by entry name),
        and the result comes in that order. Two kinds of row are taken:

        * an **abandoned** claim: claimed (``state = 0``) with its lease ended;
        * a **stalled** slot: sent (``state = 1``), but the SingletonTask run row
          of the same ``(entry, slot_us)`` (:class:`.SingletonStore`) is still
          running (``state = 0``, no outcome) with its ``expires_us`` more than
          ``lease_us`` in the past (the grace: a worker slow to renew is not
          raced), and the slot row itself last changed hands (``claimed_us``)
          more than ``lease_us`` ago (a slot sent again is not sent a third time
          before a worker could start it). Left alone: a run abandoned for a
          retry (``expires_us = 0``: its retry message is on its way), a run
          that has started more than :attr:`stalled_runs` ``.resends`` times
          (``attempts``: the cap, so that a task that kills its worker each
          time is not sent for ever), a slot or run expiry older than
          :attr:`stalled_runs` ``.window_us`` (the retention), and every slot
          when ``resends`` is 0. Slots without a run row (no SingletonTask) are
          never stalled.

        Each row passes to ``owner`` with its fence grown by one and a new lease,
        claimed (``state = 0``) again: the caller publishes it with the same
        task id and confirms it as any takeover, and the worker's
        :meth:`.SingletonStore.begin_run` retakes the expired run row.
        Concurrent callers never receive the same row. Rows of an entry paused
        now are left alone, and so is a run-now request (a row at fence 0, made
        by an operator, not a replica) of an entry that ``owner``'s catalog
        (:meth:`.FleetStore.publish_catalog`) does not list and that is not an
        enabled stored entry (:class:`.ScheduleStore`; those are in no
        catalog): only a replica that can send it takes it.

        ``seen``: the revision of the schedules table up to which ``owner``
        has read the stored entries (:meth:`.EntrySource.read_up_to`; None: it
        follows none, and this check is off). A row of a stored entry is left
        alone while the entry's row has a write above ``seen`` made more than
        ``STALE_DEFINITION_US`` before the later of now and the slot's
        instant (the first such write, from the history; the row's own
        instant once the prune has emptied it): the caller sends a slot under
        the definition it holds, and one that slept through that write would
        send it under the one it replaced (the chaos run's seed 12). A replica
        that has read it takes the row. Decided in the statement, as the
        claim's check on ``revisions`` is.
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
        shares among the live replicas of :meth:`.FleetStore.heartbeat`: a replica with
        nothing due lately is still live); kept for callers of earlier
        releases. A store that cannot tell returns ``[]``.
        """
        return []
