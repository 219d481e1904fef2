"""Liveness and readiness: the verdicts, the status file, the exec probe, the HTTP
listener of a real scheduler on the in-memory store, and the settings behind them.

The real-process version (``celery beat`` replicas, SIGSTOP, a database cut
through a proxy) is ``tests/acceptance/test_telemetry.py``.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from test_scheduler import Harness, every, harness_for  # noqa: F401 - fixture

import celery_singlebeat
from celery_singlebeat import ConfigurationError, scheduler
from celery_singlebeat.config import Settings
from celery_singlebeat.observe import health
from celery_singlebeat.observe.health import Health, Status, liveness, readiness
from celery_singlebeat.observe.telemetry import NOTHING, Fanout
from celery_singlebeat.store.sql import store as sql
from celery_singlebeat.timeline import membership

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def get(port: int, path: str) -> tuple[int, str]:
    """(status, body) of GET http://127.0.0.1:port/path."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


# -- the verdicts -----------------------------------------------------------------


def status(**values: Any) -> Status:
    s = Status(started=100.0, live_bound=60.0, ready_bound=17.0)
    for name, value in values.items():
        setattr(s, name, value)
    return s


@pytest.mark.parametrize(
    ("values", "now", "live", "ready", "why"),
    [
        ({}, 130.0, True, False, "not ready: not connected yet"),
        ({}, 161.0, False, False, "not live: no tick ended in 61.0s since start"),
        ({"loop": 150.0, "schema_ready": True, "round_trip": 150.0}, 160.0, True, True, ""),
        (
            {"loop": 150.0, "schema_ready": True, "round_trip": 150.0},
            211.0,
            False,
            False,
            "last loop 61.0s ago",
        ),
        # an outage: the loop goes on (live), nothing is sent (not ready)
        (
            {"loop": 159.0, "schema_ready": True, "round_trip": 140.0, "outage_since": 150.0},
            160.0,
            True,
            False,
            "database unreachable for 10.0s",
        ),
        # the database answered long ago (a hung statement would show here)
        (
            {"loop": 159.0, "schema_ready": True, "round_trip": 142.0},
            160.0,
            True,
            False,
            "round trip 18.0s ago",
        ),
        (
            {"loop": 159.0, "schema_ready": True, "round_trip": 150.0, "stopped": True},
            160.0,
            False,
            False,
            "stopped",
        ),
    ],
)
def test_the_verdicts(
    values: dict[str, Any], now: float, live: bool, ready: bool, why: str
) -> None:
    s = status(**values)
    assert liveness(s, now)[0] is live
    ok, line = readiness(s, now)
    assert ok is ready
    assert why in line or why in liveness(s, now)[1]
    assert "\n" not in line


def test_the_default_bounds_follow_the_lease() -> None:
    assert health.default_liveness_timeout_s(15) == 60
    assert health.default_liveness_timeout_s(60) == 150
    assert health.default_readiness_timeout_s(15) == 17
    assert health.default_readiness_timeout_s(1) == 3 * 0.5 + 2
    # the liveness bound covers the worst honest tick with room to spare
    for lease in (1, 5, 15, 30, 120):
        worst = (
            max(health.OUTAGE_BACKOFF_MAX_S, lease - 0.001)  # sleep (loop interval < lease)
            + health.CONNECT_TIMEOUT_S
            + health.ANSWER_TIMEOUT_S
            + health.PUBLISH_SHARE * lease
        )
        assert health.default_liveness_timeout_s(lease) > worst + 10, lease


def test_the_bounds_copy_what_the_scheduler_and_the_store_do(
    harness_for: Callable[..., Harness],  # noqa: F811
) -> None:
    """health.py cannot import them (the exec probe would pay for it): its
    copies must stay what the loop really does. Readiness's bound is the
    window of the rule of a live replica (membership.replica_live): a replica
    is ready exactly as long as the others count it live."""
    assert health.OUTAGE_BACKOFF_MAX_S == scheduler.BACKOFF_MAX
    for lease in (1.0, 15.0, 60.0):
        sweep_us = round(health.sweep_period_s(lease) * 1_000_000)
        bound_us = health.default_readiness_timeout_s(lease) * 1_000_000
        assert round(bound_us) == membership.live_within_us(sweep_us)
        seen_us = 10**15  # the fleet calls a replica seen that long ago live too
        assert membership.replica_live(seen_us, sweep_us, None, seen_us + round(bound_us))
        assert not membership.replica_live(seen_us, sweep_us, None, seen_us + round(bound_us) + 1)
    for url in ("postgresql+psycopg://h/db", "mysql+pymysql://h/db"):
        from sqlalchemy.engine import make_url

        args = sql._engine_defaults(make_url(url))["connect_args"]
        assert args["connect_timeout"] == health.CONNECT_TIMEOUT_S
    my = sql._engine_defaults(make_url("mysql+pymysql://h/db"))["connect_args"]
    assert my["read_timeout"] == health.ANSWER_TIMEOUT_S
    from celery_singlebeat.store.sql import psycopg_timeout

    assert psycopg_timeout.DEFAULT_READ_TIMEOUT_S == health.ANSWER_TIMEOUT_S
    for lease in (1.2, 3, 15, 60):
        h = harness_for({"a": every(1)}, singlebeat_lease=lease)
        assert h.replica().engine.sweep_every == health.sweep_period_s(lease)


# -- the status file and the exec probe -------------------------------------------


def test_the_status_file_round_trips_and_is_replaced_atomically(tmp_path: Path) -> None:
    path = str(tmp_path / "status")
    s = status(loop=150.5, round_trip=150.25, schema_ready=True, outage_since=None)
    health.write_status(path, s)
    back = health.read_status(path)
    for name in Status.__slots__:
        assert getattr(back, name) == getattr(s, name), name
    assert os.listdir(tmp_path) == ["status"]  # no temporary file left behind


def run_probe(*args: str) -> tuple[int, str, str]:
    done = subprocess.run(
        [sys.executable, "-m", "celery_singlebeat", "health", *args],
        capture_output=True,
        text=True,
        timeout=30,
    )
    return done.returncode, done.stdout, done.stderr


def test_the_exec_probe_answers_in_one_line_with_its_exit_status(tmp_path: Path) -> None:
    path = str(tmp_path / "status")
    keeper = Health(60, 17, path)
    code, out, err = run_probe("--status-file", path)
    assert (code, err) == (1, "")
    assert out.splitlines() == [out.strip()] and out.startswith("failing: not ready: not connected")
    assert run_probe("--status-file", path, "--live")[:2][0] == 0

    keeper.schema_ready()
    keeper.round_trip(0.001, True)
    keeper.loop(time.monotonic())
    code, out, _ = run_probe(f"--status-file={path}", "--ready")
    assert code == 0 and re.fullmatch(
        r"ok: ready: last database round trip \S+s ago \(bound 17s\)\n", out
    )

    keeper.close()
    code, out, _ = run_probe("--status-file", path, "--live")
    assert (code, out) == (1, "failing: not live: the scheduler stopped\n")

    (tmp_path / "junk").write_text("hello\n")
    code, out, _ = run_probe("--status-file", str(tmp_path / "junk"))
    assert code == 1 and "not a celery-singlebeat status file" in out
    code, out, _ = run_probe("--status-file", str(tmp_path / "missing"))
    assert code == 1 and "cannot read the status file" in out and "No such file" in out


@pytest.mark.parametrize(
    ("args", "problem"),
    [
        ((), "--status-file PATH is required"),
        (("--status-file",), "needs a PATH"),
        (("--status-file", "x", "--live", "--ready"), "exclude each other"),
        (("--status-file", "x", "--verbose"), "unexpected argument '--verbose'"),
    ],
)
def test_a_bad_probe_command_line_is_a_usage_error(args: tuple[str, ...], problem: str) -> None:
    code, out, err = run_probe(*args)
    assert code == 2 and out == ""
    assert problem in err and "usage:" in err and "Traceback" not in err


def imported_by(*args: str) -> set[str]:
    """The modules ``python -X importtime *args`` imported."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", *args], capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return {line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines() if "|" in line}


def test_the_exec_probe_imports_neither_celery_nor_sqlalchemy_nor_click(tmp_path: Path) -> None:
    """The kubelet runs it every few seconds in every pod (30-45 ms of CPU
    with this fast path, about an interpreter's start-up; 600+ with Celery)."""
    path = str(tmp_path / "status")
    Health(60, 17, path).loop(time.monotonic())
    probe = imported_by("-m", "celery_singlebeat", "health", "--live", "--status-file", path)
    assert "celery_singlebeat.observe.health" in probe
    heavy = {m for m in probe if m.split(".")[0] in ("celery", "kombu", "sqlalchemy", "click")}
    assert not heavy, sorted(heavy)
    # what the probe adds to the interpreter's own start-up (an editable
    # install's finder imports typing there on some Pythons)
    added = probe - imported_by("-c", "pass")
    assert not {"json", "argparse", "typing", "http.server", "dataclasses"} & added, sorted(added)


def test_the_click_command_and_the_fast_path_take_the_same_options() -> None:
    from celery_singlebeat.cli.health import health_command

    click_flags = {opt for p in health_command.params for opt in p.opts}
    assert click_flags == {flag for flag, _meta, _help in health.OPTIONS}


def test_celery_singlebeat_health_reads_the_apps_status_file(tmp_path: Path) -> None:
    """``celery -A proj singlebeat health`` (the real command, Celery's own
    start-up) finds the file in the app's settings and says the same."""
    path = str(tmp_path / "status")
    Health(60, 17, path).loop(time.monotonic())
    (tmp_path / "probeapp.py").write_text(
        "from celery import Celery\n"
        "app = Celery('probeapp')\n"
        f"app.conf.singlebeat_status_file = {path!r}\n"
    )
    celery = str(Path(sys.executable).parent / "celery")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}

    def run(*args: str) -> tuple[int, str]:
        done = subprocess.run(
            [celery, "-A", "probeapp", "singlebeat", "health", *args],
            capture_output=True, text=True, timeout=60, env=env, cwd=tmp_path,
        )  # fmt: skip
        return done.returncode, done.stdout + done.stderr

    code, out = run("--live")
    assert code == 0 and out.startswith("ok: live: last loop"), out
    code, out = run()
    assert code == 1 and out.startswith("failing: not ready: not connected yet"), out
    code, out = run("--live", "--ready")
    assert code == 2 and "exclude each other" in out and "Traceback" not in out


# -- a real scheduler: HTTP and exec probes agree ----------------------------------


@pytest.fixture
def probed(
    harness_for: Callable[..., Harness],  # noqa: F811
    tmp_path: Path,
) -> Iterator[tuple[Harness, Any, int, str]]:
    port = free_port()
    path = str(tmp_path / "beat.status")
    harness = harness_for(
        {"a": every(1), "b": every(2)},
        singlebeat_http_port=port,
        singlebeat_http_bind="127.0.0.1",
        singlebeat_status_file=path,
        singlebeat_metrics=False,
    )
    replica = harness.replica()
    try:
        yield harness, replica, port, path
    finally:
        replica.close()


def both(port: int, path: str, check: str) -> tuple[tuple[int, str], tuple[int, str]]:
    """The HTTP answer and the exec probe's (run in this process, same clock)."""
    code, line = health.probe(path, check)
    return get(port, f"/{check}z"), (code, line + "\n")


def agree(port: int, path: str, check: str) -> tuple[bool, str]:
    (status_code, body), (code, line) = both(port, path, check)
    assert (status_code == 200) is (code == 0), (body, line)
    # the same words (the ages may differ by the time between the two reads)
    assert re.sub(r"[\d.]+s", "Ns", body) == re.sub(r"[\d.]+s", "Ns", line), (body, line)
    return code == 0, line


def test_http_and_exec_probes_agree_through_an_outage_a_stall_and_a_stop(
    probed: tuple[Harness, Any, int, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    harness, replica, port, path = probed
    assert isinstance(replica.telemetry, Fanout)
    assert agree(port, path, "live")[0] is True  # starting: no tick yet
    assert agree(port, path, "ready") == (False, agree(port, path, "ready")[1])
    assert "not connected yet" in agree(port, path, "ready")[1]

    replica.tick()
    assert agree(port, path, "live")[0] and agree(port, path, "ready")[0]
    assert get(port, "/metrics")[0] == 404  # metrics off
    assert get(port, "/")[0] == 404

    # the database goes away: still live (the loop goes on), not ready, at once
    harness.store.available = False
    harness.clock.advance(timedelta(seconds=2))
    replica.tick()
    assert agree(port, path, "live")[0] is True
    ok, line = agree(port, path, "ready")
    assert not ok and "database unreachable" in line
    harness.store.available = True
    harness.clock.advance(timedelta(seconds=1))
    replica.tick()
    assert agree(port, path, "ready")[0] is True

    # the loop stalls (time passes, no tick ends): not live past the bound
    real = time.monotonic
    monkeypatch.setattr(time, "monotonic", lambda: real() + 61)
    ok, line = agree(port, path, "live")
    assert not ok and re.search(r"last loop 6\d\.\ds ago \(bound 60s\)", line)
    assert not agree(port, path, "ready")[0]
    monkeypatch.setattr(time, "monotonic", real)

    replica.close()
    assert health.probe(path, "live") == (1, "failing: not live: the scheduler stopped")
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=2)


def test_the_status_file_is_written_once_a_second_and_at_once_on_a_change(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    writes: list[float] = []
    real = health.write_status

    def counting(path: str, s: Status) -> None:
        writes.append(time.monotonic())
        real(path, s)

    monkeypatch.setattr(health, "write_status", counting)
    keeper = Health(60, 17, str(tmp_path / "s"))
    for _ in range(1000):
        keeper.loop(time.monotonic())
    assert len(writes) == 2  # at start, then the first loop; the rest within the second
    keeper.outage(True)
    assert len(writes) == 3
    assert health.read_status(str(tmp_path / "s")).outage_since is not None


# -- settings and start-up errors ----------------------------------------------


def conf(**values: Any) -> dict[str, Any]:
    return {"singlebeat_url": "sqlite:///x.sqlite", **values}


def test_the_health_settings_default_from_the_lease() -> None:
    s = Settings.from_conf(conf())
    assert (s.http_port, s.http_bind, s.status_file, s.metrics) == (None, "0.0.0.0", None, None)
    assert s.liveness_timeout == timedelta(seconds=60)
    assert s.readiness_timeout == timedelta(seconds=17)
    s = Settings.from_conf(conf(singlebeat_lease=45, singlebeat_status_file=Path("/tmp/s")))
    assert s.liveness_timeout == timedelta(seconds=120) and s.status_file == "/tmp/s"
    assert s.readiness_timeout == timedelta(seconds=47)


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"singlebeat_http_port": 0}, "singlebeat_http_port=0: expected a TCP port"),
        ({"singlebeat_http_port": "9100"}, "singlebeat_http_port='9100'"),
        ({"singlebeat_http_port": True}, "singlebeat_http_port=True"),
        ({"singlebeat_http_port": 70000}, "singlebeat_http_port=70000"),
        ({"singlebeat_http_bind": 5}, "singlebeat_http_bind=5"),
        ({"singlebeat_status_file": 3}, "singlebeat_status_file=3"),
        ({"singlebeat_liveness_timeout": 10}, "must be longer than 10s"),
        (
            {
                "singlebeat_liveness_timeout": 12,
                "beat_max_loop_interval": 14,
                "singlebeat_lease": 20,
            },
            "must be longer than 14s",
        ),
        ({"singlebeat_liveness_timeout": "1m"}, "singlebeat_liveness_timeout='1m'"),
        ({"singlebeat_readiness_timeout": 5}, "must be longer than the sweep period (5s"),
        ({"singlebeat_metrics": "yes"}, "singlebeat_metrics='yes'"),
        ({"singlebeat_metrics_entry_label": 1}, "singlebeat_metrics_entry_label=1"),
        ({"singlebeat_metrics_registry": object()}, "singlebeat_metrics_registry="),
    ],
)
def test_a_bad_health_or_metrics_setting_fails_naming_it(
    values: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigurationError, match=re.escape(message)):
        Settings.from_conf(conf(**values))


def test_metrics_asked_for_without_prometheus_client_names_the_extra(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda n, *a: None if n == "prometheus_client" else real(n, *a)
    )
    with pytest.raises(ConfigurationError, match=r"celery-singlebeat\[metrics\]"):
        Settings.from_conf(conf(singlebeat_metrics=True))


def test_a_port_in_use_fails_at_start_naming_the_setting(
    harness_for: Callable[..., Harness],  # noqa: F811
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        harness = harness_for(
            {"a": every(1)}, singlebeat_http_port=port, singlebeat_http_bind="127.0.0.1"
        )
        # celery beat's banner-only (lazy) instance fails first, before the
        # banner and any database connection, as for any bad setting
        for lazy in (True, False):
            with pytest.raises(ConfigurationError) as caught:
                harness.replica(lazy=lazy)
            message = str(caught.value)
            assert message.startswith(
                f"singlebeat_http_port={port}: cannot listen on 127.0.0.1:{port}"
            )
            assert "in use" in message and "\n" not in message
    # free again: the lazy instance's check keeps nothing listening
    lazy = harness.replica(lazy=True)
    assert lazy.telemetry is NOTHING
    harness.replica().close()


def test_an_unwritable_status_file_fails_at_start_naming_the_setting(
    harness_for: Callable[..., Harness],  # noqa: F811
    tmp_path: Path,
) -> None:
    harness = harness_for({"a": every(1)}, singlebeat_status_file=str(tmp_path / "no" / "s"))
    with pytest.raises(ConfigurationError, match=r"singlebeat_status_file=.*cannot write it"):
        harness.replica()


def test_without_probes_or_metrics_the_scheduler_runs_no_hook(
    harness_for: Callable[..., Harness],  # noqa: F811
) -> None:
    replica = harness_for({"a": every(1)}).replica()
    assert replica.telemetry is NOTHING
    replica.tick()
    assert replica.memory_store.on_round_trip is None


def test_the_lazy_package_keeps_every_public_name() -> None:
    for name in celery_singlebeat.__all__:
        assert getattr(celery_singlebeat, name) is not None, name
    assert set(celery_singlebeat.__all__) <= set(dir(celery_singlebeat))
    from celery_singlebeat import SingleBeatScheduler, SingletonTask, create_schema

    assert SingleBeatScheduler.__module__ == "celery_singlebeat.scheduler"
    assert SingletonTask.__module__ == "celery_singlebeat.singleton.task"
    assert callable(create_schema)
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        celery_singlebeat.nope  # noqa: B018
    # what `celery beat -S` resolves the scheduler by
    from celery.utils.imports import symbol_by_name

    assert symbol_by_name("celery_singlebeat.SingleBeatScheduler") is SingleBeatScheduler


def test_the_listener_answers_only_get_and_head_and_names_no_python(
    probed: tuple[Harness, Any, int, str],
) -> None:
    _harness, _replica, port, _path = probed
    import http.client

    for method, expected in (("HEAD", 503), ("POST", 501), ("DELETE", 501)):
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        conn.request(method, "/readyz")
        answer = conn.getresponse()
        body = answer.read()
        assert answer.status == expected, method
        assert answer.getheader("Server") == "celery-singlebeat", answer.getheader("Server")
        assert b"Python" not in body
        if method == "HEAD":
            assert body == b"" and int(answer.getheader("Content-Length")) > 0
        conn.close()
