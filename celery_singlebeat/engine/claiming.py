"""The claim: propose the slots that are due, and read the store's refusals.

Each tick, the entries whose next slot is due come off the agenda's heaps
(those this replica proposes first at their instant, the others
``FALLBACK_DELAY_US`` later, and not during a failover hold), each planned by
the missed-run policy (:func:`..slots.plan_due`). All their slots go to the
store in one claim. What it refuses is one of: paused (gone, like a slot
another replica won), early (proposed before it was due on the database's
clock: planned again), or lost to another replica.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import NamedTuple

from ..exceptions import StoreUnavailable
from ..observe import decisions
from ..observe.decisions import batch_fields, slot_fields
from ..sources import EntryDefinition
from ..store.base import EARLY_TOLERANCE_US, Claim, SlotKey, Written
from ..timeline.clock import US, slot_text
from ..timeline.slots import Plan, plan_due, slot_task_id
from .agenda import NOTHING_WON, Agenda, Tracked
from .context import ReplicaContext
from .controls import Controls
from .hold import Hold
from .missed import report_skipped
from .ownership import HeldSlots
from .sharing import FALLBACK_BATCH, FALLBACK_DELAY_US, FIRST_BATCH

logger = logging.getLogger("celery_singlebeat.scheduler")


class Claimed(NamedTuple):
    """What one claim won: the claims, when it was sent (monotonic), the keys
    another replica held before, and whether another replica won a slot this
    one proposes first (the views of the live replicas differ)."""

    won: list[Claim]
    started: float
    taken: set[SlotKey]
    lost_own_share: bool


class Claiming:
    """Propose the due slots in one claim; sort out what it refused."""

    def __init__(
        self,
        ctx: ReplicaContext,
        agenda: Agenda,
        hold: Hold,
        controls: Controls,
        held: HeldSlots,
        written: Callable[[EntryDefinition], Written | None],
    ) -> None:
        self.ctx = ctx
        self.agenda = agenda
        self.hold = hold
        self.controls = controls
        self.held = held
        #: the write of the store's schedules table a definition came from, as
        #: its source says (EntrySource.written); None for most sources
        self._written = written

    def _revisions(self, names: Iterable[str]) -> dict[str, Written] | None:
        """The write each due entry is proposed under, for those whose source
        names one (stored schedules: the revision and the instant of that
        write, which together name one definition also after a promoted
        standby reused the number): the claim refuses their slots once the
        database holds a definition replaced more than a second before
        (SlotStore.claim)."""
        definitions = self.agenda.definitions
        written_by = self._written
        revisions = {}
        for name in names:
            definition = definitions.get(name)
            if definition is not None:
                written = written_by(definition)
                if written is not None:
                    revisions[name] = written
        return revisions or None

    def claim_due(self) -> Claimed | None:
        """Claim what is due now; None when nothing is."""
        ctx = self.ctx
        agenda = self.agenda
        store = ctx.connected_store
        if self.hold.kept:
            self.hold.forget_kept(agenda.earliest_us())
        now_us = store.clock.now_us()
        due: list[Tracked] = []
        keys: list[SlotKey] = []
        plans: list[tuple[Tracked, Plan]] = []
        # Capped, oldest first: a replica claims no more slots than it publishes
        # in a moment, so that a replica that is free does not claim a whole
        # second of other replicas' slots and keep them waiting while it
        # publishes. What is left stays due: the next tick follows at once.
        # Judged as of the hold's start on both heaps: an entry dealt anew
        # during the hold (the replica first for it stopped) comes to the first
        # heap with the slots the hold kept back on the other.
        judged_at_us = self.hold.judged_at(now_us)
        queues = [(agenda.first, now_us, FIRST_BATCH)]
        if not self.hold.holding(ctx.env.monotonic()):
            # held after a broken connection (failover.py): the slot a fallback
            # proposal would win may be one another replica sent, whose row the
            # database lost and that replica is about to write again
            queues.append((agenda.later, now_us - FALLBACK_DELAY_US, FALLBACK_BATCH))
        kept = self.hold.kept
        for heap, ready_us, cap in queues:
            cap += len(keys)
            while len(keys) < cap:
                tracked = agenda.top(heap)
                if tracked is None or tracked.next_us > ready_us:
                    break
                agenda.pop(heap)
                due.append(tracked)
                plan = plan_due(
                    tracked.sequence, tracked.next_us, now_us, tracked.policy, judged_at_us, kept
                )
                plans.append((tracked, plan))
                keys.extend(
                    SlotKey(tracked.name, at) for at in plan.propose if at not in tracked.won
                )
        recovering = self._recovering(keys)
        if not due and not recovering:
            return None
        started = ctx.env.monotonic()
        try:
            revisions = self._revisions([*(t.name for t in due), *(k.entry for k in recovering)])
            # a store of an earlier release takes three arguments: only entries
            # of the schedules table name a write, and such a store has none
            won = (
                store.claim(ctx.replica_id, keys, ctx.settings.lease_us, revisions)
                if revisions
                else store.claim(ctx.replica_id, keys, ctx.settings.lease_us)
            )
        except StoreUnavailable:
            # No answer: keep the slots due, the next attempt proposes them again.
            # The claim may have been applied all the same: the retry then wins
            # our own claims again (fence + 1), which is not a takeover.
            self.held.answer_lost(keys, ctx.env.monotonic())
            for tracked in due:
                agenda.push(tracked)
            self.hold.recover[:0] = recovering
            raise
        mine = {c.key for c in won}
        refused = [key for key in keys if key not in mine] if len(won) < len(keys) else []
        if refused and self.controls.pauses:
            # Refused because the entry is paused (as far as this replica
            # knows): gone, like a slot another replica won. Not "early", even
            # when its instant is a few ms ahead of the database's clock: that
            # would propose it again and again, and send it after the resume.
            is_paused = self.controls.is_paused
            paused = [key for key in refused if is_paused(key.entry, now_us)]
            if paused:
                refused = [key for key in refused if not is_paused(key.entry, now_us)]
                ctx.stats["paused"] += len(paused)
                ctx.telemetry.paused(paused)
        early_keys = self._refused_as_early(refused, now_us) if refused else set()
        early: set[str] = {key.entry for key in early_keys}
        won_early: dict[str, list[int]] = {}
        if early:
            for claim in won:
                if claim.entry in early:
                    won_early.setdefault(claim.entry, []).append(claim.slot_us)
        for tracked, plan in plans:
            if tracked.name in early:
                # Proposed before it was due on the database's clock. When our
                # "now" ran ahead (a clock step), this plan also judged slots as
                # missed that are not, and coalesce/skip did not propose them.
                # Forget the plan, its skips included: the entry stays at the slot
                # it stood at before it, and is planned again with the clock the
                # claim's round trip has just corrected. Slots it won now are not
                # proposed again.
                tracked.won = tracked.won | set(won_early.get(tracked.name, ()))
                agenda.push(tracked)
                continue
            if tracked.won:
                after = plan.next_us
                ahead = {at for at in tracked.won if after is not None and at >= after}
                tracked.won = ahead or NOTHING_WON
            if plan.skipped:
                report_skipped(
                    ctx,
                    tracked.name,
                    plan.skipped,
                    plan.skipped_first_us,
                    plan.skipped_last_us,
                    tracked.policy,
                )
            if plan.next_us is not None:
                tracked.next_us = plan.next_us
                agenda.push(tracked)
            else:
                agenda.finished(tracked)
        # Slots refused before they were due are proposed again: not lost (yet).
        lost = [key for key in refused if key not in early_keys]
        if self.held:
            self.held.lost(lost)
        if lost:
            # what another replica won: proposed again after a break (Hold.recovery)
            self.hold.won_elsewhere.add(
                [key for key in lost if key not in recovering] if recovering else lost,
                ctx.env.monotonic(),
            )
        if recovering:
            self._report_recovered([c for c in won if c.key in recovering], len(recovering))
        taken = {c.key for c in won if self.held.taken_from_another(c)}
        ctx.stats["claimed"] += len(won)
        ctx.stats["lost"] += len(lost)
        if won:
            ctx.telemetry.claimed(won)
        if lost:
            ctx.telemetry.lost(lost)
        if logger.isEnabledFor(logging.DEBUG):
            self._log_lost(lost)
        first = {t.name for t in due if t.first}
        lost_own_share = bool(first) and any(key.entry in first for key in lost)
        return Claimed(won, started, taken, lost_own_share)

    def _recovering(self, keys: list[SlotKey]) -> list[SlotKey]:
        """The slots to propose again after a break (Hold.recovery) that this
        claim does not propose already, of entries this replica has (one it
        no longer has is left to a replica that does, as any such slot) and
        of the definition it has: an instant of its slot sequence, after its
        commit (``since_us``). A slot of an earlier definition (another grid,
        or before the commit) is not sent under a later one (sources.py); the
        claim may also have refused it for being of a replaced definition,
        with no row at all. The chaos run sent such slots under the later
        definition before this check (seeds 2 and 7). Added to ``keys``."""
        if not self.hold.recover:
            return []
        agenda = self.agenda
        definitions = agenda.definitions
        proposed = set(keys)
        recovering = []
        for key in self.hold.recovery(self.ctx.env.monotonic(), FALLBACK_BATCH):
            definition = definitions.get(key.entry)
            # a finished entry too (a one-off whose one slot this replica had
            # planned past): the explorer's seed 368 lost a single run so
            sequence = agenda.sequence_of(key.entry)
            if definition is None or sequence is None or key in proposed:
                continue
            since = definition.since_us
            if since is not None and key.slot_us <= since:
                continue
            if sequence.next_after(key.slot_us - 1) == key.slot_us:
                recovering.append(key)
        keys.extend(recovering)
        return recovering

    def _report_recovered(self, won: list[Claim], proposed: int) -> None:
        ctx = self.ctx
        ctx.stats["recovered"] += len(won)
        if not won:
            logger.info(
                "singlebeat: replica %s proposed again %d slot(s) other replicas had won "
                "before the connection broke; the database still has each",
                ctx.replica_id,
                proposed,
            )
            return
        first = won[0]
        logger.warning(
            "singlebeat: replica %s won %d of the %d slot(s) other replicas had won before "
            "the connection broke (first %s@%s): the database no longer has their claims (a "
            "failover to a standby that lacked them?); sent with their task ids, so a copy "
            "of one its first claimer did publish is dropped by the worker",
            ctx.replica_id,
            len(won),
            proposed,
            first.entry,
            slot_text(first.slot_us),
            extra=batch_fields(decisions.RECOVERED, ctx.replica_id, len(won), first),
        )

    def _log_lost(self, lost: list[SlotKey]) -> None:
        me = self.ctx.replica_id
        for key in lost:
            text = slot_text(key.slot_us)
            logger.debug(
                "singlebeat: replica %s lost slot %s@%s to another replica",
                me,
                key.entry,
                text,
                extra=slot_fields(
                    decisions.LOST,
                    me,
                    key.entry,
                    key.slot_us,
                    slot_task_id(key.entry, key.slot_us),
                    text=text,
                ),
            )

    def _refused_as_early(self, refused: list[SlotKey], planned_now_us: int) -> set[SlotKey]:
        """The not-won slots that are still in the future: proposed again when due.

        The claim refuses slots more than :data:`EARLY_TOLERANCE_US` ahead of the
        database's clock, and its round trip has just corrected our estimate of
        that clock. A not-won slot still in the future was refused as early, or
        won by a replica that ran ahead within the tolerance (proposing it again
        then simply loses it). Only a slot beyond the tolerance proves that our
        estimate ran ahead (a clock step): that is worth a WARNING; the rest,
        a few ms of estimate error or another replica's early win, is DEBUG.
        """
        ctx = self.ctx
        now_us = ctx.connected_store.clock.now_us()
        early = {key for key in refused if key.slot_us > now_us}
        if not early:
            return early
        stepped = any(key.slot_us > now_us + EARLY_TOLERANCE_US for key in early)
        if stepped:
            logger.warning(
                "singlebeat: replica %s proposed %d slot(s) before they were due on the "
                "database's clock (its clock stepped? it ran %.3fs ahead); proposing them "
                "again when due",
                ctx.replica_id,
                len(early),
                (planned_now_us - now_us) / US,
                extra=self._early_fields(early),
            )
        elif logger.isEnabledFor(logging.DEBUG):
            logger.debug(
                "singlebeat: replica %s did not win %d slot(s) not yet due on the database's "
                "clock (won early by another replica, within the %d ms tolerance, or its "
                "own clock estimate moved back); proposing them again when due",
                ctx.replica_id,
                len(early),
                EARLY_TOLERANCE_US // 1000,
                extra=self._early_fields(early),
            )
        return early

    def _early_fields(self, early: set[SlotKey]) -> dict[str, object]:
        first = min(early, key=lambda key: (key.slot_us, key.entry))
        return batch_fields(decisions.EARLY, self.ctx.replica_id, len(early), first)
