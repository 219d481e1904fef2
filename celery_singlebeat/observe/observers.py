"""The observers a process's settings ask for, assembled behind one set of hooks.

A beat replica may run the health probes (status file, HTTP ``/livez`` and
``/readyz``), Prometheus metrics and the HTTP listener that serves both; a
worker may run SingletonTask's metrics. This module reads the settings,
builds those that are asked for and hands the process one
:class:`~.telemetry.Telemetry` (or :class:`~.telemetry.SingletonTelemetry`).
It lives apart from :mod:`.telemetry`, whose hooks each observer subclasses,
so that the hooks import none of their implementations (no import circle),
and each observer's module is imported only when asked for: a user without
the ``metrics`` extra runs no line of :mod:`.metrics`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .telemetry import NOTHING, SINGLETON_NOTHING, Fanout, SingletonTelemetry, Telemetry

if TYPE_CHECKING:
    from ..config import Settings


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
            from ..exceptions import ConfigurationError

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
