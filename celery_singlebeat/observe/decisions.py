"""The decisions made about a slot, each named once, and the log record fields that carry them.

Every log line that reports a decision about a slot (the scheduler's: won,
took over, lost, released...; a SingletonTask's: started, dropped as a
repeat, busy...) passes these fields as record attributes (``extra=``), so a
JSON formatter ships them as fields and a plain ``logging.Formatter`` can
name them (``%(entry)s``). The words are stable: alerts, log queries and,
later, metrics labels may rely on them. docs/operations.md ("Log records")
lists which line carries which word.

A record about one slot carries :data:`SLOT_FIELDS` (``fence`` where known);
a record that covers several slots (a batch) carries ``count`` and, for the
first of them, ``entry``, ``slot`` and ``slot_us``, never per-slot fields such
as ``task_id``. None of the names is an attribute a ``LogRecord`` has of its
own (``logging`` would refuse it).
"""

from __future__ import annotations

from typing import Final

from ..store.base import Claim, SlotKey

# re-exported: the engine and SingletonTask name a slot in their lines with it
from ..timeline.clock import slot_text

# -- the scheduler (logger celery_singlebeat.scheduler) ------------------------

#: a slot this replica claimed (new, or its own claim won back) was sent
WON: Final = "won"
#: a slot another replica had held was sent by this one
TOOK_OVER: Final = "took_over"
#: a sweep claimed a slot whose owner let its lease run out unconfirmed
TAKING_OVER: Final = "taking_over"
#: a sweep claimed back one of this replica's own abandoned claims
TAKING_BACK: Final = "taking_back"
#: a sweep claimed an operator's run-now request (``singlebeat run``) to send it
RUN_NOW: Final = "run_now"
#: slots refused because their entry is paused (DEBUG)
PAUSED: Final = "paused"
#: another replica won the slot (DEBUG)
LOST: Final = "lost"
#: slots refused because they were not yet due on the database's clock (batch)
EARLY: Final = "early"
#: the publish deadline passed before these claimed slots were sent; released (batch)
EXPIRED: Final = "expired"
#: publishing one slot failed; released
PUBLISH_FAILED: Final = "publish_failed"
#: the broker was down: the rest of the batch was released untried (batch)
UNTRIED: Final = "untried"
#: a pipelined group's flush failed, its delivery is uncertain; released (batch)
UNCERTAIN: Final = "uncertain"
#: a published slot was taken over before its confirm: a repeat is on the broker
TAKEN_BEFORE_CONFIRM: Final = "taken_before_confirm"
#: slots of an entry this replica's beat_schedule lacks, held back for a replica that has it
UNKNOWN_ENTRY: Final = "unknown_entry"
#: slots taken over that are no instant of the definition this replica has,
#: due after its commit (the claimer had the one it replaced): held back (batch)
NOT_OF_DEFINITION: Final = "not_of_definition"
#: missed slots the missed-run policy dropped (batch: ``count``, first and last slot)
SKIPPED: Final = "skipped"
#: after a broken connection, the database lacked slots this replica had sent
#: (a failover to a standby that had not received them): written again
LOST_WRITES: Final = "lost_writes"
#: after a broken connection, slots another replica had won were proposed
#: again and won: the database had lost their claims (batch)
RECOVERED: Final = "recovered"

# -- SingletonTask (logger celery_singlebeat.singleton) ------------------------

#: a worker started a slot's execution (DEBUG)
RUN_STARTED: Final = "run_started"
#: a repeated delivery of a slot that already ran, or is running, was dropped
REPEAT_DROPPED: Final = "repeat_dropped"
#: the singleton key was held: skipped, retried later, or failed with SingletonBusy
BUSY_SKIPPED: Final = "busy_skipped"
BUSY_RETRY: Final = "busy_retry"
BUSY_RAISED: Final = "busy_raised"
#: the execution lost its singleton key (heartbeat)
LEASE_LOST: Final = "lease_lost"
#: another start took the slot's run row from this execution
RUN_TAKEN: Final = "run_taken"
#: the broker did not take a retry's message: it is published again (WARNING)
RETRY_UNPUBLISHED: Final = "retry_unpublished"
#: ... until ``singleton_broker_patience`` ran out: the message is dropped (ERROR)
RETRY_DROPPED: Final = "retry_dropped"

#: the fields of a record about one slot (``fence`` only where it is known)
SLOT_FIELDS: Final = ("decision", "replica", "entry", "slot", "slot_us", "task_id", "fence")

#: every field a decision's record may carry: SLOT_FIELDS, ``count`` on a batch,
#: ``last_slot``/``last_slot_us`` on ``skipped``, the singleton ``key`` on a
#: SingletonTask's records
FIELDS: Final = (*SLOT_FIELDS, "count", "last_slot", "last_slot_us", "key")


def slot_fields(
    decision: str,
    replica: str,
    entry: str,
    slot_us: int,
    task_id: str | None,
    fence: int | None = None,
    *,
    text: str | None = None,
) -> dict[str, object]:
    """The ``extra`` of a record about one slot. ``text``: ``slot_text(slot_us)``
    when the caller has it already (the per-slot INFO line formats it once)."""
    fields: dict[str, object] = {
        "decision": decision,
        "replica": replica,
        "entry": entry,
        "slot": slot_text(slot_us) if text is None else text,
        "slot_us": slot_us,
        "task_id": task_id,
    }
    if fence is not None:
        fields["fence"] = fence
    return fields


def claim_fields(
    decision: str, replica: str, claim: Claim, task_id: str, text: str
) -> dict[str, object]:
    """:func:`slot_fields` of a claimed slot: its entry, instant and fence."""
    return slot_fields(
        decision, replica, claim.entry, claim.slot_us, task_id, claim.fence, text=text
    )


def batch_fields(
    decision: str, replica: str, count: int, first: SlotKey | Claim | None
) -> dict[str, object]:
    """The ``extra`` of a record about ``count`` slots; ``first``: the first
    of them, when the line names one."""
    fields: dict[str, object] = {"decision": decision, "replica": replica, "count": count}
    if first is not None:
        fields["entry"] = first.entry
        fields["slot"] = slot_text(first.slot_us)
        fields["slot_us"] = first.slot_us
    return fields


def run_fields(
    decision: str,
    owner: str,
    task_id: str,
    key: str,
    slot: tuple[str, int] | None,
    token: int | None = None,
) -> dict[str, object]:
    """The ``extra`` of a SingletonTask's record: ``replica`` is the worker's
    owner id, ``fence`` the lease's token (when it holds one), and the slot
    fields only for a message the scheduler sent (``slot``: entry, slot_us)."""
    if slot is not None:
        fields = slot_fields(decision, owner, slot[0], slot[1], task_id, token)
    else:
        fields = {"decision": decision, "replica": owner, "task_id": task_id}
        if token is not None:
            fields["fence"] = token
    fields["key"] = key
    return fields
