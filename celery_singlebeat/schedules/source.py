"""Stored schedules as an entry source (:mod:`..sources`): the entries the
database keeps, followed through its change feed.

The engine reads the feed's versions about once a second
(:mod:`..engine.feed`); this source is asked once a tick what changed since
its cursor and answers without a statement unless the schedules' revision
moved past it. Then it reads the rows written after its cursor (tombstones
included), an index range scan whose cost grows with the number of changes,
never with the number of entries. When its cursor is older than what the
prune kept (a replica cut off for longer than the tombstones' retention), it
reads every row once and reports the difference with what it had.

Revisions are commit-ordered (store/schedule_store.py): a reader that has seen
revision R has seen every write up to R, so a cursor never skips a change.

A disabled entry is reported as removed: the replicas stop proposing it from
the tick that sees the change (one whose end has passed simply has no next
slot). A row this
release cannot read (written by a newer one, or by hand) is logged at ERROR,
naming the entry and the field, and treated as removed, rather than stopping
every replica that shares the database.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from ..exceptions import ScheduleError
from ..sources import Change, ChangeKind, EntryDefinition, EntrySource
from ..store.schedule_store import ScheduleStore
from ..store.values import ScheduleRow, Written
from ..timeline.slots import MissedPolicy
from .runs import LABEL, definition_of_row

logger = logging.getLogger("celery_singlebeat.scheduler")


class StoredSource(EntrySource):
    """The enabled entries of the store's schedules table."""

    label = LABEL
    #: every replica reads the same rows: the schedules table already says
    #: which entries exist, so a replica's catalog does not list them again
    #: (at 100,000 entries that would be 100,000 rows per edit)
    catalogued = False
    #: a row's schedule is one of the stored kinds, each of which can say its
    #: next run (checked at the write, and parsed again as the row is read),
    #: and its name fits the slot table (checked likewise)
    definitions_checked = True

    def __init__(
        self,
        store: Callable[[], ScheduleStore],
        default_policy: MissedPolicy,
        default_tz: Any,
    ) -> None:
        self._store = store
        self._policy = default_policy
        self._tz = default_tz
        #: the names this source last reported present, to tell a full
        #: reload's removals (a set of names, not of definitions)
        self._present: set[str] = set()

    def load(self) -> tuple[Sequence[EntryDefinition], object]:
        """Nothing before the first connection: the rows come with the first
        :meth:`changes` (from cursor 0), read as any change is."""
        return (), 0

    def changes(self, cursor: object) -> tuple[Sequence[Change], object]:
        store = self._store()
        if isinstance(cursor, _Reread):
            rows, revision = store.schedule_rows()
            logger.info(
                "singlebeat: the connection to the database was made again; read all %d "
                "stored entries again (a promoted standby may lack the last changes)",
                len(rows),
            )
            before = cursor.before
            return self._difference(rows, before if isinstance(before, int) else 0), revision
        after = cursor if isinstance(cursor, int) else 0
        latest = store.schedule_revision
        if latest is not None and latest < after:
            # The revisions never go back (a prune keeps its floor): this
            # database lacks writes this replica read, a promoted standby
            # reached through a connection that never broke (a pooler moved
            # it). Its next writes take the lost ones' numbers: read it all.
            rows, revision = store.schedule_rows()
            logger.warning(
                "singlebeat: the stored schedules' revision went back from %d to %d (a "
                "failover to a standby that lacked the last changes?); read all %d "
                "entries again",
                after,
                latest,
                len(rows),
            )
            return self._difference(rows, after), revision
        if latest is None or latest <= after:
            return (), after
        feed = store.schedule_feed(after)
        if feed.complete:
            return [self._change(row) for row in feed.rows], feed.revision
        rows, revision = store.schedule_rows()
        logger.info(
            "singlebeat: stored schedules changed beyond what the database keeps of "
            "their history since revision %d; read all %d entries again",
            after,
            len(rows),
        )
        return self._difference(rows, 0), revision

    def written(self, definition: EntryDefinition) -> Written:
        """The row's write (its revision and instant, which together name one
        definition also after a promoted standby reused the number): the
        claim refuses the slots of a definition replaced in the table more
        than a second before them (SlotStore.claim)."""
        return Written(int(definition.revision), definition.since_us or 0)

    def read_up_to(self, cursor: object) -> int | None:
        """The revision the cursor names: revisions are commit-ordered, so the
        definitions reflect every write up to it. After a reconnection, until
        the full read, the cursor from before it (the replica's definitions
        are still those; a promoted standby numbers from below it, so the
        takeover's check refuses nothing until the read, and the replicas'
        hold after a break covers that window)."""
        if isinstance(cursor, _Reread):
            cursor = cursor.before
        return cursor if isinstance(cursor, int) else None

    def reconnected(self, cursor: object) -> object:
        """Read everything again: after a failover the revisions go on from
        what the promoted standby had, below a cursor that counted writes it
        never received, and the numbers are used again for other writes (the
        claim's revision check compares numbers). The full read gives the
        entries as this database has them, and its revision as the cursor."""
        return _Reread(cursor)

    def _difference(self, rows: Sequence[ScheduleRow], read_up_to: int) -> list[Change]:
        """Every row as a change, and the removal of the names gone since.
        A row at or below ``read_up_to`` (the cursor before this read) is
        one this replica had read past: if it differs from what the replica
        follows, a failover put it back (``Change.found_again``)."""
        changes = [self._change(row, row.revision <= read_up_to) for row in rows]
        gone = self._present - {row.name for row in rows}
        changes.extend(Change(ChangeKind.REMOVED, name, None) for name in sorted(gone))
        self._present -= gone
        return changes

    def _change(self, row: ScheduleRow, found_again: bool = False) -> Change:
        definition = None if row.deleted or not row.enabled else self._definition(row)
        if definition is None:
            self._present.discard(row.name)
            return Change(ChangeKind.REMOVED, row.name, None)
        self._present.add(row.name)
        # CHANGED of a name the engine does not have is taken as ADDED
        return Change(ChangeKind.CHANGED, row.name, definition, found_again)

    def _definition(self, row: ScheduleRow) -> EntryDefinition | None:
        try:
            return definition_of_row(row, self._policy, self._tz, label=LABEL)
        except ScheduleError as exc:
            logger.error(
                "singlebeat: %s entry %r at revision %d cannot be read (%s); it is not sent",
                LABEL,
                row.name,
                row.revision,
                exc,
            )
            return None


class _Reread:
    """The cursor after a reconnection: read every row at the next changes()."""

    __slots__ = ("before",)

    def __init__(self, before: object) -> None:
        #: the cursor it replaced (for a reader of the engine's state)
        self.before = before


__all__ = ["LABEL", "StoredSource"]
