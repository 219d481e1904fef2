"""The beat's slots in the memory store: the memory form of the ``SlotStore`` contract.

:class:`MemorySlots` registers entries, claims, confirms and releases slots,
takes over abandoned ones, prunes sent ones under the high-water mark and
writes back what a replica sent before a failover, each as one round trip of
the store's connection, deciding as the SQL statements do. A claim also
reads the operator's pauses and, for a stored entry, whether its definition
changed (the SQL claim's joins); :meth:`MemorySlots.lose_writes` is the
slots' share of a failover to a lagging standby.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ...store.base import (
    EARLY_TOLERANCE_US,
    PAUSE_ALL,
    STALE_DEFINITION_US,
    Claim,
    EntryState,
    SlotKey,
    Written,
)
from .connection import MemoryConnection
from .state import MemoryEntry, MemorySlot

__all__ = ["MemorySlots"]


class MemorySlots:
    """The :class:`~celery_singlebeat.store.slot_store.SlotStore` methods of
    :class:`~.store.MemoryStore`, which delegates each of them here; they
    share the store's connection and state with the other parts."""

    def __init__(self, connection: MemoryConnection) -> None:
        self._connection = connection
        self._state = connection.state

    def register(self, names: Sequence[str], owner: str = "") -> dict[str, EntryState]:
        """See :meth:`.SlotStore.register`."""
        with self._connection.round_trip("register entries") as now:
            wanted = set(names)
            for name in sorted(wanted):
                self._state.entries.setdefault(name, MemoryEntry(anchor_us=now))
            latest: dict[str, int] = {}
            for key in self._state.slots:
                if key.entry in wanted and key.slot_us > latest.get(key.entry, -1):
                    latest[key.entry] = key.slot_us
            out: dict[str, EntryState] = {}
            for name in wanted:
                entry = self._state.entries[name]
                candidates = [
                    v for v in (entry.last_slot_us, latest.get(name)) if v is not None and v >= 0
                ]
                out[name] = EntryState(name, entry.anchor_us, max(candidates, default=None))
            return out

    def claim(
        self,
        owner: str,
        slots: Sequence[SlotKey],
        lease_us: int,
        revisions: Mapping[str, Written] | None = None,
    ) -> list[Claim]:
        """See :meth:`.SlotStore.claim`."""
        if not slots:
            return []
        with self._connection.round_trip("claim") as now:
            won: list[Claim] = []
            for key in sorted({SlotKey(s.entry, s.slot_us) for s in slots}):
                entry = self._state.entries.get(key.entry)
                mark = -1 if entry is None or entry.last_slot_us is None else entry.last_slot_us
                if entry is None or key.slot_us <= mark or key.slot_us > now + EARLY_TOLERANCE_US:
                    continue
                if self._state.pauses and self._paused(key.entry, now):
                    continue
                if revisions and self._stale(
                    key.entry, revisions.get(key.entry), max(now, key.slot_us)
                ):
                    continue
                row = self._state.slots.get(key)
                if row is None:
                    self._state.slot_written(key, now)
                    self._state.slots[key] = MemorySlot(0, owner, 1, now + lease_us, now)
                    won.append(Claim(key.entry, key.slot_us, 1))
                elif row.state == 0 and (row.lease_until_us < now or row.owner == owner):
                    self._state.slot_written(key, now)
                    row.owner, row.fence = owner, row.fence + 1
                    row.lease_until_us, row.claimed_us = now + lease_us, now
                    won.append(Claim(key.entry, key.slot_us, row.fence))
            return won

    def _paused(self, entry: str, now: int) -> bool:
        for name in (entry, PAUSE_ALL):
            pause = self._state.pauses.get(name)
            if pause is not None and (pause.until_us is None or pause.until_us > now):
                return True
        return False

    def _stored_live(self, entry: str) -> bool:
        """An enabled stored entry (the SQL take_over's ``_stored``)."""
        row = self._state.schedules.get(entry)
        return row is not None and row.enabled and not row.deleted

    def _stale(self, entry: str, written: Written | None, latest: int) -> bool:
        """As the SQL claim: a stored entry replaced (another write, also one
        that took the same revision number) more than a second before
        ``latest`` (the later of now and the slot's instant)."""
        if written is None or written.revision <= 0:
            return False
        row = self._state.schedules.get(entry)
        if row is None or (row.revision, row.updated_us) == written:
            return False
        if row.updated_us + STALE_DEFINITION_US < latest:
            return True
        # the first write after the claimer's, from the history
        return any(
            r.name == entry and written.at_us < r.at_us < latest - STALE_DEFINITION_US
            for r in self._state.schedule_log
        )

    def _unseen(self, entry: str, seen: int | None, latest: int) -> bool:
        """As the SQL take_over: a stored entry with a write above ``seen``
        made more than a second before ``latest`` (the first such, from the
        history; the row's own instant too)."""
        if seen is None:
            return False
        row = self._state.schedules.get(entry)
        if row is None or row.revision <= seen:
            return False
        if row.updated_us + STALE_DEFINITION_US < latest:
            return True
        return any(
            r.name == entry and r.revision > seen and r.at_us + STALE_DEFINITION_US < latest
            for r in self._state.schedule_log
        )

    def confirm(self, owner: str, claims: Sequence[Claim]) -> list[Claim]:
        """See :meth:`.SlotStore.confirm`."""
        if not claims:
            return []
        with self._connection.round_trip("confirm") as now:
            done: list[Claim] = []
            for claim in dict.fromkeys(claims):
                row = self._state.slots.get(claim.key)
                if row is None or row.owner != owner or row.fence != claim.fence:
                    continue
                if row.state == 0:
                    self._state.slot_written(claim.key, now)
                    row.state, row.sent_us = 1, now
                # already sent by this owner: a retried confirm, still ours
                done.append(claim)
            return done

    def reassert(self, owner: str, sent: Sequence[Claim]) -> list[Claim]:
        """See :meth:`.SlotStore.reassert`."""
        if not sent:
            return []
        with self._connection.round_trip("write sent slots again") as now:
            again: list[Claim] = []
            for claim in dict.fromkeys(sent):
                row = self._state.slots.get(claim.key)
                if row is None:
                    self._state.slot_written(claim.key, now)
                    self._state.slots[claim.key] = MemorySlot(1, owner, claim.fence, 0, now, now)
                elif row.state == 0 and row.owner == owner and row.fence == claim.fence:
                    self._state.slot_written(claim.key, now)
                    row.state, row.sent_us = 1, row.sent_us if row.sent_us is not None else now
                else:
                    continue
                again.append(claim)
            return sorted(again, key=lambda c: (c.slot_us, c.entry))

    def release(self, owner: str, claims: Sequence[Claim], retry_in_us: int = 0) -> None:
        """See :meth:`.SlotStore.release`."""
        if not claims:
            return
        with self._connection.round_trip("release") as now:
            for claim in claims:
                row = self._state.slots.get(claim.key)
                if row and row.state == 0 and row.owner == owner and row.fence == claim.fence:
                    self._state.slot_written(claim.key, now)
                    row.lease_until_us = now + retry_in_us if retry_in_us > 0 else 0

    def take_over(
        self, owner: str, lease_us: int, limit: int, seen: int | None = None
    ) -> list[Claim]:
        """See :meth:`.SlotStore.take_over`: abandoned claims, and sent slots
        whose run stalled (:meth:`_stalled`), but for those of a stored entry
        with a write ``seen`` does not cover (:meth:`_unseen`)."""
        with self._connection.round_trip("take over") as now:
            abandoned = [
                key
                for key, row in self._state.slots.items()
                if row.state == 0
                and row.lease_until_us < now
                and not (self._state.pauses and self._paused(key.entry, now))
                and (
                    row.fence > 0
                    or key.entry in self._state.catalog.get(owner, {})
                    or self._stored_live(key.entry)
                )
            ]
            chosen = sorted(
                (
                    k
                    for k in abandoned + self._stalled(now, lease_us)
                    if not self._unseen(k.entry, seen, max(now, k.slot_us))
                ),
                key=lambda k: (k.slot_us, k.entry),
            )
            taken: list[Claim] = []
            for key in chosen[: max(limit, 0)]:
                row = self._state.slots[key]
                self._state.slot_written(key, now)
                row.state, row.owner, row.fence = 0, owner, row.fence + 1
                row.lease_until_us, row.claimed_us = now + lease_us, now
                taken.append(Claim(key.entry, key.slot_us, row.fence))
            return taken

    def _stalled(self, now: int, grace_us: int) -> list[SlotKey]:
        """The sent slots whose SingletonTask run stalled, as the SQL statement
        finds them (``slot_statements._stalled``): from the run rows."""
        policy = self._connection.stalled_runs
        if policy.resends <= 0:
            return []
        found = []
        for key, run in self._state.runs.items():
            if not (
                run.state == 0
                and run.attempts <= policy.resends
                and now - policy.window_us < run.expires_us < now - grace_us
            ):
                continue
            row = self._state.slots.get(key)
            if (
                row is not None
                and row.state == 1
                and row.claimed_us < now - grace_us
                and key.slot_us > now - policy.window_us
                and not (self._state.pauses and self._paused(key.entry, now))
            ):
                found.append(key)
        return found

    def prune(self, retention_us: int, every_us: int) -> int | None:
        """See :meth:`.SlotStore.prune`; the slot instant tells a row's age."""
        with self._connection.round_trip("prune") as now:
            if self._state.prune_next_us > now:
                return None
            self._state.prune_next_us = now + every_us
            cutoff = now - retention_us
            old = [
                k for k, row in self._state.slots.items() if row.state == 1 and k.slot_us < cutoff
            ]
            for key in old:
                entry = self._state.entries.get(key.entry)
                if entry is not None and (
                    entry.last_slot_us is None or entry.last_slot_us < key.slot_us
                ):
                    entry.last_slot_us = key.slot_us
            for key in old:
                self._state.slot_written(key, now)
                del self._state.slots[key]
            return len(old)

    def recent_owners(self, window_us: int) -> list[str]:
        """See :meth:`.SlotStore.recent_owners`."""
        with self._connection.round_trip("recent owners") as now:
            return sorted(
                {row.owner for k, row in self._state.slots.items() if k.slot_us > now - window_us}
            )

    def lose_writes(self, after_us: int) -> int:
        """The slots' share of :meth:`.MemoryStore.lose_writes`: every slot row
        as it was at ``after_us`` (from :attr:`.MemoryState.slot_undo`: a row
        inserted since is gone, one updated since is back as it was), and
        entries registered then are gone. Past the journal's reach, rows
        claimed or taken over after ``after_us`` are gone and confirms made
        then undone. Returns how many rows changed. The caller holds the
        state's lock."""
        changed: set[SlotKey] = set()
        undo = self._state.slot_undo
        while undo and undo[-1][0] > after_us:
            _at, key, before = undo.pop()
            if before is None:
                self._state.slots.pop(key, None)
            else:
                self._state.slots[key] = before
            changed.add(key)
        for key, row in list(self._state.slots.items()):
            if row.claimed_us > after_us:
                del self._state.slots[key]
                changed.add(key)
            elif row.state == 1 and row.sent_us is not None and row.sent_us > after_us:
                row.state, row.sent_us = 0, None
                changed.add(key)
        count = len(changed)
        # entries registered since: their rows are gone too (the claim
        # refuses a slot of an entry with no row)
        for name, entry in list(self._state.entries.items()):
            if entry.anchor_us > after_us:
                del self._state.entries[name]
                count += 1
        return count
