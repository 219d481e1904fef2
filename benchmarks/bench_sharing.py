"""Sharing: how evenly and how stably the entries are shared out, and what a deal costs.

The scheduler gives each entry one *first* replica among the live ones
(``celery_singlebeat/sharing.py``). This script measures, in one run, the
positional deal of releases up to 0.x (entries sorted by a hash of their name,
dealt round robin over the sorted live replicas; reproduced below as the
baseline) against the rendezvous hashing that replaced it:

* balance: the largest share at 1,000 (and 100,000) entries over 3 and 10
  replicas, against the ideal 1/k (one replica set, and the mean and worst over
  many sets of replica ids: rendezvous spreads binomially, so its share depends
  on the ids);
* moves: how many entries change first replica when one entry is added, one
  removed, one replica added, one removed (mean over many random picks);
* cost: one deal of 100,000 entries over 3 and 10 replicas, with the entries'
  hashes prepared (what a change of the live set costs a running replica) and
  from the names (the first deal after start).

Usage: ``python benchmarks/bench_sharing.py [--quick] [--json PATH]``. No
service needed; it runs in-process, in a few seconds (``--quick``: fewer picks).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bench_scheduler import table  # noqa: E402

from celery_singlebeat.engine import sharing  # noqa: E402

Deal = Callable[[Sequence[str], Sequence[str]], dict[str, str]]


# -- the baseline: the positional deal as it was ------------------------------


def _old_hash(name: str) -> int:
    return int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8).digest(), "big")


def old_order(names: Iterable[str]) -> list[str]:
    """The entries in the order they were dealt out (by hash, then name)."""
    return sorted(names, key=lambda name: (_old_hash(name), name))


def old_deal(ordered: Sequence[str], live: Sequence[str]) -> dict[str, str]:
    """Round robin over the sorted live replicas, in :func:`old_order`."""
    return {name: live[i % len(live)] for i, name in enumerate(ordered)}


def old_first(names: Sequence[str], live: Sequence[str]) -> dict[str, str]:
    return old_deal(old_order(names), sorted(live))


def new_first(names: Sequence[str], live: Sequence[str]) -> dict[str, str]:
    return sharing.first_replicas(names, sorted(live))


SCHEMES: dict[str, Deal] = {"positional (before)": old_first, "rendezvous (now)": new_first}


# -- measurements -----------------------------------------------------------


def entries(n: int, tag: str = "entry") -> list[str]:
    return [f"{tag}-{i:06d}" for i in range(n)]


def replicas(k: int, rng: random.Random | None = None) -> list[str]:
    """Replica ids as the scheduler makes them by default (host:pid:random)."""
    if rng is None:
        return [f"beat-{i}:1:0000{i}" for i in range(k)]
    return [f"beat-{rng.randrange(10**6)}:1:{rng.getrandbits(32):08x}" for _ in range(k)]


def largest_share(first: dict[str, str]) -> int:
    return max(Counter(first.values()).values())


def balance(k: int, n: int, sets: int) -> dict[str, Any]:
    names = entries(n)
    rng = random.Random(k)
    out: dict[str, Any] = {"replicas": k, "entries": n, "ideal": round(n / k, 1)}
    for label, first in SCHEMES.items():
        fixed = largest_share(first(names, replicas(k)))
        spread = [largest_share(first(names, replicas(k, rng))) for _ in range(sets)]
        out[label] = {
            "largest": fixed,
            "mean_largest": round(statistics.mean(spread), 1),
            "worst_largest": max(spread),
        }
    return out


def _moved(before: dict[str, str], after: dict[str, str]) -> int:
    return sum(1 for name in before.keys() & after.keys() if before[name] != after[name])


def moves(k: int, n: int, picks: int) -> dict[str, Any]:
    """Entries whose first replica changes (the entry added or removed itself
    not counted), mean over ``picks`` random choices."""
    rng = random.Random(1000 + k)
    out: dict[str, Any] = {"replicas": k, "entries": n}
    for label, first in SCHEMES.items():
        counts: dict[str, list[int]] = {
            "entry added": [],
            "entry removed": [],
            "replica added": [],
            "replica removed": [],
        }
        for pick in range(picks):
            names = entries(n, f"e{pick}")
            live = replicas(k, rng)
            base = first(names, live)
            counts["entry added"].append(_moved(base, first([*names, f"new-{pick}"], live)))
            gone = rng.randrange(n)
            counts["entry removed"].append(
                _moved(base, first(names[:gone] + names[gone + 1 :], live))
            )
            counts["replica added"].append(_moved(base, first(names, [*live, *replicas(1, rng)])))
            leaving = rng.randrange(k)
            counts["replica removed"].append(
                _moved(base, first(names, live[:leaving] + live[leaving + 1 :]))
            )
        out[label] = {what: round(statistics.mean(v), 1) for what, v in counts.items()}
    return out


def _best_ms(run: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        run()
        times.append(time.perf_counter() - started)
    return round(min(times) * 1000, 1)


def cost(k: int, n: int, repeat: int) -> dict[str, Any]:
    names = entries(n)
    live = sorted(replicas(k))
    ordered = old_order(names)
    buckets = sharing.entry_buckets(names)
    return {
        "replicas": k,
        "entries": n,
        "positional (before)": {
            "redeal_ms": _best_ms(lambda: old_deal(ordered, live), repeat),
            "from_names_ms": _best_ms(lambda: old_deal(old_order(names), live), repeat),
        },
        "rendezvous (now)": {
            "redeal_ms": _best_ms(lambda: sharing.deal(buckets, live), repeat),
            "bucket_owners_ms": _best_ms(lambda: sharing.bucket_owners(live), repeat),
            "from_names_ms": _best_ms(lambda: sharing.first_replicas(names, live), repeat),
        },
    }


# -- report -------------------------------------------------------------------


def render(results: dict[str, Any]) -> str:
    old, new = SCHEMES
    parts = [
        f"machine: {results['nproc']} CPUs, load average {results['load_start']} at start, "
        f"{results['load_end']} at end; Python {results['python']}",
        "",
        table(
            "Balance: the largest share (entries a replica proposes first)",
            ["entries / replicas", "ideal", "before", "now", "now: mean", "now: worst"],
            [
                [
                    f"{b['entries']:,} / {b['replicas']}",
                    b["ideal"],
                    b[old]["largest"],
                    b[new]["largest"],
                    b[new]["mean_largest"],
                    b[new]["worst_largest"],
                ]
                for b in results["balance"]
            ],
        )
        + f"\n(mean and worst over {results['sets']} sets of replica ids at 1,000 entries, "
        f"{max(2, results['sets'] // 20)} at 100,000; before is always the ceiling of "
        "entries / replicas)",
        "",
        table(
            "Moves: entries whose first replica changes (mean; the added or removed entry "
            "not counted)",
            ["entries / replicas", "change", "before", "now"],
            [
                [f"{m['entries']:,} / {m['replicas']}", what, m[old][what], m[new][what]]
                for m in results["moves"]
                for what in m[old]
            ],
        )
        + f"\n(over {results['picks']} random picks each)",
        "",
        table(
            "Cost of one deal, ms (best of several)",
            [
                "entries / replicas",
                "before: re-deal",
                "before: from names",
                "now: re-deal",
                "now: bucket owners",
                "now: from names",
            ],
            [
                [
                    f"{c['entries']:,} / {c['replicas']}",
                    c[old]["redeal_ms"],
                    c[old]["from_names_ms"],
                    c[new]["redeal_ms"],
                    c[new]["bucket_owners_ms"],
                    c[new]["from_names_ms"],
                ]
                for c in results["cost"]
            ],
        )
        + "\n(re-deal: the entries' hashes prepared, what a change of the live set costs; "
        "bucket owners: the part of it the scheduler pays, which then looks each tracked "
        "entry up)",
    ]
    return "\n".join(parts)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer picks and repeats")
    parser.add_argument(
        "--json", type=Path, default=HERE / "results" / "sharing-latest.json", help="results file"
    )
    args = parser.parse_args(argv)
    sets, picks, repeat = (20, 5, 2) if args.quick else (100, 30, 5)
    results: dict[str, Any] = {
        "nproc": os.cpu_count(),
        "python": sys.version.split()[0],
        "load_start": round(os.getloadavg()[0], 2),
        "sets": sets,
        "picks": picks,
        "buckets": sharing.BUCKETS,
    }
    results["balance"] = [balance(k, 1000, sets) for k in (3, 10)]
    # many entries: the spread of the buckets (65,536), not of the entries, shows
    results["balance"] += [balance(k, 100_000, max(2, sets // 20)) for k in (3, 10)]
    results["moves"] = [moves(k, 1000, picks) for k in (3, 10)]
    results["cost"] = [cost(k, 100_000, repeat) for k in (3, 10)]
    results["load_end"] = round(os.getloadavg()[0], 2)
    print(render(results))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(results, indent=2) + "\n")
    print(f"\nresults: {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
