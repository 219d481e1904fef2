"""Three ``celery beat`` replicas, one worker, every run sent once.

Run with ``make demo`` (or ``python example_project/demo.py`` in a venv where
celery-singlebeat is installed). Needs nothing but Python: the broker is a
folder of message files (kombu's filesystem transport) and the coordination
database is the embedded SQLite default, both in a fresh temporary folder.

What it does, in about 30 seconds:

1. starts one real ``celery worker`` and three real ``celery beat`` processes
   (``beat-1``..``beat-3``), all running ``proj.py``'s schedule: three entries
   every 2 s and one every 5 s, with ``SingleBeatScheduler``;
2. prints each execution as the worker runs it: the entry, the slot (its
   scheduled instant, relative to the entries' anchor) and the replica that
   won and sent it;
3. half-way, kills the replica that sent the latest run with SIGKILL: the
   other two were competing for every slot all along, so the next runs are
   simply won by them, with no failover delay;
4. stops at the end of the window and checks the result against the
   database: every slot in the window ran exactly once.

The window is exact: an interval entry's slots are ``anchor + k * period``
(k >= 1), where ``anchor`` is the instant the entry was first registered, read
here from the database. The demo counts the slots ``anchor < slot <= end``
with ``end = anchor + WINDOW``; ``end`` falls between slots, and the demo waits
until every slot up to ``end`` has had time to run before it stops anything.
A run of a later slot (possible while the last runs are awaited) is shown but
not counted. The exit code is 0 only when each expected slot ran exactly once,
nothing else in the window ran (a run at an instant that is no slot of its
entry means a replica that does not coordinate), and the database agrees on
who sent each run.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import BinaryIO

HERE = Path(__file__).resolve().parent
REPLICAS = ("beat-1", "beat-2", "beat-3")
#: length of the counted window, from the anchor, in seconds.
WINDOW = 23.0
#: how long to wait for the window's last runs before calling them missing.
SETTLE = 10.0
#: the demo's own start-up budget: the database must show the entries by then.
STARTUP = 40.0
US = 1_000_000


@dataclass
class Run:
    """One execution reported by the worker."""

    entry: str
    at_us: int
    replica: str
    task_id: str
    #: when the worker started it
    ran_us: int


@dataclass
class Report:
    """Everything the summary needs."""

    expected: set[tuple[str, int]]
    runs: list[Run] = field(default_factory=list)
    late: list[Run] = field(default_factory=list)
    #: runs of instants that are no slot of their entry: a replica not coordinating
    unknown: list[Run] = field(default_factory=list)
    killed: str | None = None
    killed_at: float | None = None
    killed_us: int = 0


def log(message: str = "") -> None:
    print(message, flush=True)


def celery(*args: str) -> list[str]:
    """A ``celery`` command line run by this interpreter (so: this venv)."""
    return [sys.executable, "-m", "celery", "-A", "proj", *args]


class Demo:
    """The processes of one demo run, and their shared folder."""

    def __init__(self, folder: Path, window: float) -> None:
        self.folder = folder
        self.window = window
        self.env = {**os.environ, "DEMO_DIR": str(folder), "PYTHONUNBUFFERED": "1"}
        self.beats: dict[str, subprocess.Popen[bytes]] = {}
        self.worker: subprocess.Popen[bytes] | None = None
        self.db = folder / "singlebeat.sqlite"
        self.runs_file = folder / "runs.jsonl"
        self._offset = 0
        self._partial = b""
        self._logs: list[BinaryIO] = []

    # -- processes -------------------------------------------------------------

    def _spawn(self, name: str, argv: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
        out = (self.folder / f"{name}.log").open("wb")
        self._logs.append(out)
        # Own session: a Ctrl-C in the terminal reaches the demo only, which then
        # stops its processes in order.
        return subprocess.Popen(
            argv,
            cwd=HERE,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def start(self) -> None:
        self.worker = self._spawn(
            "worker",
            celery(
                "worker",
                "--pool=solo",
                "--without-gossip",
                "--without-mingle",
                "--without-heartbeat",
                "--loglevel=warning",
            ),
            self.env,
        )
        for name in REPLICAS:
            self.beats[name] = self._spawn(
                name,
                celery("beat", "--loglevel=info"),
                {**self.env, "DEMO_REPLICA": name},
            )

    def stop(self, proc: subprocess.Popen[bytes] | None, how: int = signal.SIGTERM) -> None:
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(how)
        try:
            proc.wait(timeout=8)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)

    def stop_all(self) -> None:
        for proc in self.beats.values():
            self.stop(proc)
        self.stop(self.worker)
        for out in self._logs:
            out.close()

    def check_alive(self, killed: str | None) -> None:
        for name, proc in self.beats.items():
            if name != killed and proc.poll() is not None:
                raise DemoError(f"{name} exited by itself (code {proc.returncode})", name)
        if self.worker is not None and self.worker.poll() is not None:
            raise DemoError(
                f"the worker exited by itself (code {self.worker.returncode})", "worker"
            )

    def tail(self, name: str, lines: int = 25) -> str:
        path = self.folder / f"{name}.log"
        if not path.exists():
            return ""
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])

    # -- the shared state ------------------------------------------------------

    def anchors(self) -> dict[str, int]:
        """Each entry's anchor from the database (empty until registered)."""
        if not self.db.exists():
            return {}
        try:
            with sqlite3.connect(f"file:{self.db}?mode=ro", uri=True, timeout=5) as conn:
                rows = conn.execute("SELECT name, anchor_us FROM singlebeat_entries").fetchall()
        except sqlite3.OperationalError:  # schema not created yet
            return {}
        return {str(name): int(anchor) for name, anchor in rows}

    def slot_rows(self) -> list[tuple[str, int, int, str, int]]:
        with sqlite3.connect(f"file:{self.db}?mode=ro", uri=True, timeout=5) as conn:
            rows = conn.execute(
                "SELECT entry, slot_us, state, owner, fence FROM singlebeat_slots"
            ).fetchall()
        return [(str(e), int(s), int(st), str(o), int(f)) for e, s, st, o, f in rows]

    def new_runs(self) -> Iterator[Run]:
        """Runs the worker appended since the last call."""
        if not self.runs_file.exists():
            return
        with self.runs_file.open("rb") as src:
            src.seek(self._offset)
            data = src.read()
        self._offset += len(data)
        data = self._partial + data
        *lines, self._partial = data.split(b"\n")
        for line in lines:
            item = json.loads(line)
            yield Run(
                item["entry"],
                int(item["at_us"]),
                str(item["replica"]),
                item["task_id"],
                int(item["ran_us"]),
            )

    def queued_messages(self) -> int:
        return sum(1 for p in (self.folder / "messages").glob("*.msg"))


class DemoError(Exception):
    """The demo could not run to the end; ``log_name`` names the log to show."""

    def __init__(self, message: str, log_name: str | None = None) -> None:
        super().__init__(message)
        self.log_name = log_name


def expected_slots(
    anchors: dict[str, int], periods: dict[str, int], end_us: int
) -> set[tuple[str, int]]:
    """Every slot ``anchor + k * period`` (k >= 1) at or before ``end_us``."""
    slots: set[tuple[str, int]] = set()
    for name, anchor in anchors.items():
        period = periods[name]
        at = anchor + period
        while at <= end_us:
            slots.add((name, at))
            at += period
    return slots


def quiet_instant(slots: set[tuple[str, int]], low_us: int, high_us: int) -> int:
    """The instant in [low, high] farthest from any slot.

    A replica killed there holds no claim, so the demo's result does not depend
    on luck. (A replica killed between claiming a slot and confirming it leaves
    an abandoned claim that another replica takes over once the lease has run
    out: see docs/guarantees.md.)
    """
    instants = sorted({at for _name, at in slots})
    best, best_gap = low_us, -1
    for candidate in range(low_us, high_us + 1, US // 10):
        gap = min((abs(candidate - at) for at in instants), default=high_us)
        if gap > best_gap:
            best, best_gap = candidate, gap
    return best


def read_periods() -> dict[str, int]:
    """The schedule's periods, from proj.py itself (so the demo cannot drift from it)."""
    sys.path.insert(0, str(HERE))
    import proj  # imported late: DEMO_DIR must be set first

    from celery_singlebeat.timeline.slots import period_of

    periods = {}
    for name, entry in proj.app.conf.beat_schedule.items():
        period = period_of(entry["schedule"])
        if period is None:
            raise DemoError(f"entry {name} is not an interval; the demo only counts intervals")
        periods[name] = period // timedelta(microseconds=1)
    return periods


def fmt_rel(at_us: int, anchor_us: int) -> str:
    return f"+{(at_us - anchor_us) / US:.1f}s"


def run(demo: Demo) -> Report:
    periods = read_periods()
    log("starting 1 worker and 3 beat replicas (beat-1, beat-2, beat-3)...")
    demo.start()
    deadline = time.monotonic() + STARTUP
    anchors: dict[str, int] = {}
    while set(anchors) != set(periods):
        demo.check_alive(None)
        if time.monotonic() > deadline:
            raise DemoError("the entries did not appear in the database in time", "beat-1")
        time.sleep(0.1)
        anchors = demo.anchors()
    anchor = min(anchors.values())
    end_us = anchor + int(demo.window * US)
    expected = expected_slots(anchors, periods, end_us)
    report = Report(expected=expected)
    # Half-way through the window, at the instant farthest from any slot.
    kill_us = quiet_instant(
        expected, anchor + int(demo.window * 0.4 * US), anchor + int(demo.window * 0.6 * US)
    )
    log(
        f"entries registered; anchor = {time.strftime('%H:%M:%S', time.gmtime(anchor / US))} "
        f"UTC; counting the slots up to {fmt_rel(end_us, anchor)} ({len(expected)} expected)"
    )
    log(f"{'slot':>8}  {'entry':<16} {'sent by':<8} task id")

    seen: Counter[tuple[str, int]] = Counter()
    last_sender: list[str] = []

    def take(item: Run) -> None:
        key = (item.entry, item.at_us)
        seen[key] += 1
        note = ""
        if key not in expected and item.at_us > end_us:
            report.late.append(item)
            note = "  (after the window: not counted)"
        elif key not in expected:
            report.unknown.append(item)
            note = "  NOT A SLOT OF THIS ENTRY"
        else:
            report.runs.append(item)
            if seen[key] > 1:
                note = "  DUPLICATE"
        last_sender[:] = [item.replica]
        log(
            f"{fmt_rel(item.at_us, anchor):>8}  {item.entry:<16} {item.replica:<8} "
            f"{item.task_id[:8]}{note}"
        )

    # Until every expected slot has run (with a deadline past the window).
    hard_deadline_us = end_us + int(SETTLE * US)
    while True:
        now_us = int(time.time() * US)  # SQLite's clock is this machine's clock
        for item in demo.new_runs():
            take(item)
        demo.check_alive(report.killed)
        if report.killed is None and now_us >= kill_us:
            victim = last_sender[0] if last_sender else REPLICAS[1]
            proc = demo.beats[victim]
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=5)
            report.killed, report.killed_at = victim, (now_us - anchor) / US
            report.killed_us = now_us
            log(
                f"{fmt_rel(now_us, anchor):>8}  *** SIGKILL {victim} (pid {proc.pid}), the "
                "replica that sent the latest run: the other two keep claiming every slot"
            )
        if (now_us > end_us and expected <= set(seen)) or now_us > hard_deadline_us:
            break
        time.sleep(0.05)

    log("window over: stopping the beat replicas, then letting the worker finish the queue")
    for proc in demo.beats.values():
        demo.stop(proc)
    # Everything the database records as sent must reach the worker; a message
    # still queued or in flight would otherwise be missed by the count.
    recorded = {(e, s) for e, s, state, _o, _f in demo.slot_rows() if state == 1}
    drain_deadline = time.monotonic() + 8
    while time.monotonic() < drain_deadline and (
        demo.queued_messages() or not recorded <= set(seen)
    ):
        for item in demo.new_runs():
            take(item)
        time.sleep(0.05)
    # A warm shutdown lets the worker finish the task in hand before it exits.
    demo.stop(demo.worker)
    for item in demo.new_runs():
        take(item)
    return report


def summarise(demo: Demo, report: Report) -> bool:
    runs = report.runs
    executed = Counter((r.entry, r.at_us) for r in runs)
    duplicates = sum(n - 1 for n in executed.values())
    missing = report.expected - set(executed)
    # every run inside the window, slot or not, counts as sent
    sent = len(runs) + len(report.unknown)
    per_replica = Counter(r.replica for r in runs + report.unknown)
    rows = {(e, s): (st, o, f) for e, s, st, o, f in demo.slot_rows()}
    in_window = {key: rows[key] for key in report.expected if key in rows}
    open_claims = [key for key, (state, _o, _f) in rows.items() if state == 0]
    taken_over = [key for key, (_s, _o, fence) in in_window.items() if fence > 1]
    owner_mismatch = [
        r
        for r in runs
        if (r.entry, r.at_us) in in_window and in_window[(r.entry, r.at_us)][1] != r.replica
    ]

    log()
    log("summary")
    log(f"  sent {sent}, expected {len(report.expected)}, duplicates {duplicates}")
    parts = []
    for name in REPLICAS:
        killed = f" (SIGKILLed at +{report.killed_at:.1f}s)" if name == report.killed else ""
        parts.append(f"{name} {per_replica.get(name, 0)}{killed}")
    log("  per replica: " + ", ".join(parts))
    log(
        f"  database: {sum(1 for s, _o, _f in in_window.values() if s == 1)} slots of the window "
        f"recorded as sent, {len(open_claims)} claims left open, {len(taken_over)} taken over"
    )
    if runs:
        delays = sorted((r.ran_us - r.at_us) / 1000 for r in runs)
        after = [(r.ran_us - r.at_us) / 1000 for r in runs if r.at_us > report.killed_us]
        log(
            f"  run started after its slot: median {delays[len(delays) // 2]:.0f} ms, "
            f"worst {delays[-1]:.0f} ms"
            + (f"; worst after the kill {max(after):.0f} ms" if after else "")
        )
    if report.late:
        log(f"  ({len(report.late)} runs of slots after the window were not counted)")

    ok = True
    if report.unknown:
        ok = False
        log(f"  FAIL: {len(report.unknown)} runs at instants that are no slot of their entry")
    if missing:
        ok = False
        first = sorted(missing, key=lambda k: k[1])[:5]
        log(f"  FAIL: {len(missing)} expected slots never ran, e.g. {first}")
    if duplicates:
        ok = False
        log(f"  FAIL: {duplicates} slots ran more than once")
    if sent != len(report.expected):
        ok = False
    if owner_mismatch:
        ok = False
        log(f"  FAIL: {len(owner_mismatch)} runs were sent by another replica than the DB says")
    if ok:
        log(
            "OK: every slot ran exactly once, on whichever replica won it; killing one "
            "replica lost nothing, and there was no failover to wait for."
        )
    return ok


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--window", type=float, default=WINDOW, help="seconds counted")
    parser.add_argument("--keep", action="store_true", help="keep the demo folder and logs")
    args = parser.parse_args(argv)

    folder = Path(tempfile.mkdtemp(prefix="singlebeat-demo-"))
    os.environ["DEMO_DIR"] = str(folder)
    log(f"celery-singlebeat demo; broker messages, SQLite database and logs in {folder}")
    demo = Demo(folder, args.window)
    ok = False
    try:
        ok = summarise(demo, run(demo))
    except DemoError as exc:
        log(f"demo failed: {exc}")
        if exc.log_name:
            log(f"--- last lines of {exc.log_name}.log ---\n{demo.tail(exc.log_name)}")
    except KeyboardInterrupt:
        log("interrupted")
    finally:
        demo.stop_all()
    if ok and not args.keep:
        shutil.rmtree(folder, ignore_errors=True)
    else:
        log(f"logs kept in {folder}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
