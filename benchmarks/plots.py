"""The plots of docs/performance.md, drawn from the recorded results.

    make plots        # or: python benchmarks/plots.py [--results DIR] [--out DIR]

Reads benchmarks/results/*.json (written by make bench, make bench-load and
make compare) and writes one PNG per figure into docs/_static/plots. Nothing is
measured here and nothing is typed in: a figure whose numbers are missing from
its JSON stops the script with the file and key that lack them, rather than
drawing a partial plot. Each figure's title names the file it comes from.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
OUT = HERE.parent / "docs" / "_static" / "plots"

#: one colour per scheduler, the same in every figure
COLOURS = {
    "singlebeat": "#1f77b4",
    "batchbeat": "#7f7f7f",
    "sendloop": "#bcbd22",
    "redbeat": "#d62728",
    "redbeat-retry": "#ff9896",
    "django": "#2ca02c",
    "default": "#9467bd",
}
#: how the figures name the senders of the results files
LABELS = {
    "singlebeat": "celery-singlebeat",
    "batchbeat": "batched publish loop (no coordination)",
    "sendloop": "plain apply_async loop",
    "redbeat": "celery-redbeat",
    "redbeat-retry": "celery-redbeat (retrying)",
    "django": "django-celery-beat",
    "default": "Celery's default (PersistentScheduler)",
}
#: the same, short enough for a bar's tick label
SHORT = {
    "singlebeat": "singlebeat",
    "redbeat": "redbeat",
    "django": "django-celery-beat",
    "default": "Celery default",
}


class MissingData(Exception):
    """A results file lacks what a figure needs."""


def load(results: Path, name: str) -> dict[str, Any]:
    path = results / name
    if not path.exists():
        raise MissingData(f"{path}: not found (run the benchmark that writes it)")
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def need(row: dict[str, Any], key: str, where: str) -> Any:
    if row.get(key) is None:
        raise MissingData(f"{where}: no {key!r} in {row}")
    return row[key]


def machine_line(data: dict[str, Any]) -> str:
    m = data.get("machine", {})
    return (
        f"{m.get('nproc', '?')} vCPU, PostgreSQL {str(m.get('postgresql_server', '?')).split()[0]}"
    )


def save(fig: Any, out: Path, name: str) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    path = out / name
    # no Software/date metadata: the same results give the same bytes
    fig.savefig(path, dpi=110, bbox_inches="tight", metadata={"Software": None})
    plt.close(fig)
    return path


def throughput(results: Path, out: Path) -> Path:
    """Dispatches per second against replicas (scale-latest.json), and every
    sender at one replica (latest.json)."""
    scale = load(results, "scale-latest.json")
    rates = load(results, "latest.json")
    sharing = scale.get("sharing") or []
    if not sharing:
        raise MissingData("scale-latest.json: no 'sharing' rows")
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2), width_ratios=[1.1, 1])

    loads = sorted({row["load"] for row in sharing})
    for n, entries in enumerate(loads):
        ours = sorted(
            (need(r, "replicas", "scale-latest.json"), need(r, "dispatches_per_s", "scale"))
            for r in sharing
            if r["sender"] == "singlebeat" and r["load"] == entries
        )
        if not ours:
            raise MissingData(f"scale-latest.json: no singlebeat rows at load {entries}")
        style = "-o" if n == 0 else "--s"
        left.plot(
            *zip(*ours),
            style,
            color=COLOURS["singlebeat"],
            label=f"celery-singlebeat, {entries:,} entries due",
        )
        for r in sharing:
            if r["sender"] == "batchbeat" and r["load"] == entries:
                left.axhline(
                    r["dispatches_per_s"],
                    color=COLOURS["batchbeat"],
                    linestyle=":" if n == 0 else "-.",
                    linewidth=1,
                    label=f"baseline: {LABELS['batchbeat']}, {entries:,}, 1 process",
                )
    replicas = sorted({r["replicas"] for r in sharing})
    left.set_xticks(replicas)
    left.set_xlabel("beat replicas")
    left.set_ylabel("messages published per second (all replicas)")
    left.set_ylim(bottom=0)
    left.legend(fontsize=7.5, loc="lower right")
    left.set_title(
        f"Throughput against replicas\nscale-latest.json ({machine_line(scale)})", fontsize=9
    )

    rows = [r for r in rates.get("rates") or [] if r.get("replicas") == 1]
    if not rows:
        raise MissingData("latest.json: no 'rates' rows at 1 replica")
    rows.sort(key=lambda r: r["dispatches_per_s"])
    names = [LABELS.get(r["sender"], r["sender"]) for r in rows]
    values = [need(r, "dispatches_per_s", "latest.json") for r in rows]
    bars = right.barh(names, values, color=[COLOURS.get(r["sender"], "k") for r in rows])
    right.bar_label(bars, labels=[f"{v:,.0f}" for v in values], fontsize=8, padding=2)
    entries = {r["entries"] for r in rows if r.get("entries")}
    right.set_xlabel("messages published per second, one process")
    right.set_xlim(0, max(values) * 1.2)
    right.tick_params(axis="y", labelsize=8)
    right.set_title(
        f"Every sender, {', '.join(f'{e:,}' for e in sorted(entries))} entries due "
        f"each second\nlatest.json ({machine_line(rates)})",
        fontsize=9,
    )
    fig.tight_layout()
    return save(fig, out, "throughput.png")


def silent_gap(results: Path, out: Path) -> Path:
    """The longest stretch without a run after the sending replica is SIGKILLed
    (and, beside it, SIGSTOPped), per scheduler (compare-latest.json)."""
    data = load(results, "compare-latest.json")
    rows = data.get("rows") or []
    scenarios = [
        ("kill", "sending replica SIGKILLed"),
        ("pause", "sending replica SIGSTOPped 20 s"),
    ]
    schedulers = ["singlebeat", "redbeat", "django", "default"]
    fig, axes = plt.subplots(1, len(scenarios), figsize=(11, 3.8), sharey=True)
    for ax, (scenario, title) in zip(axes, scenarios):
        found = {r["scheduler"]: r for r in rows if r.get("scenario") == scenario}
        missing = [s for s in schedulers if s not in found]
        if missing:
            raise MissingData(f"compare-latest.json: no {scenario!r} row for {missing}")
        gaps = [need(found[s], "longest_gap_s", f"compare {scenario}") for s in schedulers]
        bars = ax.bar(
            [f"{SHORT[s]}\n(replicas: {found[s]['replicas']})" for s in schedulers],
            gaps,
            color=[COLOURS[s] for s in schedulers],
        )
        ax.bar_label(
            bars,
            labels=[
                f"{g:g} s\n{found[s]['missed']} missed, {found[s]['duplicates']} dup."
                for g, s in zip(gaps, schedulers)
            ],
            fontsize=7.5,
            padding=2,
        )
        ax.tick_params(axis="x", labelsize=7)
        ax.set_title(f"{title} ({found['singlebeat']['window_s']:g} s window)", fontsize=9)
        ax.set_ylim(0, max(gaps) * 1.35)
    axes[0].set_ylabel("longest gap between runs (s)\nof an entry due every second")
    fig.suptitle(
        f"The silent gap after a failure\ncompare-latest.json ({machine_line(data)})", fontsize=9
    )
    fig.tight_layout()
    return save(fig, out, "silent-gap.png")


def _percentile_rows(
    quiet: dict[str, Any], load_run: dict[str, Any]
) -> Iterable[tuple[str, list[tuple[str, float]]]]:
    for row in quiet.get("duplicates") or []:
        if row.get("scheduler") != "singlebeat":
            continue
        points = [
            ("median", need(row, "delay_ms_median", "latest.json duplicates")),
            ("p95", need(row, "delay_ms_p95", "latest.json duplicates")),
            ("max", need(row, "delay_ms_max", "latest.json duplicates")),
        ]
        yield (
            f"{row['replicas']} replica(s), {row['slots_due']} slots\nin "
            f"{row['window_s']:g} s (latest.json)",
            points,
        )
    slots = load_run.get("load", {}).get("slots", {})
    replicas = len(load_run.get("load", {}).get("replicas") or [])
    points = [
        ("median", need(slots, "delay_ms_median", "load-latest.json load.slots")),
        ("p99", need(slots, "delay_ms_p99", "load-latest.json load.slots")),
        ("max", need(slots, "delay_ms_max", "load-latest.json load.slots")),
    ]
    yield (f"{replicas} replicas, {slots['due']:,} slots\nin bursts (load-latest.json)", points)


def dispatch_delay(results: Path, out: Path) -> Path:
    """How late runs were published: the recorded percentiles (latest.json's
    quiet runs, load-latest.json's 5-minute load run), and the raw per-burst
    latest send of the load run."""
    quiet = load(results, "latest.json")
    load_run = load(results, "load-latest.json")
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4), width_ratios=[1.2, 1])

    markers = {"median": "o", "p95": "^", "p99": "v", "max": "x"}
    rows = list(_percentile_rows(quiet, load_run))
    for y, (_, points) in enumerate(rows):
        values = [v for _, v in points]
        left.plot(values, [y] * len(values), "-", color=COLOURS["singlebeat"], alpha=0.4)
        for name, value in points:
            left.plot(value, y, markers[name], color=COLOURS["singlebeat"], markersize=8)
        # the values as text above the line: markers this close cannot carry a label each
        left.annotate(
            " · ".join(f"{name} {value:g}" for name, value in points) + " ms",
            (values[0], y),
            textcoords="offset points",
            xytext=(0, 10),
            fontsize=7.5,
        )
    left.set_yticks(range(len(rows)), [label for label, _ in rows], fontsize=8)
    left.set_ylim(-0.6, len(rows) - 0.3)
    left.set_xscale("log")
    left.set_xlim(right=max(v for _, pts in rows for _, v in pts) * 8)
    left.set_xlabel("publish delay after the slot's instant (ms, log scale)")
    left.set_title("Percentiles recorded by the benchmarks", fontsize=9)

    bursts = load_run.get("load", {}).get("slots", {}).get("bursts") or []
    samples = [b["last_sent_after_ms"] for b in bursts if b.get("last_sent_after_ms") is not None]
    if not samples:
        raise MissingData("load-latest.json: no load.slots.bursts[].last_sent_after_ms")
    due = [b["due"] for b in bursts if b.get("due")]
    right.hist(samples, bins=20, color=COLOURS["singlebeat"])
    right.set_xlabel("delay of the last message of each burst (ms)")
    right.set_ylabel("bursts")
    right.set_title(
        f"Raw samples: the {len(samples)} bursts of the load run\n"
        f"({min(due):,} to {max(due):,} slots due at once; load-latest.json)",
        fontsize=9,
    )
    fig.suptitle(f"Dispatch delay ({machine_line(load_run)})", fontsize=9)
    fig.tight_layout()
    return save(fig, out, "dispatch-delay.png")


def stored_entries(results: Path, out: Path) -> Path:
    """Stored entries at scale (stored-latest.json): start-up, edit to send,
    and statements a second per replica, ours against django-celery-beat's."""
    data = load(results, "stored-latest.json")
    runs = [r for r in data.get("runs") or [] if "storm" in r]
    kinds = [k for k in ("singlebeat", "django") if any(r["scheduler"] == k for r in runs)]
    if not kinds:
        raise MissingData("stored-latest.json: no complete run")
    fig, (start, edit, cost) = plt.subplots(1, 3, figsize=(13, 4))
    sizes = sorted({r["entries"] for r in runs})
    cap = 60.0

    def rows(kind: str) -> list[dict[str, Any]]:
        return sorted((r for r in runs if r["scheduler"] == kind), key=lambda r: r["entries"])

    def label(kind: str) -> str:
        return f"{LABELS[kind]} ({rows(kind)[0]['replicas']} replica(s))"

    for kind in kinds:
        mine = rows(kind)
        start.plot(
            [r["entries"] for r in mine],
            [need(r, "startup_s", "stored-latest.json") for r in mine],
            "-o",
            color=COLOURS[kind],
            label=label(kind),
        )
        for key, style, what in (("p50_s", "-o", "p50"), ("max_s", "--x", "max")):
            values = [r["latency"].get(key) for r in mine]
            cap = float(mine[0]["latency"].get("cap_s", cap))
            # an edit never sent within the cap is drawn at the cap
            edit.plot(
                [r["entries"] for r in mine],
                [cap if v is None else v for v in values],
                style,
                color=COLOURS[kind],
                label=f"{SHORT[kind]}, {what}",
            )
    start.axhline(10, color="k", linestyle=":", linewidth=1, label="target at 100,000: 10 s")
    start.set_ylabel("s from the processes' start to the first probe sent")
    start.set_title("Start-up", fontsize=9)
    edit.axhline(
        2.0, color="k", linestyle=":", linewidth=1, label="1 s to take effect + 1 s to the next run"
    )
    edit.set_yscale("log")
    edit.set_ylabel(f"s from an edit's commit to its first send (cap {cap:g} s)")
    every = data.get("plan", {}).get("latency_every_s")
    edit.set_title(f"Edit to send (an edit every {every:g} s, probes every second)", fontsize=9)

    width = 0.8 / (2 * len(kinds))
    n = 0
    for kind in kinds:
        for phase, hatch in (("idle", ""), ("storm", "//")):
            values = [
                need(
                    next(r for r in rows(kind) if r["entries"] == size)[phase],
                    "statements_per_s",
                    phase,
                )["mean"]
                for size in sizes
            ]
            bars = cost.bar(
                [i + (n - len(kinds) + 0.5) * width for i in range(len(sizes))],
                values,
                width,
                color=COLOURS[kind],
                hatch=hatch,
                edgecolor="white",
                label=f"{SHORT[kind]}, {'idle' if phase == 'idle' else '10 edits/s'}",
            )
            cost.bar_label(bars, labels=[f"{v:g}" for v in values], fontsize=7, padding=1)
            n += 1
    cost.axhline(0.5, color="k", linestyle=":", linewidth=1, label="idle budget with LISTEN: 0.5")
    cost.set_yscale("log")
    cost.set_xticks(range(len(sizes)), [f"{s:,} entries" for s in sizes])
    cost.set_ylabel("statements a second per replica")
    cost.set_title("Database statements", fontsize=9)
    for ax in (start, edit):
        ax.set_xscale("log")
        ax.set_xticks(sizes, [f"{s:,}" for s in sizes])
        ax.minorticks_off()
        ax.set_xlabel("stored entries")
    for ax in (start, edit):
        ax.legend(fontsize=7)
    # below the bars: above them it would hide the tallest one's label
    cost.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=2)
    start.set_ylim(bottom=0)
    fig.suptitle(
        f"Stored entries at scale, commit {data.get('commit', '?')}\n"
        f"stored-latest.json ({machine_line(data)})",
        fontsize=9,
    )
    fig.tight_layout()
    return save(fig, out, "stored-entries.png")


def django_drop_in(results: Path, out: Path) -> Path:
    """The drop-in against django-celery-beat's scheduler on the same tables
    (django-beat-latest.json): start-up, a save's pickup, and sends per run,
    3 replicas each."""
    data = load(results, "django-beat-latest.json")
    sides = data.get("sides") or []
    kinds = (("django-celery-beat", "django"), ("drop-in", "singlebeat"))
    if not sides:
        raise MissingData("django-beat-latest.json: no side measured")
    fig, (start, pickup, sends) = plt.subplots(1, 3, figsize=(13, 4))
    sizes = sorted({s["tasks"] for s in sides})

    def rows(side: str) -> list[dict[str, Any]]:
        return sorted((s for s in sides if s["side"] == side), key=lambda s: s["tasks"])

    for side, colour in kinds:
        mine = rows(side)
        if not mine:
            continue
        label = f"{side} ({mine[0]['replicas']} replicas)"
        xs = [r["tasks"] for r in mine]
        start.plot(
            xs, [need(r, "startup_s", side) for r in mine], "-o", color=COLOURS[colour], label=label
        )
        pickup.plot(
            xs,
            [need(r, "pickup_median_s", side) for r in mine],
            "-o",
            color=COLOURS[colour],
            label=f"{side}, median",
        )
        pickup.plot(
            xs,
            [max(need(r, "pickup_s", side)) for r in mine],
            "--x",
            color=COLOURS[colour],
            label=f"{side}, worst",
        )
        applied = [r for r in mine if r.get("applied_median_s") is not None]
        if applied:
            # the change followed by every replica (their logs), before the
            # probe's next slot carries it
            pickup.plot(
                [r["tasks"] for r in applied],
                [r["applied_median_s"] for r in applied],
                ":s",
                color=COLOURS[colour],
                label=f"{side}, in effect in every replica (median)",
            )
    width = 0.35
    for n, (side, colour) in enumerate(kinds):
        values = [
            next((r["sends_per_run"] for r in rows(side) if r["tasks"] == size), 0.0)
            for size in sizes
        ]
        bars = sends.bar(
            [i + (n - 0.5) * width for i in range(len(sizes))],
            values,
            width,
            color=COLOURS[colour],
            label=side,
        )
        sends.bar_label(bars, labels=[f"{v:g}" for v in values], fontsize=7, padding=1)
    sends.axhline(1.0, color="k", linestyle=":", linewidth=1, label="each run once")
    sends.set_xticks(range(len(sizes)), [f"{s:,} tasks" for s in sizes])
    sends.set_ylabel("messages per run of the probe (1 = once)")
    sends.set_title("Sends per run, 3 replicas", fontsize=9)
    pickup.axhline(1.0, color="k", linestyle=":", linewidth=1, label="1 s")
    pickup.set_yscale("log")
    pickup.set_ylabel("s from a save() to the first message carrying it")
    pickup.set_title("A save's pickup (a probe due every second)", fontsize=9)
    pickup.set_ylim(bottom=0.1)
    start.set_ylabel("s from the processes' start to the first probe sent")
    start.set_title("Start-up", fontsize=9)
    start.set_ylim(bottom=0)
    for ax in (start, pickup):
        ax.set_xscale("log")
        ax.set_xticks(sizes, [f"{s:,}" for s in sizes])
        ax.minorticks_off()
        ax.set_xlabel("periodic tasks")
        ax.legend(fontsize=7)
    sends.legend(fontsize=7)
    fig.suptitle(
        f"django-celery-beat's tables: its scheduler and the drop-in, commit "
        f"{data.get('commit', '?')}\ndjango-beat-latest.json ({machine_line(data)})",
        fontsize=9,
    )
    fig.tight_layout()
    return save(fig, out, "django-drop-in.png")


FIGURES = (throughput, silent_gap, dispatch_delay, stored_entries, django_drop_in)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, default=RESULTS)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    failed = 0
    for figure in FIGURES:
        try:
            path = figure(args.results, args.out)
        except MissingData as exc:
            print(f"plots: {figure.__name__}: {exc}", file=sys.stderr)
            failed += 1
        else:
            print(f"plots: {path}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
