"""The operator CLI as operators run it: real ``python -m celery_singlebeat``
and ``celery -A beatapp singlebeat`` processes.

What CliRunner cannot show (``tests/integration/test_cli.py`` holds the
logic): the exit status of a real process, that no traceback and no secret
reaches its stdout or stderr, and what a terminal gets (colour unless
``NO_COLOR``, the confirmation prompt of ``release``). The database is the
shared PostgreSQL, which trusts every client: the passwords in the URL's user
part, its query string and ``singlebeat_engine_options`` are accepted and
ignored, so the success paths run with all three present.
"""

from __future__ import annotations

import json
import os
import pty
import select
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest
from conftest import PG_URL
from fleet_rows import FleetRows, every
from harness import CELERY, HERE
from sqlalchemy.engine import make_url

from celery_singlebeat.timeline.clock import US

SECRET = "Cl1-s3cret"
USER_SECRET, QUERY_SECRET, OPTION_SECRET = (f"{SECRET}-{w}" for w in ("user", "query", "option"))
LIVE = "pod-a:11:aa"


@pytest.fixture
def fleet(pg_url: str, table_prefix: str) -> Iterator[FleetRows]:
    rows = FleetRows(pg_url, table_prefix)
    now = rows.now_us()
    rows.replica(LIVE, seen_us=now + 60 * US)  # live for the minute the test may take
    rows.entry("report", now - 95 * US)
    rows.catalog(LIVE, "report", every(10), task="beatapp.probe", schedule="every 10s")
    rows.lock("proj.billing", owner="w1", token=now, expires_us=now + 600 * US, acquired_us=now)
    yield rows
    rows.close()


def secret_url(port: int | None = None) -> str:
    url = make_url(PG_URL).set(password=USER_SECRET, port=port or make_url(PG_URL).port)
    return url.update_query_dict({"password": QUERY_SECRET}).render_as_string(False)


def shown_url(port: int | None = None) -> str:
    """How every line must show secret_url(): each secret masked, the rest kept."""
    url = make_url(PG_URL).set(port=port or make_url(PG_URL).port)
    return (
        f"{url.drivername}://{url.username}:***@{url.host}:{url.port}/{url.database}?password=***"
    )


def environment(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SB_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE), env.get("PYTHONPATH")]))
    env.pop("NO_COLOR", None)
    return {**env, **extra}


def cli(
    *args: str, app: dict[str, str] | None = None, stdin: int | None = None
) -> tuple[int, str, str]:
    """Run the CLI; with ``app`` (beatapp's SB_* settings) as ``celery -A beatapp``."""
    if app is None:
        argv = [sys.executable, "-m", "celery_singlebeat", *args]
    else:
        argv = [str(CELERY), "-A", "beatapp", "singlebeat", *args]
    done = subprocess.run(
        argv,
        env=environment(**(app or {})),
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL if stdin is None else stdin,
        cwd=HERE,
    )
    output = done.stdout + done.stderr
    for secret in (SECRET, USER_SECRET, QUERY_SECRET, OPTION_SECRET):
        assert secret not in output, output
    assert "Traceback" not in output, output
    return done.returncode, done.stdout, done.stderr


def one_error(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), stderr
    return lines[0]


@pytest.mark.slow
def test_real_processes_exit_clearly_without_secrets(fleet: FleetRows) -> None:
    base = ["--url", secret_url(), "--table-prefix", fleet.prefix]

    status, out, err = cli(*base, "status", "--json")
    assert status == 0 and err == "", err
    assert [e["name"] for e in json.loads(out)["entries"]] == ["report"]

    status, out, err = cli(*base, "pause", "reprot")
    assert (status, out) == (1, "")
    assert "did you mean 'report'?" in one_error(err)

    status, out, err = cli("--url", secret_url(port=1), "status")
    assert (status, out) == (1, "")
    assert one_error(err).startswith(f"Error: database {shown_url(port=1)}: ")

    status, out, err = cli(*base, "history", "--since", "5x")
    assert status == 2 and out == "" and err.strip().splitlines()[-1].startswith("Error: ")

    # the app's settings: the URL with its secrets, a password in connect_args
    app = {
        "SB_URL": secret_url(),
        "SB_PREFIX": fleet.prefix,
        "SB_ENGINE_OPTIONS": json.dumps({"connect_args": {"password": OPTION_SECRET}}),
    }
    status, out, err = cli("run", "report", "--json", app=app)
    assert status == 0, err
    assert json.loads(out)["entry"] == "report"
    status, out, err = cli("history", "report", app=app)
    assert status == 0 and " requested " in out, out
    status, out, err = cli("--table-prefix", "sb_nothing_here_", "status", app=app)
    assert status == 1 and "create-schema" in one_error(err)
    assert f"database {shown_url()}: " in err


def in_terminal(argv: list[str], env: dict[str, str], answer: str | None = None) -> tuple[int, str]:
    """Run ``argv`` with a pseudo-terminal as stdin, stdout and stderr; type
    ``answer`` once a prompt (a line ending in ": ") shows."""
    leader, follower = pty.openpty()
    proc = subprocess.Popen(
        argv, stdin=follower, stdout=follower, stderr=follower, env=env, cwd=HERE
    )
    os.close(follower)
    seen = b""
    deadline = time.monotonic() + 60
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([leader], [], [], 0.1)
            if ready:
                try:
                    chunk = os.read(leader, 65536)
                except OSError:  # the process closed the terminal
                    break
                if not chunk:
                    break
                seen += chunk
                if answer is not None and seen.rstrip().endswith(b"[y/N]:"):
                    os.write(leader, answer.encode() + b"\n")
                    answer = None
            elif proc.poll() is not None:
                break
        return proc.wait(timeout=10), seen.decode(errors="replace")
    finally:
        os.close(leader)
        if proc.poll() is None:
            proc.kill()


@pytest.mark.slow
def test_a_terminal_gets_colour_unless_no_color_and_release_asks_first(
    fleet: FleetRows,
) -> None:
    argv = [sys.executable, "-m", "celery_singlebeat", "--url", secret_url()]
    argv += ["--table-prefix", fleet.prefix]

    status, seen = in_terminal([*argv, "status"], environment())
    assert status == 0 and "\x1b[1m" in seen and "\x1b[" in seen.split("\n", 1)[1], seen
    status, seen = in_terminal([*argv, "status"], environment(NO_COLOR="1"))
    assert status == 0 and "\x1b[" not in seen, seen

    status, seen = in_terminal([*argv, "release", "proj.billing"], environment(), answer="n")
    assert status == 1 and "held by w1" in seen and "Aborted" in seen, seen
    assert fleet.select(fleet.tables.locks)[0].expires_us > 0
    status, seen = in_terminal([*argv, "release", "proj.billing"], environment(), answer="y")
    assert status == 0 and "released 'proj.billing'" in seen, seen
    assert fleet.select(fleet.tables.locks)[0].expires_us == 0
    assert SECRET not in seen
