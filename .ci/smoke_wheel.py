"""The built wheel, installed as a user installs it, runs beat and the CLI.

In a clean venv outside the checkout (so the source tree cannot be imported),
with the wheel from dist/ and its ``redis`` extra:

1. the package imported is the installed one, of the source's version;
2. ``celery beat`` with a 1 s entry on the embedded default (no ``singlebeat_url``:
   a SQLite file in the working directory) and Redis as the broker, until a few
   runs are in the broker's queue, each once (distinct task ids) and each
   recorded as sent in the SQLite slots table; then SIGTERM, and beat exits 0;
3. ``celery -A smokeapp singlebeat status`` (table and ``--json``) lists the entry,
   its task and the replica that sent it;
4. ``celery beat -S singlebeat`` (the entry point's short name, not a dotted
   path) starts SingleBeatScheduler, by its banner and start-up log line, and sends
   the next run.

The broker is Redis db 7 on 127.0.0.1:6379 (``SB_SMOKE_BROKER`` to change), with
a queue of this run's own name, deleted at the end. ``SB_SMOKE_PINS`` adds
requirements to the install, e.g. ``"celery==5.2.7 kombu==5.2.4"`` to smoke-test
the oldest Celery supported. Takes about a minute, most of it the install.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import redis
from cleanvenv import ROOT, Venv, built_wheel, clean_env, wait_until

BROKER = os.environ.get("SB_SMOKE_BROKER", "redis://127.0.0.1:6379/7")
ENTRY = "smoke-tick"
TASK = "smokeapp.tick"
RUNS = 3

APP = """\
import os

from celery import Celery

app = Celery("smokeapp", broker=os.environ["SMOKE_BROKER"])
# a queue of this run's own: the shared Redis may hold other runs' messages
app.conf.task_default_queue = os.environ["SMOKE_QUEUE"]
app.conf.beat_schedule = {"smoke-tick": {"task": "smokeapp.tick", "schedule": 1.0}}
# no singlebeat_url: the embedded default, a SQLite file in the working directory


@app.task(name="smokeapp.tick")
def tick():
    return "tick"
"""


def queued(client: redis.Redis, queue: str) -> list[dict[str, Any]]:
    """The task messages in the queue (kombu's Redis transport: a list of JSON)."""
    return [json.loads(raw) for raw in client.lrange(queue, 0, -1)]


def sent_rows(database: Path) -> list[tuple[str, int]]:
    if not database.exists():
        return []
    with sqlite3.connect(f"file:{database}?mode=ro", uri=True) as conn:
        try:
            return conn.execute(
                "SELECT entry, slot_us FROM singlebeat_slots WHERE state = 1"
            ).fetchall()
        except sqlite3.OperationalError:  # not created yet
            return []


class Beat:
    """A real ``celery beat`` in the venv, its output in a file."""

    def __init__(self, venv: Venv, cwd: Path, env: dict[str, str], scheduler: str) -> None:
        self.log = cwd / f"beat-{len(list(cwd.glob('beat-*.log')))}.log"
        self.output = self.log.open("w")
        self.process = subprocess.Popen(
            [venv.bin("celery"), "-A", "smokeapp", "beat", "-l", "info", "-S", scheduler],
            cwd=cwd,
            env=env,
            stdout=self.output,
            stderr=subprocess.STDOUT,
        )

    def text(self) -> str:
        return self.log.read_text()

    def alive(self) -> None:
        if self.process.poll() is not None:
            raise SystemExit(f"beat exited {self.process.returncode}:\n{self.text()}")

    def stop(self) -> None:
        self.process.send_signal(signal.SIGTERM)
        try:
            code = self.process.wait(timeout=30)
        finally:
            self.output.close()
        if code != 0:
            raise SystemExit(f"beat exited {code} on SIGTERM:\n{self.text()}")


def check(condition: bool, what: str, detail: str = "") -> None:
    if not condition:
        raise SystemExit(f"smoke: FAILED: {what}\n{detail}")
    print(f"smoke: ok: {what}")


def main() -> int:
    started = time.monotonic()
    wheel = built_wheel()
    client = redis.Redis.from_url(BROKER)
    try:
        client.ping()
    except redis.RedisError as exc:
        raise SystemExit(f"smoke: Redis at {BROKER} is not reachable: {exc}") from None
    queue = f"singlebeat-smoke-{uuid.uuid4().hex[:12]}"
    with tempfile.TemporaryDirectory(prefix="singlebeat-smoke-") as tmp:
        base = Path(tmp)
        venv = Venv(base / "venv")
        pins = os.environ.get("SB_SMOKE_PINS", "").split()
        install_s = venv.pip_install(f"{wheel}[redis]", *pins)
        print(f"smoke: {wheel.name}[redis] {' '.join(pins)} installed in {install_s:.1f}s")
        celery_version = venv.python("import celery; print(celery.__version__)", cwd=base)
        print(f"smoke: Celery {celery_version.stdout.strip()}")
        work = base / "work"
        work.mkdir()
        (work / "smokeapp.py").write_text(APP)
        env = {**clean_env(), "SMOKE_BROKER": BROKER, "SMOKE_QUEUE": queue}

        where = venv.python(
            "import celery_singlebeat as c; print(c.__file__); print(c.__version__)", cwd=work
        )
        module, version = where.stdout.split()
        source = (ROOT / "celery_singlebeat" / "_version.py").read_text()
        check(
            module.startswith(str(venv.path)) and not module.startswith(str(ROOT)),
            f"the installed package is imported ({module})",
        )
        check(f'"{version}"' in source, f"its __version__ {version} is the source's")

        try:
            database = work / "celery-singlebeat.sqlite"
            beat = Beat(venv, work, env, "celery_singlebeat.SingleBeatScheduler")

            def enough() -> bool:
                beat.alive()
                return len(queued(client, queue)) >= RUNS and len(sent_rows(database)) >= RUNS

            wait_until(enough, 60, f"{RUNS} runs of {ENTRY} in the broker and the slots table")
            beat.stop()
            messages = queued(client, queue)
            ids = [m["headers"]["id"] for m in messages]
            check(
                all(m["headers"]["task"] == TASK for m in messages),
                f"{len(messages)} messages of {TASK} in the broker",
            )
            check(len(set(ids)) == len(ids), "each run sent once (distinct task ids)", str(ids))
            check(
                all("singlebeat_slot" in m["headers"] for m in messages),
                "each message carries its slot header",
            )
            rows = sent_rows(database)
            check(
                len(rows) >= RUNS and {e for e, _ in rows} == {ENTRY},
                f"{len(rows)} slots recorded sent in the embedded default {database.name}",
            )

            status = subprocess.run(
                [venv.bin("celery"), "-A", "smokeapp", "singlebeat", "status"],
                cwd=work,
                env=env,
                capture_output=True,
                text=True,
                timeout=60,
            )
            check(
                status.returncode == 0 and ENTRY in status.stdout and TASK in status.stdout,
                "singlebeat status lists the entry and its task",
                status.stdout + status.stderr,
            )
            print(status.stdout.rstrip())
            as_json = subprocess.run(
                [venv.bin("celery"), "-A", "smokeapp", "singlebeat", "status", "--json"],
                cwd=work,
                env=env,
                capture_output=True,
                text=True,
                timeout=60,
            )
            entries = {e["name"]: e for e in json.loads(as_json.stdout)["entries"]}
            entry = entries.get(ENTRY) or {}
            check(
                entry.get("task") == TASK and entry.get("last_sender") is not None,
                "singlebeat status --json: the entry, its task and who sent it",
                as_json.stdout + as_json.stderr,
            )

            before = len(queued(client, queue))
            short = Beat(venv, work, env, "singlebeat")

            def next_run() -> bool:
                short.alive()
                return len(queued(client, queue)) > before

            wait_until(next_run, 60, "a run sent by celery beat -S singlebeat")
            short.stop()
            banner = short.text()
            check(
                "scheduler -> celery_singlebeat.scheduler.SingleBeatScheduler" in banner
                and "singlebeat: replica" in banner,
                "celery beat -S singlebeat starts SingleBeatScheduler (banner, start-up log)",
                banner,
            )
        finally:
            client.delete(queue)
    print(f"smoke: passed in {time.monotonic() - started:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
