"""Prometheus series: what the real scheduler and SingletonTask count on the
in-memory store, the ``/metrics`` answer, secrets, and the deploy/ rules and
dashboard against the package's own series.

Real ``celery beat`` replicas, a prefork worker and a real Prometheus server
scraping them are ``tests/acceptance/test_telemetry.py``.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
import urllib.request
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from celery import Celery
from conftest import IN_CI
from prometheus_client import CollectorRegistry
from test_health import free_port, get
from test_scheduler import BrokenProducer, Harness, every, harness_for  # noqa: F401 - fixture
from test_singleton import SLOT_US, make_hold, slot_apply, wait_until

from celery_singlebeat import ConfigurationError
from celery_singlebeat.observe.health import Health
from celery_singlebeat.observe.metrics import (
    Metrics,
    WorkerMetrics,
    metric_names,
    multiprocess_registry,
)
from celery_singlebeat.observe.telemetry import Fanout, Telemetry
from celery_singlebeat.singleton.runtime import forget, set_store
from celery_singlebeat.store.base import Claim, Lease
from celery_singlebeat.testing import MemoryStore

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "prometheus" / "singlebeat-rules.yml"
RULE_TESTS = ROOT / "deploy" / "prometheus" / "singlebeat-rules.test.yml"
DASHBOARD = ROOT / "deploy" / "grafana" / "singlebeat.json"
SECOND = timedelta(seconds=1)


def metrics_of(telemetry: Telemetry) -> Metrics:
    parts = telemetry.parts if isinstance(telemetry, Fanout) else (telemetry,)
    [found] = [p for p in parts if isinstance(p, Metrics)]
    return found


def value(registry: CollectorRegistry, name: str, **labels: str) -> float:
    found = registry.get_sample_value(name, labels)
    return 0.0 if found is None else found


def total(registry: CollectorRegistry, name: str) -> float:
    """The sum of a series over every label set."""
    return sum(s.value for family in registry.collect() for s in family.samples if s.name == name)


# -- beat -------------------------------------------------------------------------


def test_the_scheduler_counts_what_it_sends_loses_skips_and_fails(
    harness_for: Callable[..., Harness],  # noqa: F811
) -> None:
    harness = harness_for(
        {"a": every(1), "b": every(2), "rare": every(10, singlebeat_missed_policy="skip")},
        singlebeat_metrics=True,
        singlebeat_missed_grace=1,
    )
    replicas = [harness.replica(), harness.replica()]
    registries = [metrics_of(r.telemetry).registry for r in replicas]
    sent: list[Any] = []
    for _ in range(12):
        harness.clock.advance(SECOND)
        for replica in replicas:
            replica.tick()
        sent += harness.drain()
    assert sent
    for entry in ("a", "b", "rare"):
        counted = sum(value(r, "singlebeat_slots_sent_total", entry=entry) for r in registries)
        assert counted == sum(m.entry == entry for m in sent), entry
    for replica, registry in zip(replicas, registries):
        assert total(registry, "singlebeat_slots_sent_total") == replica.stats["sent"]
        assert total(registry, "singlebeat_slots_claimed_total") == replica.stats["claimed"]
        assert total(registry, "singlebeat_slots_lost_total") == replica.stats["lost"]
        assert value(registry, "singlebeat_dispatch_delay_seconds_count") == replica.stats["sent"]
        assert value(registry, "singlebeat_database_round_trip_seconds_count") > 0
        assert value(registry, "singlebeat_outage") == 0
        assert abs(value(registry, "singlebeat_last_loop_timestamp_seconds") - time.time()) < 5
    # the fake clock moves by whole seconds and replicas tick right after:
    # every slot was in the broker within the first bucket above a second
    assert sum(
        value(r, "singlebeat_dispatch_delay_seconds_bucket", le="1.0") for r in registries
    ) == len(sent)

    # an outage: the gauge, the errors, then what the missed-run policy dropped
    # (the replica that connected last: a MemoryStore has one round-trip listener)
    lone, registry = replicas[-1], registries[-1]
    harness.store.available = False
    for _ in range(3):
        harness.clock.advance(10 * SECOND)
        lone.tick()
    assert value(registry, "singlebeat_outage") == 1
    assert value(registry, "singlebeat_database_errors_total") == 3
    harness.store.available = True
    harness.clock.advance(SECOND)
    lone.tick()
    assert value(registry, "singlebeat_outage") == 0
    assert value(registry, "singlebeat_slots_skipped_total", entry="rare") == 3
    assert total(registry, "singlebeat_slots_skipped_total") == lone.stats["skipped"]


def test_a_failed_publish_and_its_takeover_are_counted_by_their_replicas(
    harness_for: Callable[..., Harness],  # noqa: F811
) -> None:
    harness = harness_for({"job": every(1)}, singlebeat_metrics=True)
    broken = harness.replica(Producer=BrokenProducer)
    broken.tick()
    harness.clock.advance(SECOND)
    broken.tick()
    healthy = harness.replica()
    healthy.tick()  # its first sweep takes the released claim over
    assert len(harness.drain()) == 1
    b, h = metrics_of(broken.telemetry).registry, metrics_of(healthy.telemetry).registry
    assert value(b, "singlebeat_publish_failures_total", entry="job") == 1
    assert value(b, "singlebeat_slots_sent_total", entry="job") == 0
    assert value(h, "singlebeat_slots_taken_over_total", entry="job") == 1
    assert value(h, "singlebeat_slots_sent_total", entry="job") == 1


def test_without_the_entry_label_the_counters_are_totals(
    harness_for: Callable[..., Harness],  # noqa: F811
) -> None:
    harness = harness_for(
        {f"e{i}": every(1) for i in range(5)},
        singlebeat_metrics=True,
        singlebeat_metrics_entry_label=False,
    )
    replica = harness.replica()
    for _ in range(4):  # the first registers the entries: their first slot is a second later
        harness.clock.advance(SECOND)
        replica.tick()
    registry = metrics_of(replica.telemetry).registry
    assert value(registry, "singlebeat_slots_sent_total") == len(harness.drain()) == 15
    labels = {
        tuple(s.labels) for f in registry.collect() for s in f.samples if s.name.endswith("_total")
    }
    assert labels == {()}


def test_a_batch_is_counted_per_entry_not_per_slot() -> None:
    metrics = Metrics()
    claims = [Claim(f"e{i % 10}", 1_000_000 * i, 1) for i in range(1000)]
    metrics.sent(claims, 2_000_000_000)
    assert len(metrics.sent_total._children) == 10
    assert value(metrics.registry, "singlebeat_slots_sent_total", entry="e3") == 100
    assert value(metrics.registry, "singlebeat_dispatch_delay_seconds_count") == 1000


def test_the_http_listener_serves_the_metrics_when_the_port_is_set(
    harness_for: Callable[..., Harness],  # noqa: F811
) -> None:
    port = free_port()
    harness = harness_for(
        {"a": every(1)}, singlebeat_http_port=port, singlebeat_http_bind="127.0.0.1"
    )
    replica = harness.replica()  # singlebeat_metrics unset: on, prometheus_client is here
    try:
        for _ in range(2):
            harness.clock.advance(SECOND)
            replica.tick()
        code, body = get(port, "/metrics")
        assert code == 200
        assert re.search(r'^singlebeat_slots_sent_total\{entry="a"\} 1\.0$', body, re.M), body
        # what Prometheus asks for: OpenMetrics
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/metrics",
            headers={"Accept": "application/openmetrics-text;version=1.0.0,text/plain;q=0.5"},
        )
        with urllib.request.urlopen(request, timeout=5) as answer:
            assert answer.headers["Content-Type"].startswith("application/openmetrics-text")
            assert answer.read().decode().endswith("# EOF\n")
    finally:
        replica.close()


SECRET = "hunter2-s3cret"


def test_no_secret_reaches_a_metric_a_probe_or_the_status_file(
    harness_for: Callable[..., Harness],  # noqa: F811
    tmp_path: Path,
) -> None:
    port = free_port()
    status_file = tmp_path / "status"
    harness = harness_for(
        {"a": every(1)},
        singlebeat_url=f"postgresql+psycopg://beat:{SECRET}@db.internal/app?sslpassword={SECRET}q",
        singlebeat_engine_options={"connect_args": {"password": f"{SECRET}c"}},
        singlebeat_http_port=port,
        singlebeat_http_bind="127.0.0.1",
        singlebeat_status_file=str(status_file),
    )
    replica = harness.replica()
    seen: list[str] = []
    try:
        for available in (True, False, True):
            harness.store.available = available
            harness.clock.advance(SECOND)
            replica.tick()
            for path in ("/metrics", "/livez", "/readyz", "/nothing"):
                seen.append(get(port, path)[1])
            seen.append(status_file.read_text())
        with pytest.raises(ConfigurationError) as caught:
            harness.replica()  # the same port: in use
        seen.append(str(caught.value))
    finally:
        replica.close()
    assert any("singlebeat_outage 1.0" in text for text in seen)
    assert not [text for text in seen if SECRET in text]
    assert "db.internal" not in "".join(seen)  # the probes say why, not where


# -- workers ----------------------------------------------------------------------


@pytest.fixture
def worker_app() -> Any:
    app = Celery(f"w{id(object())}", broker="memory://")
    app.conf.singlebeat_url = "sqlite:////nonexistent-dir/never-opened.sqlite"
    app.conf.singlebeat_metrics = True
    app.conf.singlebeat_metrics_registry = CollectorRegistry()
    store = MemoryStore()
    store.prepare(create=True)
    set_store(app, store)
    yield app, store, app.conf.singlebeat_metrics_registry
    forget(app)


def test_singleton_task_counts_acquired_busy_repeats_renewals_and_lost_leases(
    worker_app: Any,
) -> None:
    app, store, registry = worker_app
    hold = make_hold(app, singleton_ttl=1)
    task = {"task": "proj.hold"}

    assert hold.apply().state == "SUCCESS"
    holder = store.acquire_lease("proj.hold", "host:1:abc", 60_000_000)
    assert isinstance(holder, Lease)
    assert hold.apply().state == "SUCCESS"  # busy: skipped
    store.release_lease(holder)
    assert slot_apply(hold).state == "SUCCESS"
    assert slot_apply(hold).state == "IGNORED"  # the same slot again
    assert value(registry, "singlebeat_singleton_acquired_total", **task) == 2
    assert value(registry, "singlebeat_singleton_busy_total", policy="skip", **task) == 1
    assert value(registry, "singlebeat_singleton_repeats_dropped_total", **task) == 1

    # a run longer than its TTL (1 s) is renewed every third of it
    slot_apply(hold, lambda t: time.sleep(1.2), slot_us=SLOT_US + 1).get()
    renewals = value(registry, "singlebeat_singleton_renewals_total", **task)
    assert renewals >= 2
    assert value(registry, "singlebeat_singleton_renewal_seconds_count", **task) == renewals

    def stolen(t: Any) -> None:
        with store.state.lock:
            store.state.leases["proj.hold"].expires_us = 0
        store.acquire_lease("proj.hold", "thief", 60_000_000)
        wait_until(lambda: t.singleton.lost, timeout=3)

    hold.apply(args=(stolen,)).get()
    assert value(registry, "singlebeat_singleton_leases_lost_total", **task) == 1

    def outage(t: Any) -> None:
        store.available = False
        try:
            wait_until(
                lambda: value(registry, "singlebeat_singleton_renewal_failures_total", **task), 3
            )
        finally:
            store.available = True

    hold.apply(args=(outage,)).get()


def test_the_multiprocess_exposition_needs_its_directory(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    with pytest.raises(ConfigurationError, match="PROMETHEUS_MULTIPROC_DIR is not set"):
        multiprocess_registry()


# -- deploy/: alert rules and dashboard --------------------------------------------


def series_names() -> set[str]:
    return metric_names(Metrics().registry, WorkerMetrics().registry)


def used_names(text: str) -> set[str]:
    return set(re.findall(r"\bsinglebeat_[a-z_]+\b", text))


def test_the_dashboard_queries_only_series_the_package_exposes() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [
        target["expr"]
        for panel in dashboard["panels"]
        for target in panel.get("targets", [])
        if "expr" in target
    ]
    assert len(exprs) >= 12
    used = used_names("\n".join(exprs))
    assert used and used <= series_names(), used - series_names()
    # every beat and worker series family is on the dashboard
    families = {re.sub(r"_(total|bucket|count|sum)$", "", n) for n in used}
    wanted = {re.sub(r"_(total|bucket|count|sum|created)$", "", n) for n in series_names()}
    assert wanted <= families, wanted - families


def rule_expressions(text: str) -> list[str]:
    """The ``expr:`` of every rule (one line, or a ``|`` block) of a rules file."""
    found = []
    for match in re.finditer(r"^(\s*)expr: (.*)$((?:\n\1 .*)*)", text, re.M):
        found.append(match[2] if match[2] != "|" else match[3])
    return found


def test_the_alert_rules_query_only_series_the_package_exposes() -> None:
    exprs = rule_expressions(RULES.read_text())
    assert len(exprs) >= 8
    used = used_names("\n".join(exprs))
    assert used <= series_names(), used - series_names()


def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        if IN_CI:
            pytest.fail("promtool is not installed (CI=true: .ci/run installs prometheus)")
        pytest.skip("promtool is not installed (Debian: apt-get install prometheus)")
    return found


def test_promtool_checks_the_rules_and_runs_their_unit_tests() -> None:
    tool = promtool()
    checked = subprocess.run(
        [tool, "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    tested = subprocess.run(
        [tool, "test", "rules", str(RULE_TESTS)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=RULE_TESTS.parent,
    )
    assert tested.returncode == 0, tested.stdout + tested.stderr
    assert "SUCCESS" in tested.stdout + tested.stderr


def test_health_keeps_no_secret_either(tmp_path: Path) -> None:
    # the status file holds instants, flags and bounds only
    Health(60, 17, str(tmp_path / "s")).loop(time.monotonic())
    keys = {line.split(" ")[0] for line in (tmp_path / "s").read_text().splitlines()[1:]}
    assert keys == {
        "pid", "started", "loop", "round_trip", "outage_since", "live_bound", "ready_bound",
        "written", "schema_ready", "stopped",
    }  # fmt: skip


def test_a_registry_shared_by_two_schedulers_fails_naming_the_setting(
    harness_for: Callable[..., Harness],  # noqa: F811
) -> None:
    harness = harness_for(
        {"a": every(1)}, singlebeat_metrics=True, singlebeat_metrics_registry=CollectorRegistry()
    )
    first = harness.replica()
    with pytest.raises(ConfigurationError, match="singlebeat_metrics_registry: Duplicated"):
        harness.replica()
    first.close()
