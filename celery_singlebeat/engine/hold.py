"""The failover hold: after a broken connection, write again what this
replica sent and hold fallback proposals and sweeps while the others do.

The database answering after a break may be a promoted standby that lacks
the last commits (:mod:`..failover`). So the replica writes its recently
confirmed slots again (and those published but never recorded), and for a
sweep interval and a margin proposes nothing it is not first for and takes
nothing over: a slot another replica sent, whose row the database lost, is
about to be written again by that replica. The slots the hold keeps back are
judged on time or late as of the hold's start, not its end. When the hold
ends, the slots this replica saw another replica win during the failover
window are proposed again (:meth:`Hold.recovery`): by then every live
replica has written back what it sent, so only the claims of a replica that
could not (it died or stalled) are won, and sent.
"""

from __future__ import annotations

import logging

from ..observe import decisions
from ..observe.decisions import batch_fields
from ..store.base import Claim, SlotKey
from ..store.journal import Journal, SentJournal, hold_seconds
from ..timeline.clock import US, slot_text
from ..timeline.slots import KeptSpan
from .context import ReplicaContext

logger = logging.getLogger("celery_singlebeat.scheduler")


class Hold:
    """What a replica remembers across broken connections."""

    def __init__(self, ctx: ReplicaContext) -> None:
        self.ctx = ctx
        #: the slots confirmed lately, written again after a broken connection
        self.journal = SentJournal(ctx.settings.failover_window.total_seconds())
        #: the slots this replica proposed lately and another replica won
        self.won_elsewhere: Journal[SlotKey] = Journal(ctx.settings.failover_window.total_seconds())
        #: of those, the ones to propose again once the hold ends (what the
        #: journal held at the last break), oldest first
        self.recover: list[SlotKey] = []
        #: the store's interruption count last acted on (None: never
        #: connected, nothing to write again)
        self._seen: int | None = None
        #: until when (monotonic) fallback proposals and sweeps wait for the
        #: other replicas to write what they sent
        self.until = 0.0
        #: when that hold began, on the database's clock: the fallback
        #: proposals it delayed are judged late or on time as of then
        #: (judged_at), not as of its end
        self._since_us: int | None = None
        #: spans of slots a hold kept back until the connection broke again
        #: before they were proposed: judged as of that hold's start, however
        #: long the break (slots.plan_due's ``kept``)
        self.kept: list[KeptSpan] = []
        #: whether the last tick reached the database (the next failure is
        #: then a new break), and the database's clock when it began
        self.answering = False
        self.tick_us: int | None = None

    @property
    def seconds(self) -> float:
        return hold_seconds(self.ctx.sweep_every)

    def holding(self, monotonic: float) -> bool:
        return monotonic < self.until

    def released_unsent(self, keys: list[SlotKey], monotonic: float) -> None:
        """Remember slots this replica claimed and released unsent (the
        broker down, the lease out) for the recovery, as slots another replica
        won are: a failover to a standby that lacked the claim loses the row
        with it, and no replica then holds the slot to take it over. Proposed
        again after the break, the claim wins it only where no row says
        another replica has it (the explorer's seed 201)."""
        self.won_elsewhere.add(keys, monotonic)

    def recovery(self, monotonic: float, limit: int) -> list[SlotKey]:
        """Up to ``limit`` of the slots to propose again, once the hold has
        ended (the rest wait for the next tick); none while it holds.

        A slot another replica won has a row in the database unless the
        failover lost it; by the hold's end each live replica has written back
        what it sent, so the claim refuses those and wins only the rows of a
        claimer that could not write them (it died or stalled just before
        the failover). Without this, such a slot was never proposed again:
        every replica had planned past it (issue 30; the chaos run lost one so
        at seed 8)."""
        if not self.recover or self.holding(monotonic):
            return []
        keys, self.recover = self.recover[:limit], self.recover[limit:]
        return keys

    def interrupted(self) -> bool:
        """Whether the store's connection broke since this replica last acted on it."""
        return self._seen != self.ctx.connected_store.interruptions

    def first_connection(self) -> bool:
        """True (once) at the first connection: nothing sent yet, nobody to wait for."""
        if self._seen is not None:
            return False
        self._seen = self.ctx.connected_store.interruptions
        return True

    def judged_at(self, now_us: int) -> int | None:
        """The instant proposals are judged on time or late at, when the hold
        after a broken connection delayed them: its start, for the sweep
        interval after its end (they go out as it ends, a busy tick later at
        most); else None (now). The entries this replica proposes first are
        judged so too: one dealt to it anew during the hold (its first replica
        stopped) carries the slots the hold kept back as a fallback.

        Without it, the share of a replica that died or stalled (whose
        entries only fallbacks propose), due during the hold (7 s by default),
        would be more than the grace (5 s) late when the hold ends, and the
        missed-run policy would drop it: runs lost to a wait of our own
        making. Measured so in the chaos run with a failover (11 slots of a
        killed or paused replica's share) before this.
        """
        since = self._since_us
        if since is None:
            return None
        bound_us = int((self.seconds + self.ctx.sweep_every) * US)
        return since if now_us <= since + bound_us else None

    def broke(self) -> None:
        """A statement failed after a tick that reached the database: the
        connection broke (a restart, an outage, a failover). If a hold was
        keeping fallback proposals back, the slots it kept until now were
        delayed by this replica, not by the break: they stay judged as of the
        hold's start (``kept``) after the reconnect, however long the break and
        whatever hold follows it. Without it, a restart's hold cut short by an
        outage (or a failover) dropped a dead or paused replica's share due in
        the hold, as missed: the chaos run lost 1 slot so on seed 2 and 6 on
        seed 6. Up to the start of the tick that met the break (or the hold's
        end, if that came first): not its last answer, since a replica that
        proposes nothing first may not have asked the database anything for a
        sweep interval and the slots held meanwhile were held by us; nor the
        failure itself, which may come after a reconnect window (2 s) or a
        statement timeout (15 s), slots of the break's own.
        """
        if not self.answering:
            return  # still the same break (an outage's retries)
        self.answering = False
        if self.ctx.store is None or self.tick_us is None:
            return
        at_us = self.tick_us
        judged_us = self.judged_at(at_us)
        if judged_us is None or (self.kept and self.kept[-1][1] >= judged_us):
            return
        hold_end_us = judged_us + int(self.seconds * US)
        self.kept.append((judged_us, min(at_us, hold_end_us)))

    def forget_kept(self, earliest_us: int | None) -> None:
        """Drop the spans of kept slots every entry has planned past
        (``earliest_us``: the earliest next slot of any tracked entry)."""
        self.kept = [s for s in self.kept if earliest_us is not None and s[1] >= earliest_us]

    def begin(self, unconfirmed: list[Claim], seen: int) -> None:
        """Write again what this replica sent lately (confirmed, and
        ``unconfirmed``: published, never recorded), then hold. ``seen``: the
        store's interruption count this acts on."""
        ctx = self.ctx
        store = ctx.connected_store
        confirmed = self.journal.recent()
        sent = confirmed + unconfirmed
        written = store.reassert(ctx.replica_id, sent) if sent else []
        self._seen = seen
        # every break: a restart or an outage loses nothing, and the claim
        # refuses what still has its row, at one statement per break
        self.recover = list(dict.fromkeys([*self.recover, *self.won_elsewhere.recent()]))
        self.until = ctx.env.monotonic() + self.seconds
        self._since_us = store.clock.now_us()
        # Only a confirm the database acknowledged and no longer has is a lost
        # write. One the break cut off (unconfirmed) never committed as far as
        # we know: recording it now is the confirm's retry, not a loss, and
        # counting it would raise the failover alarm after any cut connection.
        acknowledged = set(confirmed)
        again = [claim for claim in written if claim in acknowledged]
        if not again:
            logger.info(
                "singlebeat: replica %s reconnected to the database; its fallback proposals "
                "and sweeps wait %.1fs for the other replicas to write what they sent",
                ctx.replica_id,
                self.seconds,
            )
            return
        ctx.stats["lost_writes"] += len(again)
        ctx.telemetry.lost_writes(len(again))
        first = again[0]
        logger.error(
            "singlebeat: the database lost %d of the slots replica %s sent in the last %gs "
            "(first %s@%s): a failover to a standby that had not received them? Written "
            "again as sent; fallback proposals and sweeps wait %.1fs for the other replicas "
            "to write theirs",
            len(again),
            ctx.replica_id,
            self.journal.window_s,
            first.entry,
            slot_text(first.slot_us),
            self.seconds,
            extra=batch_fields(decisions.LOST_WRITES, ctx.replica_id, len(again), first),
        )
