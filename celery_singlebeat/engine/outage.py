"""A database outage: send nothing, say so once, retry with jittered backoff.

When the database cannot be reached the replica sends nothing at all: there
is no uncoordinated fallback. It logs once per outage, retries with backoff
and picks up by itself, applying the missed-run policy to what fell due
meanwhile.
"""

from __future__ import annotations

import logging

from ..exceptions import StoreUnavailable
from ..timeline.timing import OUTAGE_BACKOFF_MAX_S
from .context import ReplicaContext

logger = logging.getLogger("celery_singlebeat.scheduler")

#: outage retry delays, in seconds: the first, doubling up to the cap. A failed
#: attempt costs a refused connection, so a short cap is cheap; it bounds how
#: long after the database is back the fleet resumes (a 10 s cap resumed 4.6 to
#: 8.2 s after 30 s outages in the chaos run, and the missed-run policy dropped
#: what fell due meanwhile).
BACKOFF_FIRST = 0.5
BACKOFF_MAX = OUTAGE_BACKOFF_MAX_S


class Outage:
    """Whether the database is unreachable, since when, and the next retry's delay."""

    def __init__(self, ctx: ReplicaContext) -> None:
        self.ctx = ctx
        #: when the outage began (monotonic), or None while the database answers
        self.since: float | None = None
        self._backoff = BACKOFF_FIRST

    def failed(self, exc: StoreUnavailable) -> float:
        """A tick could not reach the database: how long to sleep before the next."""
        ctx = self.ctx
        now = ctx.env.monotonic()
        if self.since is None:
            self.since = now
            ctx.stats["outages"] += 1
            ctx.telemetry.outage(True)
            logger.error(
                "singlebeat: database %s unreachable (%s); replica %s sends nothing until "
                "it is back, retrying with backoff up to %gs",
                ctx.settings.safe_url,
                exc,
                ctx.replica_id,
                BACKOFF_MAX,
            )
        else:
            logger.debug("singlebeat: database still unreachable: %s", exc)
        # "Equal jitter": between half the step and the step. Replicas cut off
        # together (a restart, a failover) would otherwise retry in lockstep, each
        # wave hitting a server that is still starting at the same instant.
        delay = ctx.env.random.uniform(self._backoff / 2, self._backoff)
        self._backoff = min(self._backoff * 2, BACKOFF_MAX)
        return delay

    def answered(self) -> None:
        """A tick reached the database: end the outage, if there was one."""
        if self.since is None:
            return
        ctx = self.ctx
        logger.warning(
            "singlebeat: database reachable again after %.1fs; sending resumes "
            "(missed-run policy %s applies to what fell due meanwhile)",
            ctx.env.monotonic() - self.since,
            ctx.settings.missed.mode,
        )
        self.since = None
        self._backoff = BACKOFF_FIRST
        ctx.telemetry.outage(False)
