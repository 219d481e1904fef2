"""Takeover: send the slots whose claim's lease ran out, and run-now requests.

A replica that dies (or stalls) between claim and confirm leaves a claimed
row; once its lease has run out, any replica's sweep takes it over at the
next fence and publishes it again with the same task id, which workers
deduplicate. An operator's run-now request is a row at fence 0 that the same
statement takes.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from ..observe import decisions
from ..observe.decisions import claim_fields, slot_fields
from ..store.base import Claim, SlotKey
from ..timeline.clock import slot_text
from ..timeline.slots import slot_task_id
from .context import ReplicaContext
from .ownership import HeldSlots

logger = logging.getLogger("celery_singlebeat.scheduler")


class Takeover:
    """Take over abandoned claims; tell a takeover from a claim won back."""

    def __init__(
        self, ctx: ReplicaContext, held: HeldSlots, read_up_to: Callable[[], int | None]
    ) -> None:
        self.ctx = ctx
        self.held = held
        #: the stored schedules' revision this replica has read up to
        #: (SourceWatch.read_up_to): the store refuses it a stored entry's
        #: slot whose entry has a write it has not read, made more than a
        #: second before the slot (SlotStore.take_over's ``seen``)
        self._read_up_to = read_up_to

    def take_over(self) -> tuple[list[Claim], float, set[SlotKey]]:
        """The claims taken, when the statement was sent (monotonic), and the
        keys another replica held before (the takeovers proper)."""
        ctx = self.ctx
        settings = ctx.settings
        started = ctx.env.monotonic()
        if self.held:
            self.held.forget_before(started - 2 * settings.retention.total_seconds())
        seen = self._read_up_to()
        store = ctx.connected_store
        claims = (
            store.take_over(ctx.replica_id, settings.lease_us, settings.takeover_batch)
            if seen is None  # a replica without stored schedules (and a store of before)
            else store.take_over(ctx.replica_id, settings.lease_us, settings.takeover_batch, seen)
        )
        taken: set[SlotKey] = set()
        if not claims:
            return claims, started, taken
        me = ctx.replica_id
        for claim in claims:
            text = slot_text(claim.slot_us)
            task_id = slot_task_id(claim.entry, claim.slot_us)
            if claim.fence == 1:
                # fence 0 -> 1: an operator's run-now request, not a replica's claim
                self.held.forget(claim.key)
                logger.info(
                    "singlebeat: replica %s claimed run-now request %s@%s (task id %s)",
                    me,
                    claim.entry,
                    text,
                    task_id,
                    extra=slot_fields(
                        decisions.RUN_NOW, me, claim.entry, claim.slot_us, task_id, 1, text=text
                    ),
                )
            elif self.held.taken_from_another(claim):
                taken.add(claim.key)
                logger.warning(
                    "singlebeat: replica %s took over slot %s@%s (task id %s, fence %d): "
                    "its previous owner did not confirm within the %gs lease",
                    me,
                    claim.entry,
                    text,
                    task_id,
                    claim.fence,
                    settings.lease.total_seconds(),
                    extra=claim_fields(decisions.TAKING_OVER, me, claim, task_id, text),
                )
            else:
                logger.info(
                    "singlebeat: replica %s took back slot %s@%s (task id %s, fence %d): "
                    "its own claim, which it had released or whose answer it had lost",
                    me,
                    claim.entry,
                    text,
                    task_id,
                    claim.fence,
                    extra=claim_fields(decisions.TAKING_BACK, me, claim, task_id, text),
                )
        ctx.stats["taken_over"] += len(taken)
        ctx.telemetry.claimed(claims)
        if taken:
            ctx.telemetry.taken_over([c for c in claims if c.key in taken])
        return claims, started, taken
