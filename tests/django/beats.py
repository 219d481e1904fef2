"""Real ``celery beat`` processes over the Django suite's project, and what
they sent, read off a real Redis queue (no worker consumes it, so every
message stays until the reader takes it), for tests/django/test_drop_in_*.py.

The processes run ``sbproject.celery:app`` with the settings the test process
uses (``SB_DJANGO_DB``) and ``SB_DJANGO_NAME`` naming the test database
pytest-django created, so they read the rows the test writes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

HERE = Path(__file__).resolve().parent
CELERY = Path(sys.executable).with_name("celery")
T = TypeVar("T")


def wait_for(predicate: Callable[[], T | None], timeout: float, what: str) -> T:
    """Poll ``predicate`` until it is truthy, or fail naming ``what``."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(0.1)


class Beat:
    """One ``celery beat`` subprocess, its output in a file."""

    def __init__(self, workdir: Path, name: str, scheduler: str, env: dict[str, str]) -> None:
        self.log_path = workdir / f"{name}.log"
        full_env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]),
            "DJANGO_SETTINGS_MODULE": "sbproject.settings",
            "PYTHONUNBUFFERED": "1",
            **env,
        }
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(
                [
                    str(CELERY),
                    "-A",
                    "sbproject.celery:app",
                    "beat",
                    "-S",
                    scheduler,
                    "-l",
                    "info",
                    "--pidfile=",
                    "-s",
                    str(workdir / f"{name}-schedule"),
                ],
                cwd=workdir,
                env=full_env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 10 s."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


def django_env(settings_dict: dict[str, Any], broker: str) -> dict[str, str]:
    """The environment that points a beat process at the test database."""
    return {
        "SB_DJANGO_DB": os.environ.get("SB_DJANGO_DB", "sqlite"),
        "SB_DJANGO_NAME": str(settings_dict["NAME"]),
        "SB_DJANGO_BROKER": broker,
    }


class Sent(NamedTuple):
    """One message as it sat in the queue."""

    entry: str
    #: the slot's instant (0 for a message of django-celery-beat's scheduler)
    at_us: int
    kwargs: str
    #: the reader's wall clock when it took the message
    received: float = 0.0


class RedisReader:
    """Takes every message off one Redis queue from a background thread."""

    def __init__(self, url: str, queue: str) -> None:
        import redis

        self.client = redis.Redis.from_url(url)
        self.keys = [queue] + [f"{queue}\x06\x16{step}" for step in (3, 6, 9)]
        self.queue = queue
        self.sent: list[Sent] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _collect(self) -> None:
        pipe = self.client.pipeline(transaction=True)
        for key in self.keys:
            pipe.lrange(key, 0, -1)
            pipe.delete(key)
        results = pipe.execute()
        batch = []
        now = time.time()
        for items in results[0::2]:
            for item in reversed(items):
                headers = json.loads(item)["headers"]
                slot = headers.get("singlebeat_slot") or {
                    "entry": headers.get("periodic_task_name"),
                    "at_us": 0,
                }
                batch.append(
                    Sent(
                        str(slot["entry"]),
                        int(slot["at_us"]),
                        str(headers.get("kwargsrepr")),
                        now,
                    )
                )
        with self._lock:
            self.sent.extend(batch)

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            self._collect()

    def of(self, entry: str) -> list[Sent]:
        with self._lock:
            return [s for s in self.sent if s.entry == entry]

    def close(self) -> list[Sent]:
        """Stop, read what is left, delete the queue; everything read."""
        self._stop.set()
        self._thread.join(5)
        self._collect()
        self.client.delete(*self.keys, f"_kombu.binding.{self.queue}")
        self.client.close()
        return list(self.sent)
