"""Stored schedules in the memory store: the memory ``ScheduleStore`` contract.

:class:`MemorySchedules` writes batches of schedule edits (decided by
:mod:`celery_singlebeat.store.schedule_edits`, as the SQL store's are), reads
the rows, their change feed and their history, prunes old tombstones and
history, and answers which live replicas catalogue a name and how many slots
an entry sent, each as one round trip of the store's connection. A batch is
one decision under the state's lock, so revisions are visible in order by
construction. :meth:`MemorySchedules.lose_writes` is the schedules' share of
a failover to a lagging standby: it undoes the newest writes and their
revision numbers.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ...store.base import ScheduleFeed, ScheduleLogRow, ScheduleRow, ScheduleWrite
from ...store.schedule_edits import check_batch, plan
from ...timeline.membership import replica_live
from .connection import MemoryConnection

__all__ = ["MemorySchedules"]


def _by_name(row: ScheduleRow) -> str:
    return row.name


class MemorySchedules:
    """The :class:`~celery_singlebeat.store.schedule_store.ScheduleStore`
    methods of :class:`~.store.MemoryStore`, which delegates each of them
    here; they share the store's connection and state with the other parts."""

    def __init__(self, connection: MemoryConnection) -> None:
        self._connection = connection
        self._state = connection.state

    def write_schedules(
        self,
        writes: Sequence[ScheduleWrite],
        by: str,
        why: str = "",
        connection: Any = None,
    ) -> list[ScheduleRow]:
        """See :meth:`.ScheduleStore.write_schedules`. A batch is one atomic
        decision under the store's lock, so revisions are visible in order by
        construction. ``connection`` is not supported (there is no caller's
        transaction to join in memory): TypeError."""
        if connection is not None:
            raise TypeError(
                "MemoryStore.write_schedules: connection= is not supported: the memory "
                "store has no transactions to join; call it without a connection"
            )
        writes = list(writes)
        check_batch(writes, by, why)
        if not writes:
            return []
        with self._connection.round_trip("write schedules") as now:
            revision = self._state.revision_counter + 1
            stored = {
                w.name: self._state.schedules[w.name]
                for w in writes
                if w.name in self._state.schedules
            }
            edits = plan(writes, stored, by, revision, now)
            changed = [e for e in edits if e.action is not None]
            if changed:
                for edit in changed:
                    before = stored.get(edit.after.name)
                    self._state.schedule_undo.append(
                        (now, self._state.revision_counter, edit.after.name, before)
                    )
                self._state.revision_counter = revision
                for edit in changed:
                    self._state.schedules[edit.after.name] = edit.after
                    self._state.schedule_log.append(
                        ScheduleLogRow(
                            revision, edit.after.name, edit.action or "", by, why, now, edit.changes
                        )
                    )
            return [e.after for e in edits]

    def schedule_rows(self) -> tuple[list[ScheduleRow], int]:
        """See :meth:`.ScheduleStore.schedule_rows`."""
        with self._connection.round_trip("read schedules"):
            rows = sorted(
                (r for r in self._state.schedules.values() if not r.deleted), key=_by_name
            )
            # the floor when higher: the prune may have deleted the newest tombstone
            return rows, max(self._state.top_revision(), self._state.schedule_floor)

    def schedule_row(self, name: str) -> ScheduleRow | None:
        """See :meth:`.ScheduleStore.schedule_row`."""
        with self._connection.round_trip("read schedule"):
            row = self._state.schedules.get(name)
            return None if row is None or row.deleted else row

    def schedule_feed(self, after: int) -> ScheduleFeed:
        """See :meth:`.ScheduleStore.schedule_feed`."""
        with self._connection.round_trip("read schedule feed"):
            rows = sorted(
                (r for r in self._state.schedules.values() if r.revision > after),
                key=lambda r: (r.revision, r.name),
            )
            cursor = max((r.revision for r in rows), default=after)
            return ScheduleFeed(rows, cursor, after >= self._state.schedule_floor)

    def feed_versions(self) -> int:
        """See :meth:`.ScheduleStore.feed_versions`; the control version is the
        one the operator's controls (:meth:`.MemoryStore.pause`,
        :meth:`~.MemoryStore.resume`, :meth:`~.MemoryStore.request_run`) raise."""
        with self._connection.round_trip("read feed versions"):
            self._connection.schedule_revision = self._state.top_revision()
            return self._connection.schedule_revision

    def schedule_log(self, name: str | None = None, limit: int = 100) -> list[ScheduleLogRow]:
        """See :meth:`.ScheduleStore.schedule_log`."""
        with self._connection.round_trip("read schedule log"):
            rows = [r for r in self._state.schedule_log if name is None or r.name == name]
            rows.sort(key=lambda r: (-r.revision, r.name))
            return rows[: max(limit, 0)]

    def prune_schedules(self, tombstones_us: int, log_us: int) -> int:
        """See :meth:`.ScheduleStore.prune_schedules`."""
        with self._connection.round_trip("prune schedules") as now:
            old = [
                r
                for r in self._state.schedules.values()
                if r.deleted and r.updated_us < now - tombstones_us
            ]
            self._state.schedule_floor = max(
                [self._state.schedule_floor, *(r.revision for r in old)]
            )
            for row in old:
                del self._state.schedules[row.name]
            kept = [r for r in self._state.schedule_log if r.at_us >= now - log_us]
            gone = len(self._state.schedule_log) - len(kept)
            self._state.schedule_log = kept
            return len(old) + gone

    def catalogued(self, names: Sequence[str]) -> dict[str, list[str]]:
        """See :meth:`.ScheduleStore.catalogued`."""
        with self._connection.round_trip("read the catalogued names") as now:
            found: dict[str, list[str]] = {}
            for rid, r in sorted(self._state.replicas.items()):
                if not replica_live(r["seen_us"], r["heartbeat_us"], r["stopped_us"], now):
                    continue
                for name in self._state.catalog.get(rid, {}).keys() & set(names):
                    found.setdefault(name, []).append(rid)
            return {name: found[name] for name in sorted(found)}

    def sent_count(self, name: str, since_us: int) -> int:
        """See :meth:`.ScheduleStore.sent_count`."""
        with self._connection.round_trip("count sent slots"):
            return sum(1 for k in self._state.slots if k.entry == name and k.slot_us >= since_us)

    def lose_writes(self, after_us: int) -> int:
        """The schedules' share of :meth:`.MemoryStore.lose_writes`: the rows
        as they were at ``after_us``, the revision counter too (the next
        write takes a number the lost ones had), and the history written
        since gone. Returns how many rows changed (not counting the history).
        The caller holds the state's lock."""
        changed = 0
        state = self._state
        while state.schedule_undo and state.schedule_undo[-1][0] > after_us:
            _at, counter, name, before = state.schedule_undo.pop()
            if before is None:
                state.schedules.pop(name, None)
            else:
                state.schedules[name] = before
            state.revision_counter = counter
            changed += 1
        state.schedule_log = [r for r in state.schedule_log if r.at_us <= after_us]
        return changed
