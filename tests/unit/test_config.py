"""Settings (celery_singlebeat.config): defaults, and every bad setting refused at
start-up with a ConfigurationError that names it, without leaking a password."""

from __future__ import annotations

import os
import socket
import traceback
from datetime import timedelta
from typing import Any

import pytest
from celery import Celery

from celery_singlebeat.config import (
    DEFAULT_MAX_LOOP_INTERVAL,
    Overrides,
    Settings,
    parse_missed_policy,
)
from celery_singlebeat.exceptions import ConfigurationError
from celery_singlebeat.timeline.slots import MissedPolicy

PASSWORD = "hunter2-s3cret"


def refused(conf: dict[str, Any], **kwargs: Any) -> ConfigurationError:
    """The ConfigurationError from_conf raises for ``conf``."""
    with pytest.raises(ConfigurationError) as info:
        Settings.from_conf(conf, **kwargs)
    return info.value


def shown(exc: BaseException) -> str:
    """Everything a log of the exception would show, chained causes included."""
    return "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))


def test_defaults() -> None:
    settings = Settings.from_conf({})
    # a SQLite file, relative: in the working directory of the beat process
    assert settings.backend == "sqlite"
    assert settings.url.database == "celery-singlebeat.sqlite"
    assert not os.path.isabs(settings.url.database)
    assert settings.lease == timedelta(seconds=15)
    assert settings.retention == timedelta(seconds=900)
    assert settings.missed == MissedPolicy("coalesce", 5_000_000, 100)
    assert settings.create_schema is True
    assert settings.table_prefix == "singlebeat_"
    assert settings.max_loop_interval == DEFAULT_MAX_LOOP_INTERVAL
    assert settings.takeover_batch == 500
    host, pid, suffix = settings.replica_id.rsplit(":", 2)
    assert (host, pid, len(suffix)) == (socket.gethostname(), str(os.getpid()), 6)
    assert Settings.from_conf({}).replica_id != settings.replica_id  # a restart differs


def test_a_real_celery_apps_default_conf_is_accepted() -> None:
    # Celery's default beat_max_loop_interval is 0 ("the scheduler's own"), which
    # must not be read as a zero-second loop.
    app = Celery(set_as_current=False)
    assert app.conf.beat_max_loop_interval == 0
    settings = Settings.from_conf(app.conf)
    assert settings.max_loop_interval == DEFAULT_MAX_LOOP_INTERVAL
    app.conf.beat_max_loop_interval = 20  # longer than the default 15 s lease
    assert "beat_max_loop_interval (20s)" in str(refused(app.conf))  # type: ignore[arg-type]


def test_explicit_values_are_read() -> None:
    settings = Settings.from_conf(
        {
            "singlebeat_url": f"postgresql+psycopg://bob:{PASSWORD}@db.internal:5432/app",
            "singlebeat_lease": timedelta(seconds=30),
            "singlebeat_retention": 3600,
            "singlebeat_missed_policy": "all",
            "singlebeat_missed_grace": 2.5,
            "singlebeat_missed_max": 7,
            "singlebeat_table_prefix": "beat_2_",
            "singlebeat_replica_id": "pod-a",
            "singlebeat_create_schema": False,
            "singlebeat_engine_options": {"pool_size": 2},
            "singlebeat_takeover_batch": 5,
        },
        max_loop_interval=10,
    )
    assert settings.lease_us == 30_000_000
    assert settings.retention_us == 3_600_000_000
    assert settings.missed == MissedPolicy("all", 2_500_000, 7)
    assert (settings.table_prefix, settings.replica_id) == ("beat_2_", "pod-a")
    assert settings.create_schema is False
    assert settings.engine_options == {"pool_size": 2}
    assert settings.takeover_batch == 5
    assert settings.max_loop_interval == timedelta(seconds=10)
    assert settings.backend == "postgresql"


def test_safe_url_masks_the_password() -> None:
    settings = Settings.from_conf(
        {"singlebeat_url": f"postgresql+psycopg://bob:{PASSWORD}@db.internal:5432/app"}
    )
    assert settings.safe_url == "postgresql+psycopg://bob:***@db.internal:5432/app"
    assert PASSWORD not in repr(settings)
    # the engine still gets the real one
    assert settings.url.password == PASSWORD


@pytest.mark.parametrize(
    "url",
    [
        f"postgresql://bob:{PASSWORD}@db:notaport/app",  # bad port
        f"postgresql//bob:{PASSWORD}@db/app",  # no "://"
        f"postgresql://bob:{PASSWORD}",  # the password where the port goes
        f"bob:{PASSWORD}",
        f"postgresql+psycopg://bob:{PASSWORD}@[::1/app",  # unclosed IPv6 bracket
        "not a url",
    ],
)
def test_malformed_url_is_named_and_the_password_never_shown(url: str) -> None:
    exc = refused({"singlebeat_url": url})
    assert str(exc).startswith("singlebeat_url: cannot parse the database URL")
    assert PASSWORD not in shown(exc)


@pytest.mark.parametrize(
    ("url", "backend"),
    [(f"oracle://bob:{PASSWORD}@db/app", "oracle"), ("redis://localhost:6379/0", "redis")],
)
def test_unsupported_database(url: str, backend: str) -> None:
    exc = refused({"singlebeat_url": url})
    assert str(exc).startswith(f"singlebeat_url: unsupported database {backend!r}")
    assert PASSWORD not in shown(exc)


def test_url_of_the_wrong_type() -> None:
    assert "singlebeat_url" in str(refused({"singlebeat_url": 5432}))


@pytest.mark.parametrize("url", ["sqlite://", "sqlite:///:memory:", "sqlite+pysqlite:///:memory:"])
def test_in_memory_sqlite_cannot_be_shared(url: str) -> None:
    assert "singlebeat_url: an in-memory SQLite database" in str(refused({"singlebeat_url": url}))


BAD_DURATIONS = [0, -1, -0.5, timedelta(0), timedelta(seconds=-3), "15", "15s", None, True]
BAD_NUMBERS = [float("nan"), float("inf"), 1e30]


@pytest.mark.parametrize(
    "name", ["singlebeat_lease", "singlebeat_retention", "singlebeat_missed_grace"]
)
@pytest.mark.parametrize("value", BAD_DURATIONS + BAD_NUMBERS, ids=repr)
def test_bad_durations_are_named(name: str, value: Any) -> None:
    if name == "singlebeat_missed_grace" and value is None:
        # an explicit None grace means "the default", like an absent one
        assert Settings.from_conf({name: value}).missed.grace_us == 5_000_000
        return
    assert str(refused({name: value})).startswith(f"{name}=")


@pytest.mark.parametrize("value", [-1, "5", timedelta(seconds=-1), *BAD_NUMBERS], ids=repr)
def test_bad_loop_interval_is_named(value: Any) -> None:
    assert str(refused({"beat_max_loop_interval": value})).startswith("beat_max_loop_interval=")


def test_lease_shorter_than_a_second() -> None:
    exc = refused({"singlebeat_lease": 0.5, "beat_max_loop_interval": 0.1})
    assert str(exc) == "singlebeat_lease=0.5s: must be at least 1 second"


@pytest.mark.parametrize(
    ("conf", "kwargs"),
    [
        ({"singlebeat_lease": 5}, {}),  # equal to the default loop interval
        ({"singlebeat_lease": 10, "beat_max_loop_interval": 10}, {}),
        ({}, {"max_loop_interval": 20}),  # celery beat --max-interval=20
        ({}, {"max_loop_interval": timedelta(seconds=15)}),
    ],
)
def test_lease_must_be_longer_than_the_loop_interval(
    conf: dict[str, Any], kwargs: dict[str, Any]
) -> None:
    message = str(refused(conf, **kwargs))
    assert "singlebeat_lease" in message and "beat_max_loop_interval" in message
    assert Settings.from_conf(
        {**conf, "singlebeat_lease": 30, "singlebeat_retention": 120}, **kwargs
    )


def test_retention_at_least_four_leases() -> None:
    message = str(refused({"singlebeat_lease": 15, "singlebeat_retention": 59.9}))
    assert message.startswith("singlebeat_retention (59.9s) must be at least four times")
    assert Settings.from_conf({"singlebeat_lease": 15, "singlebeat_retention": 60})


def test_unknown_missed_policy() -> None:
    message = str(refused({"singlebeat_missed_policy": "latest"}))
    assert message == "singlebeat_missed_policy='latest': expected one of coalesce, skip, all"


@pytest.mark.parametrize("value", [0, -1, "5", 1.5, True, None])
def test_bad_missed_max(value: Any) -> None:
    assert str(refused({"singlebeat_missed_max": value})).startswith("singlebeat_missed_max=")


@pytest.mark.parametrize("value", [0, -1, "5", 1.5, True, None])
def test_bad_takeover_batch(value: Any) -> None:
    message = str(refused({"singlebeat_takeover_batch": value}))
    assert message == f"singlebeat_takeover_batch={value!r}: expected an integer >= 1"


@pytest.mark.parametrize(
    "prefix",
    [
        "",
        "bad-prefix",
        "has space_",
        "semi;colon",
        "x" * 31,
        5,
        None,
        # str.isalnum() accepts these: non-ASCII letters and digits
        "béat_",
        "ßeat",
        "beat²_",
        "beat٣",
        "sb_\n",
        # a digit first
        "2beat_",
    ],
)
def test_bad_table_prefix(prefix: Any) -> None:
    assert str(refused({"singlebeat_table_prefix": prefix})).startswith("singlebeat_table_prefix=")


@pytest.mark.parametrize("prefix", ["x" * 30, "sb_", "Beat2", "_sb", "_"])
def test_good_table_prefix(prefix: str) -> None:
    assert Settings.from_conf({"singlebeat_table_prefix": prefix}).table_prefix == prefix


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("singlebeat_engine_options", [("pool_size", 2)]),
        ("singlebeat_replica_id", "r" * 121),
        ("singlebeat_replica_id", 42),
        ("singlebeat_create_schema", "yes"),
    ],
)
def test_other_bad_settings_are_named(name: str, value: Any) -> None:
    assert str(refused({name: value})).startswith(name)


def test_per_entry_policy_overrides_the_default() -> None:
    default = MissedPolicy("coalesce", 5_000_000, 100)
    options = {"singlebeat_missed_policy": "skip", "singlebeat_missed_grace": timedelta(minutes=1)}
    assert parse_missed_policy("singlebeat_", options, default) == MissedPolicy(
        "skip", 60_000_000, 100
    )
    assert parse_missed_policy("singlebeat_", {}, default) == default
    with pytest.raises(ConfigurationError, match=r"^singlebeat_missed_max=0"):
        parse_missed_policy("singlebeat_", {"singlebeat_missed_max": 0}, default)


@pytest.mark.parametrize(
    ("part", "value", "reason"),
    [
        ("policy", "never", "'never': expected one of coalesce, skip, all"),
        ("grace", 0, "0: must be positive"),
        ("grace", "5", "'5': expected a datetime.timedelta or a number of seconds"),
        ("grace", float("nan"), "nan: not a usable number of seconds"),
        ("max", 0, "0: expected an integer >= 1"),
    ],
)
def test_one_policy_parser_each_caller_names_the_part(part: str, value: Any, reason: str) -> None:
    """The settings, a beat_schedule entry's options and a stored entry's override
    read a policy with one parser, and each names a wrong part its own way."""
    from celery_singlebeat import stored_entry
    from celery_singlebeat.beat.source import entry_policy
    from celery_singlebeat.exceptions import InvalidEntry

    key = f"singlebeat_missed_{part}"
    error = refused({key: value})
    assert type(error) is ConfigurationError
    assert str(error) == f"{key}={reason}"
    with pytest.raises(ConfigurationError) as beat:
        entry_policy("e", {key: value}, MissedPolicy("coalesce", 5_000_000, 100))
    assert str(beat.value) == f"beat_schedule['e'].options: {key}={reason}"
    with pytest.raises(InvalidEntry) as stored:
        stored_entry("e", "proj.t", 30, missed={part: value})
    assert stored.value.problems == ((f"missed.{part}", reason),)


def test_overrides_read_a_namespaced_conf_through_get() -> None:
    # config_from_object(..., namespace="CELERY"), as Django projects configure
    # Celery: the conf answers get() but not `in` for the unprefixed name, so a
    # ChainMap over it read the defaults (the CLI's --url over a Django app)
    class DjangoLike:
        CELERY_SINGLEBEAT_LEASE = 20
        CELERY_SINGLEBEAT_TABLE_PREFIX = "beat_"

    app = Celery(set_as_current=False)
    app.config_from_object(DjangoLike, namespace="CELERY")
    settings = Settings.from_conf(Overrides({"singlebeat_table_prefix": "cli_"}, app.conf))
    assert settings.lease == timedelta(seconds=20)
    assert settings.table_prefix == "cli_"


def test_stalled_run_resends_default_on_and_reach_the_store() -> None:
    from celery_singlebeat.store.base import StalledRuns
    from celery_singlebeat.store.sql import SqlStore

    settings = Settings.from_conf({})
    assert settings.stalled_run_resends == 2 == StalledRuns().resends
    assert settings.retention_us == StalledRuns().window_us
    off = Settings.from_conf({"singlebeat_stalled_run_resends": 0, "singlebeat_retention": 120})
    store = SqlStore.from_settings(off)
    try:
        assert store.stalled_runs == StalledRuns(resends=0, window_us=120 * 1_000_000)
    finally:
        store.close()


@pytest.mark.parametrize("value", [-1, 1.5, "2", True, None])
def test_bad_stalled_run_resends(value: Any) -> None:
    message = str(refused({"singlebeat_stalled_run_resends": value}))
    assert message.startswith(f"singlebeat_stalled_run_resends={value!r}: expected an integer >= 0")
