"""No secret anywhere: real ``celery beat``, ``celery worker`` and CLI processes
given a database password in every place it can be given (the URL's user part,
its query string, ``singlebeat_engine_options``' connect_args), against a
database that *rejects* it, so that the error paths run. Nothing they print may
carry any of the three; what they print must still say which database.

The rejecting databases: a PostgreSQL cluster of this module's own that asks
TCP clients for a password (the shared one trusts everybody), and a MariaDB
user of this module's own with another password (dropped at the end). The
happy path (a replica that connects and sends) is held by
``test_coordination.py::test_log_names_replica_slot_and_task_id_and_masks_the_password``,
a host that does not answer by ``test_startup.py``.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple
from urllib.parse import quote

import pytest
from conftest import MYSQL_URL, direct_engine, require
from harness import CELERY, HERE, Rig, Sender, group_env, private_postgres, wait_for, wait_ready
from sqlalchemy import text
from sqlalchemy.engine import make_url

SECRET = "Pa55-w0rd-s3cr3t"
#: one per place it is given, so that a leak of each would show
USER_SECRET, QUERY_SECRET, OPTION_SECRET = (f"{SECRET}-{w}" for w in ("user", "query", "option"))
#: the Redis database of this file's worker test
REDIS_DB = 8


class Rejecting(NamedTuple):
    """A database that refuses the secrets, and what the output must show."""

    #: the URL, with USER_SECRET in its user part and QUERY_SECRET in its query
    url: str
    #: singlebeat_engine_options with OPTION_SECRET, as JSON (SB_ENGINE_OPTIONS)
    options: str
    #: the URL as every line must show it: each secret masked, the rest kept
    shown: str
    #: the server's refusal, as the driver words it
    refusal: str


def _rejecting(base: str, user: str, refusal: str) -> Rejecting:
    url = make_url(base).set(username=user, password=USER_SECRET)
    url = url.update_query_dict({"password": QUERY_SECRET, "connect_timeout": "5"})
    rendered = url.render_as_string(hide_password=False)
    # the secrets need no URL-encoding: masked, the URL reads as before
    shown = rendered.replace(USER_SECRET, "***").replace(QUERY_SECRET, "***")
    options = json.dumps({"connect_args": {"password": OPTION_SECRET}})
    return Rejecting(rendered, options, shown, refusal)


@pytest.fixture(
    scope="module",
    params=[
        pytest.param("postgres", marks=pytest.mark.postgres),
        pytest.param("mysql", marks=pytest.mark.mysql),
    ],
)
def rejecting(request: pytest.FixtureRequest) -> Iterator[Rejecting]:
    if request.param == "postgres":
        # the superuser's real password, in a cluster that asks TCP clients for it
        with private_postgres(password=f"right-{uuid.uuid4().hex}") as pg:
            yield _rejecting(pg.url, "postgres", "password authentication failed")
        return
    require("mysql")
    user = f"sb_secret_{uuid.uuid4().hex[:8]}"
    engine = direct_engine(MYSQL_URL, isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        conn.execute(text(f"CREATE USER '{user}'@'%' IDENTIFIED BY 'right-{uuid.uuid4().hex}'"))
    try:
        yield _rejecting(MYSQL_URL, user, "Access denied for user")
    finally:
        with engine.connect() as conn:
            conn.execute(text(f"DROP USER IF EXISTS '{user}'@'%'"))
        engine.dispose()


def no_secret(output: str) -> None:
    """None of the three secrets, in any encoding a URL or JSON would give it."""
    for secret in (SECRET, quote(SECRET, safe=""), json.dumps(SECRET)[1:-1]):
        assert secret not in output, output[-6000:]


@pytest.mark.slow
def test_beat_against_a_database_that_rejects_the_password_prints_no_secret(
    rig: Rig, rejecting: Rejecting
) -> None:
    env = group_env(
        broker="memory://",
        db_url=rejecting.url,
        prefix="sb_secret_",
        queue="secrets",
        SB_ENGINE_OPTIONS=rejecting.options,
        SB_LOOP="0.5",
    )
    beat = rig.start_beat(env, "beat")
    wait_for(lambda: "unreachable (" in beat.log(), 60, "the outage's ERROR line", interval=0.1)
    rig.group.stop_all()
    log = beat.log()
    no_secret(log)
    # each line that names the database shows it, its secrets masked
    assert f". singlebeat -> {rejecting.shown}\n" in log, log
    assert f"coordinating 5 entries through {rejecting.shown} (" in log, log
    errors = re.findall(r"ERROR/\S+\] (.*)", log)
    assert len(errors) == 1, log
    assert errors[0].startswith(f"singlebeat: database {rejecting.shown} unreachable ("), log
    assert rejecting.refusal in errors[0], "not the rejection path"
    assert "connected to" not in log


@pytest.mark.slow
def test_create_schema_with_a_rejected_password_prints_no_secret(
    rejecting: Rejecting, tmp_path: Path
) -> None:
    env = {
        **group_env(broker="memory://", db_url=rejecting.url, prefix="sb_secret_", queue="secrets"),
        "SB_ENGINE_OPTIONS": rejecting.options,
    }
    commands = {
        "celery -A": [CELERY, "-A", "startapp", "singlebeat", "create-schema"],
        "python -m": [
            *(sys.executable, "-m", "celery_singlebeat", "create-schema"),
            *("--url", rejecting.url),
        ],
    }
    for how, argv in commands.items():
        done = subprocess.run(
            argv,
            cwd=tmp_path,
            env={**_process_env(), **env},
            capture_output=True,
            text=True,
            timeout=60,
        )
        output = done.stdout + done.stderr
        assert done.returncode != 0, (how, output)
        no_secret(output)
        assert "schema check failed" in output and rejecting.refusal in output, (how, output)
        assert "Traceback" not in output, (how, output)


def _process_env() -> dict[str, str]:
    """Our environment minus any stray SB_*, with the test apps importable."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SB_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE), env.get("PYTHONPATH")]))
    return env


@pytest.mark.slow
@pytest.mark.redis
def test_singleton_worker_with_a_rejected_password_prints_no_secret(
    rig: Rig, rejecting: Rejecting, redis_url: str, tmp_path: Path
) -> None:
    """A SingletonTask start the database refuses: the worker's WARNING, and the
    task's failure with its traceback (``max_retries=0``), carry no secret."""
    broker = f"{redis_url}/{REDIS_DB}"
    sender = Sender(broker)
    try:
        queue = sender.queue()
        record = tmp_path / "record.jsonl"
        env = group_env(
            broker=broker,
            db_url=rejecting.url,
            prefix="sb_secret_",
            queue=queue,
            SB_ENGINE_OPTIONS=rejecting.options,
            SB_RECORD=str(record),
        )
        worker = rig.start_worker(env, "w-secret", pool="solo")
        wait_ready(worker)
        task_id = sender.send(queue, "singletonapp.hold_once", 0.0, "x")
        wait_for(
            lambda: f"[{task_id}] raised unexpected" in worker.log(),
            60,
            "the task's failure",
            interval=0.1,
        )
        rig.group.stop_all()
    finally:
        sender.close()
    log = worker.log()
    no_secret(log)
    warning = re.search(rf"WARNING/\S+\] singlebeat: \S+\[{task_id}\]: cannot reach .*", log)
    assert warning and rejecting.refusal in warning[0], log
    assert "Traceback (most recent call last)" in log and "StoreUnavailable" in log, log
    assert not record.exists(), "the body ran without the database"
