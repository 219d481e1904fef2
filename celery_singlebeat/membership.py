"""Who is in the fleet: the one meaning of a *live replica*.

Every replica upserts its row in the replicas table with each heartbeat (its
sweep, a third of the lease: 5 s by default) and marks it stopped when it stops
gracefully (:meth:`.Store.heartbeat`, :meth:`.Store.stopped`). A replica is
live while its row is not stopped and was seen within :data:`LIVE_HEARTBEATS`
of its own heartbeat periods plus :data:`LIVE_SLACK_US` (17 s by default),
judged on the database's clock (``seen_us`` is the database's instant of the
heartbeat, ``now_us`` the database's instant of the read).

The same rule decides, for each of its users:

* sharing: the replicas among which the entries are shared (sharing.py; read by
  every heartbeat, so a graceful stop hands its share over at the others' next
  heartbeat, and a schedule with nothing due for hours still shares);
* the fleet's view: ``status`` calls a replica live, stopped or lost by it, and
  the controls refuse names that no live replica's catalog lists (store/fleet.py);
* readiness: a replica is ready while its last round trip is within the same
  bound, so that it reports ready exactly as long as the others count it live
  (health.py, :func:`live_within_us` of its sweep period).

The SQL statements carry it as ``store.statements.live_replica`` (the same
comparison, with ``:beats`` and ``:slack_us`` bound to these constants); the
contract suites check that the databases and the in-memory store agree with
:func:`replica_live`.
"""

from __future__ import annotations

#: a replica row counts as live this many of its heartbeat periods after it was seen
LIVE_HEARTBEATS = 3
#: ... plus this slack: a sweep runs late by up to a tick, a heartbeat's commit
#: by a slow round trip
LIVE_SLACK_US = 2_000_000


def live_within_us(heartbeat_us: int) -> int:
    """How long after its last heartbeat a replica that beats every
    ``heartbeat_us`` still counts as live (17 s at the default 5 s)."""
    return LIVE_HEARTBEATS * heartbeat_us + LIVE_SLACK_US


def replica_live(seen_us: int, heartbeat_us: int, stopped_us: int | None, now_us: int) -> bool:
    """Whether a replica row is live at ``now_us``: not stopped, and seen at
    most :func:`live_within_us` of its heartbeat before (all on the database's
    clock). A paused or partitioned process stops being live when its row
    ages; a gracefully stopped one at once."""
    return stopped_us is None and seen_us >= now_us - live_within_us(heartbeat_us)
