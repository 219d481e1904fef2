"""Sending: publish what this replica claimed, then confirm it in the store.

Claimed slots are handed to the broker in pipelined groups
(:mod:`..publishing`), each message with the slot's deterministic task id and
the slot in a header, then confirmed in one statement. Nothing is handed over
once the claim's lease may have run out (another replica may be taking the
slot over); what could not be sent is released for any replica to send; a
slot of an entry this replica does not have is left to one that has it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from celery.beat import _evaluate_entry_args, _evaluate_entry_kwargs
from kombu.exceptions import OperationalError as KombuOperationalError

from .. import signals
from ..exceptions import StoreUnavailable
from ..observe import decisions
from ..observe.decisions import batch_fields, claim_fields
from ..observe.telemetry import NOTHING
from ..sources import EntryDefinition
from ..store.base import Claim, SlotKey
from ..store.values import EARLY_TOLERANCE_US, STALE_DEFINITION_US
from ..timeline.clock import US, slot_text, us_to_datetime
from ..timeline.slots import SLOT_HEADER, slot_header, slot_task_id
from ..timeline.timing import PUBLISH_SHARE
from .agenda import Agenda
from .context import ReplicaContext
from .hold import Hold
from .ownership import HeldSlots
from .publishing import PublishGroup, skip_declared

logger = logging.getLogger("celery_singlebeat.scheduler")

_Item = tuple[Claim, EntryDefinition]


def is_connection_error(exc: BaseException, producer: Any) -> bool:
    """True when ``exc`` says the broker cannot be reached (not a bad message)."""
    if isinstance(exc, KombuOperationalError):
        return True
    connection = getattr(producer, "connection", None)
    errors = getattr(connection, "connection_errors", ())
    return bool(errors) and isinstance(exc, tuple(errors))


class Sending:
    """Publish and confirm claimed slots; keep what the store did not record."""

    def __init__(
        self,
        ctx: ReplicaContext,
        agenda: Agenda,
        held: HeldSlots,
        hold: Hold,
        app: Any,
        producer: Callable[[], Any],
        written_back: Callable[[list[Claim]], None],
    ) -> None:
        self.ctx = ctx
        self.agenda = agenda
        self.held = held
        self.hold = hold
        self.app = app
        self._producer = producer
        #: told which claims were confirmed: the change watch's
        #: (SourceWatch.written_back), for the sources that keep run counts
        self._written_back = written_back
        #: published but not recorded (an outage between publish and
        #: confirm): confirmed first thing when the database is back
        self.unconfirmed: list[Claim] = []
        self._broker_down = False
        self._warned_unknown: set[str] = set()

    def confirm_pending(self) -> None:
        """Confirm what an outage left unrecorded. Before any sweep: our own
        sweep would otherwise take over (and publish again) claims we
        published but could not record."""
        if self.unconfirmed:
            pending, self.unconfirmed = self.unconfirmed, []
            self.confirm(pending)

    def send(self, claims: list[Claim], claimed_at: float, taken_over: set[SlotKey]) -> None:
        """Publish and confirm ``claims``; ``taken_over``: keys another replica held.
        ``claimed_at``: the monotonic time just before the claim was sent."""
        if not claims:
            return
        ctx = self.ctx
        monotonic = ctx.env.monotonic
        # Stop publishing once our lease may have run out: another replica may be
        # taking the slot over, and two publishes would then race. Local monotonic
        # time, measured from *before* the claim was sent, is a safe upper bound.
        deadline = claimed_at + ctx.settings.lease.total_seconds() * PUBLISH_SHARE
        unknown: list[Claim] = []
        foreign: list[Claim] = []
        published: list[Claim] = []
        failed: list[Claim] = []
        expired: list[Claim] = []
        untried = 0
        first_untried: Claim | None = None
        producer = None
        group: PublishGroup[_Item] | None = None
        definitions = self.agenda.definitions
        self._broker_down = False
        try:
            for claim in claims:
                definition = definitions.get(claim.entry)
                if definition is None:
                    # A slot of an entry none of this replica's sources has (rolling
                    # restart, or an entry removed while its slot was in flight):
                    # held back for a replica that has it, also after a broker error
                    # or past the deadline, or it would bounce between sweeps.
                    unknown.append(claim)
                    continue
                if not self._of_definition(claim, definition):
                    foreign.append(claim)
                    continue
                if self._broker_down:
                    failed.append(claim)
                    untried += 1
                    first_untried = first_untried or claim
                    continue
                if monotonic() >= deadline:
                    expired.append(claim)
                    continue
                if producer is None:
                    producer = skip_declared(self._producer())
                    group = PublishGroup(producer)
                assert group is not None
                outcome = self._publish(
                    definition, claim, producer, deadline, claim.key in taken_over
                )
                if outcome is None:
                    expired.append(claim)
                elif outcome:
                    published.extend(
                        self._handed_over(group.added((claim, definition)), taken_over)
                    )
                else:
                    failed.append(claim)
                if group.full:
                    self._flush(group, deadline, published, failed, expired, taken_over)
            if group is not None:
                self._flush(group, deadline, published, failed, expired, taken_over)
        finally:
            if group is not None:
                group.close()
        if expired:
            logger.warning(
                "singlebeat: lease ran out before %d claimed slots were published "
                "(first %s@%s); releasing them for another replica to send",
                len(expired),
                expired[0].entry,
                slot_text(expired[0].slot_us),
                extra=batch_fields(decisions.EXPIRED, ctx.replica_id, len(expired), expired[0]),
            )
        if untried:
            logger.error(
                "singlebeat: broker unreachable; released %d claimed slots without trying "
                "them, for whichever replica reaches the broker first",
                untried,
                extra=batch_fields(decisions.UNTRIED, ctx.replica_id, untried, first_untried),
            )
        if failed or expired or unknown or foreign:
            self.held.released(failed + expired + unknown + foreign, monotonic())
        if failed or expired:
            # remembered for the recovery after a break (Hold.released_unsent)
            self.hold.released_unsent([c.key for c in failed + expired], monotonic())
            ctx.connected_store.release(ctx.replica_id, failed + expired)
        if unknown:
            self._leave_unknown(unknown)
        if foreign:
            self._leave_foreign(foreign)
        if not published:
            return
        ctx.stats["sent"] += len(published)
        self.confirm(published)

    def confirm(self, published: list[Claim]) -> None:
        ctx = self.ctx
        try:
            confirmed = ctx.connected_store.confirm(ctx.replica_id, published)
            self.hold.journal.add(confirmed, ctx.env.monotonic())
        except StoreUnavailable:
            # Published but not recorded: keep them and confirm first thing when
            # the database is back. Fences make that safe, and if our lease ran
            # out meanwhile the taker re-publishes with the same task id.
            self.unconfirmed.extend(published)
            raise
        if confirmed:
            self._written_back(confirmed)
        if len(confirmed) < len(published):
            ok = set(confirmed)
            for claim in published:
                if claim not in ok:
                    text = slot_text(claim.slot_us)
                    task_id = slot_task_id(claim.entry, claim.slot_us)
                    logger.warning(
                        "singlebeat: slot %s@%s was taken over before replica %s confirmed "
                        "its publish; it is published again with the same task id %s",
                        claim.entry,
                        text,
                        ctx.replica_id,
                        task_id,
                        extra=claim_fields(
                            decisions.TAKEN_BEFORE_CONFIRM, ctx.replica_id, claim, task_id, text
                        ),
                    )

    def _of_definition(self, claim: Claim, definition: EntryDefinition) -> bool:
        """False for a slot claimed under the definition ``definition``
        replaced and taken over by this replica, which has the new one: due
        after the commit, within the second in which a claim may still go
        under the replaced definition (SlotStore.claim refuses it from then
        on, so no such slot lies later), and no instant of the new one. Sent
        under the new definition it would be no slot of either (the
        explorer's seed 15). A slot at or before the commit is of an earlier
        version, in force at its instant, and goes out under the sender's
        definition (docs/guarantees.md, "Stored schedules"). A first claim
        (fence 1: proposed from this definition, or an operator's run-now
        request, whose instant is on no grid) is not judged."""
        since = definition.since_us
        if (
            since is None
            or claim.fence <= 1
            or not since < claim.slot_us <= since + STALE_DEFINITION_US + EARLY_TOLERANCE_US
        ):
            return True
        entry = self.agenda.tracked.get(claim.entry)
        return entry is None or entry.sequence.next_after(claim.slot_us - 1) == claim.slot_us

    def _leave_foreign(self, claims: list[Claim]) -> None:
        """Hold back slots no replica should send under the definition in
        force, as slots of an unknown entry are: released for the retention
        (a replica that still has the replaced definition may send them only
        within a second of the commit, and the claim's check is what holds
        that), visible in the slots table until an operator clears them."""
        ctx = self.ctx
        retry_in_us = ctx.settings.retention_us
        ctx.connected_store.release(ctx.replica_id, claims, retry_in_us)
        first = claims[0]
        logger.warning(
            "singlebeat: replica %s holds %d slot(s) that are no instant of the definition "
            "it has (first %s@%s), due after that definition's commit: claimed under the one "
            "it replaced; not sent, left claimed (retry in %gs)",
            ctx.replica_id,
            len(claims),
            first.entry,
            slot_text(first.slot_us),
            retry_in_us / US,
            extra=batch_fields(decisions.NOT_OF_DEFINITION, ctx.replica_id, len(claims), first),
        )

    def _leave_unknown(self, claims: list[Claim]) -> None:
        """Hand back slots of entries this replica cannot publish, for a while.

        A replica that has the entry (an older version during a rolling restart)
        takes them over; released at once they would bounce between sweeps of
        replicas that cannot send them. A slot nobody can send stays claimed and
        is visible in the slots table (docs/operations.md says how to clear it).
        """
        ctx = self.ctx
        retry_in_us = ctx.settings.retention_us
        ctx.connected_store.release(ctx.replica_id, claims, retry_in_us)
        for name in sorted({c.entry for c in claims} - self._warned_unknown):
            self._warned_unknown.add(name)
            mine = [c for c in claims if c.entry == name]
            logger.warning(
                "singlebeat: replica %s holds slot(s) of entry %r, which is not in its "
                "beat_schedule or any other of its entry sources; leaving them to a "
                "replica that has it (retry in %gs)",
                ctx.replica_id,
                name,
                retry_in_us / US,
                extra=batch_fields(decisions.UNKNOWN_ENTRY, ctx.replica_id, len(mine), mine[0]),
            )

    def _publish(
        self,
        definition: EntryDefinition,
        claim: Claim,
        producer: Any,
        deadline: float,
        taken_over: bool,
    ) -> bool | None:
        """Publish one claimed slot: True when sent, False when publishing failed,
        None when the lease may have run out first (nothing was sent).
        ``taken_over``: another replica held the slot before us."""
        ctx = self.ctx
        task_id = slot_task_id(claim.entry, claim.slot_us)
        if signals.slot_claimed.receivers:
            signals.slot_claimed.send(
                sender=ctx.signal_sender,
                entry=claim.entry,
                slot=us_to_datetime(claim.slot_us),
                task_id=task_id,
                fence=claim.fence,
                taken_over=taken_over,
            )
        options = dict(definition.options)
        headers = dict(options.pop("headers", None) or {})
        headers["celery_beat_task"] = True
        headers[SLOT_HEADER] = slot_header(claim.entry, claim.slot_us)
        options.pop("task_id", None)
        try:
            args = _evaluate_entry_args(definition.args)
            kwargs = _evaluate_entry_kwargs(definition.kwargs)
            # Checked again as late as possible: slot_claimed receivers and the
            # argument evaluation above take time, and a process stalled in
            # between (GC pause, SIGSTOP, slow hook) may have lost the slot to a
            # takeover that is publishing it right now.
            if ctx.env.monotonic() >= deadline:
                return None
            task = self.app.tasks.get(definition.task)
            if task is not None:
                task.apply_async(
                    args, kwargs, producer=producer, task_id=task_id, headers=headers, **options
                )
            else:
                self.app.send_task(
                    definition.task,
                    args,
                    kwargs,
                    producer=producer,
                    task_id=task_id,
                    headers=headers,
                    **options,
                )
        except Exception as exc:
            if is_connection_error(exc, producer):
                # The broker, not this message: the rest of the batch would fail
                # the same way, each after kombu's publish retries.
                self._broker_down = True
            text = slot_text(claim.slot_us)
            logger.exception(
                "singlebeat: publishing slot %s@%s (task %s) failed; releasing the claim "
                "so that a replica sends it again",
                claim.entry,
                text,
                definition.task,
                extra=claim_fields(decisions.PUBLISH_FAILED, ctx.replica_id, claim, task_id, text),
            )
            ctx.telemetry.publish_failed([claim])
            return False
        return True

    def _flush(
        self,
        group: PublishGroup[_Item],
        deadline: float,
        published: list[Claim],
        failed: list[Claim],
        expired: list[Claim],
        taken_over: set[SlotKey],
    ) -> None:
        """Hand the buffered messages to the broker, if our lease still allows it."""
        if not group.pipelined:
            return
        if self.ctx.env.monotonic() >= deadline:
            # Same rule as for one message: never hand one over once the lease
            # may be another replica's. Nothing of the group has left.
            expired.extend(claim for claim, _ in group.discard())
            return
        try:
            published.extend(self._handed_over(group.flush(), taken_over))
        except Exception:
            # The pipeline may have run in part: these messages are uncertain.
            # Released, they are sent again with the same task ids by whichever
            # replica takes them over; the rest of the batch is not tried.
            uncertain = [claim for claim, _ in group.discard()]
            logger.exception(
                "singlebeat: handing %d messages to the broker failed (delivery "
                "uncertain); releasing them so that a replica sends them again",
                len(uncertain),
                extra=batch_fields(
                    decisions.UNCERTAIN,
                    self.ctx.replica_id,
                    len(uncertain),
                    uncertain[0] if uncertain else None,
                ),
            )
            failed.extend(uncertain)
            self.ctx.telemetry.publish_failed(uncertain)
            self._broker_down = True

    def _handed_over(self, done: list[_Item], taken_over: set[SlotKey]) -> list[Claim]:
        """Log and signal messages that reached the broker; returns their claims.
        ``taken_over``: keys another replica held before us."""
        ctx = self.ctx
        # Every message of the group is in the broker already: log them all before
        # any slot_published receiver runs (it may stall, or the process die).
        if done and ctx.telemetry is not NOTHING:
            ctx.telemetry.sent([claim for claim, _ in done], ctx.connected_store.clock.now_us())
        # The hot path (one line per slot sent, 10,000 a second at full load):
        # with INFO off nothing of it runs, and the fields reuse the message's values.
        if logger.isEnabledFor(logging.INFO):
            me = ctx.replica_id
            for claim, definition in done:
                text = slot_text(claim.slot_us)
                task_id = slot_task_id(claim.entry, claim.slot_us)
                took_over = claim.key in taken_over
                logger.info(
                    "singlebeat: replica %s %s slot %s@%s: sent %s (task id %s)",
                    me,
                    "took over" if took_over else "won",
                    claim.entry,
                    text,
                    definition.task,
                    task_id,
                    extra=claim_fields(
                        decisions.TOOK_OVER if took_over else decisions.WON,
                        me,
                        claim,
                        task_id,
                        text,
                    ),
                )
        if signals.slot_published.receivers:
            for claim, _ in done:
                signals.slot_published.send(
                    sender=ctx.signal_sender,
                    entry=claim.entry,
                    slot=us_to_datetime(claim.slot_us),
                    task_id=slot_task_id(claim.entry, claim.slot_us),
                    fence=claim.fence,
                    taken_over=claim.key in taken_over,
                )
        return [claim for claim, _ in done]
