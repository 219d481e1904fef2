"""Prometheus series of the beat replicas and of SingletonTask workers.

Needs the ``metrics`` extra (``prometheus_client``); nothing imports this
module unless metrics are on, so a user without the extra runs no line of it.

Beat (:class:`Metrics`): the scheduler's hooks (``telemetry.py``) turned
into counters, histograms and gauges in a registry of their own (not the
process-wide default one, unless ``singlebeat_metrics_registry`` says so),
served on ``/metrics`` by the beat's HTTP listener. Every hook takes a whole
batch; a batch's slots are counted per entry first, so a tick that sends 1,000
slots of 10 entries makes 10 counter increments, not 1,000.

Workers (:class:`WorkerMetrics`): SingletonTask's decisions and heartbeats,
counted in whichever pool process runs the task. Under the prefork pool every
child is its own process, so the values must go through prometheus_client's
multiprocess mode (``PROMETHEUS_MULTIPROC_DIR``) and be exposed by one
process that reads every child's files (:func:`serve_multiprocess`).
docs/operations.md ("Metrics") has the set-up.

Labels carry entry and task names only, never a URL, an option or an error
text: no setting's value can reach a label.
"""

from __future__ import annotations

import os
import time
from collections import Counter as Tally
from collections.abc import Iterable, Sequence
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import choose_encoder

from ..store.base import Claim, SlotKey
from .telemetry import SingletonTelemetry, Telemetry

#: dispatch delay (slot instant to broker accept): on time is milliseconds; a
#: slot shared to another replica leaves 250 ms late; a takeover after a death
#: up to lease + lease/3 (20 s by default); beyond that, an outage's catch-up
DISPATCH_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 60.0)
#: one statement: a millisecond on a local network; 15 s is the answer timeout
ROUND_TRIP_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 15.0)
#: a heartbeat renewal: one or two statements
RENEWAL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 15.0)


class _PerEntry:
    """One counter, labelled by entry (or not at all): counts a batch per entry,
    through cached children (``labels()`` takes a lock and a dict lookup)."""

    def __init__(
        self, name: str, documentation: str, registry: CollectorRegistry, by_entry: bool
    ) -> None:
        self.counter = Counter(
            name, documentation, ["entry"] if by_entry else [], registry=registry
        )
        self.by_entry = by_entry
        self._children: dict[str, Any] = {}

    def add(self, entries: Iterable[str], count: int) -> None:
        if not count:
            return
        if not self.by_entry:
            self.counter.inc(count)
            return
        if count == 1:
            # a transport without pipelining reports each message on its own
            self.add_one(next(iter(entries)), 1)
            return
        children = self._children
        for entry, n in Tally(entries).items():
            child = children.get(entry)
            if child is None:
                child = children[entry] = self.counter.labels(entry)
            child.inc(n)

    def add_one(self, entry: str, count: int) -> None:
        if not count:
            return
        if not self.by_entry:
            self.counter.inc(count)
            return
        child = self._children.get(entry)
        if child is None:
            child = self._children[entry] = self.counter.labels(entry)
        child.inc(count)


class Metrics(Telemetry):
    """The beat replica's series (the names are in docs/operations.md, "Metrics")."""

    def __init__(self, registry: CollectorRegistry | None = None, entry_label: bool = True) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry

        def per_entry(name: str, text: str) -> _PerEntry:
            return _PerEntry(name, text, r, entry_label)

        self.claimed_total = per_entry(
            "singlebeat_slots_claimed", "Slots this replica won (by its claim or a sweep)."
        )
        self.sent_total = per_entry(
            "singlebeat_slots_sent",
            "Slots this replica handed to the broker (accepted), takeovers included.",
        )
        self.taken_over_total = per_entry(
            "singlebeat_slots_taken_over",
            "Slots this replica took over from another replica whose lease ran out.",
        )
        self.lost_total = per_entry(
            "singlebeat_slots_lost", "Slots this replica proposed that another replica had won."
        )
        self.paused_total = per_entry(
            "singlebeat_slots_paused", "Slots not sent because their entry was paused."
        )
        self.skipped_total = per_entry(
            "singlebeat_slots_skipped", "Slots the missed-run policy did not send."
        )
        self.publish_failures_total = per_entry(
            "singlebeat_publish_failures",
            "Slots whose publish failed (released for a replica to send again).",
        )
        self.lost_writes_total = Counter(
            "singlebeat_lost_writes",
            "Slots this replica had sent that the database no longer had after a broken "
            "connection (a failover to a lagging standby), written again.",
            registry=r,
        )
        self.database_errors = Counter(
            "singlebeat_database_errors",
            "Statements to the coordination database that failed.",
            registry=r,
        )
        self.dispatch_delay = Histogram(
            "singlebeat_dispatch_delay_seconds",
            "From a slot's instant to the broker accepting its message (database clock).",
            buckets=DISPATCH_BUCKETS,
            registry=r,
        )
        self.round_trip_seconds = Histogram(
            "singlebeat_database_round_trip_seconds",
            "Duration of each successful statement to the coordination database.",
            buckets=ROUND_TRIP_BUCKETS,
            registry=r,
        )
        self.outage_gauge = Gauge(
            "singlebeat_outage",
            "1 while this replica cannot reach the database (it sends nothing), else 0.",
            registry=r,
        )
        self.last_loop = Gauge(
            "singlebeat_last_loop_timestamp_seconds",
            "When this replica's loop last ended a tick (Unix time).",
            registry=r,
        )
        self.live_replicas = Gauge(
            "singlebeat_live_replicas",
            "Replicas this one saw live at its last heartbeat (itself included).",
            registry=r,
        )
        self.open_claims = Gauge(
            "singlebeat_open_claims",
            "Claimed but unsent slot rows in the whole store, at the last heartbeat.",
            registry=r,
        )
        self.outage_gauge.set(0)

    def exposition(self, accept: str = "") -> tuple[int, str, bytes]:
        """The ``/metrics`` answer: (status, content type, body), in the format
        the scraper's ``Accept`` asks for (OpenMetrics for Prometheus)."""
        return _exposition(self.registry, accept)

    # -- Telemetry ------------------------------------------------------------

    def loop(self, monotonic: float) -> None:
        self.last_loop.set(time.time())

    def round_trip(self, seconds: float, ok: bool) -> None:
        if ok:
            self.round_trip_seconds.observe(seconds)
        else:
            self.database_errors.inc()

    def outage(self, active: bool) -> None:
        self.outage_gauge.set(1 if active else 0)

    def claimed(self, claims: Sequence[Claim]) -> None:
        self.claimed_total.add((c.entry for c in claims), len(claims))

    def lost(self, keys: Sequence[SlotKey]) -> None:
        self.lost_total.add((k.entry for k in keys), len(keys))

    def paused(self, keys: Sequence[SlotKey]) -> None:
        self.paused_total.add((k.entry for k in keys), len(keys))

    def taken_over(self, claims: Sequence[Claim]) -> None:
        self.taken_over_total.add((c.entry for c in claims), len(claims))

    def skipped(self, entry: str, count: int) -> None:
        self.skipped_total.add_one(entry, count)

    def publish_failed(self, claims: Sequence[Claim]) -> None:
        self.publish_failures_total.add((c.entry for c in claims), len(claims))

    def lost_writes(self, count: int) -> None:
        self.lost_writes_total.inc(count)

    def sent(self, claims: Sequence[Claim], accepted_us: int) -> None:
        self.sent_total.add((c.entry for c in claims), len(claims))
        observe = self.dispatch_delay.observe
        for claim in claims:
            # a slot can be accepted a little before its instant (the claim's
            # early tolerance); a negative delay would only skew the low bucket
            observe(max(0, accepted_us - claim.slot_us) / 1e6)

    def fleet(self, live_replicas: int, open_claims: int | None) -> None:
        self.live_replicas.set(live_replicas)
        if open_claims is not None:
            self.open_claims.set(open_claims)


class WorkerMetrics(SingletonTelemetry):
    """SingletonTask's series, labelled by task name (bounded: one per task type)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.acquired_total = Counter(
            "singlebeat_singleton_acquired",
            "Executions that acquired their singleton key and ran.",
            ["task"],
            registry=r,
        )
        self.busy_total = Counter(
            "singlebeat_singleton_busy",
            "Calls that found their key held, by busy policy (skip, retry, raise).",
            ["task", "policy"],
            registry=r,
        )
        self.repeats_total = Counter(
            "singlebeat_singleton_repeats_dropped",
            "Repeated deliveries of a slot that already ran (or runs), dropped.",
            ["task"],
            registry=r,
        )
        self.lost_total = Counter(
            "singlebeat_singleton_leases_lost",
            "Executions that lost their lease while running (taken over, or the "
            "database unreachable until it ended).",
            ["task"],
            registry=r,
        )
        self.renewals_total = Counter(
            "singlebeat_singleton_renewals",
            "Heartbeat renewals of running executions' leases that succeeded.",
            ["task"],
            registry=r,
        )
        self.renewal_failures_total = Counter(
            "singlebeat_singleton_renewal_failures",
            "Heartbeat renewals that could not reach the database (retried until the lease ends).",
            ["task"],
            registry=r,
        )
        self.lost_writes_total = Counter(
            "singlebeat_singleton_lost_writes",
            "Run rows this worker wrote that the database had lost after a broken "
            "connection (a failover to a lagging standby), written again.",
            registry=r,
        )
        self.renewal_seconds = Histogram(
            "singlebeat_singleton_renewal_seconds",
            "Duration of each successful heartbeat renewal (lease and run row).",
            ["task"],
            buckets=RENEWAL_BUCKETS,
            registry=r,
        )

    def acquired(self, task: str) -> None:
        self.acquired_total.labels(task).inc()

    def busy(self, task: str, policy: str) -> None:
        self.busy_total.labels(task, policy).inc()

    def repeat_dropped(self, task: str) -> None:
        self.repeats_total.labels(task).inc()

    def renewed(self, task: str, seconds: float) -> None:
        self.renewals_total.labels(task).inc()
        self.renewal_seconds.labels(task).observe(seconds)

    def renew_failed(self, task: str) -> None:
        self.renewal_failures_total.labels(task).inc()

    def lease_lost(self, task: str) -> None:
        self.lost_total.labels(task).inc()

    def lost_writes(self, count: int) -> None:
        self.lost_writes_total.inc(count)


_worker_metrics: dict[int, WorkerMetrics] = {}


def worker_metrics(registry: CollectorRegistry | None = None) -> WorkerMetrics:
    """This process's :class:`WorkerMetrics` for ``registry`` (None: a
    dedicated one), made once: a series can be registered only once per
    registry, and a prefork child inherits its parent's (prometheus_client
    moves their values to the child's own files at its first increment)."""
    key = id(registry)
    metrics = _worker_metrics.get(key)
    if metrics is None:
        metrics = _worker_metrics[key] = WorkerMetrics(registry)
    return metrics


def multiprocess_registry() -> CollectorRegistry:
    """A registry that reads every process's values in ``PROMETHEUS_MULTIPROC_DIR``."""
    from prometheus_client import multiprocess

    if not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from ..exceptions import ConfigurationError

        raise ConfigurationError(
            "PROMETHEUS_MULTIPROC_DIR is not set: set it to an empty directory, the same "
            "for the worker and its pool children, before the worker starts"
        )
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
    return registry


def serve_multiprocess(port: int, bind: str = "0.0.0.0") -> Any:
    """Serve ``/metrics`` of every process sharing ``PROMETHEUS_MULTIPROC_DIR``
    on ``bind``:``port`` from a daemon thread; returns the listener (its
    ``close()`` stops it). Call it once, in a worker's main process
    (``worker_init``), or in a sidecar that sees the same directory."""
    from .listener import Listener

    registry = multiprocess_registry()

    def answer(accept: str) -> tuple[int, str, bytes]:
        return _exposition(registry, accept)

    return Listener.start(bind, port, {"/metrics": answer}, setting="port")


def _exposition(registry: CollectorRegistry, accept: str) -> tuple[int, str, bytes]:
    encoder, content_type = choose_encoder(accept)
    return 200, content_type, encoder(registry)


def metric_names(*registries: CollectorRegistry) -> set[str]:
    """Every sample name these registries can expose (``_total`` of counters,
    ``_bucket``/``_sum``/``_count`` of histograms): what dashboards and rules
    may query (a unit test checks deploy/ against it)."""
    suffixes = {
        "counter": ("_total", "_created"),
        "histogram": ("_bucket", "_sum", "_count", "_created"),
        "gauge": ("",),
    }
    names: set[str] = set()
    for registry in registries:
        for family in registry.collect():
            names.update(family.name + s for s in suffixes.get(family.type, ("",)))
    return names


__all__ = [
    "Metrics",
    "WorkerMetrics",
    "metric_names",
    "multiprocess_registry",
    "serve_multiprocess",
    "worker_metrics",
]
