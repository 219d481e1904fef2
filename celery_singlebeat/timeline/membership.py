"""Who is in the fleet: the one meaning of a *live replica*.

Every replica upserts its row in the replicas table with each heartbeat (its
sweep, a third of the lease: 5 s by default) and marks it stopped when it stops
gracefully (:meth:`.FleetStore.heartbeat`, :meth:`.FleetStore.stopped`). A
replica is live while its row is not stopped and was seen within ``LIVE_HEARTBEATS``
of its own heartbeat periods plus ``LIVE_SLACK_US`` (17 s by default),
judged on the database's clock (``seen_us`` is the database's instant of the
heartbeat, ``now_us`` the database's instant of the read).

The same rule decides, for each of its users:

* sharing: the replicas among which the entries are shared (sharing.py; read by
  every heartbeat, so a graceful stop hands its share over at the others' next
  heartbeat, and a schedule with nothing due for hours still shares);
* the fleet's view: ``status`` calls a replica live, stopped or lost by it, and
  the controls refuse names that no live replica's catalog lists (store/sql/operator.py);
* readiness: a replica is ready while its last round trip is within the same
  bound, so that it reports ready exactly as long as the others count it live
  (``timing.default_readiness_timeout_s``: ``timing.live_within_us`` of its sweep
  period).

The SQL statements carry it as ``store.sql.dialect.live_replica`` (the same
comparison, with ``:beats`` and ``:slack_us`` bound to these constants); the
contract suites check that the databases and the in-memory store agree with
:func:`replica_live`.
"""

from __future__ import annotations

# The constants and the window live in timing.py, the leaf of the timing
# constants that the configuration and the health probe read too (readiness's
# bound is this window); named here as well, where the rule is.
from .timing import LIVE_HEARTBEATS as LIVE_HEARTBEATS
from .timing import LIVE_SLACK_US as LIVE_SLACK_US
from .timing import live_within_us as live_within_us


def replica_live(seen_us: int, heartbeat_us: int, stopped_us: int | None, now_us: int) -> bool:
    """Whether a replica row is live at ``now_us``: not stopped, and seen at
    most ``timing.live_within_us`` of its heartbeat before (all on the database's
    clock). A paused or partitioned process stops being live when its row
    ages; a gracefully stopped one at once."""
    return stopped_us is None and seen_us >= now_us - live_within_us(heartbeat_us)
