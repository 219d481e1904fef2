"""The timing constants several layers share, and the probe bounds derived from them.

The configuration derives its defaults from these, the health probes judge by
them, the scheduler sleeps and sweeps by them and the store counts a replica
live by them. Each lived in one of those modules and was copied into
another, so importing the constant meant importing its owner, and the owners
import each other (the configuration reads the health defaults, the health
probe the telemetry hooks, the telemetry the configuration). One leaf that
imports nothing lets each of them depend on it instead of on one another.

Standard library only, and not even that: the exec probe (``python -m
celery_singlebeat health``) imports this module through :mod:`.health`, and a
kubelet runs that probe every few seconds in every pod.
"""

from __future__ import annotations

#: the longest sleep of a replica in an outage (seconds; scheduler.BACKOFF_MAX)
OUTAGE_BACKOFF_MAX_S = 1.5
#: a new connection's connect timeout (seconds; PostgreSQL, MySQL defaults)
CONNECT_TIMEOUT_S = 5.0
#: the shortest liveness timeout accepted (seconds): an outage tick can wait out
#: a connect timeout on a silent network and then sleep the backoff (5 + 1.5 s);
#: the rest is margin for a starved CPU, so that no outage ever fails liveness
LIVENESS_FLOOR_S = 10.0
#: how long a statement waits for its answer (seconds; psycopg 3.3+, MySQL read timeout)
ANSWER_TIMEOUT_S = 15.0
#: the publish deadline: this share of the lease after the claim was sent
PUBLISH_SHARE = 0.8
#: a replica is live while its row is not stopped and was seen within this many
#: heartbeat periods (sweeps), plus the slack: a sweep can run late by a tick
LIVE_HEARTBEATS = 3
LIVE_SLACK_S = 2.0
LIVE_SLACK_US = 2_000_000


def sweep_period_s(lease_s: float) -> float:
    """How often a replica sweeps and heartbeats: a third of the lease, at
    least 0.5 s (scheduler.py's ``_sweep_every``)."""
    return max(0.5, lease_s / 3)


def default_liveness_timeout_s(lease_s: float) -> float:
    """``max(60 s, 2 * lease + 30 s)``.

    The longest a healthy loop goes between two ends of ticks: the sleep
    before the tick (at most the 5 s default loop interval, which exceeds the
    1.5 s outage backoff), a statement meeting a silent network (connect 5 s,
    then at most 15 s for the answer) and one publish batch (0.8 * lease, 12 s
    by default): 5 + 20 + 12 = 37 s with the default lease. 60 s leaves more
    than a third for a few ordinary statements, a GC pause and a starved CPU; a
    longer lease lengthens the batch, so the bound grows with it (2 * lease +
    30 s always covers 10 + 20 + 0.8 * lease with room to spare)."""
    return max(60.0, 2 * lease_s + 30)


def live_within_us(heartbeat_us: int) -> int:
    """How long after its last heartbeat a replica that beats every
    ``heartbeat_us`` still counts as live: LIVE_HEARTBEATS of them plus
    LIVE_SLACK_US (17 s at the default 5 s). The rule that uses it, for
    sharing, the fleet, the controls and readiness: membership.replica_live."""
    return LIVE_HEARTBEATS * heartbeat_us + LIVE_SLACK_US


def default_readiness_timeout_s(lease_s: float) -> float:
    """Three heartbeat periods plus 2 s (``lease + 2 s`` for leases of 1.5 s
    and more; 17 s by default): a replica with nothing due still talks to
    the database at every sweep, and this is the rule by which the other
    replicas count it live (``live_within_us``), so readiness, sharing
    and the fleet's view agree."""
    return live_within_us(round(sweep_period_s(lease_s) * 1_000_000)) / 1_000_000
