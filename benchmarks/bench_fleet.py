"""Operating the fleet: what replica rows, controls and probes cost, before and after.

Measured in one run, alternating the code of a baseline commit (before issue
12: no replica rows, catalog, pauses, listener or telemetry) and this tree, so
the machine's state weighs on both alike:

1. idle statements a second per replica (entries not due), on PostgreSQL,
   MariaDB and SQLite, in-process (``bench_scale.measure_idle``);
2. throughput: one replica with 2,000 entries due every second, and three
   replicas with 10,000, real ``celery beat`` processes on PostgreSQL and
   Redis (``bench_scheduler._rate``): messages reaching the broker a second;
3. the exec health probe's CPU (user + system of the child process), this
   tree only (the baseline has none).

Usage: ``python benchmarks/bench_fleet.py [--baseline REV] [--rounds N] [--quick]
[--json PATH]``. The baseline is checked out in a temporary git worktree.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

#: the last commit before issue 12's first change
DEFAULT_BASELINE = "c670127"
DATABASES = {
    "postgresql": os.environ.get("SB_TEST_PG", "postgresql+psycopg://postgres@127.0.0.1:5432/test"),
    "mariadb": os.environ.get("SB_TEST_MYSQL", "mysql+pymysql://root@127.0.0.1:3306/test"),
}


def worktree(rev: str) -> Path:
    """A checkout of ``rev`` (made once, reused by later runs)."""
    path = Path(tempfile.gettempdir()) / f"singlebeat-baseline-{rev}"
    if not (path / "celery_singlebeat").is_dir():
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "add", "--detach", "--force", str(path), rev],
            check=True,
            capture_output=True,
        )
    return path


#: imported at every interpreter's start-up (``sitecustomize``): an editable
#: install's import hook finds celery_singlebeat before PYTHONPATH is looked
#: at, so the baseline's processes drop it and import the baseline's tree
_SITECUSTOMIZE = """
import sys
sys.meta_path[:] = [f for f in sys.meta_path if "__editable__" not in getattr(f, "__module__", "")]
"""


def child(package_root: Path, code: str) -> Any:
    """Run ``code`` (which prints one JSON document) in a Python process that
    imports celery_singlebeat from ``package_root``; the replicas it starts do too."""
    hook = Path(tempfile.gettempdir()) / "singlebeat-bench-site"
    hook.mkdir(exist_ok=True)
    (hook / "sitecustomize.py").write_text(_SITECUSTOMIZE)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(hook), str(package_root), str(HERE)]),
        "BENCH_PACKAGE_ROOT": str(package_root),
    }
    out = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        capture_output=True,
        text=True,
        check=False,
        # not this tree: `python -c` puts the working directory first on sys.path
        cwd=tempfile.gettempdir(),
    )
    if out.returncode != 0:
        raise RuntimeError(f"child failed:\n{out.stdout[-2000:]}\n{out.stderr[-4000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


IDLE = """
import json, sys, tempfile
import bench_scale, celery_singlebeat
assert celery_singlebeat.__file__.startswith({root!r}), celery_singlebeat.__file__
class Plan: idle_window = {window}
bench_scale.PG_URL = {url!r}
print(json.dumps(bench_scale.measure_idle(Plan)))
"""

RATE = """
import json
import bench_scheduler as b
plan = b.Plan.make({quick})
config = b.Config(plan, {redis_db})
scenario = b.Scenario("singlebeat", {replicas}, {entries}, 1.0, config)
try:
    print(json.dumps(b._rate(scenario, plan)))
finally:
    scenario.cleanup()
"""


def measure_idle(trees: dict[str, Path], window: float) -> list[dict[str, Any]]:
    rows = []
    sqlite = Path(tempfile.mkdtemp(prefix="bench-idle-")) / "idle.sqlite"
    urls = {**DATABASES, "sqlite": f"sqlite:///{sqlite}"}
    for database, url in urls.items():
        for label, tree in trees.items():
            result = child(tree, IDLE.format(root=str(tree), window=window, url=url))
            rows.append({"database": database, "code": label, **result})
    return rows


def measure_rates(
    trees: dict[str, Path], rounds: int, quick: bool, redis_db: int
) -> list[dict[str, Any]]:
    rows = []
    for replicas, entries in ((1, 2000), (3, 10000)):
        for round_ in range(rounds):
            # alternate the order, so neither side always runs on a warmer machine
            order = list(trees.items()) if round_ % 2 == 0 else list(reversed(trees.items()))
            for label, tree in order:
                code = RATE.format(
                    quick=quick, redis_db=redis_db, replicas=replicas, entries=entries
                )
                result = child(tree, code)
                rows.append({"code": label, "round": round_, **result})
    return rows


def measure_probe_cpu(runs: int) -> dict[str, Any] | None:
    """CPU of ``python -m celery_singlebeat health --status-file F`` (this tree)."""
    try:
        from celery_singlebeat.observe import health  # noqa: F401
    except ImportError:
        return None
    status = Path(tempfile.mkdtemp(prefix="bench-probe-")) / "status"
    # a fresh status file as a running replica writes it
    subprocess.run(
        [sys.executable, "-c", HEALTH_WRITE.format(path=str(status))], check=True, env=_env()
    )
    probe = [sys.executable, "-m", "celery_singlebeat", "health", "--status-file", str(status)]
    # the baseline: an interpreter that starts and does nothing, in turn with the probe
    empty = [sys.executable, "-c", "pass"]
    samples: dict[str, list[float]] = {"probe": [], "empty": []}
    codes = []
    for _ in range(runs):
        for name, argv in (("probe", probe), ("empty", empty)):
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            done = subprocess.run(argv, capture_output=True, env=_env(), check=False)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            if name == "probe":
                codes.append(done.returncode)
            samples[name].append(
                (after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime) * 1000
            )
    return {
        "runs": runs,
        "exit_codes": sorted(set(codes)),
        "cpu_ms_median": round(statistics.median(samples["probe"]), 1),
        "cpu_ms_max": round(max(samples["probe"]), 1),
        "empty_interpreter_ms_median": round(statistics.median(samples["empty"]), 1),
    }


#: a live, ready replica's status file, as its loop writes it
HEALTH_WRITE = """
import time
from celery_singlebeat.observe import health
replica = health.Health(60.0, 17.0, {path!r})
replica.schema_ready()
replica.round_trip(0.001, True)
replica.loop(time.monotonic())
"""


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT)}


def render(results: dict[str, Any]) -> str:
    out = [f"bench_fleet: baseline {results['baseline']} against {results['current']}", ""]
    out.append("1. idle statements a second per replica (entries not due)")
    out.append(
        f"   {'database':<11} {'code':<9} {'window':>7} {'ticks':>6} {'stmts':>6} {'per s':>6}"
    )
    for r in results["idle"]:
        out.append(
            f"   {r['database']:<11} {r['code']:<9} {r['window_s']:>6}s {r['ticks']:>6} "
            f"{r['statements']:>6} {r['statements_per_s']:>6}"
        )
    out.append("")
    out.append("2. messages reaching the broker a second (PostgreSQL, Redis)")
    out.append(f"   {'replicas x due/s':<17} {'code':<9} {'rounds':>6} {'median/s':>9} {'all':>24}")
    by: dict[tuple[int, int, str], list[float]] = {}
    for r in results["rates"]:
        key = (r["replicas"], r["entries"], r["code"])
        by.setdefault(key, []).append(r["dispatches_per_s"])
    for (replicas, entries, code), values in sorted(by.items()):
        shown = ", ".join(f"{v:,.0f}" for v in values)
        out.append(
            f"   {f'{replicas} x {entries:,}':<17} {code:<9} {len(values):>6} "
            f"{statistics.median(values):>9,.0f} {shown:>24}"
        )
    probe = results.get("probe")
    out.append("")
    if probe:
        out.append(
            f"3. exec probe CPU: median {probe['cpu_ms_median']} ms, max {probe['cpu_ms_max']} ms "
            f"over {probe['runs']} runs (exit codes {probe['exit_codes']}); an empty "
            f"interpreter (python -c pass) {probe['empty_interpreter_ms_median']} ms"
        )
    else:
        out.append("3. exec probe: not in this tree")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", default=DEFAULT_BASELINE)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="short windows")
    parser.add_argument("--only", default="1,2,3")
    parser.add_argument("--redis-db", type=int, default=9)
    parser.add_argument("--json", type=Path, default=HERE / "results" / "fleet-latest.json")
    args = parser.parse_args(argv)
    only = {int(x) for x in args.only.split(",") if x.strip()}
    current = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    trees = {"before": worktree(args.baseline), "after": ROOT}
    started = time.monotonic()
    results: dict[str, Any] = {"baseline": args.baseline, "current": current}
    if 1 in only:
        results["idle"] = measure_idle(trees, 20.0 if args.quick else 60.0)
    if 2 in only:
        results["rates"] = measure_rates(trees, args.rounds, args.quick, args.redis_db)
    if 3 in only:
        results["probe"] = measure_probe_cpu(20)
    results.setdefault("idle", [])
    results.setdefault("rates", [])
    results["elapsed_s"] = round(time.monotonic() - started, 1)
    print(render(results))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
