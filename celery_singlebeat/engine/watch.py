"""The change watch: the entries of every source, loaded once, then followed.

At the first connection each source's full set is loaded, checked (one name,
one source) and registered in the store; then, once a tick, each source is
asked what changed since its cursor, and the agenda, the store's entry rows
and this replica's catalog follow. A source that never changes (Celery's
``beat_schedule``) costs a method call a tick.
"""

from __future__ import annotations

import gc
import logging
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from ..exceptions import ConfigurationError
from ..sources import Change, ChangeKind, EntryDefinition, EntrySource, check_definition
from ..store.base import Claim, EntryState, Written
from ..store.journal import Journal
from .agenda import Agenda
from .context import ReplicaContext

logger = logging.getLogger("celery_singlebeat.scheduler")


@contextmanager
def _collector_paused() -> Iterator[None]:
    """Python's cycle collector off while changes are read and applied.

    A first read of 100,000 stored entries makes some two million objects,
    none of them in a cycle, and the collector's passes over a heap growing
    that fast took 1.1 of the 4.6 s it lasted. It is off for that read only
    (on again after, as the process had it; freeing by reference counts goes
    on), and a poll with nothing to apply costs two calls.
    """
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


class SourceWatch:
    """Every source of one replica's entries, and where each stands."""

    def __init__(
        self, ctx: ReplicaContext, agenda: Agenda, sources: Sequence[EntrySource] = ()
    ) -> None:
        self.ctx = ctx
        self.agenda = agenda
        self.follow(sources)

    def follow(self, sources: Sequence[EntrySource]) -> None:
        """Follow ``sources`` from now on, from nothing loaded (the host hands
        them once, before the first connection: the Celery adapter builds
        them in ``setup_schedule``, after the engine). The watch itself stays:
        the steps given its methods at construction keep them."""
        by_label: dict[str, EntrySource] = {}
        for source in sources:
            if source.label in by_label:
                raise ConfigurationError(
                    f"two entry sources are labelled {source.label!r}: give each its own label"
                )
            by_label[source.label] = source
        self.sources = list(sources)
        #: each source by its label: an entry's ``source`` names its owner, so
        #: no second map of 100,000 names is kept
        self._by_label = by_label
        self._cursors: list[object] = [None] * len(self.sources)
        #: per source, the cursor its applied definitions go with while some
        #: of its changes are deferred (None: none are)
        self._floors: list[object] = [None] * len(self.sources)
        #: the sources' entries as first loaded, until the agenda holds them
        #: (None: not loaded yet)
        self._loaded: list[EntryDefinition] | None = None
        self._tracking = False
        self._writes_back = any(s.writes_back for s in self.sources)
        self._uncatalogued = frozenset(s.label for s in self.sources if not s.catalogued)
        #: changed definitions held back to the end of the tick
        #: (apply_deferred), each with the definition it replaces
        self._deferred: dict[str, tuple[EntryDefinition, EntryState, EntryDefinition]] = {}
        #: the database's instant of the poll before the last one: a change
        #: read now may have been committed any time since (an outage between
        #: the two polls), and its slots count from its commit that far back
        self._read_before_us: int | None = None
        self._polled_us: int | None = None
        #: when the connection was last made again (the database's clock): a
        #: definition a failover put back is in force from then at the latest
        self._reconnected_us: int | None = None
        #: the names registered during the failover window (register_again)
        self.registered: Journal[str] = Journal(self.ctx.settings.failover_window.total_seconds())

    def load(self) -> list[EntryDefinition]:
        """Every source's entries: loaded once per process (a ConfigurationError
        when two sources define one name), then as the agenda holds them."""
        if self._tracking:
            return list(self.agenda.definitions.values())
        if self._loaded is not None:
            return self._loaded
        definitions: list[EntryDefinition] = []
        seen: dict[str, str] = {}
        for index, source in enumerate(self.sources):
            loaded, cursor = source.load()
            self._cursors[index] = cursor
            for definition in loaded:
                other = seen.get(definition.name)
                if other is not None:
                    raise ConfigurationError(
                        f"entry {definition.name!r} is defined by both {other} and "
                        f"{source.label}; rename one of them"
                    )
                seen[definition.name] = source.label
                definitions.append(self._stamped(definition, source))
        self._loaded = definitions
        return definitions

    def tracked(self) -> None:
        """The agenda holds every loaded entry now: the loaded list is let go."""
        self._tracking = True
        self._loaded = None

    @staticmethod
    def _stamped(definition: EntryDefinition, source: EntrySource) -> EntryDefinition:
        if definition.source == source.label:
            return definition
        return definition._replace(source=source.label)

    def uncatalogued(self) -> frozenset[str]:
        """The labels of the sources whose entries no catalog lists
        (:attr:`EntrySource.catalogued` False)."""
        return self._uncatalogued

    def written(self, definition: EntryDefinition) -> Written | None:
        """The write of the store's schedules table ``definition`` came from,
        as its source says (:meth:`EntrySource.written`), for the claim."""
        source = self._by_label.get(definition.source)
        return None if source is None else source.written(definition)

    def read_up_to(self) -> int | None:
        """The stored schedules' revision this replica's definitions are read
        up to (EntrySource.read_up_to; the lowest where several sources say),
        for the takeover's check; None when no source follows them."""
        # a source whose changes wait for the tick's end (apply_deferred)
        # reports the cursor before them: the replica still sends under the
        # definitions they replace (the explorer's seed 100589 took a slot
        # over and sent it under one replaced 5 s before)
        cursors = [
            cursor if floor is None else floor for cursor, floor in zip(self._cursors, self._floors)
        ]
        seen = [
            r for r in (s.read_up_to(c) for s, c in zip(self.sources, cursors)) if r is not None
        ]
        return min(seen) if seen else None

    def reconnected(self) -> None:
        """The connection was made again (perhaps to another database): each
        source says where its next poll goes on from. What it brings may
        include definitions a failover put back (``Change.found_again``):
        their slots count from that tick, never from further back; otherwise
        the reach back for a change read late (``CHANGE_REACH_US``) sent,
        after the failover, a slot of the put-back definition due while the
        old primary had it deleted (the chaos run's seed 8, issue 30)."""
        self._cursors = [
            source.reconnected(cursor) for source, cursor in zip(self.sources, self._cursors)
        ]
        self._reconnected_us = self.ctx.connected_store.clock.now_us()

    def poll(self, now_us: int) -> set[str]:
        """Apply what changed in every source since the last poll; the names
        of the catalogued entries that were added, changed or removed."""
        touched: set[str] = set()
        self._read_before_us, self._polled_us = self._polled_us, now_us
        with _collector_paused():
            for index, source in enumerate(self.sources):
                before = self._cursors[index]
                changes, cursor = source.changes(before)
                if changes:
                    names = self._apply(source, changes, now_us)
                    if source.catalogued:
                        touched |= names
                    if self._deferred and self._floors[index] is None:
                        # changes held back until the tick's end: until then
                        # the definitions are those of the cursor before
                        self._floors[index] = before
                # only once applied: a change whose registration failed (the
                # database lost meanwhile) is read again at the next poll, not
                # taken as seen (after a reconnect, a row at or below the
                # cursor counts as one a failover put back: the explorer's
                # seed 2408 followed a new entry only from its reconnection)
                self._cursors[index] = cursor
        return touched

    def _apply(self, source: EntrySource, changes: Sequence[Change], now_us: int) -> set[str]:
        ctx = self.ctx
        agenda = self.agenda
        # the last change of each name wins: an entry added and removed since
        # the last poll is removed, one removed and added again is changed
        final: dict[str, EntryDefinition | None] = {}
        #: the names whose definition a failover put back (Change.found_again)
        again: set[str] = set()
        for change in changes:
            name = change.name
            known = agenda.definitions.get(name)
            if known is not None and known.source != source.label:
                logger.error(
                    "singlebeat: %s %s entry %r, which %s already defines; ignored (rename one)",
                    source.label,
                    change.kind.value,
                    name,
                    known.source,
                )
                continue
            definition = change.definition
            if change.kind is ChangeKind.REMOVED or definition is None:
                final[name] = None
                continue
            definition = self._stamped(definition, source)
            if change.found_again:
                again.add(name)
            else:
                again.discard(name)
            if not source.definitions_checked:
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
                if known is not None:
                    removed.append(name)
            elif known is None:
                added.append(definition)
            elif known != definition:
                changed.append(definition)
        for name in removed:
            self._deferred.pop(name, None)
            agenda.remove(name)
        states = self._register([d.name for d in added + changed])
        # a definition a failover put back: its slots count from when this
        # replica reached the promoted database, not from the tick that reads
        # it, which an outage right after may delay by seconds (the explorer's
        # seed 695 dropped its slots within the missed-run grace so); never
        # from before, when the old primary had the lost writes
        back = now_us if self._reconnected_us is None else min(now_us, self._reconnected_us)
        for definition in added:
            floor = back if definition.name in again else None
            agenda.track(definition, states[definition.name], now_us, floor)
        for definition in changed:
            if definition.name in again:
                # put back by a failover: the definition it replaces was a
                # lost one, whose due slot is not owed (reconnected)
                self._deferred.pop(definition.name, None)
                agenda.change(definition, states[definition.name], now_us, back)
            elif self._due_before(definition, now_us):
                # the old definition has a slot due now from before the
                # change's commit: its own, to claim and send this tick under
                # the old definition; the change follows at the tick's end
                old = agenda.definitions[definition.name]
                self._deferred[definition.name] = (definition, states[definition.name], old)
            else:
                self._deferred.pop(definition.name, None)
                agenda.change(
                    definition, states[definition.name], now_us, read_before_us=self._read_before_us
                )
        if not (added or changed or removed):
            return set()
        logger.info(
            "singlebeat: replica %s follows %d new, %d changed and %d removed entries of %s",
            ctx.replica_id,
            len(added),
            len(changed),
            len(removed),
            source.label,
        )
        return {d.name for d in added + changed} | set(removed)

    def _due_before(self, definition: EntryDefinition, now_us: int) -> bool:
        """Whether the entry's old definition has a slot due now whose instant
        is before ``definition``'s commit (its ``since_us``)."""
        since = definition.since_us
        old = self.agenda.tracked.get(definition.name)
        return (
            since is not None
            and old is not None
            and old.next_us < since
            and (old.next_us <= now_us)
        )

    def apply_deferred(self, now_us: int) -> None:
        """Apply the changes :meth:`poll` held back for the old definitions'
        due slots, once this tick has claimed and sent them (the messages
        take the definition the agenda holds when they are sent)."""
        deferred, self._deferred = self._deferred, {}
        self._floors = [None] * len(self.sources)
        for definition, state, old in deferred.values():
            # not if a later change or a removal came meanwhile (a tick that
            # failed before its end polled again)
            if self.agenda.definitions.get(definition.name) is old:
                self.agenda.change(definition, state, now_us, read_before_us=self._read_before_us)

    def _register(self, names: list[str]) -> dict[str, EntryState]:
        if not names:
            return {}
        states = self.ctx.connected_store.register(names, self.ctx.replica_id)
        self.registered.add(names, self.ctx.env.monotonic())
        return states

    def register_again(self) -> None:
        """After a broken connection: register again the names registered
        during the failover window. A promoted standby may lack their rows,
        and the claim refuses every slot of an entry without one, silently,
        as lost to another replica: an entry added just before a failover was
        not sent again until a replica restarted (the chaos run, issue 30,
        seed 7: two of a limited entry's four runs). Idempotent: a row the
        database has keeps its anchor. (One a failover lost takes a new
        anchor: that moves the interval grid of a ``beat_schedule`` entry
        registered in the window, for replicas that start after; stored
        entries count from their creation.)"""
        names = list(dict.fromkeys(self.registered.recent()))
        if names:
            self.ctx.connected_store.register(names, self.ctx.replica_id)

    def written_back(self, confirmed: list[Claim]) -> None:
        """Tell the sources that keep run counts which of their slots were sent."""
        if not self._writes_back:
            return
        by_entry: dict[str, list[int]] = {}
        for claim in confirmed:
            by_entry.setdefault(claim.entry, []).append(claim.slot_us)
        definitions = self.agenda.definitions
        for name, slots in by_entry.items():
            definition = definitions.get(name)
            source = self._by_label.get(definition.source) if definition is not None else None
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
