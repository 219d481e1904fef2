"""example_project's deploy files: valid for their tools, and consistent with the project.

``docker-compose.yml`` is checked against the Compose specification's schema
(check-jsonschema's vendored ``vendor.compose-spec``) and ``k8s/`` against
Kubernetes' own schemas (kubernetes-validate ships them; ``--strict`` refuses
unknown fields), both offline. Each check also runs on a broken copy, which must
fail, so a validator that accepts anything cannot pass the test. A missing tool
skips locally and fails in CI (``CI=true``), as a missing service does.

Then what no schema knows: every environment variable the files set is one
``mysite/settings.py`` reads (its ``ENVIRONMENT``), every process gets the
required ones, beat runs as 3 replicas, the PodDisruptionBudget selects the
beat pods and no other, and the probes ask the paths and ports the replicas
really serve: a real health listener and the real exec probe answer them here.
"""

from __future__ import annotations

import ast
import os
import shutil
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
PROJECT = Path(__file__).resolve().parents[2] / "example_project"
COMPOSE = PROJECT / "docker-compose.yml"
K8S = PROJECT / "k8s"
SETTINGS = PROJECT / "mysite" / "settings.py"
#: what every process of the project needs (settings.py stops without them)
REQUIRED = {"DATABASE_URL", "DJANGO_SECRET_KEY", "CELERY_BROKER_URL"}
BEAT_LABELS = {"app.kubernetes.io/name": "shop", "app.kubernetes.io/component": "beat"}


def tool(name: str) -> str:
    """The tool's executable beside this interpreter (the venv's), else on PATH;
    skipped locally, failed in CI, when neither has it."""
    beside = Path(sys.executable).parent / name
    found = str(beside) if beside.exists() else shutil.which(name)
    if found is None:
        message = f"{name} is not installed (the dev extra installs it)"
        if IN_CI:
            pytest.fail(f"{message} (CI=true: a missing tool is a failure)")
        pytest.skip(message)
    return found


def run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)


def settings_environment() -> tuple[set[str], set[str]]:
    """settings.py's ENVIRONMENT keys, and the names its env*() calls read."""
    tree = ast.parse(SETTINGS.read_text(encoding="utf-8"))
    listed: set[str] = set()
    read: set[str] = set()
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == "ENVIRONMENT" for t in node.targets)
            and isinstance(node.value, ast.Dict)
        ):
            listed = {k.value for k in node.value.keys if isinstance(k, ast.Constant)}
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id.startswith("env")
            and node.args
            and isinstance(node.args[0], ast.Constant)
        ):
            read.add(node.args[0].value)
    return listed, read


def k8s_documents() -> dict[tuple[str, str], dict[str, Any]]:
    """Every Kubernetes object under k8s/, by (kind, name)."""
    found = {}
    for path in sorted(K8S.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")):
            if doc and doc.get("kind") != "Kustomization":
                found[(doc["kind"], doc["metadata"]["name"])] = doc
    return found


def pod_specs(docs: dict[tuple[str, str], dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The pod template of every workload, by workload name."""
    return {
        name: doc["spec"]["template"]
        for (kind, name), doc in docs.items()
        if kind in ("Deployment", "Job")
    }


def container_env(
    container: dict[str, Any], docs: dict[tuple[str, str], dict[str, Any]]
) -> dict[str, Any]:
    """The environment a container gets: its envFrom sources' keys, then its env."""
    env: dict[str, Any] = {}
    for source in container.get("envFrom", []):
        if "configMapRef" in source:
            data = docs[("ConfigMap", source["configMapRef"]["name"])]["data"]
        else:
            data = docs[("Secret", source["secretRef"]["name"])]["stringData"]
        env.update(data)
    for item in container.get("env", []):
        env[item["name"]] = item.get("value", item.get("valueFrom"))
    return env


# -- the tools -----------------------------------------------------------------


def test_compose_file_is_valid_against_the_compose_spec(tmp_path: Path) -> None:
    checker = tool("check-jsonschema")
    result = run(checker, "--builtin-schema", "vendor.compose-spec", str(COMPOSE))
    assert result.returncode == 0, result.stdout + result.stderr
    # the same file with a key Compose does not know must be refused
    broken = tmp_path / "docker-compose.yml"
    broken.write_text(
        COMPOSE.read_text(encoding="utf-8").replace("    deploy:\n", "    deploy_:\n", 1),
        encoding="utf-8",
    )
    result = run(checker, "--builtin-schema", "vendor.compose-spec", str(broken))
    assert result.returncode == 1 and "deploy_" in result.stdout, result.stdout + result.stderr


def test_k8s_manifests_are_valid_kubernetes_objects(tmp_path: Path) -> None:
    validator = tool("kubernetes-validate")
    files = sorted(str(p) for p in K8S.glob("*.yaml") if p.name != "kustomization.yaml")
    result = run(validator, "--strict", *files)
    assert result.returncode == 0, result.stdout + result.stderr
    kinds = {(kind.lower(), name) for kind, name in k8s_documents()}
    for kind, name in kinds:
        assert f"passed for resource {kind}/{name}" in result.stdout + result.stderr, kind
    broken = tmp_path / "beat.yaml"
    broken.write_text(
        (K8S / "beat.yaml").read_text(encoding="utf-8").replace("periodSeconds", "periodSecs", 1),
        encoding="utf-8",
    )
    result = run(validator, "--strict", str(broken))
    assert result.returncode != 0 and "periodSecs" in result.stdout + result.stderr


def test_kustomization_lists_every_manifest() -> None:
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text(encoding="utf-8"))
    on_disk = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert set(kustomization["resources"]) == on_disk


# -- consistency with the project ----------------------------------------------


def test_settings_list_every_variable_they_read() -> None:
    listed, read = settings_environment()
    assert listed >= REQUIRED
    assert read == listed, read ^ listed


def test_compose_sets_what_the_settings_read() -> None:
    listed, _read = settings_environment()
    compose = yaml.safe_load(COMPOSE.read_text(encoding="utf-8"))
    services = compose["services"]
    app = {name: s for name, s in services.items() if s.get("image") == "singlebeat-example:latest"}
    assert set(app) == {"migrate", "web", "worker", "beat"}
    for name, service in app.items():
        env = service["environment"]
        assert set(env) <= listed, (name, set(env) - listed)
        assert set(env) >= REQUIRED, (name, REQUIRED - set(env))
    # the URLs point at the services that exist, with the database's own credentials
    db = urlsplit(app["web"]["environment"]["DATABASE_URL"])
    pg = services["postgres"]["environment"]
    assert (db.hostname, db.username, db.password, db.path[1:]) == (
        "postgres",
        pg["POSTGRES_USER"],
        pg["POSTGRES_PASSWORD"],
        pg["POSTGRES_DB"],
    )
    assert urlsplit(app["web"]["environment"]["CELERY_BROKER_URL"]).hostname == "redis"
    beat = app["beat"]
    assert beat["deploy"]["replicas"] == 3
    assert "migrate" in beat["depends_on"]
    test = beat["healthcheck"]["test"]
    assert test[1:6] == ["python", "-m", "celery_singlebeat", "health", "--ready"]
    assert test[test.index("--status-file") + 1] == beat["environment"]["SINGLEBEAT_STATUS_FILE"]


def test_k8s_sets_what_the_settings_read() -> None:
    listed, _read = settings_environment()
    docs = k8s_documents()
    pods = pod_specs(docs)
    assert set(pods) == {"shop-beat", "shop-worker", "shop-web", "shop-migrate"}
    for name, template in pods.items():
        for container in template["spec"]["containers"]:
            env = container_env(container, docs)
            assert set(env) <= listed, (name, set(env) - listed)
            assert set(env) >= REQUIRED, (name, REQUIRED - set(env))
    # the secret holds placeholders that say so, never a value that looks real
    secret = docs[("Secret", "shop-secrets")]["stringData"]
    assert set(secret) == {"DATABASE_URL", "DJANGO_SECRET_KEY"}
    assert all("CHANGE-ME" in value for value in secret.values())


def test_k8s_runs_three_beat_replicas_behind_a_budget_that_selects_them() -> None:
    docs = k8s_documents()
    beat = docs[("Deployment", "shop-beat")]
    assert beat["spec"]["replicas"] == 3
    assert beat["spec"]["selector"]["matchLabels"] == BEAT_LABELS
    pdb = docs[("PodDisruptionBudget", "shop-beat")]["spec"]
    selector = pdb["selector"]["matchLabels"]
    for name, template in pod_specs(docs).items():
        labels = template["metadata"]["labels"]
        selected = all(labels.get(k) == v for k, v in selector.items())
        assert selected == (name == "shop-beat"), name
    # a drain leaves at least two of the three sending
    assert pdb.get("maxUnavailable") == 1 or pdb.get("minAvailable") == 2
    # the web Service reaches the web pods on their named port
    service = docs[("Service", "shop-web")]["spec"]
    web = pod_specs(docs)["shop-web"]
    assert all(web["metadata"]["labels"].get(k) == v for k, v in service["selector"].items())
    ports = {p["name"] for p in web["spec"]["containers"][0]["ports"]}
    assert service["ports"][0]["targetPort"] in ports


def test_k8s_probes_ask_what_the_processes_serve() -> None:
    docs = k8s_documents()
    beat = pod_specs(docs)["shop-beat"]["spec"]
    (container,) = beat["containers"]
    env = container_env(container, docs)
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    probes = {kind: container[kind]["httpGet"] for kind in ("livenessProbe", "readinessProbe")}
    assert probes["livenessProbe"]["path"] == "/livez"
    assert probes["readinessProbe"]["path"] == "/readyz"
    for probe in probes.values():
        assert ports[probe["port"]] == int(env["SINGLEBEAT_HTTP_PORT"])
    # the status file's folder is a writable volume (the root file system is read-only)
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    assert str(Path(env["SINGLEBEAT_STATUS_FILE"]).parent) in mounts
    # the web pods' probes: a path urls.py serves, with a Host Django accepts
    web = pod_specs(docs)["shop-web"]["spec"]["containers"][0]
    web_env = container_env(web, docs)
    urls = (PROJECT / "mysite" / "urls.py").read_text(encoding="utf-8")
    for kind in ("livenessProbe", "readinessProbe"):
        get = web[kind]["httpGet"]
        assert f'path("{get["path"].lstrip("/")}"' in urls
        hosts = {h["value"] for h in get["httpHeaders"] if h["name"] == "Host"}
        assert hosts <= set(web_env["DJANGO_ALLOWED_HOSTS"].split(","))


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_a_replicas_listener_and_exec_probe_answer_the_deploy_files(tmp_path: Path) -> None:
    """The health parts a beat replica starts with the deploy files' settings
    (a port, a status file) answer the k8s paths and the compose exec probe."""
    from celery_singlebeat.config import Settings
    from celery_singlebeat.observe.observers import for_scheduler

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    status_file = tmp_path / "status"
    settings = Settings.from_conf(
        {
            "singlebeat_url": f"sqlite:///{tmp_path / 'db.sqlite'}",
            "singlebeat_http_port": port,
            "singlebeat_http_bind": "127.0.0.1",
            "singlebeat_status_file": str(status_file),
        }
    )
    telemetry = for_scheduler(settings)
    try:
        beat = pod_specs(k8s_documents())["shop-beat"]["spec"]["containers"][0]
        # a replica starting up is live, and not ready until it reached the
        # database: both paths are served, with their verdicts
        expected = {"livenessProbe": (200, "ok"), "readinessProbe": (503, "failing")}
        for kind, answer in expected.items():
            status, body = _get(f"http://127.0.0.1:{port}{beat[kind]['httpGet']['path']}")
            assert (status, body.split(":")[0]) == answer, (kind, body)
        compose = yaml.safe_load(COMPOSE.read_text(encoding="utf-8"))
        test = compose["services"]["beat"]["healthcheck"]["test"][1:]
        argv = [sys.executable if a == "python" else a for a in test]
        argv[argv.index("--status-file") + 1] = str(status_file)
        probe = run(*argv)
        # the exec probe read the file and judged it as /readyz did: not ready yet
        assert (probe.returncode, probe.stdout.split(":")[0]) == (1, "failing"), probe
        assert "not ready" in probe.stdout
    finally:
        telemetry.close()
