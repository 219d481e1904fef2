"""What :class:`~.operator.Operator` answers in: one named tuple per answer,
and the words its states are named by.

Plain values, so that a reader (the CLI's tables and ``--json``, a script)
needs no connection to use them. Instants are integer microseconds since the
Unix epoch, UTC, on the database's clock.
"""

from __future__ import annotations

from typing import NamedTuple

from ..values import Pause
from .fleet import FleetPruned

#: a slot this long past due that no replica claimed is *overdue*: a replica
#: claims a due slot within its tick (milliseconds), one that is not the
#: entry's first proposer 250 ms later, so two seconds is far beyond normal
DUE_SLACK_US = 2_000_000

#: slot states as :meth:`.Operator.history` and :meth:`.Operator.status` name them
CLAIMED, SENT, ABANDONED, REQUESTED = "claimed", "sent", "abandoned", "requested"

#: replica states
LIVE, STOPPED, LOST = "live", "stopped", "lost"

#: lease states
HELD, EXPIRED, RELEASED = "held", "expired", "released"


class EntryStatus(NamedTuple):
    """One registered entry as the fleet sees it."""

    name: str
    #: the task, from the catalog row of a live replica (of the greatest id,
    #: should live replicas differ: a rolling deploy), else of any replica; None
    #: when no replica row lists the entry (removed from beat_schedule, or
    #: registered by a release that publishes no catalog)
    task: str | None
    #: the schedule as a person reads it ("every 10s", "crontab(...) Europe/Paris")
    schedule: str | None
    #: how many live replicas have the entry
    replicas: int
    #: the next slot the fleet will send (None: unknown, see ``next_known``)
    next_slot_us: int | None
    #: the first slot after the last claimed one, when it fell due more than
    #: :data:`DUE_SLACK_US` ago and the entry is not paused: no replica claimed
    #: it (none has the entry, none reaches the database, or the slot was
    #: dropped: missed-run policy ``skip``, or it fell in a pause). None otherwise
    overdue_slot_us: int | None
    #: False when only the replicas can compute the slots (a custom
    #: schedule, an unknown spec) or no catalog lists the entry
    next_known: bool
    #: the latest slot claimed (its row, or the high-water mark once pruned)
    last_slot_us: int | None
    #: state of that slot's row (None once pruned): claimed, sent, abandoned, requested
    last_state: str | None
    #: the latest sent slot still kept, who sent it and how late (sent - slot)
    last_sent_slot_us: int | None
    last_sender: str | None
    last_delay_us: int | None
    #: the pause in force for this entry: its own, else the pause of all ("*")
    pause: Pause | None


class ReplicaStatus(NamedTuple):
    """One replica row, and whether it is live."""

    id: str
    host: str
    pid: int
    version: str
    started_us: int
    #: the database's clock at its last heartbeat
    seen_us: int
    #: its estimate of the database's clock at its last loop
    loop_us: int
    #: database clock minus its own clock
    offset_us: int
    tracked: int
    proposes_first: int
    heartbeat_us: int
    stopped_us: int | None
    #: live, stopped (a graceful stop) or lost (not seen for
    #: LIVE_HEARTBEATS heartbeats plus LIVE_SLACK_US)
    state: str
    #: the id of the catalog it published (a digest of its entries; replicas
    #: of one release share it), None before its first heartbeat
    catalog: str | None = None
    #: slots it had sent that the database lacked after a broken connection
    #: (a failover lost them) and that it wrote again, since it started
    lost_writes: int = 0

    @property
    def share(self) -> float | None:
        """The part of its entries it proposes first (None: it tracks none)."""
        return self.proposes_first / self.tracked if self.tracked else None


class Status(NamedTuple):
    """The answer of :meth:`.Operator.status`."""

    now_us: int
    #: every registered entry, the next due first (unknown next slots last)
    entries: list[EntryStatus]
    replicas: list[ReplicaStatus]
    #: the pauses in force
    pauses: list[Pause]


class HistoryRow(NamedTuple):
    """One slot row (a run claimed, sent, abandoned or requested)."""

    entry: str
    slot_us: int
    #: claimed, sent, abandoned (claimed, its lease ran out), requested (a
    #: run-now no replica took yet)
    state: str
    #: the replica holding the claim (claimed, abandoned); None otherwise
    holder: str | None
    #: the replica that sent it (sent); None otherwise
    sender: str | None
    #: 1 for a first claim, higher each time the row changed hands; 0 for a
    #: request not taken yet. Only the last owner is kept.
    fence: int
    lease_until_us: int
    claimed_us: int
    sent_us: int | None
    #: sent_us - slot_us
    delay_us: int | None
    #: the task id every publish of this slot uses
    task_id: str
    #: who asked for this run (a run-now request), when and why
    requested_by: str | None
    request_reason: str | None
    requested_us: int | None


class LeaseStatus(NamedTuple):
    """One SingletonTask key's lease row."""

    key: str
    #: the worker that holds it, or held it last
    holder: str
    token: int
    #: 0 once released
    expires_us: int
    acquired_us: int
    #: held, expired, released
    state: str


class PauseResult(NamedTuple):
    """The answer of :meth:`.Operator.pause`."""

    pauses: list[Pause]
    controls_version: int


class ResumeResult(NamedTuple):
    """The answer of :meth:`.Operator.resume`."""

    #: names whose pause row was deleted
    resumed: list[str]
    #: names that had no pause row
    not_paused: list[str]
    #: the pause of all entries, when it is still in force after this resume
    #: (the resumed entries stay paused by it)
    still_paused_by: Pause | None
    controls_version: int
    #: the database's clock in the transaction
    now_us: int


class RunNowResult(NamedTuple):
    """The answer of :meth:`.Operator.run_now`: the slot a replica will send."""

    entry: str
    slot_us: int
    task_id: str
    requested_by: str
    reason: str
    requested_us: int
    controls_version: int


class PruneReport(NamedTuple):
    """Rows :meth:`.Operator.prune` deleted."""

    slots: int
    singleton_rows: int
    fleet: FleetPruned
