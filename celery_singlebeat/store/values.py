"""The value types every storage contract speaks in, and the constants they share.

Slot keys and claims (:mod:`.slot_store`), replica rows, catalog entries and
pauses (:mod:`.fleet_store`), SingletonTask's leases and runs
(:mod:`.singleton_store`), stored schedules' rows, writes, feed and log
(:mod:`.schedule_store`). The vocabulary (slot row, claim, lease, fence,
high-water mark, token, run) is defined once, in :mod:`.base`. Instants are
microseconds since the Unix epoch, UTC, on the database's clock.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import Enum
from types import MappingProxyType
from typing import Any, NamedTuple

from ..timeline import timing

#: How far ahead of the database's clock a slot may be claimed. Replicas
#: estimate that clock to within half a round trip; this absorbs the estimate's
#: error while refusing a replica whose clock stepped forward.
EARLY_TOLERANCE_US = 250_000

#: a slot of a stored entry is refused when the claimer's definition was
#: replaced (edited, disabled, deleted) this long before the database's now:
#: replicas read the change feed every 0.9 s, so a replica still claiming under
#: an older definition after this is one that has not read it (SlotStore.claim)
STALE_DEFINITION_US = 1_000_000


class Written(NamedTuple):
    """Which write of a stored entry a definition came from: the revision the
    write took and the database's instant of it (microseconds since the epoch).

    The revision alone does not name one definition: a standby promoted
    without the last writes counts revisions on from below them, so the next
    write takes a number a lost one had. Two writes share both the number and
    the microsecond only if the promoted standby's clock reads, at its write,
    the very microsecond the lost write was stamped with.
    """

    revision: int
    at_us: int


class StalledRuns(NamedTuple):
    """Which sent slots :meth:`.SlotStore.take_over` sends again because the
    SingletonTask run of the slot stalled: its worker died mid-run (docs/guarantees.md).

    A sent slot whose run row is still running, with its expiry lapsed by
    more than the grace and no outcome, is taken over while the run has
    started at most ``resends`` times (its ``attempts``): each start that
    died earns one more send, so a task that kills its worker every time
    starts ``resends + 1`` times in all, then its slot is left alone. 0 turns
    the re-sends off. Only slots and runs younger than ``window_us`` (the
    slots' retention) are looked at.
    """

    #: ``singlebeat_stalled_run_resends``
    resends: int = 2
    #: ``singlebeat_retention``, in microseconds
    window_us: int = 900 * 1_000_000


class SlotKey(NamedTuple):
    """One run of one entry: the entry's name and the slot instant."""

    entry: str
    slot_us: int


class Claim(NamedTuple):
    """A slot this replica holds; ``fence`` proves which hand-over it won."""

    entry: str
    slot_us: int
    fence: int

    @property
    def key(self) -> SlotKey:
        return SlotKey(self.entry, self.slot_us)

    @property
    def taken_over(self) -> bool:
        """True when the row changed hands before this claim (``fence > 1``).

        That is a takeover from another replica (it died, stalled or released
        the slot), or the same owner winning its own claim again: a retry after
        the answer to its claim was lost, or a slot it had released. Stores do
        not record previous owners, so this cannot tell the two apart; the
        scheduler does, from the claims it knows it may still hold.
        """
        return self.fence > 1


class EntryState(NamedTuple):
    """What the database knows about an entry."""

    name: str
    #: instant the entry was first registered: interval slots count from here.
    anchor_us: int
    #: latest slot any replica claimed (None: never run).
    last_slot_us: int | None


class ReplicaInfo(NamedTuple):
    """What a replica records about itself with each heartbeat."""

    id: str
    host: str
    pid: int
    #: the celery-singlebeat release it runs
    version: str
    #: when the process started (database clock)
    started_us: int
    #: its estimate of the database clock at its last loop
    loop_us: int
    #: how far its own clock runs from the database's (database minus local)
    offset_us: int
    #: entries it tracks, and how many of those it proposes first (sharing.py)
    tracked: int
    proposes_first: int
    #: how often it sends a heartbeat (its sweep period)
    heartbeat_us: int
    #: slots it had sent that the database lacked after a broken connection
    #: (a failover lost them), written again; since the process started
    lost_writes: int = 0


class CatalogEntry(NamedTuple):
    """One entry as a replica has it (see :mod:`celery_singlebeat.engine.catalog`)."""

    entry: str
    task: str
    #: the schedule as a person reads it
    schedule: str
    #: JSON from which a reader rebuilds the slot sequence
    spec: str


class Pause(NamedTuple):
    """A paused entry (``"*"``: every entry), and who paused it, when and why."""

    entry: str
    #: the pause ends by itself at this instant (None: until resumed)
    until_us: int | None
    by: str
    reason: str
    at_us: int


#: the ``entry`` of a pause of every entry
PAUSE_ALL = "*"

#: a replica is live while its row is not stopped and was seen within
#: LIVE_HEARTBEATS heartbeat periods plus LIVE_SLACK_US (timing.py, which the
#: health probes' readiness bound shares; the rule: membership.replica_live)
LIVE_HEARTBEATS = timing.LIVE_HEARTBEATS
LIVE_SLACK_US = timing.LIVE_SLACK_US

#: the meta row whose value every control change raises by one
CONTROLS_KEY = "controls"


def controls_channel(prefix: str) -> str:
    """The PostgreSQL NOTIFY channel of a control change, for a table prefix."""
    return f"{prefix}controls"


class Lease(NamedTuple):
    """A singleton key this process holds, and the proof of which hand-over it won."""

    key: str
    token: int
    #: the lease's end on the database's clock (renewals move it).
    expires_us: int


class Busy(NamedTuple):
    """Who holds a key that could not be acquired (for logs and errors)."""

    owner: str
    expires_us: int


class RunStatus(Enum):
    """What :meth:`.SingletonStore.begin_run` found for a slot."""

    #: this worker starts the slot's execution (first delivery, or a retake).
    STARTED = "started"
    #: the slot already ran to the end: this delivery is a repeat.
    FINISHED = "finished"
    #: another worker is running the slot right now (its row is live).
    RUNNING = "running"


class Run(NamedTuple):
    """One start of one slot's execution, as :meth:`.SingletonStore.begin_run` made it."""

    entry: str
    slot_us: int
    run_id: str


class RunBegin(NamedTuple):
    """The answer of :meth:`.SingletonStore.begin_run`."""

    status: RunStatus
    #: the worker that holds (or last held) the run row.
    owner: str
    #: the outcome recorded when the run finished (``None`` while running).
    outcome: str | None


class RunRecord(NamedTuple):
    """What a worker process wrote about one run, as :meth:`.SingletonStore.reassert_runs`
    writes it again: the run row as ``begin_run`` made it and, once the run
    finished, as ``finish_run`` left it."""

    run: Run
    owner: str
    task_id: str
    #: database clock of the start, and the row's expiry as last written
    started_us: int
    expires_us: int
    #: ``None`` while it runs (or when it was abandoned for a retry)
    outcome: str | None = None
    finished_us: int | None = None


# -- stored schedules (schedule_store.py) --------------------------------------


class ScheduleRow(NamedTuple):
    """One stored schedule entry as the store keeps it: plain values, some of
    them JSON texts the store does not interpret (only parses, to diff them).

    The first 14 fields (:data:`EDITABLE`) are written by the caller; the
    rest are kept by the store. Instants are µs on the database's clock.
    """

    name: str
    task: str
    #: the schedule, JSON text (opaque to the store)
    spec: str
    #: JSON texts (opaque): the task's arguments and its ``apply_async`` options
    args: str
    kwargs: str
    options: str
    enabled: bool
    start_us: int | None
    end_us: int | None
    max_runs: int | None
    #: the missed-run policy override, JSON text, or None
    policy: str | None
    jitter_us: int
    description: str
    #: who manages the entry (a file kept in git, say), None: by hand
    managed_by: str | None
    #: the revision of the write that last changed the row (its batch's)
    revision: int = 0
    #: the database's clock at the create (or at the revival of a tombstone)
    #: and at the last change, and who made them
    created_us: int = 0
    updated_us: int = 0
    created_by: str = ""
    updated_by: str = ""
    #: a tombstone: the row of a deleted entry, kept so that feeds report the
    #: delete (only a feed returns it; its other fields are the entry's last)
    deleted: bool = False


#: the fields of :class:`ScheduleRow` a caller writes, in order
EDITABLE: tuple[str, ...] = ScheduleRow._fields[:14]

#: the write operations of :class:`ScheduleWrite`
SCHEDULE_OPS = ("create", "replace", "update", "delete")

#: an empty, immutable ``fields`` (a shared default must not be a dict)
NO_FIELDS: Mapping[str, Any] = MappingProxyType({})


class ScheduleWrite(NamedTuple):
    """One write of a batch (:meth:`.ScheduleStore.write_schedules`).

    ``op``: ``"create"`` (the name must have no live row), ``"replace"``
    (create or overwrite), ``"update"`` (change some fields of a live row) or
    ``"delete"`` (the live row becomes a tombstone). ``fields``: for create and
    replace every :data:`EDITABLE` field but ``name``; for update only those
    that change; for delete nothing. ``if_revision``: refuse the write unless
    the stored live row is at exactly this revision
    (:class:`~celery_singlebeat.exceptions.ScheduleConflict`).
    """

    op: str
    name: str
    fields: Mapping[str, Any] = NO_FIELDS
    if_revision: int | None = None


class ScheduleFeed(NamedTuple):
    """What :meth:`.ScheduleStore.schedule_feed` read after a cursor."""

    #: every row (tombstones included) written after the cursor, by revision
    rows: list[ScheduleRow]
    #: the cursor to pass next time
    revision: int
    #: False: the cursor is older than what the prune kept (tombstones were
    #: deleted since): reload with :meth:`.ScheduleStore.schedule_rows`
    complete: bool


class ScheduleLogRow(NamedTuple):
    """One change of one entry, as the history of stored schedules records it."""

    revision: int
    name: str
    #: ``"created"``, ``"changed"`` or ``"deleted"``
    action: str
    by: str
    why: str
    #: the database's clock at the write
    at_us: int
    #: JSON text ``{"field": [old, new], ...}`` over the EDITABLE fields; the
    #: JSON-text fields as parsed values, ``args`` and ``kwargs`` as digests only
    changes: str


#: the meta row whose value is the last revision given to a schedule write
#: (only writers touch it: schedule_store.py says why)
SCHEDULE_REVISION_KEY = "schedule_revision"

#: the meta row holding the highest revision of a tombstone the prune deleted
SCHEDULE_FLOOR_KEY = "schedule_floor"
