"""Clean virtual environments outside the checkout, for checks of the built wheel.

Shared by smoke_wheel.py and check_extras.py. A venv here is made in a temporary
folder outside the source tree and installs the wheel from dist/, never the
checkout, so what is checked is what ``pip install celery-singlebeat`` gives a
user. pip's own cache is reused: a second run downloads nothing.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DIST = ROOT / "dist"


def built_wheel() -> Path:
    """The one wheel in dist/ (``make dist`` builds it)."""
    wheels = sorted(DIST.glob("celery_singlebeat-*-py3-none-any.whl"))
    if len(wheels) != 1:
        raise SystemExit(
            f"expected one wheel in {DIST}, found {[w.name for w in wheels]}: run make dist"
        )
    return wheels[0]


def clean_env() -> dict[str, str]:
    """The environment for processes in a clean venv: nothing that would make the
    checkout importable, and no virtualenv of the caller's."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PYTHONNOUSERSITE"] = "1"
    return env


class Venv:
    """A venv at ``path``, made with ``python`` (this interpreter by default)."""

    def __init__(self, path: Path, python: str = sys.executable) -> None:
        self.path = path
        started = time.monotonic()
        subprocess.run([python, "-m", "venv", str(path)], check=True, env=clean_env())
        self.created_s = time.monotonic() - started

    def bin(self, name: str) -> str:
        return str(self.path / "bin" / name)

    def pip_install(self, *requirements: str) -> float:
        """Install and return how long it took (s); pip's output only if it failed."""
        started = time.monotonic()
        done = subprocess.run(
            [self.bin("python"), "-m", "pip", "install", "--quiet", *requirements],
            env=clean_env(),
            cwd=self.path,
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            raise SystemExit(
                f"pip install {' '.join(requirements)} failed ({done.returncode}):\n"
                f"{done.stdout}{done.stderr}"
            )
        return time.monotonic() - started

    def python(self, code: str, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
        """Run ``code`` in this venv's interpreter from ``cwd``; output captured."""
        return subprocess.run(
            [self.bin("python"), "-c", code],
            cwd=cwd,
            env={**clean_env(), **env},
            capture_output=True,
            text=True,
            timeout=120,
        )


def wait_until(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    """Poll ``condition`` until it holds, or fail naming ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out after {timeout_s:g}s waiting for {what}")
        time.sleep(0.2)
