"""Settings, read once from the Celery app into a frozen, validated object.

Every check runs at start-up, before any database connection, and a failure
raises :class:`~celery_singlebeat.exceptions.ConfigurationError` naming the
setting and the fix. Durations accept a ``timedelta`` or a number of seconds.
"""

from __future__ import annotations

import os
import re
import socket
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from datetime import timedelta
from typing import Any

from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError

from . import redact
from .exceptions import ConfigurationError
from .slots import MISSED_MODES, MissedPolicy

#: The embedded default: a SQLite file in the working directory.
DEFAULT_URL = "sqlite:///celery-singlebeat.sqlite"

#: Default sleep bound of our scheduler when ``beat_max_loop_interval`` is unset.
DEFAULT_MAX_LOOP_INTERVAL = timedelta(seconds=5)

SUPPORTED_BACKENDS = ("postgresql", "mysql", "mariadb", "sqlite")

#: ``singlebeat_table_prefix``: an unquoted SQL identifier start, 30 characters at most.
_TABLE_PREFIX = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,29}")


def _duration(name: str, value: Any) -> timedelta:
    if isinstance(value, timedelta):
        result = value
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        try:
            result = timedelta(seconds=value)
        except (ValueError, OverflowError):  # nan, inf, beyond timedelta's range
            raise ConfigurationError(f"{name}={value!r}: not a usable number of seconds") from None
    else:
        raise ConfigurationError(
            f"{name}={value!r}: expected a datetime.timedelta or a number of seconds"
        )
    if result <= timedelta(0):
        raise ConfigurationError(f"{name}={value!r}: must be positive")
    return result


def _us(value: timedelta) -> int:
    return value // timedelta(microseconds=1)


def default_replica_id() -> str:
    """``host:pid:random``: the host (pod name) and pid say where; the suffix
    tells apart restarts that reuse a pid (every container's beat may be pid 1)."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


def parse_missed_policy(
    prefix: str, options: Mapping[str, Any], default: MissedPolicy
) -> MissedPolicy:
    """A missed-run policy from ``<prefix>missed_policy``/``_grace``/``_max`` keys."""
    mode = options.get(f"{prefix}missed_policy", default.mode)
    if mode not in MISSED_MODES:
        raise ConfigurationError(
            f"{prefix}missed_policy={mode!r}: expected one of {', '.join(MISSED_MODES)}"
        )
    grace = options.get(f"{prefix}missed_grace")
    grace_us = default.grace_us if grace is None else _us(_duration(f"{prefix}missed_grace", grace))
    max_missed = options.get(f"{prefix}missed_max", default.max_missed)
    if not isinstance(max_missed, int) or isinstance(max_missed, bool) or max_missed < 1:
        raise ConfigurationError(f"{prefix}missed_max={max_missed!r}: expected an integer >= 1")
    policy = MissedPolicy(mode=mode, grace_us=grace_us, max_missed=max_missed)
    # the default's own instance when equal: one per entry adds up at 100,000 entries
    return default if policy == default else policy


@dataclass(frozen=True, repr=False)
class Settings:
    """Validated celery-singlebeat settings (``app.conf.singlebeat_*``)."""

    url: URL
    #: extra keyword arguments for ``sqlalchemy.create_engine``.
    engine_options: Mapping[str, Any]
    #: how long a claim keeps other replicas off a slot while its winner publishes.
    lease: timedelta
    #: slot rows younger than this are never deleted; older proposals are checked
    #: against each entry's high-water mark instead.
    retention: timedelta
    missed: MissedPolicy
    create_schema: bool
    table_prefix: str
    replica_id: str
    max_loop_interval: timedelta
    #: how many expired claims one sweep takes over at most.
    takeover_batch: int = 500
    #: SingletonTask: finished run rows (per-slot dedupe) and idle key rows are
    #: kept this long; a slot delivered again later than this runs again.
    run_retention: timedelta = timedelta(days=7)
    extra: Mapping[str, Any] = field(default_factory=dict)

    @property
    def lease_us(self) -> int:
        return _us(self.lease)

    @property
    def retention_us(self) -> int:
        return _us(self.retention)

    @property
    def run_retention_us(self) -> int:
        return _us(self.run_retention)

    @property
    def safe_url(self) -> str:
        """The database URL with its password and secret query parameters masked,
        for logs, the banner and the CLI (:func:`celery_singlebeat.redact.safe_url`)."""
        return redact.safe_url(self.url)

    def __repr__(self) -> str:
        # The generated repr would show the URL's secret query parameters (its
        # repr masks only the password) and engine_options' connect_args whole.
        shown = {f.name: getattr(self, f.name) for f in fields(self)}
        shown["url"] = self.safe_url
        shown["engine_options"] = redact.redact_options(self.engine_options)
        shown["extra"] = redact.redact_options(self.extra)
        return f"Settings({', '.join(f'{k}={v!r}' for k, v in shown.items())})"

    @property
    def backend(self) -> str:
        return self.url.get_backend_name()

    @classmethod
    def from_conf(
        cls, conf: Mapping[str, Any], max_loop_interval: float | timedelta | None = None
    ) -> Settings:
        """Read and validate the settings from a Celery app's ``conf``.

        ``max_loop_interval`` is the scheduler's effective loop interval when the
        caller knows it (``celery beat --max-interval``); otherwise it is read
        from ``beat_max_loop_interval``.
        """
        raw_url = conf.get("singlebeat_url") or DEFAULT_URL
        if isinstance(raw_url, str) and raw_url.startswith("django://"):
            from .contrib.django import SCHEME, database_url

            raw_url = database_url(raw_url[len(SCHEME) :] or "default")
        try:
            url = make_url(raw_url) if isinstance(raw_url, str) else raw_url
        except (ArgumentError, ValueError):
            # Neither the URL nor the parser's message may be shown whole: a typo
            # can put the password where a port or host is expected.
            raise ConfigurationError(
                f"singlebeat_url: cannot parse the database URL {redact.safe_url(str(raw_url))!r}. "
                "Expected an SQLAlchemy URL such as postgresql+psycopg://user:pass@host/db"
            ) from None
        if not isinstance(url, URL):
            raise ConfigurationError("singlebeat_url: expected a string or sqlalchemy URL")
        if url.get_backend_name() not in SUPPORTED_BACKENDS:
            raise ConfigurationError(
                f"singlebeat_url: unsupported database {url.get_backend_name()!r}; "
                f"use one of {', '.join(SUPPORTED_BACKENDS)}"
            )
        if url.get_backend_name() == "sqlite" and url.database in (None, "", ":memory:"):
            raise ConfigurationError(
                "singlebeat_url: an in-memory SQLite database cannot be shared between "
                "beat processes; use a file, e.g. sqlite:///celery-singlebeat.sqlite"
            )

        lease = _duration("singlebeat_lease", conf.get("singlebeat_lease", 15))
        if lease < timedelta(seconds=1):
            raise ConfigurationError(
                f"singlebeat_lease={lease.total_seconds()}s: must be at least 1 second"
            )
        # 0 is Celery's default for beat_max_loop_interval and means "the scheduler's own".
        loop = max_loop_interval or conf.get("beat_max_loop_interval")
        max_loop = (
            DEFAULT_MAX_LOOP_INTERVAL if not loop else _duration("beat_max_loop_interval", loop)
        )
        if lease <= max_loop:
            raise ConfigurationError(
                f"singlebeat_lease ({lease.total_seconds():g}s) must be longer than "
                f"beat_max_loop_interval ({max_loop.total_seconds():g}s): a replica checks "
                "for abandoned claims once per loop, so a shorter lease cannot be honoured. "
                "Raise singlebeat_lease or lower beat_max_loop_interval."
            )
        retention = _duration("singlebeat_retention", conf.get("singlebeat_retention", 900))
        if retention < lease * 4:
            raise ConfigurationError(
                f"singlebeat_retention ({retention.total_seconds():g}s) must be at least four "
                f"times singlebeat_lease ({lease.total_seconds():g}s)"
            )
        run_retention = _duration(
            "singlebeat_run_retention", conf.get("singlebeat_run_retention", 7 * 86_400)
        )
        if run_retention < timedelta(hours=1):
            raise ConfigurationError(
                f"singlebeat_run_retention ({run_retention.total_seconds():g}s) must be at "
                "least one hour: it is how long a repeated delivery of a slot is recognised"
            )
        default_policy = MissedPolicy("coalesce", _us(timedelta(seconds=5)), 100)
        missed = parse_missed_policy("singlebeat_", conf, default_policy)

        prefix = conf.get("singlebeat_table_prefix", "singlebeat_")
        # ASCII only: str.isalnum() also accepts "é", "²" or "٣", which the
        # table names (and MySQL's 64-byte identifier limit) should not see.
        if not isinstance(prefix, str) or not _TABLE_PREFIX.fullmatch(prefix):
            raise ConfigurationError(
                f"singlebeat_table_prefix={prefix!r}: use ASCII letters, digits and "
                "underscores, starting with a letter or an underscore (at most 30 characters)"
            )
        engine_options = conf.get("singlebeat_engine_options") or {}
        if not isinstance(engine_options, Mapping):
            raise ConfigurationError("singlebeat_engine_options: expected a dict")
        replica_id = conf.get("singlebeat_replica_id") or default_replica_id()
        if not isinstance(replica_id, str) or len(replica_id) > 120:
            raise ConfigurationError(
                "singlebeat_replica_id: expected a string of at most 120 characters"
            )
        # Read from the app's conf, not only a field: a replica catching up after a
        # broker outage publishes at most this many taken-over slots per sweep, and
        # an operator (or a test) may need to bound that burst.
        takeover_batch = conf.get("singlebeat_takeover_batch", 500)
        if (
            not isinstance(takeover_batch, int)
            or isinstance(takeover_batch, bool)
            or takeover_batch < 1
        ):
            raise ConfigurationError(
                f"singlebeat_takeover_batch={takeover_batch!r}: expected an integer >= 1"
            )
        create_schema = conf.get("singlebeat_create_schema", True)
        if not isinstance(create_schema, bool):
            raise ConfigurationError(
                f"singlebeat_create_schema={create_schema!r}: expected True or False"
            )
        return cls(
            url=url,
            engine_options=dict(engine_options),
            lease=lease,
            retention=retention,
            missed=missed,
            create_schema=create_schema,
            table_prefix=prefix,
            replica_id=replica_id,
            max_loop_interval=max_loop,
            takeover_batch=takeover_batch,
            run_retention=run_retention,
        )
