"""Start-up behaviour of the real ``celery beat`` command, and the schema command.

Every test runs ``celery -A startapp beat`` (see ``startapp.py``) as a
subprocess. What Celery 5.7 does with an exception from the scheduler:

* the *lazy* instance ``celery beat`` builds for its banner is created before
  logging is set up and outside any ``try``: the exception ends the process
  with exit status 1, before the banner is printed, and with a traceback of
  some 20 frames unless, as the scheduler does for a configuration error
  (``fatal.py``), the interpreter's hook prints it as one line;
* the *real* instance (built on ``Service.start``'s first use of
  ``service.scheduler``) and its ticks run inside ``Beat.start_scheduler``'s
  ``try``: Celery logs ``beat raised exception`` at CRITICAL, re-raises, and
  the traceback is re-printed through its stderr logging proxy; exit status 1.
  A ``SystemExit`` from a tick, on the other hand, is taken for a shutdown
  request and exits 0, so the scheduler must never raise it.

The scheduler validates its settings and every entry in the lazy instance, so
a configuration error stops ``celery beat`` before the banner, without touching
the database.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis
from celery import Celery
from conftest import direct_engine, drop_tables
from sqlalchemy import inspect
from sqlalchemy.engine import make_url

from celery_singlebeat import SingleBeatScheduler, create_schema
from celery_singlebeat.store.sql.schema import SCHEMA_VERSION, Tables

HERE = Path(__file__).resolve().parent
BIN = Path(sys.executable).parent
CELERY = str(BIN / "celery")

#: the Redis database this file's tests may use, and nothing else.
REDIS_DB = 7
SECRET = "s3cret"

#: markers in beat's log.
ERROR_LINE = re.compile(r"^\[[^]]*: (ERROR|CRITICAL)/", re.MULTILINE)
UNREACHABLE = "unreachable ("
CONNECTED = "singlebeat: connected to"

pytestmark = pytest.mark.slow


# -- helpers -----------------------------------------------------------------


def wait_until(check: Callable[[], bool], timeout: float, what: str) -> None:
    """Poll ``check`` until it holds; fail naming ``what`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.05)


def beat_env(**settings: str) -> dict[str, str]:
    """The environment of a ``startapp`` process: ours, minus any stray SB_*."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SB_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE), env.get("PYTHONPATH")]))
    # the banner is print()ed: unbuffered, so it reaches the log as it happens
    env["PYTHONUNBUFFERED"] = "1"
    env.update(settings)
    return env


class Proc:
    """A process started by a test, its stdout and stderr in one file."""

    def __init__(self, argv: list[str], cwd: Path, env: dict[str, str]) -> None:
        self.log = cwd / f"out-{uuid.uuid4().hex[:8]}.log"
        with self.log.open("wb") as sink:
            self.popen = subprocess.Popen(
                argv, cwd=cwd, env=env, stdout=sink, stderr=subprocess.STDOUT
            )

    @property
    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def alive(self) -> bool:
        return self.popen.poll() is None

    def wait_for(self, needle: str, timeout: float = 20) -> None:
        def seen() -> bool:
            if needle in self.output:
                return True
            assert self.alive(), f"exited {self.popen.returncode}:\n{self.output[-3000:]}"
            return False

        wait_until(seen, timeout, f"{needle!r} in the output")

    def exit_code(self, timeout: float = 20) -> int:
        try:
            return self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            message = f"still running after {timeout}s:\n{self.output[-3000:]}"
            raise AssertionError(message) from None

    def stop(self) -> int:
        """SIGTERM, as a pod shutdown does; beat must leave within seconds."""
        if self.alive():
            self.popen.send_signal(signal.SIGTERM)
        return self.exit_code(15)

    def kill(self) -> None:
        if self.alive():
            self.popen.kill()
            self.popen.wait(10)


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[Callable[..., Proc]]:
    """Start processes in ``tmp_path``; whatever a failing test leaves is killed."""
    started: list[Proc] = []

    def start(*argv: str, **settings: str) -> Proc:
        proc = Proc(list(argv), tmp_path, beat_env(**settings))
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.kill()


def beat(spawn: Callable[..., Proc], *args: str, **settings: str) -> Proc:
    return spawn(CELERY, "-A", "startapp", "beat", "-l", "info", *args, **settings)


@pytest.fixture
def closed_port() -> int:
    """A local TCP port where nothing listens."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def with_secret(url: str) -> tuple[str, str]:
    """``url`` with a password, given twice (in the user part and in the query
    string), and that password, to prove it is never printed.

    The test services trust local users, so an added password is never checked.
    """
    parsed = make_url(url)
    if parsed.password is None:
        parsed = parsed.set(password=SECRET)
    password = str(parsed.password)
    parsed = parsed.update_query_dict({"password": password})
    return parsed.render_as_string(hide_password=False), password


def options_with(secret: str) -> str:
    """SB_ENGINE_OPTIONS giving the same password a third time, in connect_args."""
    return json.dumps({"connect_args": {"password": secret}})


@pytest.fixture
def schema_cleanup() -> Iterator[list[tuple[str, str]]]:
    """(url, prefix) pairs whose tables a test created on a shared server."""
    created: list[tuple[str, str]] = []
    yield created
    for url, prefix in created:
        if url.startswith("sqlite"):
            continue
        drop_tables(url, prefix)


@pytest.fixture
def queue(redis_url: str) -> Iterator[tuple[str, str]]:
    """(broker URL on Redis DB 7, a queue name of this test's own)."""
    name = f"startup-{uuid.uuid4().hex[:8]}"
    broker = f"{redis_url}/{REDIS_DB}"
    yield broker, name
    client = redis.Redis.from_url(broker)
    client.delete(name)
    client.close()


def queued(broker: str, name: str) -> int:
    client = redis.Redis.from_url(broker)
    try:
        return int(client.llen(name))
    finally:
        client.close()


def table_names(url: str, prefix: str) -> set[str]:
    engine = direct_engine(url)
    try:
        with engine.connect() as conn:
            return {n for n in inspect(conn).get_table_names() if n.startswith(prefix)}
    finally:
        engine.dispose()


def expected_tables(prefix: str) -> set[str]:
    return {t.name for t in Tables(prefix).metadata.sorted_tables}


# -- 1. bad configuration ------------------------------------------------------

BAD_CONFIGURATIONS = {
    # name: (extra settings, extra beat arguments, what the message must name)
    "malformed url": (
        {"SB_URL": f"postgresql://beat:{SECRET}@db:notaport/x"},
        [],
        ["singlebeat_url", "cannot parse"],
    ),
    "malformed url, password in its query string": (
        {"SB_URL": f"postgresql://beat@db:notaport/x?sslmode=require&password={SECRET}"},
        [],
        ["singlebeat_url", "cannot parse", "db:notaport/x"],
    ),
    "unsupported scheme": (
        {"SB_URL": f"oracle://beat:{SECRET}@db/x"},
        [],
        ["singlebeat_url", "'oracle'"],
    ),
    "unknown missed policy": (
        {"SB_POLICY": "bogus"},
        [],
        ["singlebeat_missed_policy='bogus'"],
    ),
    "lease shorter than the loop": (
        {"SB_LEASE": "3", "SB_LOOP": "5"},
        [],
        ["singlebeat_lease", "beat_max_loop_interval"],
    ),
    "lease shorter than --max-interval": (
        {"SB_LEASE": "3"},
        ["--max-interval", "5"],
        ["singlebeat_lease", "beat_max_loop_interval"],
    ),
    "bad per-entry policy": (
        {"SB_ENTRY": "bad-policy"},
        [],
        ["beat_schedule['probe']", "singlebeat_missed_policy='bogus'"],
    ),
    "entry name too long": (
        {"SB_ENTRY": "long-name"},
        [],
        ["beat_schedule entry name", "longer than 255 bytes"],
    ),
    "schedule we cannot coordinate": (
        {"SB_ENTRY": "opaque"},
        [],
        ["beat_schedule['probe']", "remaining_estimate"],
    ),
}


@pytest.mark.parametrize("case", list(BAD_CONFIGURATIONS))
def test_bad_configuration_stops_beat_before_it_starts(
    case: str, spawn: Callable[..., Proc], closed_port: int, tmp_path: Path
) -> None:
    settings, args, needles = BAD_CONFIGURATIONS[case]
    # A database that would answer nothing: the check must not need one.
    settings = {"SB_URL": f"postgresql://beat:{SECRET}@127.0.0.1:{closed_port}/x", **settings}
    started = time.monotonic()
    proc = beat(spawn, *args, **settings)
    code = proc.exit_code(timeout=20)
    output = proc.output
    assert code != 0, output
    assert time.monotonic() - started < 10, "configuration errors must stop beat at once"
    # Celery's "celery beat v5.7.0 (...) is starting." and the one line that
    # names the setting: no traceback
    lines = output.strip().splitlines()
    assert len(lines) == 2 and "is starting" in lines[0], output
    assert "Traceback" not in output
    last_line = lines[-1]
    assert last_line.startswith("celery-singlebeat: configuration error: "), output
    for needle in needles:
        assert needle in last_line, output
    # failed in the lazy banner instance: before the banner, before any tick
    assert "Configuration ->" not in output
    assert "beat: Starting" not in output
    assert SECRET not in output
    assert sorted(p.suffix for p in tmp_path.iterdir()) == [".log"], "no file may be created"


# -- 2. the lazy banner instance touches no database ---------------------------


def test_banner_prints_without_a_database_and_beat_stays_up(
    spawn: Callable[..., Proc], closed_port: int, tmp_path: Path
) -> None:
    proc = beat(
        spawn, SB_URL=f"postgresql://beat:{SECRET}@127.0.0.1:{closed_port}/x", SB_LOOP="0.2"
    )
    proc.wait_for(UNREACHABLE)
    output = proc.output
    banner = output.index("Configuration ->")
    assert f". singlebeat -> postgresql://beat:***@127.0.0.1:{closed_port}/x" in output
    assert banner < output.index(UNREACHABLE)
    assert proc.alive()
    assert len(ERROR_LINE.findall(output)) == 1, output
    # the banner names the replica that actually runs (not the lazy instance's own id)
    banner_id = re.search(r"\. replica -> (\S+)", output)
    running_id = re.search(r"singlebeat: replica (\S+) coordinating", output)
    assert banner_id and running_id and banner_id.group(1) == running_id.group(1), output
    assert SECRET not in output
    # neither instance left a file behind: no SQLite default, no shelve schedule
    assert sorted(p.suffix for p in tmp_path.iterdir()) == [".log"]
    assert proc.stop() == 0


def test_constructing_the_scheduler_opens_no_database(tmp_path: Path) -> None:
    """In-process: neither the lazy nor the real instance connects in __init__."""
    path = tmp_path / "never.sqlite"
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        port = listener.getsockname()[1]
        for url in (f"sqlite:///{path}", f"postgresql://beat:{SECRET}@127.0.0.1:{port}/x"):
            app = Celery("lazy", broker="memory://", set_as_current=False)
            app.conf.update(
                beat_scheduler="celery_singlebeat.SingleBeatScheduler",
                beat_schedule={"probe": {"task": "probe", "schedule": 1.0}},
                singlebeat_url=url,
            )
            lazy = SingleBeatScheduler(app, lazy=True)
            assert SECRET not in lazy.info
            real = SingleBeatScheduler(app)
            real.close()
        listener.settimeout(0.3)
        with pytest.raises(socket.timeout):
            # a connection attempt would be waiting in the backlog
            listener.accept()
    assert not path.exists()
    assert list(tmp_path.iterdir()) == []


# -- 3. database down at start-up ----------------------------------------------


def test_database_down_at_start_sends_nothing_and_logs_one_error(
    spawn: Callable[..., Proc], closed_port: int, queue: tuple[str, str]
) -> None:
    broker, name = queue
    proc = spawn(
        CELERY,
        "-A",
        "startapp",
        "beat",
        "-l",
        "debug",  # the retries are logged at DEBUG: we count them
        # the password in each place it can be given; none may be printed
        SB_URL=f"postgresql://beat:{SECRET}@127.0.0.1:{closed_port}/x?password={SECRET}",
        SB_ENGINE_OPTIONS=options_with(SECRET),
        SB_BROKER=broker,
        SB_QUEUE=name,
        SB_EVERY="0.5",
        SB_LOOP="0.5",
    )
    proc.wait_for(UNREACHABLE)
    # backoff 0.5, 1, 2 s: three retries land about 3.5 s after the first failure
    wait_until(
        lambda: proc.output.count("database still unreachable") >= 3 or not proc.alive(),
        15,
        "three retries",
    )
    output = proc.output
    assert proc.alive(), output
    errors = ERROR_LINE.findall(output)
    assert errors == ["ERROR"], output
    assert queued(broker, name) == 0
    assert "sent startapp.probe" not in output
    assert SECRET not in output
    # and the lines still say which database
    assert f"database postgresql://beat:***@127.0.0.1:{closed_port}/x?password=*** " in output
    assert proc.stop() == 0


# -- 4. singlebeat_create_schema = False, and the create-schema commands ---------


def test_schema_creation_by_command_when_beat_may_not_create_it(
    spawn: Callable[..., Proc],
    pg_url: str,
    table_prefix: str,
    queue: tuple[str, str],
    schema_cleanup: list[tuple[str, str]],
) -> None:
    url, secret = with_secret(pg_url)
    other_prefix = f"{table_prefix}b_"
    schema_cleanup += [(pg_url, table_prefix), (pg_url, other_prefix)]
    broker, name = queue
    settings = {
        "SB_URL": url,
        "SB_ENGINE_OPTIONS": options_with(secret),
        "SB_PREFIX": table_prefix,
        "SB_CREATE_SCHEMA": "0",
        "SB_BROKER": broker,
        "SB_QUEUE": name,
        "SB_EVERY": "0.5",
    }

    refused = beat(spawn, **settings)
    assert refused.exit_code(timeout=30) != 0, refused.output
    output = refused.output
    assert "singlebeat_create_schema is False" in output
    assert "celery -A proj singlebeat create-schema" in output
    assert secret not in output
    assert table_names(pg_url, table_prefix) == set(), "beat must only check the schema"

    created = spawn(CELERY, "-A", "startapp", "singlebeat", "create-schema", **settings)
    assert created.exit_code() == 0, created.output
    assert "schema ready in postgresql" in created.output
    assert secret not in created.output
    assert table_names(pg_url, table_prefix) == expected_tables(table_prefix)

    standalone = spawn(
        sys.executable,
        "-m",
        "celery_singlebeat",
        "create-schema",
        "--url",
        url,
        "--table-prefix",
        other_prefix,
    )
    assert standalone.exit_code() == 0, standalone.output
    assert secret not in standalone.output
    assert table_names(pg_url, other_prefix) == expected_tables(other_prefix)

    sending = beat(spawn, **settings)
    sending.wait_for(CONNECTED)
    wait_until(lambda: queued(broker, name) >= 1, 20, "a task in the broker queue")
    assert not ERROR_LINE.findall(sending.output), sending.output
    assert sending.stop() == 0


def test_create_schema_command_needs_an_app_or_a_url(spawn: Callable[..., Proc]) -> None:
    # Without -A Celery passes its default app, whose default URL is a SQLite
    # file in the working directory: that must not be created by accident.
    proc = spawn(CELERY, "singlebeat", "create-schema")
    assert proc.exit_code() != 0
    assert "pass --url" in proc.output


# -- 5. replicas starting together on an empty database ------------------------


def test_three_replicas_starting_together_create_the_schema_once(
    spawn: Callable[..., Proc],
    db_url: str,
    table_prefix: str,
    schema_cleanup: list[tuple[str, str]],
    tmp_path: Path,
) -> None:
    schema_cleanup.append((db_url, table_prefix))
    # Each process waits (beat_init) at a gate before its first tick, the one
    # that creates the schema; once all three are there, the gate opens on an
    # instant 1 s ahead (startapp.py), so that they reach the database together.
    gate = tmp_path / "gate"
    gate.mkdir()
    procs = [
        beat(spawn, SB_URL=db_url, SB_PREFIX=table_prefix, SB_GATE=str(gate), SB_EVERY="1")
        for _ in range(3)
    ]
    wait_until(
        lambda: len(list(gate.glob("arrived-*"))) == 3 or any(not p.alive() for p in procs),
        60,
        "the three processes at the gate",
    )
    assert all(p.alive() for p in procs), [p.output for p in procs]
    opening = gate / "release.tmp"
    opening.write_text(f"{time.time() + 1:.3f}")
    opening.rename(gate / "release")  # whole: a process never reads half of it
    for proc in procs:
        proc.wait_for(CONNECTED, timeout=30)
    for proc in procs:
        assert proc.alive()
        assert not ERROR_LINE.findall(proc.output), proc.output
        assert "SB-LATE" not in proc.output, "the processes did not start together"
    assert table_names(db_url, table_prefix) == expected_tables(table_prefix)
    tables = Tables(table_prefix)
    engine = direct_engine(db_url)
    try:
        with engine.connect() as conn:
            meta = conn.execute(tables.meta.select()).all()
            entries = conn.execute(tables.entries.select()).all()
    finally:
        engine.dispose()
    # one row per key (the prune turns have moved on by now)
    values = {str(key): int(value) for key, value in meta}
    assert sorted(values) == [
        "controls",
        "prune",
        "prune_singletons",
        "schedule_floor",
        "schedule_revision",
        "schema_version",
    ]
    assert len(meta) == 6
    assert values["schema_version"] == SCHEMA_VERSION
    assert [row.name for row in entries] == ["probe"]
    for proc in procs:
        assert proc.stop() == 0


# -- 6. a schema newer than this release -----------------------------------------


def test_newer_schema_version_stops_beat(
    spawn: Callable[..., Proc],
    db_url: str,
    table_prefix: str,
    schema_cleanup: list[tuple[str, str]],
) -> None:
    schema_cleanup.append((db_url, table_prefix))
    create_schema(db_url, table_prefix=table_prefix)
    tables = Tables(table_prefix)
    engine = direct_engine(db_url, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as conn:
            conn.execute(
                tables.meta.update()
                .where(tables.meta.c.key == "schema_version")
                .values(value_us=99)
            )
    finally:
        engine.dispose()
    proc = beat(spawn, SB_URL=db_url, SB_PREFIX=table_prefix)
    assert proc.exit_code(timeout=30) != 0, proc.output
    output = proc.output
    assert "schema is version 99, newer than" in output
    assert "upgrade the package" in output
    assert CONNECTED not in output
    # Celery's own verdict, so the exit status is not an accident
    assert "beat raised exception" in output
