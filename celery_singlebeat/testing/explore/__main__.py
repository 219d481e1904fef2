"""``python -m celery_singlebeat.testing.explore``: explore seeds, shrink and
replay what fails (``make explore``; docs/testing.md, "The explorer").

    --seeds N --from K   explore seeds K .. K+N-1
    --replay SEED        run one seed again, its history's digest printed
    --faults I,J,...     with only those faults of its plan (a shrunk replay)
    --without KIND,...   leave kinds of fault out of every plan

The last line is ``explored N seeds, V violations, S seeds/s``; the exit
status is 1 when any seed had a violation.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time

from .explorer import draw_plan, run_seed, shrink


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m celery_singlebeat.testing.explore")
    parser.add_argument("--seeds", type=int, default=200)
    parser.add_argument("--from", dest="first", type=int, default=0)
    parser.add_argument("--replay", type=int, default=None)
    parser.add_argument("--faults", default=None)
    parser.add_argument("--without", default="")
    parser.add_argument("--no-shrink", action="store_true")
    args = parser.parse_args(argv)
    # the replicas' own log lines are the simulation's, not the explorer's
    logging.disable(logging.CRITICAL)
    without = [k for k in args.without.split(",") if k]
    if args.replay is not None:
        plan = draw_plan(args.replay, without)
        if args.faults is not None:
            plan = [plan[int(i)] for i in args.faults.split(",") if i != ""]
        outcome = run_seed(args.replay, plan)
        for fault in plan:
            print(f"  fault {fault.describe()}")
        for line in outcome.violations:
            print(f"  violation: {line}")
        print(f"seed {args.replay}: digest {outcome.digest}, {outcome.stats}")
        print(f"explored 1 seeds, {len(outcome.violations)} violations, - seeds/s")
        return 1 if outcome.violations else 0
    started = time.monotonic()
    violations = 0
    seeds = range(args.first, args.first + args.seeds)
    for seed in seeds:
        outcome = run_seed(seed, without=without)
        if outcome.ok:
            continue
        violations += len(outcome.violations)
        plan = outcome.plan
        kept = plan if args.no_shrink else shrink(seed, plan)
        indices = ",".join(str(plan.index(f)) for f in kept)
        print(f"seed {seed}: {len(outcome.violations)} violation(s)")
        for line in outcome.violations[:10]:
            print(f"  {line}")
        print(f"  shortest failing plan ({len(kept)} of {len(plan)} faults):")
        for fault in kept:
            print(f"    {fault.describe()}")
        extra = f" WITHOUT={','.join(without)}" if without else ""
        print(f"  replay: make explore REPLAY={seed} FAULTS={indices}{extra}")
        sys.stdout.flush()
    rate = len(seeds) / max(time.monotonic() - started, 1e-9)
    print(f"explored {len(seeds)} seeds, {violations} violations, {rate:.1f} seeds/s")
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main())
