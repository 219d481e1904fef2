"""The change watch: the entries of every source, loaded once, then followed.

At the first connection each source's full set is loaded, checked (one name,
one source) and registered in the store; then, once a tick, each source is
asked what changed since its cursor, and the agenda, the store's entry rows
and this replica's catalog follow. A source that never changes (Celery's
``beat_schedule``) costs a method call a tick.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from ..exceptions import ConfigurationError
from ..sources import Change, ChangeKind, EntryDefinition, EntrySource, check_definition
from ..store.base import Claim, EntryState
from .agenda import Agenda
from .context import ReplicaContext

logger = logging.getLogger("celery_singlebeat.scheduler")


class SourceWatch:
    """Every source of one replica's entries, and where each stands."""

    def __init__(self, ctx: ReplicaContext, agenda: Agenda, sources: Sequence[EntrySource]) -> None:
        self.ctx = ctx
        self.agenda = agenda
        self.sources = list(sources)
        self._cursors: list[object] = [None] * len(self.sources)
        #: the sources' entries as first loaded (None: not yet)
        self._loaded: list[EntryDefinition] | None = None
        #: entry name -> the source that defines it
        self._owner: dict[str, EntrySource] = {}
        self._writes_back = any(s.writes_back for s in self.sources)

    def load(self) -> list[EntryDefinition]:
        """Every source's entries (once per process): a ConfigurationError when
        two sources define one name."""
        if self._loaded is not None:
            return self._loaded
        definitions: list[EntryDefinition] = []
        for index, source in enumerate(self.sources):
            loaded, cursor = source.load()
            self._cursors[index] = cursor
            for definition in loaded:
                other = self._owner.get(definition.name)
                if other is not None:
                    raise ConfigurationError(
                        f"entry {definition.name!r} is defined by both {other.label} and "
                        f"{source.label}; rename one of them"
                    )
                self._owner[definition.name] = source
                definitions.append(definition)
        self._loaded = definitions
        return definitions

    def poll(self, now_us: int) -> bool:
        """Apply what changed in every source since the last poll; True when
        anything did (the catalog is then written again)."""
        applied = False
        for index, source in enumerate(self.sources):
            changes, cursor = source.changes(self._cursors[index])
            self._cursors[index] = cursor
            if changes:
                applied = self._apply(source, changes, now_us) or applied
        return applied

    def _apply(self, source: EntrySource, changes: Sequence[Change], now_us: int) -> bool:
        ctx = self.ctx
        agenda = self.agenda
        # the last change of each name wins: an entry added and removed since
        # the last poll is removed, one removed and added again is changed
        final: dict[str, EntryDefinition | None] = {}
        for change in changes:
            name = change.name
            owner = self._owner.get(name)
            if owner is not None and owner is not source:
                logger.error(
                    "singlebeat: %s %s entry %r, which %s already defines; ignored (rename one)",
                    source.label,
                    change.kind.value,
                    name,
                    owner.label,
                )
                continue
            definition = change.definition
            if change.kind is ChangeKind.REMOVED or definition is None:
                final[name] = None
                continue
            try:
                check_definition(definition, agenda.tz_of(definition), now_us)
            except ConfigurationError as exc:
                logger.error("singlebeat: %s; the change is ignored", exc)
                continue
            final[name] = definition
        added: list[EntryDefinition] = []
        changed: list[EntryDefinition] = []
        removed: list[str] = []
        for name, definition in final.items():
            known = agenda.definitions.get(name)
            if definition is None:
                if self._owner.pop(name, None) is not None:
                    removed.append(name)
            elif known is None:
                added.append(definition)
            elif known != definition:
                changed.append(definition)
            if definition is not None:
                self._owner[name] = source
        for name in removed:
            agenda.remove(name)
        states = self._register([d.name for d in added + changed])
        for definition in added:
            agenda.track(definition, states[definition.name], now_us)
        for definition in changed:
            agenda.change(definition, states[definition.name], now_us)
        if not (added or changed or removed):
            return False
        logger.info(
            "singlebeat: replica %s follows %d new, %d changed and %d removed entries of %s",
            ctx.replica_id,
            len(added),
            len(changed),
            len(removed),
            source.label,
        )
        return True

    def _register(self, names: list[str]) -> dict[str, EntryState]:
        if not names:
            return {}
        return self.ctx.connected_store.register(names, self.ctx.replica_id)

    def written_back(self, confirmed: list[Claim]) -> None:
        """Tell the sources that keep run counts which of their slots were sent."""
        if not self._writes_back:
            return
        by_entry: dict[str, list[int]] = {}
        for claim in confirmed:
            by_entry.setdefault(claim.entry, []).append(claim.slot_us)
        definitions = self.agenda.definitions
        for name, slots in by_entry.items():
            source = self._owner.get(name)
            definition = definitions.get(name)
            if source is None or definition is None or not source.writes_back:
                continue
            try:
                source.sent(definition, slots)
            except Exception:
                logger.exception(
                    "singlebeat: %s could not record the sent slots of entry %r",
                    source.label,
                    name,
                )
