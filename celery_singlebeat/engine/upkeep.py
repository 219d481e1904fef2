"""Upkeep: pruning old slot rows, the rows of replicas gone, and the stored
schedules' tombstones and history.

One replica's turn comes round at most once a minute for the slot rows (the
store decides whose turn it is, so a fleet prunes once a minute in all), and
at most every ten minutes for replica rows, which age by the retention.
"""

from __future__ import annotations

import logging
from datetime import timedelta

from ..timeline.clock import US
from .context import ReplicaContext

logger = logging.getLogger("celery_singlebeat.scheduler")

#: how often one replica's turn to prune old slot rows comes round at most.
PRUNE_EVERY_US = 60 * US

#: how often one replica prunes the rows of replicas gone, at most (seconds)
FLEET_PRUNE_EVERY_S = 600.0


class Upkeep:
    """When this replica next offers to prune, and the pruning."""

    def __init__(self, ctx: ReplicaContext) -> None:
        self.ctx = ctx
        self.next_prune = 0.0
        self._next_fleet_prune = 0.0

    def due(self, monotonic: float) -> bool:
        return monotonic >= self.next_prune

    def prune(self, monotonic: float) -> None:
        ctx = self.ctx
        store = ctx.connected_store
        retention_us = ctx.settings.retention_us
        self.next_prune = monotonic + PRUNE_EVERY_US / US
        deleted = store.prune(retention_us, PRUNE_EVERY_US)
        if deleted:
            logger.info(
                "singlebeat: pruned %d slot rows older than %s",
                deleted,
                ctx.settings.retention,
            )
        if deleted is not None and monotonic >= self._next_fleet_prune:
            # replica rows age by the retention (15 min by default): their
            # prune need not cost statements at every minute's turn
            self._next_fleet_prune = monotonic + FLEET_PRUNE_EVERY_S
            gone = store.prune_fleet(retention_us)
            if gone:
                logger.info("singlebeat: pruned %d rows of replicas gone", gone)
            # a deleted stored entry's tombstone is kept as long as slot rows
            # are: a replica cut off for longer reads every row once when back
            # (schedules/source.py); the history as long as the setting says.
            # The store's own tables, like the replica rows: pruned here also
            # where no replica follows them (singlebeat_schedules off, the CLI
            # writing), so not a hook of their entry source
            pruned = store.prune_schedules(
                retention_us, ctx.settings.schedule_log_retention // timedelta(microseconds=1)
            )
            if pruned:
                logger.info(
                    "singlebeat: pruned %d tombstones and history rows of stored schedules",
                    pruned,
                )
