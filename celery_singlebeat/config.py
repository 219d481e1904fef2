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
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, fields
from datetime import timedelta
from typing import Any

from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError

from . import redact
from .exceptions import ConfigurationError
from .timeline import timing
from .timeline.slots import MISSED_MODES, MissedPolicy
from .widths import MAX_REPLICA_ID

#: The embedded default: a SQLite file in the working directory.
DEFAULT_URL = "sqlite:///celery-singlebeat.sqlite"

#: Default sleep bound of our scheduler when ``beat_max_loop_interval`` is unset.
DEFAULT_MAX_LOOP_INTERVAL = timedelta(seconds=5)

SUPPORTED_BACKENDS = ("postgresql", "mysql", "mariadb", "sqlite")

#: ``singlebeat_http_bind``'s default: every interface, because the kubelet's
#: probes and Prometheus reach a pod at its pod IP, never at its 127.0.0.1.
DEFAULT_HTTP_BIND = "0.0.0.0"


@dataclass(frozen=True)
class Setting:
    """One setting: its name, what it accepts, its default and meaning; what the
    parser reads and the docs show.

    :data:`SETTINGS` is the only list of settings: :meth:`Settings.from_conf`
    reads each through :func:`read_setting`, which refuses a name not defined there,
    and the configuration reference of the docs is rendered from it
    (``docs/_ext/singlebeat_settings.py``).
    """

    #: the key in the Celery app's configuration (``app.conf``)
    name: str
    #: what it accepts, for people
    type: str
    #: what :func:`read_setting` answers when the key is unset; None also where the
    #: parser computes the default (``default_doc`` then says how)
    default: Any
    #: one sentence (Markdown) on what it does
    meaning: str
    #: the default as the docs show it, when ``repr(default)`` would not say it
    default_doc: str | None = None
    #: also accepted in a ``beat_schedule`` entry's ``options``, overriding it there
    entry_option: bool = False
    #: who reads it: ``"beat"`` (every replica), ``"celery"`` (Celery's own
    #: setting, with our reading of it) or ``"testing"`` (the in-memory scheduler)
    scope: str = "beat"

    @property
    def shown_default(self) -> str:
        """The default, as the configuration reference prints it."""
        return self.default_doc if self.default_doc is not None else f"`{self.default!r}`"


#: Every setting celery-singlebeat reads, in the order the reference lists them.
SETTINGS: tuple[Setting, ...] = (
    Setting(
        "singlebeat_url",
        "str or `sqlalchemy.URL`",
        DEFAULT_URL,
        "The coordination database: an SQLAlchemy URL of PostgreSQL, MySQL/MariaDB or "
        'SQLite, or `"django://<alias>"` for one of Django\'s `DATABASES`. In a Django '
        "project with `celery_singlebeat.contrib.django` installed, the default is "
        '`"django://default"`.',
        default_doc=(
            '`"sqlite:///celery-singlebeat.sqlite"`; `"django://default"` with the Django app'
        ),
    ),
    Setting(
        "singlebeat_lease",
        "duration",
        15,
        "How long a claim keeps other replicas off a slot while its winner publishes. "
        "At least 1 s and longer than `beat_max_loop_interval`.",
        default_doc="`15` (s)",
    ),
    Setting(
        "singlebeat_retention",
        "duration",
        900,
        "Sent slot rows younger than this are kept; older ones are pruned. At least four "
        "times the lease.",
        default_doc="`900` (s)",
    ),
    Setting(
        "singlebeat_failover_window",
        "duration",
        10,
        "How far back a replica remembers the slots it sent, to write them again after "
        "its connection to the database broke (a failover to a standby that had not "
        "received them); `0` turns it off. At most half the retention.",
        default_doc="`10` (s)",
    ),
    Setting(
        "singlebeat_missed_policy",
        "`coalesce`, `skip` or `all`",
        "coalesce",
        "What to send of slots that are due but later than the grace.",
        entry_option=True,
    ),
    Setting(
        "singlebeat_missed_grace",
        "duration",
        5,
        "A slot is on time while it is at most this late.",
        default_doc="`5` (s)",
        entry_option=True,
    ),
    Setting(
        "singlebeat_missed_max",
        "int ≥ 1",
        100,
        "With `all`, send at most this many of the most recent missed slots per entry.",
        entry_option=True,
    ),
    Setting(
        "singlebeat_create_schema",
        "bool",
        True,
        "Create missing tables at start-up. `False`: only check, and stop if they are missing.",
    ),
    Setting(
        "singlebeat_table_prefix",
        "str (SQL identifier, ≤ 30 characters)",
        "singlebeat_",
        "Prefix of the table names; processes coordinate with every process using the same "
        "database and prefix.",
    ),
    Setting(
        "singlebeat_takeover_batch",
        "int ≥ 1",
        500,
        "How many abandoned claims (released after a failed publish, or left by a replica "
        "that died) one sweep of one replica takes over and publishes at most, oldest first.",
    ),
    Setting(
        "singlebeat_stalled_run_resends",
        "int ≥ 0",
        2,
        "SingletonTask: a slot sent and confirmed whose run was left running by a worker "
        "that died mid-run (its `singleton_ttl` lapsed, then the lease, with no outcome) is "
        "sent again by the fleet, with the same task id, while its run has started at most "
        "this many times; `0` turns the re-sends off.",
    ),
    Setting(
        "singlebeat_engine_options",
        "dict",
        None,
        "Extra keyword arguments for `sqlalchemy.create_engine`, on top of the defaults.",
        default_doc="`{}`",
    ),
    Setting(
        "singlebeat_run_retention",
        "duration",
        7 * 86_400,
        "SingletonTask: finished run rows (per-slot dedupe) and idle key rows are kept this "
        "long; at least one hour.",
        default_doc="`604800` (s, 7 days)",
    ),
    Setting(
        "singlebeat_replica_id",
        f"str (≤ {MAX_REPLICA_ID} characters)",
        None,
        "This replica's name in the database and the logs; unique per running process.",
        default_doc='`"<host>:<pid>:<random>"`',
    ),
    Setting(
        "singlebeat_listen",
        "bool",
        True,
        "PostgreSQL: hear of changes and controls at once (LISTEN/NOTIFY on one extra "
        "connection, proven by a probe: a pooler in transaction mode is found and left). "
        "Off skips the attempt.",
    ),
    Setting(
        "singlebeat_schedules",
        "bool",
        True,
        "Send the entries stored in the database (`Schedules`, `singlebeat schedules`) "
        "besides `beat_schedule`, following their edits within a second. Off: this "
        "replica sends only its `beat_schedule`.",
    ),
    Setting(
        "singlebeat_schedule_log_retention",
        "duration",
        90 * 86400,
        "How long the history of stored entries' changes (`singlebeat schedules log`) is "
        "kept. At least one day.",
        default_doc="`7776000` (s, 90 days)",
    ),
    Setting(
        "singlebeat_http_port",
        "int (1-65535) or None",
        None,
        "The beat process's HTTP listener for `/livez`, `/readyz` and `/metrics`; `None`: no "
        "listener.",
        default_doc="`None` (off)",
    ),
    Setting(
        "singlebeat_http_bind",
        "str (an address)",
        DEFAULT_HTTP_BIND,
        "The address the HTTP listener binds: every interface, since probes and Prometheus "
        "reach the pod IP.",
    ),
    Setting(
        "singlebeat_status_file",
        "path or None",
        None,
        "A file the loop keeps fresh for the exec probe (`python -m celery_singlebeat health`).",
        default_doc="`None` (off)",
    ),
    Setting(
        "singlebeat_liveness_timeout",
        "duration or None",
        None,
        "Live while the loop ended a tick this recently. Longer than 10 s and than the loop "
        "interval.",
        default_doc="`max(60, 2 * lease + 30)` (s)",
    ),
    Setting(
        "singlebeat_readiness_timeout",
        "duration or None",
        None,
        "Ready while the last successful statement is this recent (and no outage). Longer "
        "than the sweep period.",
        default_doc="`3 * max(0.5, lease / 3) + 2` (s, 17 by default)",
    ),
    Setting(
        "singlebeat_metrics",
        "bool or None",
        None,
        "Prometheus series: `True` requires them, `False` turns them off; `None`: on where "
        "they can be served and `prometheus_client` is installed.",
    ),
    Setting(
        "singlebeat_metrics_entry_label",
        "bool",
        True,
        "Whether beat's slot counters carry an `entry` label.",
    ),
    Setting(
        "singlebeat_metrics_registry",
        "`prometheus_client.CollectorRegistry` or None",
        None,
        "The registry the series go to.",
        default_doc="`None` (a dedicated one)",
    ),
    Setting(
        "beat_max_loop_interval",
        "duration",
        0,
        "Celery's setting (or `celery beat --max-interval`): the longest sleep between two "
        "ticks. Must stay below `singlebeat_lease`.",
        default_doc=f"`0`: {DEFAULT_MAX_LOOP_INTERVAL.total_seconds():g} s for this scheduler",
        scope="celery",
    ),
    Setting(
        "singlebeat_memory_store",
        "`celery_singlebeat.testing.MemoryStore` or None",
        None,
        "Read only by `celery_singlebeat.testing.MemoryScheduler`: the in-memory store its "
        "replicas share.",
        default_doc="`None` (one store per scheduler)",
        scope="testing",
    ),
)

#: name -> setting
SETTINGS_BY_NAME: Mapping[str, Setting] = {s.name: s for s in SETTINGS}

#: the keys a ``beat_schedule`` entry's ``options`` may carry for us
ENTRY_OPTIONS: frozenset[str] = frozenset(s.name for s in SETTINGS if s.entry_option)


def setting_default(name: str) -> Any:
    """The defined default of setting ``name`` (KeyError if it is not defined)."""
    return SETTINGS_BY_NAME[name].default


class Overrides(Mapping[str, Any]):
    """Settings a caller gives (``--url``, ``table_prefix=``) over a Celery
    app's ``conf``, read through the conf's ``get``.

    Not a ``ChainMap``: a conf read under a namespace
    (``config_from_object("django.conf:settings", namespace="CELERY")``)
    answers ``conf.get("singlebeat_url")`` with ``CELERY_SINGLEBEAT_URL``, but
    ``"singlebeat_url" in conf`` is False until that first ``get``, and its
    iteration can fail; a ChainMap asks ``in`` first, and so took the default
    over the project's setting.
    """

    def __init__(self, given: Mapping[str, Any], conf: Mapping[str, Any]) -> None:
        self._given = given
        self._conf = conf

    def __getitem__(self, name: str) -> Any:
        if name in self._given:
            return self._given[name]
        missing = object()
        value = self._conf.get(name, missing)
        if value is missing:
            raise KeyError(name)
        return value

    def __iter__(self) -> Iterator[str]:
        # the given names only: a namespaced conf may not iterate
        return iter(self._given)

    def __len__(self) -> int:
        return len(self._given)


#: ``read_setting``'s marker for "no ``unset`` given"
_DEFINED = object()


def read_setting(conf: Mapping[str, Any], name: str, unset: Any = _DEFINED) -> Any:
    """Setting ``name`` from ``conf``, or its defined default when unset
    (``unset`` instead, when given: a default that depends on the process,
    as ``singlebeat_url``'s in a Django project).

    The only way the package reads a setting: a name missing from
    :data:`SETTINGS` raises KeyError at once, so the reference cannot lack a
    setting the code reads.
    """
    definition = SETTINGS_BY_NAME[name]
    return conf.get(name, definition.default if unset is _DEFINED else unset)


#: ``singlebeat_table_prefix``: an unquoted SQL identifier start, 30 characters at most.
_TABLE_PREFIX = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,29}")


def _duration(name: str, value: Any, allow_zero: bool = False) -> timedelta:
    """Setting ``name``'s ``value`` as a duration; a ConfigurationError naming it."""
    try:
        return _duration_of(value, allow_zero)
    except ValueError as exc:
        raise ConfigurationError(f"{name}={value!r}: {exc}") from None


def _duration_of(value: Any, allow_zero: bool = False) -> timedelta:
    """A timedelta or a number of seconds as a timedelta; ValueError saying why not
    (its caller names the setting or the part)."""
    if isinstance(value, timedelta):
        result = value
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        try:
            result = timedelta(seconds=value)
        except (ValueError, OverflowError):  # nan, inf, beyond timedelta's range
            raise ValueError("not a usable number of seconds") from None
    else:
        raise ValueError("expected a datetime.timedelta or a number of seconds")
    if result < timedelta(0) or (result == timedelta(0) and not allow_zero):
        raise ValueError("must be " + ("0 or more" if allow_zero else "positive"))
    return result


def _us(value: timedelta) -> int:
    return value // timedelta(microseconds=1)


def _flag(conf: Mapping[str, Any], name: str) -> bool:
    flag = read_setting(conf, name)
    if not isinstance(flag, bool):
        raise ConfigurationError(f"{name}={flag!r}: expected True or False")
    return flag


def _observing(conf: Mapping[str, Any], lease: timedelta, max_loop: timedelta) -> dict[str, Any]:
    """The health and metrics settings (docs/configuration.md says why each
    default is what it is; timing.py derives the bounds)."""
    port = read_setting(conf, "singlebeat_http_port")
    if port is not None and (
        not isinstance(port, int) or isinstance(port, bool) or not 1 <= port <= 65535
    ):
        raise ConfigurationError(
            f"singlebeat_http_port={port!r}: expected a TCP port (an integer 1-65535), "
            "or None for no HTTP listener"
        )
    bind = read_setting(conf, "singlebeat_http_bind") or DEFAULT_HTTP_BIND
    if not isinstance(bind, str):
        raise ConfigurationError(
            f"singlebeat_http_bind={bind!r}: expected an address such as 0.0.0.0, :: or 10.0.0.5"
        )
    status_file = read_setting(conf, "singlebeat_status_file")
    if status_file is not None:
        if not isinstance(status_file, (str, os.PathLike)) or not os.fspath(status_file):
            raise ConfigurationError(
                f"singlebeat_status_file={status_file!r}: expected a file path, or None"
            )
        status_file = os.fspath(status_file)
    lease_s = lease.total_seconds()
    raw_live = read_setting(conf, "singlebeat_liveness_timeout")
    if raw_live is None:
        liveness = timedelta(seconds=timing.default_liveness_timeout_s(lease_s))
    else:
        liveness = _duration("singlebeat_liveness_timeout", raw_live)
        # In an outage a tick can wait out a connect timeout, then sleep the
        # backoff, and when idle the loop sleeps up to its interval: a shorter
        # bound would fail (and restart) every replica in a database outage,
        # which liveness must never do.
        floor = max(max_loop.total_seconds(), timing.LIVENESS_FLOOR_S)
        if liveness.total_seconds() <= floor:
            raise ConfigurationError(
                f"singlebeat_liveness_timeout ({liveness.total_seconds():g}s) must be longer "
                f"than {floor:g}s: a tick in a database outage can take that long (a "
                "connect timeout, then the backoff), an idle loop sleeps its "
                "beat_max_loop_interval, and an outage must not fail liveness"
            )
    raw_ready = read_setting(conf, "singlebeat_readiness_timeout")
    sweep = timing.sweep_period_s(lease_s)
    if raw_ready is None:
        readiness = timedelta(seconds=timing.default_readiness_timeout_s(lease_s))
    else:
        readiness = _duration("singlebeat_readiness_timeout", raw_ready)
        if readiness.total_seconds() <= sweep:
            raise ConfigurationError(
                f"singlebeat_readiness_timeout ({readiness.total_seconds():g}s) must be longer "
                f"than the sweep period ({sweep:g}s, a third of singlebeat_lease): a replica "
                "with nothing due talks to the database only that often"
            )
    metrics = read_setting(conf, "singlebeat_metrics")
    if metrics is not None and not isinstance(metrics, bool):
        raise ConfigurationError(
            f"singlebeat_metrics={metrics!r}: expected True, False or None (on when "
            "singlebeat_http_port is set and prometheus_client is installed)"
        )
    if metrics:
        from importlib.util import find_spec

        if find_spec("prometheus_client") is None:
            raise ConfigurationError(
                "singlebeat_metrics=True needs prometheus_client: install the metrics "
                "extra, pip install 'celery-singlebeat[metrics]'"
            )
    registry = read_setting(conf, "singlebeat_metrics_registry")
    if registry is not None and not callable(getattr(registry, "register", None)):
        raise ConfigurationError(
            f"singlebeat_metrics_registry={registry!r}: expected a prometheus_client "
            "CollectorRegistry (e.g. prometheus_client.REGISTRY), or None for a dedicated one"
        )
    return {
        "http_port": port,
        "http_bind": bind,
        "status_file": status_file,
        "liveness_timeout": liveness,
        "readiness_timeout": readiness,
        "metrics": metrics,
        "metrics_entry_label": _flag(conf, "singlebeat_metrics_entry_label"),
        "metrics_registry": registry,
    }


def default_replica_id() -> str:
    """``host:pid:random``: the host (pod name) and pid say where; the suffix
    tells apart restarts that reuse a pid (every container's beat may be pid 1)."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


# -- the missed-run policy ------------------------------------------------------

#: the parts of a missed-run policy as a stored entry's document names them, and
#: the key of each in the settings and in a beat_schedule entry's options, after
#: their ``singlebeat_`` prefix
MISSED_KEYS: Mapping[str, str] = {
    "policy": "missed_policy",
    "grace": "missed_grace",
    "max": "missed_max",
}

#: the policy of ``singlebeat_missed_*``'s defined defaults: what the settings
#: leave unsaid, and what a stored entry's override does (an entry is stored
#: apart from any app, so not the app's settings)
BUILTIN_MISSED_POLICY = MissedPolicy(
    mode=setting_default("singlebeat_missed_policy"),
    grace_us=_us(timedelta(seconds=setting_default("singlebeat_missed_grace"))),
    max_missed=setting_default("singlebeat_missed_max"),
)


class MissedPolicyError(ConfigurationError):
    """One part of a missed-run policy is wrong.

    ``part`` is ``policy``, ``grace`` or ``max``; ``reason`` the value and why
    (``0: expected an integer >= 1``). The text names the key the part was
    given as (``singlebeat_missed_max=0: expected an integer >= 1``); a caller
    that names the part its own way (a stored entry's ``missed.max``) reads
    ``part`` and ``reason``.
    """

    def __init__(self, prefix: str, part: str, reason: str) -> None:
        # args are the constructor's, so that pickle rebuilds the same error
        super().__init__(prefix, part, reason)
        self.prefix = prefix
        self.part = part
        self.reason = reason

    def __str__(self) -> str:
        return f"{self.prefix}{MISSED_KEYS[self.part]}={self.reason}"


def parse_missed_policy(
    prefix: str, options: Mapping[str, Any], default: MissedPolicy
) -> MissedPolicy:
    """A missed-run policy from the ``<prefix>missed_policy``/``_grace``/``_max``
    keys of ``options``, ``default``'s parts where they say nothing; a
    :class:`MissedPolicyError` for the first wrong part.

    The one parser of a policy: the settings (``singlebeat_``), a
    beat_schedule entry's options (``singlebeat_``:
    :func:`celery_singlebeat.beat.source.entry_policy`) and a stored entry's
    override (its document form's parts, given here without a prefix:
    :func:`celery_singlebeat.schedules.checks.parse_missed`) all read it here,
    and each names a wrong part its own way.
    """
    mode = options.get(f"{prefix}{MISSED_KEYS['policy']}", default.mode)
    if mode not in MISSED_MODES:
        raise MissedPolicyError(
            prefix, "policy", f"{mode!r}: expected one of {', '.join(MISSED_MODES)}"
        )
    grace = options.get(f"{prefix}{MISSED_KEYS['grace']}")
    if grace is None:
        grace_us = default.grace_us
    else:
        try:
            grace_us = _us(_duration_of(grace))
        except ValueError as exc:
            raise MissedPolicyError(prefix, "grace", f"{grace!r}: {exc}") from None
    max_missed = options.get(f"{prefix}{MISSED_KEYS['max']}", default.max_missed)
    if not isinstance(max_missed, int) or isinstance(max_missed, bool) or max_missed < 1:
        raise MissedPolicyError(prefix, "max", f"{max_missed!r}: expected an integer >= 1")
    policy = MissedPolicy(mode=mode, grace_us=grace_us, max_missed=max_missed)
    # the default's own instance when equal: one per entry adds up at 100,000 entries
    return default if policy == default else policy


def check_missed_policy(policy: MissedPolicy) -> MissedPolicy:
    """``policy``, given whole as a :class:`MissedPolicy` (a stored entry's
    override), checked part by part; a :class:`MissedPolicyError` for the first
    wrong part."""
    if policy.mode not in MISSED_MODES:
        raise MissedPolicyError(
            "", "policy", f"{policy.mode!r}: expected one of {', '.join(MISSED_MODES)}"
        )
    if policy.grace_us <= 0:
        raise MissedPolicyError("", "grace", f"{policy.grace_us} us: must be positive")
    if policy.max_missed < 1:
        raise MissedPolicyError("", "max", f"{policy.max_missed}: expected an integer >= 1")
    return policy


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
    takeover_batch: int = setting_default("singlebeat_takeover_batch")
    #: SingletonTask: how many times a sent slot whose run stalled (its worker
    #: died mid-run) is sent again, counted by the run's starts (0: never)
    stalled_run_resends: int = setting_default("singlebeat_stalled_run_resends")
    #: how far back the slots a replica sent are written again after a broken
    #: connection (scheduler: docs/guarantees.md, "Database failover")
    failover_window: timedelta = timedelta(seconds=setting_default("singlebeat_failover_window"))
    #: SingletonTask: finished run rows (per-slot dedupe) and idle key rows are
    #: kept this long; a slot delivered again later than this runs again.
    run_retention: timedelta = timedelta(seconds=setting_default("singlebeat_run_retention"))
    #: PostgreSQL: hear of changes at once (LISTEN/NOTIFY) on one extra
    #: connection, which a probe proves (a pooler in transaction mode cannot
    #: carry it); off skips the attempt
    listen: bool = setting_default("singlebeat_listen")
    #: follow the entries stored in the database (stored schedules)
    schedules: bool = setting_default("singlebeat_schedules")
    #: how long the stored entries' change history is kept
    schedule_log_retention: timedelta = timedelta(
        seconds=setting_default("singlebeat_schedule_log_retention")
    )
    #: the HTTP listener (/livez, /readyz, /metrics): port (None: off) and address
    http_port: int | None = None
    http_bind: str = DEFAULT_HTTP_BIND
    #: the exec probe's status file (None: off)
    status_file: str | None = None
    #: the loop must have ended a tick this recently to be live
    liveness_timeout: timedelta = timedelta(seconds=60)
    #: a successful database round trip this recent (and no outage) to be ready
    readiness_timeout: timedelta = timedelta(seconds=17)
    #: Prometheus metrics: True, False, or None (on when it can be served)
    metrics: bool | None = None
    #: whether beat's slot counters carry an ``entry`` label
    metrics_entry_label: bool = setting_default("singlebeat_metrics_entry_label")
    #: the prometheus_client registry the series go to (None: a dedicated one)
    metrics_registry: Any = None
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
        from .contrib.django.database import SCHEME, database_url, default_url

        # a Django project with the app installed coordinates in its own
        # database unless told otherwise (contrib/django/database.py); asked
        # only when the setting is unset, since read_setting would answer the
        # SQLite default and hide it
        raw_url = (
            read_setting(conf, "singlebeat_url", unset=None)
            or default_url()
            or read_setting(conf, "singlebeat_url")
        )
        if isinstance(raw_url, str) and raw_url.startswith(SCHEME):
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

        lease = _duration("singlebeat_lease", read_setting(conf, "singlebeat_lease"))
        if lease < timedelta(seconds=1):
            raise ConfigurationError(
                f"singlebeat_lease={lease.total_seconds()}s: must be at least 1 second"
            )
        # 0 is Celery's default for beat_max_loop_interval and means "the scheduler's own".
        loop = max_loop_interval or read_setting(conf, "beat_max_loop_interval")
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
        retention = _duration("singlebeat_retention", read_setting(conf, "singlebeat_retention"))
        if retention < lease * 4:
            raise ConfigurationError(
                f"singlebeat_retention ({retention.total_seconds():g}s) must be at least four "
                f"times singlebeat_lease ({lease.total_seconds():g}s)"
            )
        failover_window = _duration(
            "singlebeat_failover_window",
            read_setting(conf, "singlebeat_failover_window"),
            allow_zero=True,
        )
        if failover_window * 2 > retention:
            raise ConfigurationError(
                f"singlebeat_failover_window ({failover_window.total_seconds():g}s) must be "
                f"at most half of singlebeat_retention ({retention.total_seconds():g}s): the "
                "slot rows it writes again must outlive it"
            )
        run_retention = _duration(
            "singlebeat_run_retention", read_setting(conf, "singlebeat_run_retention")
        )
        if run_retention < timedelta(hours=1):
            raise ConfigurationError(
                f"singlebeat_run_retention ({run_retention.total_seconds():g}s) must be at "
                "least one hour: it is how long a repeated delivery of a slot is recognised"
            )
        try:
            missed = parse_missed_policy("singlebeat_", conf, BUILTIN_MISSED_POLICY)
        except MissedPolicyError as exc:
            # a plain ConfigurationError, as every other setting's
            raise ConfigurationError(str(exc)) from None

        prefix = read_setting(conf, "singlebeat_table_prefix")
        # ASCII only: str.isalnum() also accepts "é", "²" or "٣", which the
        # table names (and MySQL's 64-byte identifier limit) should not see.
        if not isinstance(prefix, str) or not _TABLE_PREFIX.fullmatch(prefix):
            raise ConfigurationError(
                f"singlebeat_table_prefix={prefix!r}: use ASCII letters, digits and "
                "underscores, starting with a letter or an underscore (at most 30 characters)"
            )
        engine_options = read_setting(conf, "singlebeat_engine_options") or {}
        if not isinstance(engine_options, Mapping):
            raise ConfigurationError("singlebeat_engine_options: expected a dict")
        replica_id = read_setting(conf, "singlebeat_replica_id") or default_replica_id()
        if not isinstance(replica_id, str) or len(replica_id) > MAX_REPLICA_ID:
            raise ConfigurationError(
                f"singlebeat_replica_id: expected a string of at most {MAX_REPLICA_ID} characters"
            )
        # Read from the app's conf, not only a field: a replica catching up after a
        # broker outage publishes at most this many taken-over slots per sweep, and
        # an operator (or a test) may need to bound that burst.
        takeover_batch = read_setting(conf, "singlebeat_takeover_batch")
        if (
            not isinstance(takeover_batch, int)
            or isinstance(takeover_batch, bool)
            or takeover_batch < 1
        ):
            raise ConfigurationError(
                f"singlebeat_takeover_batch={takeover_batch!r}: expected an integer >= 1"
            )
        resends = read_setting(conf, "singlebeat_stalled_run_resends")
        if not isinstance(resends, int) or isinstance(resends, bool) or resends < 0:
            raise ConfigurationError(
                f"singlebeat_stalled_run_resends={resends!r}: expected an integer >= 0 "
                "(0 turns off re-sending the slots whose SingletonTask run stalled)"
            )
        create_schema = _flag(conf, "singlebeat_create_schema")
        listen = _flag(conf, "singlebeat_listen")
        schedules = _flag(conf, "singlebeat_schedules")
        schedule_log_retention = _duration(
            "singlebeat_schedule_log_retention",
            read_setting(conf, "singlebeat_schedule_log_retention"),
        )
        if schedule_log_retention < timedelta(days=1):
            raise ConfigurationError(
                "singlebeat_schedule_log_retention "
                f"({schedule_log_retention.total_seconds():g}s) must be at least one day"
            )
        observing = _observing(conf, lease, max_loop)
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
            stalled_run_resends=resends,
            failover_window=failover_window,
            run_retention=run_retention,
            listen=listen,
            schedules=schedules,
            schedule_log_retention=schedule_log_retention,
            **observing,
        )
