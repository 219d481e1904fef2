"""Can the explorer see? Each mechanism that holds a guarantee, taken out one
at a time, must make the explorer report a violation within the seeds
``make test`` explores (issue 37; the table in docs/testing.md, "The
explorer").

A mutation replaces one function or value of the real engine, store or
worker model for the run (``unittest.mock.patch``), then explores seeds
from 0 until the first violation, up to ``--seeds``. The table gives, per
mechanism, the first failing seed, its first violation and the seeds
explored until then; ``MISSED`` where none failed (the explorer could not
see that mechanism's absence, which is a finding of its own). Without any
mutation the same range must pass: the last row.

Usage: ``python benchmarks/explore_mutations.py [--seeds 200] [--only NAME,...]``
(about 2 minutes per mechanism caught late, seconds for one caught early).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import sys
import time
from collections.abc import Callable
from typing import Any
from unittest import mock

from celery_singlebeat.testing.explore import run_seed


def _patch(target: str, new: Any) -> Callable[[], contextlib.AbstractContextManager[Any]]:
    return lambda: mock.patch(target, new)


#: mechanism -> (what it holds, how it is taken out)
MUTATIONS: dict[str, tuple[str, Callable[[], contextlib.AbstractContextManager[Any]]]] = {
    "recovery after a break": (
        "slots another replica won before a break are proposed again (Hold.recovery, issue 30)",
        _patch("celery_singlebeat.engine.hold.Hold.recovery", lambda self, m, limit: []),
    ),
    "write-back after a break": (
        "the slots a replica sent lately are written again (Hold.begin's reassert, issue 30)",
        _patch(
            "celery_singlebeat.testing.memory.slots.MemorySlots.reassert",
            lambda self, owner, sent: [],
        ),
    ),
    "found_again": (
        "a definition a failover put back counts its slots from the tick that sees it",
        _patch("celery_singlebeat.sources.Change.found_again", False),
    ),
    "Written check at the claim": (
        "the claim refuses a slot proposed under a definition replaced over 1 s before",
        _patch("celery_singlebeat.engine.claiming.Claiming._revisions", lambda self, names: None),
    ),
    "re-registration after a break": (
        "entries registered in the failover window are registered again (issue 30)",
        _patch("celery_singlebeat.engine.watch.SourceWatch.register_again", lambda self: None),
    ),
    "takeover of a stalled run (seed 10)": (
        "a sent slot whose SingletonTask run lapsed is sent again",
        _patch(
            "celery_singlebeat.testing.memory.slots.MemorySlots._stalled",
            lambda self, now, grace: [],
        ),
    ),
    "takeover's read check (seed 12)": (
        "a stored slot is not taken over by a replica that has not read a write 1 s old",
        _patch(
            "celery_singlebeat.testing.memory.slots.MemorySlots._unseen",
            lambda self, entry, seen, latest: False,
        ),
    ),
    "takeover's instant check (seed 15)": (
        "a slot taken over is an instant of the taker's definition, or before its commit",
        _patch(
            "celery_singlebeat.engine.sending.Sending._of_definition",
            lambda self, claim, definition: True,
        ),
    ),
    "released slots proposed again (seed 201)": (
        "a slot released unsent is remembered for the recovery after a break",
        _patch(
            "celery_singlebeat.engine.hold.Hold.released_unsent",
            lambda self, keys, monotonic: None,
        ),
    ),
    "a lost retake written back (seed 79)": (
        "a worker's write-back puts back its retake of a dead run's row a failover lost",
        _patch(
            "celery_singlebeat.testing.memory.singletons.MemorySingletons.reassert_runs",
            lambda self, records: _reassert_without_retake(self, records),
        ),
    ),
    "a finished one-off proposed again (seed 368)": (
        "a one-off whose one slot was planned past is still proposed again after a break",
        _patch(
            "celery_singlebeat.engine.agenda.Agenda.sequence_of",
            lambda self, name: t.sequence if (t := self.tracked.get(name)) else None,
        ),
    ),
    "a start let go unrun gives back its attempt": (
        "busy retries do not use up the stalled re-sends' cap",
        _patch(
            "celery_singlebeat.testing.memory.singletons.MemorySingletons.abandon_run",
            lambda self, run, ran=True: _abandon_counting(self, run),
        ),
    ),
}


def _abandon_counting(singletons: Any, run: Any) -> bool:
    """abandon_run as before the fix: the start keeps its count."""
    with singletons._connection.round_trip("abandon run"):
        row = singletons._own_run(run)
        if row is not None:
            row.expires_us = 0
        return row is not None


def _reassert_without_retake(singletons: Any, records: Any) -> list[Any]:
    """reassert_runs as before the fix: a row another run holds is left alone."""
    from celery_singlebeat.store.base import SlotKey
    from celery_singlebeat.testing.memory.state import MemoryRun

    with singletons._connection.round_trip("write run rows again"):
        again = []
        for record in records:
            run = record.run
            key = SlotKey(run.entry, run.slot_us)
            row = singletons._state.runs.get(key)
            finished = record.outcome is not None
            if row is None:
                singletons._state.runs[key] = MemoryRun(
                    run.run_id, 1 if finished else 0, record.owner, record.task_id,
                    record.expires_us, record.started_us,
                    finished_us=record.finished_us, outcome=record.outcome,
                )  # fmt: skip
            elif finished and row.state == 0 and row.run_id == run.run_id:
                row.state, row.finished_us, row.outcome = 1, record.finished_us, record.outcome
            else:
                continue
            again.append(record)
        return again


def first_violation(seeds: int) -> tuple[int | None, str, int]:
    for seed in range(seeds):
        outcome = run_seed(seed)
        if not outcome.ok:
            return seed, outcome.violations[0], seed + 1
    return None, "", seeds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", type=int, default=200)
    parser.add_argument("--only", default="")
    args = parser.parse_args(argv)
    logging.disable(logging.CRITICAL)
    only = [n for n in args.only.split(",") if n]
    rows = []
    missed = 0
    for name, (what, patch) in MUTATIONS.items():
        if only and not any(o in name for o in only):
            continue
        started = time.monotonic()
        with patch():
            seed, violation, explored = first_violation(args.seeds)
        took = time.monotonic() - started
        missed += seed is None
        rows.append(
            (f"{name}: {what}", "MISSED" if seed is None else str(seed), explored, took, violation)
        )
        print(f"{name}: {rows[-1][1]} after {explored} seeds, {took:.0f}s  {violation[:90]}")
        sys.stdout.flush()
    if not only:
        started = time.monotonic()
        seed, violation, explored = first_violation(args.seeds)
        rows.append(
            ("(none: the final engine)", "-" if seed is None else f"FAILS at {seed}", explored,
             time.monotonic() - started, violation)
        )  # fmt: skip
        missed += seed is not None
    print()
    print("| mechanism taken out | first failing seed | seeds explored | first violation |")
    print("|---|---|---|---|")
    for name, seed_text, explored, _, violation in rows:
        print(f"| {name} | {seed_text} | {explored} | {violation[:100]} |")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
