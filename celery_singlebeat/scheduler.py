"""``SingleBeatScheduler``: run ``celery beat`` in every pod, send each run once.

The Celery adapter. Celery builds it (twice: a lazy instance for the banner,
then the real one), calls ``setup_schedule`` and then ``tick`` in its loop;
this class turns those calls into the engine's (:mod:`.engine`), which
decides when each slot is sent and by whom, and keeps the outage backoff.
Its entries come from sources (:mod:`.sources`), which this adapter builds
and hands to the engine: Celery's ``beat_schedule`` first
(:mod:`.beat.source`), then any given to it, then the stored schedules
(:mod:`.schedules.source`) unless ``singlebeat_schedules`` is off.

When the database cannot be reached the replica sends nothing at all: there is
no uncoordinated fallback (:mod:`.engine.outage`).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import replace
from functools import cached_property
from typing import Any

from celery.beat import Scheduler

from .beat.embedded import stop_worker
from .beat.fatal import stop_beat
from .beat.source import BeatScheduleSource
from .beat.stopping import stop_deferred
from .config import DEFAULT_MAX_LOOP_INTERVAL, Settings, read_setting
from .engine import SYSTEM, Engine, Environment
from .engine.outage import BACKOFF_MAX
from .exceptions import ConfigurationError, ConnectionReplaced, StoreUnavailable
from .observe.observers import check_for_scheduler, for_scheduler
from .observe.telemetry import NOTHING, Telemetry
from .schedules.source import StoredSource
from .sources import EntryDefinition, EntrySource
from .store.base import Store
from .timeline.clock import US

#: a child of "celery_singlebeat": configuring that logger still configures this one
logger = logging.getLogger("celery_singlebeat.scheduler")


class SingleBeatScheduler(Scheduler):  # type: ignore[misc]
    """A Celery beat scheduler whose replicas coordinate through a SQL database.

    Set ``beat_scheduler = "celery_singlebeat.SingleBeatScheduler"`` and
    ``singlebeat_url`` (any SQLAlchemy URL; default: a SQLite file in the working
    directory), then run ``celery beat`` in every pod.

    Built by hand (tests, the simulation), it also takes keyword arguments
    Celery never passes: ``sources``, entry sources besides ``beat_schedule``
    (:class:`~celery_singlebeat.sources.EntrySource`); ``env``, the clocks and
    random source (:class:`~celery_singlebeat.engine.Environment`); and
    ``replica_id``, which overrides ``singlebeat_replica_id``.
    """

    #: sleep at most this long between ticks unless ``beat_max_loop_interval`` says otherwise.
    max_interval = DEFAULT_MAX_LOOP_INTERVAL.total_seconds()

    def __init__(
        self,
        app: Any,
        *args: Any,
        lazy: bool = False,
        sources: Sequence[EntrySource] = (),
        env: Environment | None = None,
        replica_id: str | None = None,
        **kwargs: Any,
    ) -> None:
        try:
            self._build(app, args, kwargs, lazy, sources, env or SYSTEM, replica_id)
        except ConfigurationError as exc:
            stop_beat(exc)  # one line, not Celery's traceback (fatal.py)
            raise

    def _build(
        self,
        app: Any,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        lazy: bool,
        sources: Sequence[EntrySource],
        env: Environment,
        replica_id: str | None,
    ) -> None:
        loop = kwargs.get("max_interval") or app.conf.beat_max_loop_interval
        # Validated before anything else, also for the lazy instance celery beat
        # builds for its banner, so a bad setting stops the process at start-up.
        settings = Settings.from_conf(app.conf, max_loop_interval=loop)
        if replica_id:
            settings = replace(settings, replica_id=replica_id)
        elif not read_setting(app.conf, "singlebeat_replica_id"):
            # celery beat builds a lazy instance for its banner, then the real one:
            # hand the generated id on, or the banner names a replica that never runs.
            if lazy:
                app._singlebeat_banner_replica_id = settings.replica_id
            elif banner_id := app.__dict__.pop("_singlebeat_banner_replica_id", None):
                settings = replace(settings, replica_id=banner_id)
        self._settings = settings
        self.env = env
        self._sources = list(sources)
        #: metrics and probes (telemetry.py); built with the real instance
        self.telemetry: Telemetry = self._make_telemetry(lazy)
        #: the engine: every decision about a slot (engine/)
        self.engine = Engine(
            settings,
            env=env,
            telemetry=self.telemetry,
            open_store=self._open_store,
            app=app,
            producer=lambda: self.producer,
            default_tz=app.timezone,
            max_interval=self.max_interval,
            signal_sender=self,
            fatal=stop_worker,
        )
        super().__init__(app, *args, lazy=lazy, **kwargs)
        # Celery may have set max_interval from its argument or setting
        self.engine.max_interval = self.max_interval
        if lazy:
            # Celery builds the lazy instance before it sets up logging: a bad entry
            # fails here as one plain traceback. Raised by the real instance, Celery
            # logs it, then re-prints it line by line through its stderr proxy.
            schedule = {
                name: self.Entry(**dict(fields, name=name, app=app))
                for name, fields in (app.conf.beat_schedule or {}).items()
            }
            self._beat_source(schedule)

    # -- Celery's Scheduler API -----------------------------------------------

    @property
    def settings(self) -> Settings:
        """This replica's settings, read once at start-up (read-only: the
        engine holds them; pass ``replica_id`` to override the id)."""
        return self._settings

    @property
    def info(self) -> str:
        return (
            f"    . singlebeat -> {self.settings.safe_url}\n"
            f"    . replica -> {self.settings.replica_id}"
        )

    @property
    def stats(self) -> dict[str, int]:
        """Per-tick figures (claimed, lost, sent, taken over, skipped, ...),
        read by benchmarks and tests."""
        return self.engine.stats

    @property
    def entries(self) -> dict[str, EntryDefinition]:
        """Every entry this replica has, from all its sources, by name (after
        ``setup_schedule``; an entry changed at run time as last seen)."""
        return self.engine.entries()

    def setup_schedule(self) -> None:
        super().setup_schedule()
        sources: list[EntrySource] = [self._beat_source(self.schedule), *self._sources]
        if self.settings.schedules:
            sources.append(
                StoredSource(self.engine.connected_store, self.settings.missed, self.app.timezone)
            )
        self.engine.use_sources(sources)
        count = self.engine.load_sources()
        logger.info(
            "singlebeat: replica %s coordinating %d entries through %s "
            "(lease %gs, missed-run policy %s, grace %gs)",
            self.settings.replica_id,
            count,
            self.settings.safe_url,
            self.settings.lease.total_seconds(),
            self.settings.missed.mode,
            self.settings.missed.grace_us / US,
        )

    def _beat_source(self, schedule: dict[str, Any]) -> BeatScheduleSource:
        return BeatScheduleSource(
            schedule,
            self.settings.missed,
            self.app.timezone,
            int(self.env.time() * US),
        )

    def tick(self, *args: Any, **kwargs: Any) -> float:
        engine = self.engine
        # A stop (SIGTERM, SIGINT) waits for the tick: cut between a claim and
        # its confirm it would delay or repeat those slots (stopping.py).
        try:
            with stop_deferred():
                if not engine.ready:
                    engine.connect()
                delay = engine.tick()
        except ConnectionReplaced:
            # reconnected, maybe to a promoted standby: the next tick writes back
            # what this replica sent (failover.py) before it decides anything
            engine.broke()
            self.telemetry.loop(self.env.monotonic())
            return 0.0
        except StoreUnavailable as exc:
            engine.broke()
            delay = engine.outage.failed(exc)
            self.telemetry.loop(self.env.monotonic())
            return delay
        engine.answered()
        self.telemetry.loop(self.env.monotonic())
        return delay

    @cached_property
    def producer(self) -> Any:
        """The producer every publish goes through, connecting at its first use.

        Celery's own first waits for the broker in ``ensure_connection()``, up to
        ``broker_connection_max_retries`` (100) with a back-off growing to 30 s:
        a replica whose first publish comes during a broker outage would stall
        its loop for the outage (up to ~47 minutes), neither publishing nor
        releasing what it claimed nor proposing what falls due, which the
        missed-run policy then drops. Connected lazily, the first publish fails
        like any later one, after ``task_publish_retry_policy``.
        """
        return self.Producer(self.connection, auto_declare=False)

    def _make_telemetry(self, lazy: bool) -> Telemetry:
        """The hooks the settings ask for (metrics, probes), or none; the lazy
        (banner) instance only checks that they can be made, as it checks the
        settings, so that a port in use stops beat before its banner."""
        if lazy:
            check_for_scheduler(self.settings)
            return NOTHING
        return for_scheduler(self.settings)

    def _open_store(self) -> Store:
        from .store.sql import SqlStore

        store = SqlStore.from_settings(self.settings)
        store.stop_at_reconnect = True
        return store

    def sync(self) -> None:
        # Nothing to persist: every decision is already in the database.
        pass

    def close(self) -> None:
        try:
            super().close()
        finally:
            self.telemetry.close()
            self.engine.close()


__all__ = ["BACKOFF_MAX", "SingleBeatScheduler"]
