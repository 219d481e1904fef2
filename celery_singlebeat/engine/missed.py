"""Reporting the slots the missed-run policy did not send.

The policy itself is slot maths (:class:`..slots.MissedPolicy`,
:func:`..slots.plan_due`); this is what a replica tells about its decision:
a WARNING naming the entry, its source, the slots and the policy, the
``slots_skipped`` signal and the skipped counter.
"""

from __future__ import annotations

import logging

from .. import signals
from ..observe import decisions
from ..observe.decisions import batch_fields
from ..store.base import SlotKey
from ..timeline.clock import US, slot_text, us_to_datetime
from ..timeline.slots import MissedPolicy
from .context import ReplicaContext

logger = logging.getLogger("celery_singlebeat.scheduler")


def report_skipped(
    ctx: ReplicaContext,
    name: str,
    count: int,
    first_us: int | None,
    last_us: int | None,
    policy: MissedPolicy,
) -> None:
    """Tell that ``count`` slots of ``name``, ``first_us`` to ``last_us``, were not sent."""
    ctx.stats["skipped"] += count
    ctx.telemetry.skipped(name, count)
    fields = batch_fields(
        decisions.SKIPPED,
        ctx.replica_id,
        count,
        SlotKey(name, first_us) if first_us else None,
    )
    fields["entry"] = name
    if last_us:
        fields["last_slot"] = slot_text(last_us)
        fields["last_slot_us"] = last_us
    logger.warning(
        "singlebeat: %s: %d missed slot(s) %s..%s not sent (missed-run policy %s, grace %gs)",
        name,
        count,
        fields.get("slot", "?"),
        fields.get("last_slot", "?"),
        policy.mode,
        policy.grace_us / US,
        extra=fields,
    )
    if signals.slots_skipped.receivers:
        signals.slots_skipped.send(
            sender=ctx.signal_sender,
            entry=name,
            count=count,
            first=us_to_datetime(first_us) if first_us else None,
            last=us_to_datetime(last_us) if last_us else None,
        )
