"""``example_project/demo.py``, the README's first command, run as users run it.

The demo starts three real ``celery beat`` replicas and a real worker on the
filesystem broker and the SQLite default, SIGKILLs one replica half-way, and
exits 0 only when every slot of its window ran exactly once. This test runs
the script itself (not ``make``), so a broken demo fails the suite.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

DEMO = Path(__file__).resolve().parents[2] / "example_project" / "demo.py"


@pytest.mark.slow
def test_demo_runs_every_slot_once_and_survives_a_killed_replica() -> None:
    result = subprocess.run(
        [sys.executable, str(DEMO)],
        capture_output=True,
        text=True,
        timeout=150,
        check=False,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    summary = re.search(r"sent (\d+), expected (\d+), duplicates (\d+)", output)
    assert summary is not None, output
    sent, expected, duplicates = map(int, summary.groups())
    assert duplicates == 0, output
    assert sent == expected > 0, output
    # the kill really happened, and the replica had sent runs before it
    assert re.search(r"SIGKILL beat-\d", output), output
    killed = re.search(r"(beat-\d) (\d+) \(SIGKILLed", output)
    assert killed is not None and int(killed.group(2)) > 0, output
    # the per-replica counts account for every run, and the survivors sent runs
    per_replica = re.search(r"per replica: (.*)", output)
    assert per_replica is not None, output
    counts = {name: int(n) for name, n in re.findall(r"(beat-\d) (\d+)", per_replica.group(1))}
    assert sum(counts.values()) == sent, output
    assert sum(n for name, n in counts.items() if name != killed.group(1)) > 0, output
