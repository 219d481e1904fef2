"""``Schedules``: the stored entries, read and edited from Python.

Every replica follows the table these methods write within about a second of
each commit (docs/algorithm.md, "Stored schedules"). Each write is one
transaction that takes one commit-ordered revision and records who, when (the
database's clock), why and what changed; it is validated whole before it
reaches the database, so a bad edit raises
:class:`~celery_singlebeat.exceptions.InvalidEntry` naming the entry and the
field and changes nothing. Given the caller's connection (SQLAlchemy's
``Connection`` or ``Session``, or Django's), a write joins the caller's
transaction and commits or rolls back with the caller's own rows.

Concurrent editors are told apart by revision: ``update(..., if_revision=R)``
applies only if the entry is still at ``R`` and otherwise raises
:class:`~celery_singlebeat.exceptions.ScheduleConflict` naming both revisions.
"""

from __future__ import annotations

import builtins
from collections.abc import Iterable, Sequence
from datetime import datetime, timezone
from typing import Any

from ..config import Overrides, Settings
from ..exceptions import InvalidEntry, ScheduleConflict, ScheduleNotFound
from ..store.author import default_author
from ..store.schedule_store import ScheduleStore
from ..store.values import ScheduleLogRow, ScheduleWrite
from ..timeline.clock import datetime_to_us
from ..widths import MAX_AUTHOR
from .columns import entry_from_fields, entry_to_fields
from .entry import StoredEntry, stored_entry, with_changes
from .runs import next_runs as _next_runs

#: what ``upsert`` does when the name exists
IF_EXISTS = ("replace", "error", "keep")

#: how often ``update`` reads again when another editor wrote in between
_RETRIES = 3

#: the fields of a limited entry (``max_runs``) that decide which instants are
#: its runs: fixed once it has run, so that it runs exactly that many times
_RUNS_DEFINE = ("schedule", "start", "max_runs", "jitter")


class Schedules:
    """The stored entries of one database (and table prefix).

    ``Schedules(app)`` reads the app's ``singlebeat_*`` settings and knows its
    ``beat_schedule``, whose names a stored entry may not take;
    ``Schedules("postgresql+psycopg://...")`` takes a URL;
    ``Schedules(store=...)`` a store (the in-memory one in tests). ``by``
    names the editor in the history (default ``user@host``).
    """

    def __init__(
        self,
        app_or_url: Any = None,
        *,
        store: ScheduleStore | None = None,
        by: str | None = None,
        table_prefix: str | None = None,
        static_names: Iterable[str] = (),
    ) -> None:
        self.by = (by or default_author())[:MAX_AUTHOR]
        self._static = set(static_names)
        self._owned = store is None
        self.default_tz: Any = None
        if store is None:
            store, self.default_tz = self._open(app_or_url, table_prefix)
        self.store: ScheduleStore = store

    def _open(self, app_or_url: Any, table_prefix: str | None) -> tuple[ScheduleStore, Any]:
        from ..store.sql import SqlStore

        conf: dict[str, Any] = {}
        base: Any = {}
        tz = None
        if isinstance(app_or_url, str) or hasattr(app_or_url, "drivername"):
            conf["singlebeat_url"] = app_or_url
        elif app_or_url is not None:
            base = app_or_url.conf
            tz = app_or_url.timezone
            self._static |= set(app_or_url.conf.beat_schedule or {})
        if table_prefix is not None:
            conf["singlebeat_table_prefix"] = table_prefix
        # read through the conf's get: a namespaced conf cannot be copied whole
        settings = Settings.from_conf(Overrides(conf, base))
        store = SqlStore.from_settings(settings)
        store.prepare(settings.create_schema)
        return store, tz

    # -- reading -----------------------------------------------------------------

    def get(self, name: str) -> StoredEntry:
        """The stored entry ``name``; ScheduleNotFound if there is none."""
        row = self.store.schedule_row(name)
        if row is None:
            raise ScheduleNotFound(name)
        return entry_from_fields(row._asdict())

    def list(
        self, *, enabled: bool | None = None, managed_by: str | None = None
    ) -> builtins.list[StoredEntry]:
        """Every stored entry, by name; only the enabled (or disabled) ones, or
        only those an import file manages, when asked."""
        rows, _ = self.store.schedule_rows()
        entries = [entry_from_fields(r._asdict()) for r in sorted(rows, key=lambda r: r.name)]
        if enabled is not None:
            entries = [e for e in entries if e.enabled is enabled]
        if managed_by is not None:
            entries = [e for e in entries if e.managed_by == managed_by]
        return entries

    def log(self, name: str | None = None, limit: int = 100) -> builtins.list[ScheduleLogRow]:
        """The history of changes, newest first (of one entry, or of all)."""
        return self.store.schedule_log(name, limit)

    def next_runs(
        self,
        name_or_entry: str | StoredEntry | Any,
        n: int = 5,
        *,
        now: datetime | None = None,
        anchor: datetime | None = None,
    ) -> builtins.list[datetime]:
        """The next ``n`` instants (aware, UTC) the replicas would send: of a
        stored entry by name, of an entry not saved yet (a
        :class:`StoredEntry`), or of a bare schedule (a ``crontab``, a
        ``timedelta``...), as the engine computes them."""
        target = self.get(name_or_entry) if isinstance(name_or_entry, str) else name_or_entry
        return _next_runs(target, n, now=now, tz=self.default_tz or timezone.utc, anchor=anchor)

    # -- writing -----------------------------------------------------------------

    def upsert(
        self,
        entry: StoredEntry | str,
        task: str | None = None,
        schedule: Any = None,
        *,
        if_exists: str = "replace",
        why: str = "",
        by: str | None = None,
        connection: Any = None,
        **fields: Any,
    ) -> StoredEntry:
        """Create the entry, or (``if_exists``) replace it whole (``"replace"``),
        refuse (``"error"``: ScheduleExists) or leave it (``"keep"``). Takes a
        :class:`StoredEntry` or the arguments of
        :func:`~celery_singlebeat.stored_entry`. Idempotent: an upsert of what is
        stored writes nothing (no revision, no history)."""
        if if_exists not in IF_EXISTS:
            raise ValueError(f"if_exists={if_exists!r}: expected one of {', '.join(IF_EXISTS)}")
        if isinstance(entry, str):
            if task is None or schedule is None:
                raise TypeError("upsert(name, task, schedule, ...) needs a task and a schedule")
            entry = stored_entry(entry, task, schedule, **fields)
        elif task is not None or schedule is not None or fields:
            raise TypeError("upsert(StoredEntry) takes no other fields: use with_changes()")
        self.check_name(entry.name)
        if if_exists == "keep":
            existing = self.store.schedule_row(entry.name)
            if existing is not None:
                return entry_from_fields(existing._asdict())
        op = "create" if if_exists == "error" else "replace"
        if op == "replace":
            self._check_runs_fixed(entry.name, entry)
        return self._write([self._of(op, entry)], why, by, connection)[0]

    def update(
        self,
        name: str,
        *,
        if_revision: int | None = None,
        why: str = "",
        by: str | None = None,
        connection: Any = None,
        **fields: Any,
    ) -> StoredEntry:
        """Change some fields of ``name`` (the rest stay). ``if_revision``:
        only if it is still at that revision (ScheduleConflict otherwise)."""
        if not fields:
            raise TypeError("update() needs at least one field to change")
        if "name" in fields:
            raise InvalidEntry(
                name, "name", "an entry is renamed by deleting it and adding the new name"
            )
        for attempt in range(_RETRIES):
            current = self.get(name)
            changed = with_changes(current, **fields)
            self._check_runs_fixed(name, changed, current)
            new = entry_to_fields(changed)
            old = entry_to_fields(current)
            delta = {k: v for k, v in new.items() if k != "name" and old.get(k) != v}
            # validated whole against the revision read: written only at that
            # revision, so that another editor's change in between cannot make
            # the merged entry one nobody validated; the caller's own
            # if_revision is the caller's to handle, ours is retried
            expected = current.revision if if_revision is None else if_revision
            try:
                return self._write(
                    [ScheduleWrite("update", name, delta, expected)], why, by, connection
                )[0]
            except ScheduleConflict:
                if if_revision is not None or attempt == _RETRIES - 1:
                    raise
        raise AssertionError("unreachable")  # pragma: no cover

    def enable(self, name: str, **kwargs: Any) -> StoredEntry:
        """Send ``name`` again from its next slot on (the disabled span is not
        caught up)."""
        return self.update(name, enabled=True, **kwargs)

    def disable(self, name: str, **kwargs: Any) -> StoredEntry:
        """Stop sending ``name`` from the replicas' next tick on; it stays stored."""
        return self.update(name, enabled=False, **kwargs)

    def delete(
        self,
        name: str,
        *,
        if_revision: int | None = None,
        why: str = "",
        by: str | None = None,
        connection: Any = None,
    ) -> None:
        """Remove ``name`` (ScheduleNotFound if there is none). Its history
        stays; a claimed slot of it not yet sent is not sent."""
        self._write([ScheduleWrite("delete", name, {}, if_revision)], why, by, connection)

    def apply(
        self,
        writes: Sequence[ScheduleWrite],
        *,
        why: str = "",
        by: str | None = None,
        connection: Any = None,
    ) -> builtins.list[StoredEntry]:
        """Several writes in one transaction, all or nothing (an import)."""
        self.check_names(w.name for w in writes if w.op != "delete")
        return self._write(list(writes), why, by, connection)

    def close(self) -> None:
        """Close the store this object opened (not one it was given)."""
        if self._owned:
            self.store.close()

    def __enter__(self) -> Schedules:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- helpers -----------------------------------------------------------------

    @staticmethod
    def _of(op: str, entry: StoredEntry) -> ScheduleWrite:
        fields = entry_to_fields(entry)
        fields.pop("name", None)
        return ScheduleWrite(op, entry.name, fields, None)

    def _write(
        self, writes: builtins.list[ScheduleWrite], why: str, by: str | None, connection: Any
    ) -> builtins.list[StoredEntry]:
        rows = self.store.write_schedules(
            writes, (by or self.by)[:MAX_AUTHOR], why, connection=connection
        )
        return [entry_from_fields(r._asdict()) for r in rows if not r.deleted]

    def check_name(self, name: str) -> None:
        """Refuse a name ``beat_schedule`` already has (InvalidEntry): this
        app's, or a live replica's (its catalog, whatever its release)."""
        self.check_names([name])

    def check_names(self, names: Iterable[str]) -> None:
        """:meth:`check_name` of several names, in one read of the catalogs."""
        names = builtins.list(dict.fromkeys(names))
        for name in names:
            if name in self._static:
                raise InvalidEntry(
                    name,
                    "name",
                    "beat_schedule defines an entry of this name: a stored entry may not "
                    "take it (edit beat_schedule, or choose another name)",
                )
        clashes = self.store.catalogued(names)
        for name in names:
            replicas = clashes.get(name)
            if replicas:
                shown = ", ".join(replicas[:3]) + (" ..." if len(replicas) > 3 else "")
                raise InvalidEntry(
                    name,
                    "name",
                    f"the beat_schedule of live replica {shown} defines an entry of this "
                    "name: a stored entry may not take it (choose another name, or deploy "
                    "without it first)",
                )

    def _check_runs_fixed(
        self, name: str, new: StoredEntry, current: StoredEntry | None = None
    ) -> None:
        """An entry limited to N runs keeps the instants that are its runs once
        one was sent: otherwise an edit could make it run more, or fewer,
        than N times in all."""
        if current is None:
            row = self.store.schedule_row(name)
            if row is None:
                return
            current = entry_from_fields(row._asdict())
        if current.max_runs is None:
            return
        moved = [f for f in _RUNS_DEFINE if getattr(current, f) != getattr(new, f)]
        if not moved:
            return
        since = current.start or current.created
        since_us = 0 if since is None else datetime_to_us(since)
        if self.store.sent_count(name, since_us) > 0:
            raise InvalidEntry(
                name,
                moved[0],
                f"entry limited to {current.max_runs} runs has already run: its "
                f"{', '.join(moved)} cannot change (delete it and add it again)",
            )


__all__ = ["IF_EXISTS", "Schedules", "default_author"]
