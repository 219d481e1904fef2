"""What the scheduler reports as it works: the hooks behind metrics and probes.

The scheduler calls a :class:`Telemetry` at each decision; the default does
nothing, so a replica without metrics or probes pays one method call per
batch (never per slot: every hook takes the whole batch). :mod:`.metrics`
turns the calls into Prometheus series, :mod:`.health` into liveness and
readiness; :class:`Fanout` hands each call to several.

Instants are microseconds on the database's clock (the replica's estimate of
it), durations seconds.
"""

from __future__ import annotations

# Annotations only: health.py subclasses Telemetry, and the exec probe imports
# health.py, which must not pay for the store's modules (mypy reads any name
# TYPE_CHECKING as typing's; importing typing would cost the probe ~8 ms).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any

    from .config import Settings
    from .store.base import Claim, SlotKey


class Telemetry:
    """No-op hooks; subclasses override what they record."""

    def loop(self, monotonic: float) -> None:
        """A tick ended (also one that met an outage): the loop is alive."""

    def schema_ready(self) -> None:
        """The schema was checked and the entries registered."""

    def round_trip(self, seconds: float, ok: bool) -> None:
        """One statement to the database took ``seconds``; ``ok`` False: it failed."""

    def outage(self, active: bool) -> None:
        """The database became unreachable (True) or reachable again (False)."""

    def claimed(self, claims: Sequence[Claim]) -> None:
        """Slots this replica won (by its claim or a sweep)."""

    def lost(self, keys: Sequence[SlotKey]) -> None:
        """Slots it proposed that another replica had won."""

    def paused(self, keys: Sequence[SlotKey]) -> None:
        """Slots it proposed that were not sent because their entry is paused."""

    def taken_over(self, claims: Sequence[Claim]) -> None:
        """Slots it took over from another replica (lease ran out)."""

    def skipped(self, entry: str, count: int) -> None:
        """Slots the missed-run policy did not send."""

    def publish_failed(self, claims: Sequence[Claim]) -> None:
        """Slots whose publish failed (released for a replica to send again)."""

    def sent(self, claims: Sequence[Claim], accepted_us: int) -> None:
        """Slots the broker accepted at ``accepted_us`` (dispatch delay:
        ``accepted_us - claim.slot_us``)."""

    def lost_writes(self, count: int) -> None:
        """After a broken connection, ``count`` slots this replica had sent were
        missing from the database (a failover lost them) and were written again."""

    def fleet(self, live_replicas: int, open_claims: int | None) -> None:
        """What the last heartbeat read: replicas that won a slot lately
        (itself included), and claimed-but-unsent rows in the whole store."""

    def close(self) -> None:
        """The scheduler stops: release what the hooks hold (a listener, a file)."""


class Fanout(Telemetry):
    """Hands every call to each of ``parts``, in order."""

    def __init__(self, parts: Sequence[Telemetry]) -> None:
        self.parts = tuple(parts)

    def loop(self, monotonic: float) -> None:
        for part in self.parts:
            part.loop(monotonic)

    def schema_ready(self) -> None:
        for part in self.parts:
            part.schema_ready()

    def round_trip(self, seconds: float, ok: bool) -> None:
        for part in self.parts:
            part.round_trip(seconds, ok)

    def outage(self, active: bool) -> None:
        for part in self.parts:
            part.outage(active)

    def claimed(self, claims: Sequence[Claim]) -> None:
        for part in self.parts:
            part.claimed(claims)

    def lost(self, keys: Sequence[SlotKey]) -> None:
        for part in self.parts:
            part.lost(keys)

    def paused(self, keys: Sequence[SlotKey]) -> None:
        for part in self.parts:
            part.paused(keys)

    def taken_over(self, claims: Sequence[Claim]) -> None:
        for part in self.parts:
            part.taken_over(claims)

    def skipped(self, entry: str, count: int) -> None:
        for part in self.parts:
            part.skipped(entry, count)

    def publish_failed(self, claims: Sequence[Claim]) -> None:
        for part in self.parts:
            part.publish_failed(claims)

    def sent(self, claims: Sequence[Claim], accepted_us: int) -> None:
        for part in self.parts:
            part.sent(claims, accepted_us)

    def lost_writes(self, count: int) -> None:
        for part in self.parts:
            part.lost_writes(count)

    def fleet(self, live_replicas: int, open_claims: int | None) -> None:
        for part in self.parts:
            part.fleet(live_replicas, open_claims)

    def close(self) -> None:
        for part in self.parts:
            part.close()


#: the hooks of a replica without metrics or probes
NOTHING = Telemetry()


class SingletonTelemetry:
    """No-op hooks of SingletonTask in a worker (:class:`.metrics.WorkerMetrics`
    records them); ``task`` is the task's name. Each is one call per execution
    or per renewal, never inside the database's answer."""

    def acquired(self, task: str) -> None:
        """An execution acquired its key and runs."""

    def busy(self, task: str, policy: str) -> None:
        """A call found its key held; ``policy`` is what it does (skip, retry, raise)."""

    def repeat_dropped(self, task: str) -> None:
        """A repeated delivery of a slot that already ran (or runs) was dropped."""

    def renewed(self, task: str, seconds: float) -> None:
        """The heartbeat renewed a running execution's lease in ``seconds``."""

    def renew_failed(self, task: str) -> None:
        """A renewal could not reach the database (retried until the lease ends)."""

    def lease_lost(self, task: str) -> None:
        """A running execution lost its lease."""

    def lost_writes(self, count: int) -> None:
        """After a broken connection, ``count`` run rows this process wrote were
        missing and were written again (singleton/writeback.py)."""


#: the hooks of a worker without metrics
SINGLETON_NOTHING = SingletonTelemetry()


def _prometheus_installed() -> bool:
    from importlib.util import find_spec

    return find_spec("prometheus_client") is not None


def beat_metrics_on(settings: Settings) -> bool:
    """``singlebeat_metrics``; unset: on when the HTTP listener runs and
    prometheus_client is installed (Settings checked that True has it)."""
    if settings.metrics is not None:
        return settings.metrics
    return settings.http_port is not None and _prometheus_installed()


def worker_metrics_on(settings: Settings) -> bool:
    """``singlebeat_metrics``; unset: on when the worker runs prometheus_client's
    multiprocess mode (``PROMETHEUS_MULTIPROC_DIR``), the only way a prefork
    pool's counts can be collected, and prometheus_client is installed."""
    import os

    if settings.metrics is not None:
        return settings.metrics
    return bool(os.environ.get("PROMETHEUS_MULTIPROC_DIR")) and _prometheus_installed()


def for_scheduler(settings: Settings) -> Telemetry:
    """The hooks a beat replica's settings ask for: health (status file, HTTP
    probes), metrics, the HTTP listener; :data:`NOTHING` when none.

    Raises ConfigurationError (naming the setting) when the status file cannot
    be written or the port cannot be listened on."""
    metrics_on = beat_metrics_on(settings)
    probes = settings.http_port is not None or settings.status_file is not None
    if not probes and not metrics_on:
        return NOTHING
    parts: list[Telemetry] = []
    routes: dict[str, Any] = {}
    if probes:
        from .health import Health
        from .listener import probe_route

        health = Health(
            settings.liveness_timeout.total_seconds(),
            settings.readiness_timeout.total_seconds(),
            settings.status_file,
        )
        parts.append(health)
        routes["/livez"] = probe_route(health.live)
        routes["/readyz"] = probe_route(health.ready)
    if metrics_on:
        from .metrics import Metrics

        try:
            metrics = Metrics(settings.metrics_registry, settings.metrics_entry_label)
        except ValueError as exc:  # prometheus_client: "Duplicated timeseries"
            from .exceptions import ConfigurationError

            for part in parts:
                part.close()
            raise ConfigurationError(
                f"singlebeat_metrics_registry: {exc}; it already holds this scheduler's "
                "series (a second scheduler in this process?): leave it None for a "
                "registry of each scheduler's own"
            ) from None
        parts.append(metrics)
        routes["/metrics"] = metrics.exposition
    if settings.http_port is not None:
        from .listener import Listener

        try:
            parts.append(Listener.start(settings.http_bind, settings.http_port, routes))
        except Exception:
            for part in parts:
                part.close()
            raise
    return parts[0] if len(parts) == 1 else Fanout(parts)


def check_for_scheduler(settings: Settings) -> None:
    """Raise the ConfigurationError :func:`for_scheduler` would (the status
    file's directory, the port in use), keeping nothing: the status file
    is written ("starting") and the port listened on for an instant."""
    if settings.status_file is not None:
        from .health import Health

        Health(
            settings.liveness_timeout.total_seconds(),
            settings.readiness_timeout.total_seconds(),
            settings.status_file,
        )
    if settings.http_port is not None:
        from .listener import Listener

        Listener.check(settings.http_bind, settings.http_port)


def for_worker(settings: Settings) -> SingletonTelemetry:
    """SingletonTask's hooks in this worker process: metrics or nothing."""
    if not worker_metrics_on(settings):
        return SINGLETON_NOTHING
    from .metrics import worker_metrics

    return worker_metrics(settings.metrics_registry)
