"""Where the engine learns its entries: entry sources.

The engine decides *when* a slot is due and *who* sends it; a source says
*what* runs. Celery's ``beat_schedule`` is the first source
(:class:`~celery_singlebeat.beat.source.BeatScheduleSource`); stored schedules
(``schedules.source.StoredSource``) the second, and
django-celery-beat's models the next. A source hands the engine its full set
of entries once, when the replica connects, and from then on the changes since
a cursor it returns with each answer, as often as the engine asks (once a
tick). Each entry is an :class:`EntryDefinition` with a revision that changes
whenever the definition does, and names the source it came from, so that every
message about an entry can say where to fix it.

How a source plugs in: the host builds the list of sources and hands it to the
engine (``Engine.use_sources``); the Celery
adapter hands ``beat_schedule``'s, those given to it by hand, then the stored
schedules unless ``singlebeat_schedules`` is off. The engine never imports a
source: what differs from one source to another is said by this interface
alone, in its methods (:meth:`EntrySource.load`, :meth:`~EntrySource.changes`,
:meth:`~EntrySource.reconnected`, :meth:`~EntrySource.written`,
:meth:`~EntrySource.sent`) and its class attributes (``label``,
``catalogued``, ``definitions_checked``, ``writes_back``).

What the engine guarantees for entries that come, change and go while it
runs (docs/algorithm.md, "Entry sources"):

* an entry added is registered (its slot row history, its interval anchor)
  and tracked from the tick that sees it; its first slot is the first after
  its last recorded slot (a replica that restarts goes on where the fleet
  is), or after that tick for an entry never sent, and never at or before its
  definition's ``since_us`` (an entry removed and added again does not catch
  up the slots of the time it was gone);
* an entry changed follows its new definition from the tick that sees the
  change: its next slot is the new definition's first instant after that
  tick (and after its ``since_us``), so an edit never sends a burst of past
  slots; a slot already claimed keeps the instant it was claimed for (one
  slot per entry and instant); an interval keeps the anchor the entry was
  registered with, so its instants stay on one grid across edits;
* an entry removed is not proposed from the tick that sees its removal on;
  a claimed slot of it that this replica has not yet published is left to a
  replica that still has the entry (as during a rolling deploy);
* two sources may not define one name: at start-up that stops beat with a
  message naming both sources; at run time the second definition is refused
  (logged at ERROR, naming both) and the first stays in force.

Sources are read on the scheduler's thread only; a source that is edited from
other threads (:class:`celery_singlebeat.testing.MemorySource`) guards its own
state.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from enum import Enum
from typing import Any, NamedTuple

from .exceptions import ConfigurationError, ScheduleError
from .store.values import Written
from .timeline.slots import MissedPolicy, sequence_for
from .widths import MAX_ENTRY_NAME


class EntryDefinition(NamedTuple):
    """One entry as a source defines it: what to send, and when.

    What the engine does with each field:

    * ``name``: the entry's key in the slot table (a slot is one name and one
      instant, whichever source and version proposed it), so it is unique
      across every source of a replica and at most ``MAX_ENTRY_NAME`` bytes;
    * ``task``, ``args``, ``kwargs``, ``options``: what each run sends.
      ``options`` are the ``apply_async`` options (never the ``singlebeat_*``
      keys, which configure us);
    * ``schedule``: a Celery schedule (``crontab``, ``schedule``/``timedelta``,
      ``solar``, or one whose ``remaining_estimate()`` says when it runs next)
      from which every replica computes the same instants;
    * ``policy`` and ``tz``: the missed-run policy and the time zone of a
      crontab's instants; None for the replica's defaults
      (``singlebeat_missed_*``, Celery's timezone);
    * ``revision``: changes whenever anything else does. The engine compares
      whole definitions to tell a change; the revision is the source's, for
      the source's own use (:meth:`EntrySource.written`);
    * ``source``: the label of the source it came from (the engine sets it
      to :attr:`EntrySource.label` if it differs), in every message about the
      entry, and to find the source again (:meth:`EntrySource.written`,
      :meth:`EntrySource.sent`, ``catalogued``);
    * ``since_us``: the instant (the database's clock, microseconds since the
      epoch) from which this definition is in force: no slot at or before it
      is sent under it, whichever replica starts tracking it and however late;
      None for no such bound (``beat_schedule``: a definition is as old as its
      process).
    """

    name: str
    task: str
    schedule: Any
    args: Any = ()
    kwargs: Any = None
    options: Mapping[str, Any] = {}
    policy: MissedPolicy | None = None
    tz: Any = None
    revision: str = ""
    source: str = ""
    since_us: int | None = None


class ChangeKind(Enum):
    """What happened to an entry since a cursor."""

    ADDED = "added"
    CHANGED = "changed"
    REMOVED = "removed"


class Change(NamedTuple):
    """One change a source reports: ``definition`` is None for a removal.

    ``found_again``: not a new commit but a definition the source had read
    past and finds in force again (a failover to a standby that lacked the
    writes after it put it back). It was not in force while those writes
    were, so its slots count from the tick that sees it, never from further
    back (a new commit read late counts from its commit, within
    ``CHANGE_REACH_US``).
    """

    kind: ChangeKind
    name: str
    definition: EntryDefinition | None
    found_again: bool = False


class EntrySource(ABC):
    """A source of entries: a full set once, then changes since a cursor.

    The cursor is the source's own (a version number, a commit-ordered
    revision, a timestamp): the engine only keeps the last one each answer
    returned and passes it back. A source must report every change after the
    cursor it was given, in order; reporting one twice is harmless (an ADDED
    for a known name is taken as CHANGED, a CHANGED for an unknown one as
    ADDED, a REMOVED of an unknown one is ignored).

    Every method is called on the scheduler's thread, between two statements
    of the tick: :meth:`load` once, then :meth:`changes` once a tick,
    :meth:`reconnected` after each broken connection, :meth:`written` for each
    entry the tick claims, :meth:`sent` after each confirm. Only
    :meth:`load` is abstract.
    """

    #: the source's name in messages ("beat_schedule"), and how the engine
    #: finds the source of a definition again (its ``source`` field): two
    #: sources of one replica may not share a label (a ConfigurationError
    #: when they are handed to the engine)
    label: str = "source"

    @abstractmethod
    def load(self) -> tuple[Sequence[EntryDefinition], object]:
        """Every entry of the source now, and the cursor of that state.

        Called when the replica first connects. Raises
        :class:`~celery_singlebeat.exceptions.ConfigurationError` for an entry
        that cannot be scheduled (that stops beat at start-up).
        """

    def changes(self, cursor: object) -> tuple[Sequence[Change], object]:
        """The changes since ``cursor`` and the cursor after them.

        Called once a tick while the replica is connected (the first time with
        the cursor :meth:`load` returned), so it must be cheap when nothing
        changed. The engine applies the changes at once (the last change of a
        name wins) and passes the returned cursor to the next call. A
        definition that fails :func:`check_definition` (unless the source says
        ``definitions_checked``) is logged at ERROR and ignored, the previous
        one staying in force. A source that never changes (``beat_schedule``)
        keeps this default.
        """
        return (), cursor

    def reconnected(self, cursor: object) -> object:
        """The cursor to go on from once the replica's broken connection to
        the database is made again; the default: ``cursor``.

        The database may not be the one the cursor was read from: a promoted
        standby lacks the writes its old primary had not sent it yet, and
        counts versions again from below the cursor. A source kept in the
        database answers a cursor that makes its next :meth:`changes` read
        everything again and report the difference.
        """
        return cursor

    #: whether each replica lists the entries in its catalog (the operators'
    #: view of which replica has which entry). A source whose entries every
    #: replica reads from one table (stored schedules) says False: the table
    #: already lists them, once for the whole fleet.
    catalogued: bool = True

    #: whether every definition the source gives has passed
    #: :func:`check_definition`'s checks already (stored entries: at their
    #: write, and their names and schedules again as each row is read): the
    #: engine then skips that check, a next-slot computation per entry, which
    #: was a quarter of a replica's start-up with 100,000 stored entries
    definitions_checked: bool = False

    def read_up_to(self, cursor: object) -> int | None:
        """The revision of the store's schedules table up to which this
        source's definitions are read, given its ``cursor`` (every write at or
        below it applied); None, this default, for a source of other entries.

        The engine passes it to each takeover
        (:meth:`~celery_singlebeat.store.slot_store.SlotStore.take_over`'s
        ``seen``): a stored entry's slot is
        not taken over by a replica that has not read a write made to the
        entry more than ``STALE_DEFINITION_US`` before the slot (it would send
        it under the definition that write replaced, however long it slept).
        Called once a sweep: no statement.
        """
        return None

    def written(self, definition: EntryDefinition) -> Written | None:
        """The write of the store's schedules table that ``definition`` came
        from (:class:`~celery_singlebeat.store.values.Written`: its revision
        and the database's instant of it); None, this default, for a
        definition the store keeps no write of (``beat_schedule``, a source
        with tables of its own).

        Called for each entry whose slots the tick claims, so it must be cheap
        (no statement). The engine passes the writes to the claim
        (:meth:`~celery_singlebeat.store.slot_store.SlotStore.claim`'s
        ``revisions``), and the store refuses a slot of such an entry once its
        row in the schedules table is another write made more than
        ``STALE_DEFINITION_US`` (a second) before the later of the slot's
        instant and the database's now: a replica that has not yet seen an
        edit sends no slot under the definition it replaced. Stored schedules
        answer their row's revision and write instant.
        """
        return None

    #: whether :meth:`sent` does anything: the engine skips the call otherwise
    writes_back: bool = False

    def sent(self, definition: EntryDefinition, slot_us: Sequence[int]) -> None:  # noqa: B027
        """Called after slots of ``definition`` were published and recorded
        (the database's clock; microseconds since the epoch), for a source that
        keeps a run count or a last-run time (``writes_back`` True). Must not
        raise: the slots are sent whatever it does (an exception is logged)."""


def check_definition(definition: EntryDefinition, tz: Any, now_us: int) -> None:
    """Refuse an entry the replicas cannot schedule, naming its source.

    A name longer than the slot table's column, or a schedule that cannot say
    when it runs next (``remaining_estimate`` not implemented): found now, not
    at the first tick that proposes it.
    """
    name, where = definition.name, definition.source or "source"
    if len(name.encode()) > MAX_ENTRY_NAME:
        raise ConfigurationError(
            f"{where} entry name {name[:40]!r}... is longer than {MAX_ENTRY_NAME} bytes; shorten it"
        )
    try:
        sequence_for(definition.schedule, 0, tz).next_after(now_us)
    except ScheduleError as exc:
        raise ConfigurationError(
            f"{where}[{name!r}]: {exc}. Replicas can only agree on the runs of "
            "crontab, interval and solar schedules, or of a schedule whose "
            "remaining_estimate() says when it runs next"
        ) from None


__all__ = [
    "Change",
    "ChangeKind",
    "EntryDefinition",
    "EntrySource",
    "check_definition",
]
