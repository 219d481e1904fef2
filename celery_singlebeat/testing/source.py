"""An entry source in process memory, which a test edits while the replicas run.

:class:`MemorySource` hands the engine entries besides ``beat_schedule``, as
stored schedules do from the database: a test adds, edits and removes them
between ticks and sees every replica given the source follow at its next
tick. It needs no store: the replicas share it as they would share a
database's stored entries.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

from ..sources import Change, ChangeKind, EntryDefinition, EntrySource
from ..timeline.slots import MissedPolicy
from .clock import wall_us

__all__ = ["MemorySource"]


class MemorySource(EntrySource):
    """An entry source in process memory, edited while replicas run: for tests.

    :meth:`set` adds or replaces an entry, :meth:`remove` removes one; each
    replica given the source follows the changes from its next tick (the
    engine asks every source for its changes once a tick). Replicas sharing
    one ``MemorySource`` see the same entries, as replicas sharing a database
    will see stored ones. Thread-safe, so a test may edit from another thread.
    :attr:`sent_slots` records every slot the replicas reported sent (the optional
    write-back), in order.
    """

    writes_back = True

    def __init__(
        self, label: str = "memory source", now_us: Callable[[], int] | None = None
    ) -> None:
        #: the source's name in messages
        self.label = label
        #: the clock that dates each definition (``since_us``): the store's
        #: (a :class:`~celery_singlebeat.testing.FakeClock`), else this host's
        self._now_us = now_us or wall_us
        self._lock = threading.Lock()
        self._entries: dict[str, EntryDefinition] = {}
        self._log: list[tuple[int, Change]] = []
        self._version = 0
        #: (entry, slot instant in microseconds) of every slot reported sent
        self.sent_slots: list[tuple[str, int]] = []

    def set(
        self,
        name: str,
        task: str,
        schedule: Any,
        *,
        args: Sequence[Any] = (),
        kwargs: dict[str, Any] | None = None,
        options: dict[str, Any] | None = None,
        policy: MissedPolicy | None = None,
        tz: Any = None,
    ) -> EntryDefinition:
        """Add entry ``name``, or replace its definition; returns the definition.

        ``schedule`` is a Celery schedule, or a ``timedelta`` or a number of
        seconds for an interval (as in ``beat_schedule``)."""
        if isinstance(schedule, (int, float, timedelta)):
            from celery.schedules import schedule as interval

            seconds = schedule.total_seconds() if isinstance(schedule, timedelta) else schedule
            schedule = interval(timedelta(seconds=seconds))
        with self._lock:
            self._version += 1
            definition = EntryDefinition(
                name=name,
                task=task,
                schedule=schedule,
                args=tuple(args),
                kwargs=dict(kwargs or {}),
                options=dict(options or {}),
                policy=policy,
                tz=tz,
                revision=str(self._version),
                source=self.label,
                since_us=self._now_us(),
            )
            kind = ChangeKind.CHANGED if name in self._entries else ChangeKind.ADDED
            self._entries[name] = definition
            self._log.append((self._version, Change(kind, name, definition)))
            return definition

    def remove(self, name: str) -> None:
        """Remove entry ``name`` (a KeyError if the source has no such entry)."""
        with self._lock:
            del self._entries[name]
            self._version += 1
            self._log.append((self._version, Change(ChangeKind.REMOVED, name, None)))

    @property
    def entries(self) -> dict[str, EntryDefinition]:
        """The entries now, by name."""
        with self._lock:
            return dict(self._entries)

    def load(self) -> tuple[Sequence[EntryDefinition], object]:
        """See :meth:`.EntrySource.load`."""
        with self._lock:
            return list(self._entries.values()), self._version

    def changes(self, cursor: object) -> tuple[Sequence[Change], object]:
        """See :meth:`.EntrySource.changes`."""
        with self._lock:
            since = cursor if isinstance(cursor, int) else 0
            if since >= self._version:
                return (), since
            return [change for version, change in self._log if version > since], self._version

    def sent(self, definition: EntryDefinition, slot_us: Sequence[int]) -> None:
        """See :meth:`.EntrySource.sent`."""
        with self._lock:
            self.sent_slots.extend((definition.name, at) for at in slot_us)
