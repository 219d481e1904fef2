"""Membership: this replica's row and catalog, and the live replicas it shares among.

At every sweep (a third of the lease) a replica writes its heartbeat (its
replica row: host, pid, version, clock offset, what it tracks) and reads back
the live replicas (:func:`..membership.replica_live`) in one statement where
the store can; the agenda deals the entries among them
(:mod:`..sharing`). Its catalog (one row per entry it has, with a schedule
spec) tells operators and the controls which entries exist: written when it
connects, after every broken connection and whenever its entries change.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Iterable

from .._version import __version__
from ..store.base import CatalogEntry, ReplicaInfo
from ..timeline.clock import US
from . import catalog
from .agenda import Agenda
from .context import ReplicaContext
from .sharing import SHARE_RECHECK, live_replicas


class Membership:
    """The heartbeat, the catalog, and when to read the live replicas again."""

    def __init__(
        self,
        ctx: ReplicaContext,
        agenda: Agenda,
        uncatalogued: Callable[[], frozenset[str]],
    ) -> None:
        self.ctx = ctx
        self.agenda = agenda
        #: the labels of the sources whose entries the catalog leaves out
        #: (``EntrySource.catalogued`` False: a table lists them for the whole
        #: fleet), as the change watch has them when the catalog is written
        self._uncatalogued = uncatalogued
        #: the database clock when this process first connected (its replica row)
        self.started_us: int | None = None
        #: when to read the live replicas again (with each sweep, sooner when
        #: another replica claims slots this one proposes first: views differ)
        self.next_share = 0.0
        self._shared_at = 0.0
        #: each entry's catalog row, described once: at 100,000 entries that is
        #: a second of CPU
        self._catalog: dict[str, CatalogEntry] = {}

    def beat(self, monotonic: float) -> None:
        """Record this replica's row, read the live replicas and deal the share."""
        ctx = self.ctx
        store = ctx.connected_store
        self._shared_at = monotonic
        self.next_share = monotonic + ctx.sweep_every
        clock = store.clock
        info = ReplicaInfo(
            id=ctx.replica_id,
            host=socket.gethostname(),
            pid=os.getpid(),
            version=__version__,
            started_us=self.started_us or clock.now_us(),
            loop_us=clock.now_us(),
            offset_us=clock.offset_us,
            tracked=len(self.agenda.tracked),
            proposes_first=self.agenda.first_count,
            heartbeat_us=int(ctx.sweep_every * US),
            lost_writes=ctx.stats["lost_writes"],
        )
        live = store.heartbeat(info)
        self.agenda.share(live_replicas(live, ctx.replica_id))
        ctx.telemetry.fleet(len(self.agenda.live), store.open_claims)

    def recheck_soon(self) -> None:
        """Another replica claimed slots we propose first: it does not see the
        live replicas as we do (one just started or stopped). Look again soon
        rather than at the next sweep, so that the views converge."""
        self.next_share = min(self.next_share, self._shared_at + SHARE_RECHECK)

    def publish_catalog(self, changed: Iterable[str] | None = None) -> None:
        """Tell the store which entries this replica has: when it connects, after
        every broken connection, and when its entries change (``changed``: the
        names added, changed or removed since the last write; None: all)."""
        agenda = self.agenda
        described = self._catalog
        definitions = agenda.definitions
        names = definitions.keys() if changed is None else changed
        uncatalogued = self._uncatalogued()
        for name in names:
            definition = definitions.get(name)
            if definition is None or definition.source in uncatalogued:
                described.pop(name, None)
            elif changed is not None or name not in described:
                described[name] = catalog.describe(
                    name, definition.task, definition.schedule, agenda.tz_of(definition)
                )
        self.ctx.connected_store.publish_catalog(self.ctx.replica_id, list(described.values()))
