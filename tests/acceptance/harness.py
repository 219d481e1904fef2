"""Process management, broker readers, a cuttable TCP proxy and slot accounting
for the acceptance tests that run real ``celery beat`` replicas, and helpers
for those that run real ``celery worker`` processes of ``singletonapp``.

Everything here observes the system from outside, as an operator would: the
replicas are ``celery -A beatapp beat`` subprocesses, what they sent is read off
the real broker (no worker runs, so every message stays in its queue until a
reader takes it), and what "should have been sent" is computed from the
database's rows (each entry's anchor and the period), never from sleeps.

The SingletonTask tests send tasks by name (:class:`Sender`) to workers started
by :meth:`Rig.start_worker` (:func:`wait_ready`), and judge what ran from the
record file every execution appends to (:func:`read_records`,
:func:`executions`, :func:`overlaps`), from the workers' logs (:func:`log_ids`)
and from the database's lease and run rows (:func:`lease_row`, :func:`run_rows`).
"""

from __future__ import annotations

import glob
import json
import os
import queue
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple, TypeVar
from urllib.parse import quote

import sqlalchemy as sa
from conftest import IN_CI, direct_engine
from sqlalchemy.engine import Engine

from celery_singlebeat.engine.sharing import first_replicas
from celery_singlebeat.store.sql.schema import Tables
from celery_singlebeat.store.sql.store_statements import store_dialect_for
from celery_singlebeat.timeline.slots import slot_task_id

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
CELERY = ROOT / ".venv" / "bin" / "celery"
US = 1_000_000

T = TypeVar("T")


# -- waiting ------------------------------------------------------------------


def wait_for(
    predicate: Callable[[], T | None],
    timeout: float,
    what: str = "condition",
    interval: float = 0.1,
) -> T:
    """Poll ``predicate`` until it returns something truthy; return that value.

    Raises AssertionError naming ``what`` when ``timeout`` seconds pass first.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(interval)


# -- beat processes -----------------------------------------------------------

#: one publish as the scheduler logs it: replica, won/took over, entry, task id
SENT_LINE = re.compile(
    r"singlebeat: replica (?P<replica>\S+) (?P<how>won|took over) slot "
    r"(?P<entry>[^@\s]+)@(?P<at>\S+): sent \S+ \(task id (?P<task_id>[0-9a-f-]{36})\)"
)
REPLICA_LINE = re.compile(r"singlebeat: replica (?P<replica>\S+) coordinating")


class BeatProcess:
    """One ``celery beat`` subprocess; stdout and stderr go to ``log_path``."""

    def __init__(self, name: str, proc: subprocess.Popen[bytes], log_path: Path) -> None:
        self.name = name
        self.proc = proc
        self.log_path = log_path

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def lines(self, needle: str) -> list[str]:
        return [line for line in self.log().splitlines() if needle in line]

    def sent_task_ids(self) -> list[str]:
        """Task ids this replica logged as published (won or took over)."""
        return [m["task_id"] for m in SENT_LINE.finditer(self.log())]

    def replica_id(self) -> str | None:
        match = REPLICA_LINE.search(self.log())
        return match["replica"] if match else None

    def state(self) -> str:
        """The kernel's process state letter (``T`` while SIGSTOPped)."""
        stat = Path(f"/proc/{self.pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0]

    def signal(self, sig: int) -> None:
        if self.alive():
            os.kill(self.pid, sig)

    def stop(self, timeout: float = 10.0, *, asked: bool = False) -> None:
        """Resume if stopped, ask to exit, and kill if it does not in time.

        ``asked``: SIGTERM was sent already. A second one would land while
        Celery's beat runs its exit handlers and raise SystemExit inside them
        (a Traceback in the log that no scheduler code caused)."""
        if not self.alive():
            return
        if not asked:
            # A stopped process cannot act on SIGTERM: continue it first.
            self.signal(signal.SIGCONT)
            self.signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)

    def kill(self) -> None:
        self.signal(signal.SIGKILL)
        self.proc.wait(5)


class BeatGroup:
    """The beat replicas of one test; :meth:`stop_all` runs at fixture teardown."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.procs: list[BeatProcess] = []

    def start_beat(self, env: dict[str, str], name: str) -> BeatProcess:
        """Start ``celery -A beatapp beat -l info`` with ``env`` added to ours."""
        log_path = self.workdir / f"{name}.log"
        full_env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]),
            "PYTHONUNBUFFERED": "1",
            **env,
        }
        with log_path.open("wb") as log:
            proc = subprocess.Popen(
                [
                    str(CELERY),
                    "-A",
                    "beatapp",
                    "beat",
                    "-l",
                    "info",
                    "--pidfile=",
                    "-s",
                    str(self.workdir / f"{name}-schedule"),
                ],
                cwd=self.workdir,
                env=full_env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        beat = BeatProcess(name, proc, log_path)
        self.procs.append(beat)
        return beat

    def start_worker(
        self,
        env: dict[str, str],
        name: str,
        *,
        app: str = "singletonapp",
        pool: str = "prefork",
        concurrency: int = 2,
        extra: tuple[str, ...] = (),
        queues: str | None = None,
    ) -> BeatProcess:
        """Start ``celery -A <app> worker`` (same env rules as :meth:`start_beat`);
        it consumes ``queues`` (default ``SB_QUEUE``). Stopped with the beats at
        teardown."""
        log_path = self.workdir / f"{name}.log"
        full_env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]),
            "PYTHONUNBUFFERED": "1",
            **env,
        }
        command = [
            str(CELERY),
            "-A",
            app,
            "worker",
            "-l",
            "info",
            "-P",
            pool,
            "-c",
            str(concurrency),
            "-n",
            f"{name}@%h",
            "-Q",
            queues or full_env.get("SB_QUEUE", "celery"),
            "--without-gossip",
            "--without-mingle",
            "--without-heartbeat",
            *extra,
        ]
        with log_path.open("wb") as log:
            proc = subprocess.Popen(
                command,
                cwd=self.workdir,
                env=full_env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                # its own process group: a test can SIGKILL the whole worker
                # (parent and pool children) with os.killpg
                start_new_session=True,
            )
        worker = BeatProcess(name, proc, log_path)
        self.procs.append(worker)
        return worker

    def stop_all(self) -> None:
        # SIGTERM everyone first, so the replicas shut down in parallel.
        for beat in self.procs:
            if beat.alive():
                beat.signal(signal.SIGCONT)
                beat.signal(signal.SIGTERM)
        for beat in self.procs:
            beat.stop(asked=True)

    def outputs(self) -> str:
        """Every replica's log, for assertion messages."""
        return "\n".join(f"===== {b.name}\n{b.log()[-6000:]}" for b in self.procs)


# -- brokers ------------------------------------------------------------------


class Received(NamedTuple):
    """One message as it sat in the broker."""

    task_id: str
    entry: str
    at_us: int
    #: local wall clock when the reader took it off the broker (same host as the DB)
    received: float
    #: the keyword arguments as Celery's message headers show them (``kwargsrepr``)
    kwargs: str = ""

    @property
    def slot(self) -> tuple[str, int]:
        return (self.entry, self.at_us)


def _received(headers: dict[str, Any], when: float) -> Received:
    slot = headers["singlebeat_slot"]
    return Received(
        str(headers["id"]),
        str(slot["entry"]),
        int(slot["at_us"]),
        when,
        str(headers.get("kwargsrepr") or ""),
    )


class QueueReader:
    """Takes every message off one queue from a background thread, stamping when.

    Reading continuously (instead of once at the end) gives each message an
    arrival time, which is what "sending goes on" is measured with.
    """

    poll = 0.05

    def __init__(self, queue: str) -> None:
        self.queue = queue
        self.raw: list[str] = []
        self.errors: list[str] = []
        self._messages: list[Received] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _take(self) -> list[tuple[dict[str, Any], str]]:
        """Remove and return every message now in the queue: (headers, raw text)."""
        raise NotImplementedError

    def _delete(self) -> None:
        raise NotImplementedError

    def _collect(self) -> None:
        batch = self._take()
        now = time.time()
        with self._lock:
            for headers, raw in batch:
                self.raw.append(raw)
                self._messages.append(_received(headers, now))

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._collect()
            except Exception as exc:  # reported by the test, never silently lost
                self.errors.append(repr(exc))
            self._stop.wait(self.poll)

    def start(self) -> QueueReader:
        self._thread = threading.Thread(target=self._run, name=f"reader-{self.queue}", daemon=True)
        self._thread.start()
        return self

    def messages(self) -> list[Received]:
        with self._lock:
            return list(self._messages)

    def finish(self) -> list[Received]:
        """Stop the background thread, read what is left, return everything."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        self._collect()
        assert not self.errors, self.errors
        return self.messages()

    def close(self) -> None:
        """Stop reading and delete the queue from the broker."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        self._delete()


class RedisQueueReader(QueueReader):
    """Kombu's Redis transport keeps a queue as a list named after it (LPUSH on
    publish); priority steps above 0 live in suffixed lists, read for safety."""

    def __init__(self, url: str, queue: str) -> None:
        import redis

        super().__init__(queue)
        self.client = redis.Redis.from_url(url)
        self.keys = [queue] + [f"{queue}\x06\x16{step}" for step in (3, 6, 9)]

    def _take(self) -> list[tuple[dict[str, Any], str]]:
        pipe = self.client.pipeline(transaction=True)
        for key in self.keys:
            pipe.lrange(key, 0, -1)
            pipe.delete(key)
        results = pipe.execute()
        out: list[tuple[dict[str, Any], str]] = []
        for items in results[0::2]:
            for item in reversed(items):  # LPUSHed: oldest last
                text = item.decode()
                out.append((json.loads(text)["headers"], text))
        return out

    def _delete(self) -> None:
        self.client.delete(
            *self.keys,
            f"_kombu.binding.{self.queue}",
            f"_kombu.binding_permanent.{self.queue}",
        )
        self.client.close()


class AmqpQueueReader(QueueReader):
    """basic_get (no ack) until the queue is empty. The queue is declared here
    exactly as Celery declares its default queue, so it exists before the first
    publish and both declarations agree."""

    def __init__(self, url: str, queue: str) -> None:
        from kombu import Connection, Exchange
        from kombu import Queue as KombuQueue

        super().__init__(queue)
        self.connection = Connection(url)
        self.channel = self.connection.channel()
        self.exchange = Exchange(queue, type="direct")
        self.q = KombuQueue(queue, self.exchange, routing_key=queue)(self.channel)
        self.q.declare()

    def _take(self) -> list[tuple[dict[str, Any], str]]:
        out: list[tuple[dict[str, Any], str]] = []
        while True:
            message = self.q.get(no_ack=True)
            if message is None:
                return out
            body = message.body.decode() if isinstance(message.body, bytes) else message.body
            raw = json.dumps({"headers": message.headers, "body": body}, default=str)
            out.append((dict(message.headers), raw))

    def _delete(self) -> None:
        with suppress(Exception):
            self.q.delete()
            self.exchange(self.channel).delete()
        self.connection.release()


def open_reader(broker_url: str, queue: str) -> QueueReader:
    """A started reader for ``queue`` on a ``redis://`` or ``amqp://`` broker."""
    if broker_url.startswith("redis"):
        return RedisQueueReader(broker_url, queue).start()
    return AmqpQueueReader(broker_url, queue).start()


# -- a TCP proxy that can be cut ---------------------------------------------


def _hard_close(sock: socket.socket) -> None:
    # linger 0: close with RST, as a dead network path or a killed server looks
    with suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    # shutdown wakes the pump thread blocked in recv (close alone does not on Linux)
    with suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    with suppress(OSError):
        sock.close()


class TcpProxy:
    """Forwards 127.0.0.1:<port> to ``target``; :meth:`cut` closes every
    connection and refuses new ones (the port is closed) until :meth:`restore`.

    :meth:`blackhole` is the other way a network fails: silence. Nothing is
    forwarded in either direction, no socket is closed, and a new connection
    completes its handshake (the kernel's backlog) but is never forwarded, so
    the client waits on a peer that says nothing, as behind dropped packets.
    One difference remains: this host's kernel acknowledges what the client
    sends, so the client's own TCP timeouts for unacknowledged data
    (``tcp_user_timeout``) and keepalives do not fire: what it sees is a
    path through a TCP-terminating middlebox (a sidecar, a pooler) whose far
    side went silent, and only a timeout of the client's own on the reply
    ends its wait. :meth:`restore` forwards again, what was held included.

    ``lag``: seconds by which everything the target sends back reaches the
    client late (a long link: what the client sends is not delayed, so a
    request/reply costs one ``lag``). Each chunk is held in order, not
    throttled; what is held when the connection closes is dropped, as bytes
    on a wire are when its far end dies. :meth:`move` points the proxy at
    another target and closes every connection it carries, as an address
    that moves to another server does; new connections go to the new one."""

    def __init__(self, target: tuple[str, int], lag: float = 0.0) -> None:
        self.target = target
        self.lag = lag
        self.port = 0
        #: set while forwarding; cleared by blackhole()
        self._open = threading.Event()
        self._open.set()
        self._lock = threading.Lock()
        self._conns: set[socket.socket] = set()
        self._listener: socket.socket | None = None
        self._listen()

    def _listen(self) -> None:
        deadline = time.monotonic() + 5
        while True:
            listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                listener.bind(("127.0.0.1", self.port))
                break
            except OSError:
                listener.close()
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        listener.listen(64)
        self.port = listener.getsockname()[1]
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # cut() shut the listener down
            # black hole: the connection is accepted, and held unforwarded
            self._open.wait()
            target = self.target
            try:
                upstream = socket.create_connection(target, timeout=5)
                upstream.settimeout(None)
            except OSError:
                _hard_close(client)
                continue
            with self._lock:
                if self.target != target:  # moved meanwhile: reset, as move() does
                    _hard_close(client)
                    _hard_close(upstream)
                    continue
                if self._listener is not listener:
                    _hard_close(client)
                    _hard_close(upstream)
                    return
                self._conns.update((client, upstream))
            threading.Thread(target=self._pump, args=(client, upstream), daemon=True).start()
            back = self._pump_late if self.lag > 0 else self._pump
            threading.Thread(target=back, args=(upstream, client), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while True:
                # black hole: read nothing more, and hold what was read
                self._open.wait()
                data = src.recv(65536)
                if not data:
                    break
                self._open.wait()
                dst.sendall(data)
        except OSError:
            pass
        finally:
            self._forget(src, dst)

    def _pump_late(self, src: socket.socket, dst: socket.socket) -> None:
        """:meth:`_pump` for the way back when ``lag`` is set: a reader takes
        chunks off ``src`` as they come and a sender hands each to ``dst``
        ``lag`` seconds after it was read, so the delay adds no throttling."""
        held: queue.Queue[tuple[float, bytes]] = queue.Queue()

        def send() -> None:
            try:
                while True:
                    due, data = held.get()
                    if not data:
                        break
                    time.sleep(max(0.0, due - time.monotonic()))
                    self._open.wait()
                    dst.sendall(data)
            except OSError:
                pass
            finally:
                self._forget(src, dst)

        sender = threading.Thread(target=send, daemon=True)
        sender.start()
        try:
            while True:
                self._open.wait()
                data = src.recv(65536)
                held.put((time.monotonic() + self.lag, data))
                if not data:
                    break
        except OSError:
            held.put((0.0, b""))
        sender.join()

    def _forget(self, src: socket.socket, dst: socket.socket) -> None:
        with self._lock:
            self._conns.discard(src)
            self._conns.discard(dst)
        _hard_close(src)
        _hard_close(dst)

    def move(self, target: tuple[str, int]) -> None:
        """Send new connections to ``target`` and reset every current one."""
        with self._lock:
            self.target = target
            conns, self._conns = list(self._conns), set()
        for sock in conns:
            _hard_close(sock)

    def cut(self) -> None:
        with self._lock:
            listener, self._listener = self._listener, None
            conns, self._conns = list(self._conns), set()
        if listener is not None:
            _hard_close(listener)
        for sock in conns:
            _hard_close(sock)

    def blackhole(self) -> None:
        """Go silent until :meth:`restore`: forward nothing, close nothing."""
        self._open.clear()

    def restore(self) -> None:
        self._open.set()
        with self._lock:
            if self._listener is None:
                self._listen()

    def close(self) -> None:
        self.cut()
        # wake threads held by a black hole, so that they meet the closed sockets
        self._open.set()


# -- a PostgreSQL cluster of a test's own -----------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Postgres:
    """A PostgreSQL cluster of a test's (or a benchmark run's) own, so that it can be
    restarted or stopped without touching the shared server.

    ``password``: the ``postgres`` user's, and TCP connections must give it
    (scram-sha-256), so that a wrong one is rejected; without, all are trusted."""

    def __init__(self, password: str | None = None, prefix: str = "chaos-pg-") -> None:
        found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
        if not found:
            raise RuntimeError("no /usr/lib/postgresql/*/bin/initdb")
        self.bindir = Path(found[-1]).parent
        # its own folder under /tmp: the postgres user must be able to reach it
        self.dir = Path(tempfile.mkdtemp(prefix=prefix))
        self.data = self.dir / "data"
        self.port = free_port()
        self.version = ""
        self.password = password

    @property
    def url(self) -> str:
        user = "postgres" if self.password is None else f"postgres:{quote(self.password, safe='')}"
        return f"postgresql+psycopg://{user}@127.0.0.1:{self.port}/postgres"

    def _run(self, *command: str, timeout: float = 120) -> str:
        argv = [str(self.bindir / command[0]), *command[1:]]
        if os.geteuid() == 0:  # initdb refuses root
            argv = ["runuser", "-u", "postgres", "--", *argv]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
        if done.returncode:
            raise RuntimeError(f"{' '.join(argv)} failed:\n{done.stdout}\n{done.stderr}")
        return done.stdout

    def _ctl(self, action: str, *extra: str) -> None:
        options = (
            f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 "
            "-c fsync=off -c max_connections=200"
        )
        self._run(
            "pg_ctl", action, "-D", str(self.data), "-l", str(self.dir / "server.log"),
            "-w", "-t", "60", "-o", options, *extra,
        )  # fmt: skip

    def start(self) -> None:
        if os.geteuid() == 0:
            shutil.chown(self.dir, "postgres", "postgres")
        auth = ["--auth=trust"]
        if self.password is not None:
            pwfile = self.dir / "pwfile"
            pwfile.write_text(self.password + "\n")
            if os.geteuid() == 0:
                shutil.chown(pwfile, "postgres", "postgres")
            auth = [
                "--auth-local=trust", "--auth-host=scram-sha-256", f"--pwfile={pwfile}",
            ]  # fmt: skip
        self._run(
            "initdb", "-D", str(self.data), "-U", "postgres", *auth, "-E", "UTF8",
            "--no-sync",
        )  # fmt: skip
        self._ctl("start")
        self.version = self._run("postgres", "--version").strip()

    def restart(self) -> None:
        self._ctl("restart", "-m", "fast")

    def stop(self) -> None:
        """Shut the server down (fast: every session is cut) until :meth:`resume`."""
        self._ctl("stop", "-m", "fast")

    def resume(self) -> None:
        """Start the server again after :meth:`stop`, on the same port and data."""
        self._ctl("start")

    def close(self, keep: bool) -> None:
        try:
            self._ctl("stop", "-m", "immediate")
        except Exception as exc:
            print(f"chaos: stopping PostgreSQL: {exc}", file=sys.stderr)
        if not keep:
            shutil.rmtree(self.dir, ignore_errors=True)


@contextmanager
def private_postgres(password: str | None = None) -> Iterator[Postgres]:
    """A started :class:`Postgres` of the caller's own, removed afterwards. No
    PostgreSQL binaries here: a skip locally, a failure under CI=true."""
    import pytest

    try:
        pg = Postgres(password)
        pg.start()
    except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
        message = f"no private PostgreSQL cluster: {exc}"
        if IN_CI:
            pytest.fail(message)
        pytest.skip(message)
    try:
        yield pg
    finally:
        pg.close(keep=False)


# -- the database, read directly by the test ---------------------------------


class SlotRow(NamedTuple):
    entry: str
    slot_us: int
    state: int
    owner: str
    fence: int
    claimed_us: int


class Db:
    """Direct access to one test's tables (never through the proxy)."""

    def __init__(self, url: str, prefix: str) -> None:
        self.engine: Engine = direct_engine(url, poolclass=sa.pool.NullPool)
        self.tables = Tables(prefix)
        self.sql = store_dialect_for(self.engine.dialect.name, prefix)

    def now_us(self) -> int:
        """The database's clock, the one every slot and lease is measured on."""
        with self.engine.connect() as conn:
            return int(conn.execute(sa.text(self.sql.ping)).scalar_one())

    def anchors(self) -> dict[str, int]:
        """Each registered entry's anchor (empty until the tables exist)."""
        entries = self.tables.entries
        try:
            with self.engine.connect() as conn:
                rows = conn.execute(sa.select(entries.c.name, entries.c.anchor_us)).all()
        except sa.exc.DBAPIError:
            return {}
        return {name: int(anchor) for name, anchor in rows}

    def rows(self) -> dict[tuple[str, int], SlotRow]:
        s = self.tables.slots
        with self.engine.connect() as conn:
            result = conn.execute(
                sa.select(s.c.entry, s.c.slot_us, s.c.state, s.c.owner, s.c.fence, s.c.claimed_us)
            ).all()
        return {
            (r[0], int(r[1])): SlotRow(r[0], int(r[1]), int(r[2]), r[3], int(r[4]), int(r[5]))
            for r in result
        }

    def drop(self) -> None:
        with suppress(sa.exc.DBAPIError):
            self.tables.metadata.drop_all(self.engine)
        self.engine.dispose()


def wait_connected(beats: Iterable[BeatProcess], timeout: float = 45.0) -> None:
    """Wait until every replica logged that it connected to the database."""
    beats = list(beats)
    wait_for(
        lambda: all("connected to" in b.log() for b in beats),
        timeout,
        "every replica to connect",
        interval=0.2,
    )


def wait_db_time(
    db: Db, until_us: int, beats: Iterable[BeatProcess], interval: float = 0.2
) -> None:
    """Wait until the database's clock passes ``until_us``; every replica must live."""
    beats = list(beats)

    def passed() -> bool:
        dead = [b.name for b in beats if not b.alive()]
        assert not dead, f"beat died: {dead}"
        return db.now_us() >= until_us

    wait_for(passed, (until_us - db.now_us()) / US + 10, "the database clock", interval)


# -- slot accounting -----------------------------------------------------------


def interval_slots(anchor_us: int, period_us: int, upto_us: int) -> list[int]:
    """Every slot ``anchor + k * period`` (k >= 1) at or before ``upto_us``."""
    count = max(0, (upto_us - anchor_us) // period_us)
    return [anchor_us + k * period_us for k in range(1, count + 1)]


def publish_counts(beats: Iterable[BeatProcess]) -> Counter[str]:
    """How many times the replicas logged publishing each task id."""
    counts: Counter[str] = Counter()
    for beat in beats:
        counts.update(beat.sent_task_ids())
    return counts


@dataclass
class SlotReport:
    """What the broker held, judged against the slots the database implies."""

    problems: list[str] = field(default_factory=list)
    #: slots published twice, each explained by a takeover of an unconfirmed publish
    doubled: list[tuple[str, int]] = field(default_factory=list)
    #: slots a replica took over (fence > 1) and that reached the broker
    taken_over: list[tuple[str, int]] = field(default_factory=list)


def check_slots(
    messages: list[Received],
    expected: dict[str, list[int]],
    upto_us: int,
    rows: dict[tuple[str, int], SlotRow],
    published: Counter[str],
) -> SlotReport:
    """Exactly one message per expected slot, none outside it up to ``upto_us``,
    every task id deterministic; a second copy only where the database shows a
    takeover (fence > 1) and two replicas logged publishing it."""
    report = SlotReport()
    copies = Counter(m.slot for m in messages)
    for m in messages:
        if m.task_id != slot_task_id(m.entry, m.at_us):
            report.problems.append(f"{m.entry}@{m.at_us}: task id {m.task_id} not deterministic")
    wanted = {(entry, at) for entry, slots in expected.items() for at in slots}
    for slot in sorted(wanted):
        if copies[slot] == 0:
            report.problems.append(f"{slot[0]}@{slot[1]}: expected, never reached the broker")
    for slot, n in sorted(copies.items()):
        if slot[1] <= upto_us and slot not in wanted:
            report.problems.append(f"{slot[0]}@{slot[1]}: sent ({n}x) but not an expected slot")
        row = rows.get(slot)
        if row is not None and row.fence > 1:
            report.taken_over.append(slot)
        if n == 1:
            continue
        logged = published[slot_task_id(*slot)]
        if n == 2 and row is not None and row.fence > 1 and logged == 2:
            report.doubled.append(slot)
        else:
            fence = row.fence if row else None
            report.problems.append(
                f"{slot[0]}@{slot[1]}: {n} copies (fence {fence}, {logged} publishes logged)"
            )
    return report


#: how late past ``L + L/3`` after its instant a taken-over slot may be *measured*
#: in the broker. The promise counts from the instant to the takeover's publish;
#: measuring adds the reader's poll (0.05 s), the taker's tick work after its
#: sweep statement (a round trip and a publish: ms) and its wake-up jitter
#: (0.01 s), plus how late the abandoned claim itself was made after the instant
#: (ms, or the 0.25 s fallback delay for an entry the claimant proposed second),
#: plus scheduling delay on a shared 2-core machine. 1 s covers that with room;
#: the figures each test prints show how much is used.
TAKEOVER_SLACK = 1.0


@dataclass
class Takeover:
    """One slot abandoned by a replica and published by the replica that took it over."""

    slot: tuple[str, int]
    #: the abandoned claim's instant (fence 1, database clock)
    claimed_us: int
    #: the takeover's claim (the row's ``claimed_us`` at the end)
    retaken_us: int
    #: when the takeover's copy (the last one) reached the reader, local wall clock
    arrived: float

    def delay(self) -> float:
        """Seconds from the slot's instant to the takeover's copy in the broker."""
        return self.arrived - self.slot[1] / US


def unsent_claims(db: Db, owner: str | None) -> dict[tuple[str, int], SlotRow]:
    """The claims ``owner`` holds unsent now (state 0): read while it is frozen,
    they are what a takeover must publish later."""
    return {k: r for k, r in db.rows().items() if r.state == 0 and r.owner == owner}


def check_takeovers(
    messages: list[Received],
    rows: dict[tuple[str, int], SlotRow],
    abandoned: dict[tuple[str, int], SlotRow],
    taken_over: Iterable[tuple[str, int]],
    lease_us: int,
) -> tuple[list[str], list[Takeover]]:
    """Judge every taken-over slot against guarantees.md: it was one of the
    ``abandoned`` claims, and its takeover's copy reached the broker no earlier
    than the abandoned claim + L (the lease really ran out) and no later than
    the slot's instant + L + L/3 (the next sweep) + :data:`TAKEOVER_SLACK`.

    ``received`` is this machine's wall clock and ``slot_us``/``claimed_us`` the
    database's: the database runs on this machine, so they are the same clock
    (``time.time()`` and the server's ``clock_timestamp()`` both read
    CLOCK_REALTIME; SQLite's clock is the beat process's, the same one)."""
    problems: list[str] = []
    found: list[Takeover] = []
    arrivals: dict[tuple[str, int], list[float]] = defaultdict(list)
    for m in messages:
        arrivals[m.slot].append(m.received)
    bound = (lease_us + lease_us // 3) / US + TAKEOVER_SLACK
    for slot in taken_over:
        before, row = abandoned.get(slot), rows[slot]
        if before is None:
            problems.append(f"{slot}: taken over (fence {row.fence}) but not an abandoned claim")
            continue
        took = Takeover(slot, before.claimed_us, row.claimed_us, max(arrivals[slot]))
        found.append(took)
        lease_end = (before.claimed_us + lease_us) / US
        if not took.retaken_us > before.claimed_us + lease_us or took.arrived < lease_end:
            problems.append(f"{took}: taken over before the lease ({lease_us / US:g}s) ran out")
        if took.delay() > bound:
            problems.append(
                f"{took}: in the broker {took.delay():.3f}s after its instant > {bound:g}s"
            )
    return problems, found


def max_gaps(
    messages: list[Received], rows: dict[tuple[str, int], SlotRow], after: float = 0.0
) -> dict[str, float]:
    """Per entry, the longest wait (seconds, arrival times) between consecutive
    slots that were sent on the normal path; taken-over slots arrive late by
    design and are excluded. Only messages that arrived after ``after`` count."""
    first: dict[tuple[str, int], float] = {}
    for m in messages:
        row = rows.get(m.slot)
        if row is not None and row.fence > 1:
            continue
        first[m.slot] = min(first.get(m.slot, m.received), m.received)
    by_entry: dict[str, list[tuple[int, float]]] = defaultdict(list)
    for (entry, at), when in first.items():
        if when >= after:
            by_entry[entry].append((at, when))
    gaps = {}
    for entry, items in by_entry.items():
        items.sort()
        arrivals = [when for _, when in items]
        gaps[entry] = max((b - a for a, b in zip(arrivals, arrivals[1:])), default=0.0)
    return gaps


def replica_ids_with_shares(names: Sequence[str], entries: int) -> dict[str, str]:
    """``SB_REPLICA_ID`` for each of the replicas ``names`` (all the replicas of a
    test) such that each proposes at least one of beatapp's ``entries`` entries
    (``probe-0`` ...) first. Sharing is by rendezvous hashing of the replica ids:
    with a few entries a replica now and then has none (3 entries over 3
    replicas: about 3 times in 10), and only wins a slot when the others are
    late, so a test that waits for one given replica to win would wait in vain."""
    probes = [f"probe-{i}" for i in range(entries)]
    for attempt in range(1000):
        ids = {name: f"{name}-{attempt}" for name in names}
        first = first_replicas(probes, sorted(ids.values()))
        if set(first.values()) == set(ids.values()):
            return ids
    raise AssertionError(f"no replica ids give each of {list(names)} a share of {entries}")


def group_env(*, broker: str, db_url: str, prefix: str, queue: str, **extra: str) -> dict[str, str]:
    """The beatapp environment shared by the replicas of one test."""
    return {"SB_BROKER": broker, "SB_URL": db_url, "SB_PREFIX": prefix, "SB_QUEUE": queue, **extra}


@dataclass
class Outcome:
    """What a run left behind, read once every replica has stopped."""

    upto_us: int
    expected: dict[str, list[int]]
    messages: list[Received]
    rows: dict[tuple[str, int], SlotRow]
    published: Counter[str]


def collect(
    rig: Rig,
    reader: QueueReader,
    db: Db,
    anchors: dict[str, int],
    period_us: int,
    *,
    beats: list[BeatProcess],
    alive: list[BeatProcess],
    timeout: float,
    upto_us: int | None = None,
) -> Outcome:
    """Wait until every slot up to ``upto_us`` (default: the database's now) is in
    the broker, check that the ``alive`` replicas still run, stop them all, and
    read messages, rows and the publishes each replica logged."""
    upto = db.now_us() if upto_us is None else upto_us
    expected = {name: interval_slots(anchor, period_us, upto) for name, anchor in anchors.items()}
    wanted = {(e, at) for e, slots in expected.items() for at in slots}
    wait_for(
        lambda: wanted <= {m.slot for m in reader.messages()},
        timeout,
        "every expected slot in the broker",
        interval=0.2,
    )
    assert all(b.alive() for b in alive), rig.group.outputs()
    rig.group.stop_all()
    return Outcome(upto, expected, reader.finish(), db.rows(), publish_counts(beats))


class Fleet(NamedTuple):
    """See :meth:`Rig.fleet`."""

    reader: QueueReader
    db: Db
    env: dict[str, str]


class Rig:
    """Everything one test starts, torn down in a safe order: the replicas first
    (resumed, then terminated or killed), then proxies, queues and tables."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.group = BeatGroup(workdir)
        self.readers: list[QueueReader] = []
        self.dbs: list[Db] = []
        self.proxies: list[TcpProxy] = []

    def start_beat(self, env: dict[str, str], name: str) -> BeatProcess:
        return self.group.start_beat(env, name)

    def start_worker(self, env: dict[str, str], name: str, **options: Any) -> BeatProcess:
        """A ``celery worker`` process (see :meth:`BeatGroup.start_worker`)."""
        return self.group.start_worker(env, name, **options)

    def reader(self, broker_url: str) -> QueueReader:
        """A reader of a fresh queue (uuid name) on this broker."""
        reader = open_reader(broker_url, f"sbq-{uuid.uuid4().hex}")
        self.readers.append(reader)
        return reader

    def db(self, url: str, prefix: str) -> Db:
        db = Db(url, prefix)
        self.dbs.append(db)
        return db

    def fleet(
        self,
        broker_url: str,
        db_url: str,
        prefix: str,
        *,
        beats_url: str | None = None,
        **extra: str,
    ) -> Fleet:
        """What replicas sharing one database and one broker queue need: a reader
        of a fresh queue, the tables (read through ``db_url``) and the beatapp
        environment. ``beats_url``: the URL the replicas use, when it is not
        ``db_url`` (through a proxy, with a password); ``extra``: more SB_* values."""
        reader = self.reader(broker_url)
        env = group_env(
            broker=broker_url,
            db_url=beats_url or db_url,
            prefix=prefix,
            queue=reader.queue,
            **extra,
        )
        return Fleet(reader, self.db(db_url, prefix), env)

    def proxy(self, target: tuple[str, int]) -> TcpProxy:
        proxy = TcpProxy(target)
        self.proxies.append(proxy)
        return proxy

    def close(self) -> None:
        try:
            self.group.stop_all()
        finally:
            for proxy in self.proxies:
                proxy.close()
            for reader in self.readers:
                with suppress(Exception):
                    reader.close()
            for db in self.dbs:
                db.drop()


# -- SingletonTask workers: readiness, sending, records, logs and rows --------


def wait_ready(*workers: BeatProcess, timeout: float = 60.0) -> None:
    """Wait until every ``celery worker`` logged that it consumes (`` ready.``);
    fail at once if one exited. Started together, they get ready together."""

    def ready(worker: BeatProcess) -> bool:
        assert worker.alive(), f"worker {worker.name} exited:\n{worker.log()[-4000:]}"
        return " ready." in worker.log()

    names = ", ".join(w.name for w in workers)
    wait_for(lambda: all([ready(w) for w in workers]), timeout, f"{names} to be ready")


def kill_group(worker: BeatProcess) -> None:
    """SIGKILL a worker's whole process group (parent and pool children)."""
    with suppress(ProcessLookupError):
        os.killpg(worker.pid, signal.SIGKILL)
    worker.proc.wait(5)


def pid_gone(pid: int) -> bool:
    """True once ``pid`` has exited (gone, or a zombie not reaped yet)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] in ("Z", "X")


def delete_queue(broker_url: str, queue: str) -> None:
    """Remove a queue declared as Celery declares it (exchange = routing key =
    name), with its messages, on Redis or RabbitMQ. Declared again first: kombu
    deletes only the bindings its channel knows (Redis keeps them in keys
    named after the exchange, which would stay behind)."""
    from kombu import Connection, Exchange
    from kombu import Queue as KombuQueue

    with suppress(Exception), Connection(broker_url) as conn:
        channel = conn.channel()
        exchange = Exchange(queue, type="direct")
        bound = KombuQueue(queue, exchange, routing_key=queue)(channel)
        bound.declare()
        bound.delete()
        exchange(channel).delete()


class Sender:
    """Publishes tasks by name to fresh queues of one broker, as any producer
    would (no task class); results go to ``backend`` when given.
    :meth:`close` deletes the queues."""

    def __init__(self, broker_url: str, backend: str | None = None) -> None:
        from celery import Celery

        self.broker_url = broker_url
        self.app = Celery("sender", broker=broker_url, backend=backend)
        self.app.conf.broker_connection_retry_on_startup = True
        self.queues: list[str] = []

    def queue(self) -> str:
        name = f"sbq-{uuid.uuid4().hex}"
        self.queues.append(name)
        return name

    def send(self, queue: str, name: str, *args: Any, **options: Any) -> str:
        """Send ``name(*args)`` to ``queue`` (``options`` as ``send_task`` takes
        them, ``kwargs`` included); returns the task id."""
        result = self.app.send_task(
            name, args=args, queue=queue, exchange=queue, routing_key=queue, **options
        )
        return str(result.id)

    def close(self) -> None:
        try:
            for queue in self.queues:
                delete_queue(self.broker_url, queue)
        finally:
            self.app.close()


#: a finished task as the worker logs it (skips, executions and drops alike)
DONE_LINE = re.compile(r"Task (?P<name>\S+)\[(?P<id>[0-9a-f-]{36})\] (?P<how>succeeded|ignored)")
#: a call that found its singleton key busy (policy skip)
SKIPPED_LINE = re.compile(
    r"singlebeat: (?P<name>\S+)\[(?P<id>[0-9a-f-]{36})\]: singleton key .*: skipped"
)
#: a repeated delivery of a slot, dropped
DROPPED_LINE = re.compile(
    r"singlebeat: (?P<name>\S+)\[(?P<id>[0-9a-f-]{36})\]: slot \S+ already (?P<status>\w+) "
    r"\(by \S+\): dropping this repeated delivery"
)
#: what a replica and a worker log when a failover lost writes they had seen
#: committed, and they wrote them again (scheduler.py, singleton/writeback.py)
LOST_SLOTS_LINE = re.compile(r"the database lost (?P<n>\d+) of the slots replica")
LOST_RUNS_LINE = re.compile(r"the database lost (?P<n>\d+) of the run rows worker")


def log_ids(workers: Iterable[BeatProcess], pattern: re.Pattern[str]) -> list[str]:
    """Task ids of every line matching ``pattern`` in these workers' logs."""
    return [m["id"] for w in workers for m in pattern.finditer(w.log())]


def read_records(path: Path) -> list[dict[str, Any]]:
    """The JSON lines ``singletonapp.record`` appended to ``path`` (none yet: [])."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return []
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def imported_from(records: list[dict[str, Any]]) -> list[str]:
    """The celery_singlebeat files the ``singletonapp.where`` calls recorded."""
    return [r["file"] for r in records if r["event"] == "where"]


class Execution(NamedTuple):
    """One execution of a task body: its ``start`` record and its ``end``, if any."""

    task: str
    task_id: str
    pid: int
    token: int | None
    key: str | None
    slot: tuple[str, int] | None
    start: float
    #: None while it runs, or when it never ended (killed, or it raised: a
    #: ``self.retry()``, a soft time limit)
    end: float | None
    lost: bool | None
    tag: str


def executions(
    records: list[dict[str, Any]], *, task: str | None = None, key: str | None = None
) -> list[Execution]:
    """Every execution these records hold, ended or not, in start order; only
    those of ``task`` and holding ``key`` when given."""
    starts: dict[tuple[str, int, object], dict[str, Any]] = {}
    ends: dict[tuple[str, int, object], dict[str, Any]] = {}
    for rec in records:
        if rec["event"] not in ("start", "end"):
            continue
        if (task is not None and rec["task"] != task) or (key is not None and rec["key"] != key):
            continue
        ident = (rec["task_id"], rec["pid"], rec["token"])
        (starts if rec["event"] == "start" else ends)[ident] = rec
    out = []
    for ident, s in starts.items():
        e = ends.get(ident)
        out.append(
            Execution(
                s["task"],
                s["task_id"],
                s["pid"],
                s["token"],
                s["key"],
                (s["slot"][0], int(s["slot"][1])) if s["slot"] else None,
                s["at"],
                e["at"] if e else None,
                e.get("lost") if e else None,
                s.get("tag", ""),
            )
        )
    return sorted(out, key=lambda x: x.start)


def overlaps(executions: list[Execution]) -> list[str]:
    """What contradicts one-at-a-time in these executions of one key (start
    order): one that overlapped the next, or did not end before it started
    (so pass only executions that must have ended), or a fencing token that
    did not grow. Empty when all is well."""
    problems = []
    for a, b in zip(executions, executions[1:]):
        if a.end is None or a.end > b.start:
            problems.append(f"overlap: {a} and {b}")
        if a.token is None or b.token is None or not a.token < b.token:
            problems.append(f"token did not grow: {a.token} then {b.token}")
    return problems


class RunRow(NamedTuple):
    entry: str
    slot_us: int
    state: int
    owner: str
    task_id: str
    outcome: str | None
    attempts: int
    repeats: int


class LeaseRow(NamedTuple):
    name: str
    token: int
    owner: str
    expires_us: int
    acquired_us: int


def run_rows(db: Db) -> dict[tuple[str, int], RunRow]:
    """The SingletonTask run rows of one test's tables, by slot."""
    r = db.tables.runs
    columns = (r.c.entry, r.c.slot_us, r.c.state, r.c.owner, r.c.task_id, r.c.outcome)
    with db.engine.connect() as conn:
        rows = conn.execute(sa.select(*columns, r.c.attempts, r.c.repeats)).all()
    return {
        (row[0], int(row[1])): RunRow(
            row[0], int(row[1]), int(row[2]), row[3], row[4], row[5], int(row[6]), int(row[7])
        )
        for row in rows
    }


def lease_row(db: Db, key: str) -> LeaseRow | None:
    """The lease row of one singleton key (None before its first acquisition);
    ``expires_us`` 0 once released."""
    lk = db.tables.locks
    columns = (lk.c.name, lk.c.token, lk.c.owner, lk.c.expires_us, lk.c.acquired_us)
    with db.engine.connect() as conn:
        row = conn.execute(sa.select(*columns).where(lk.c.name == key)).first()
    if row is None:
        return None
    return LeaseRow(row[0], int(row[1]), row[2], int(row[3]), int(row[4]))


# -- a Prometheus server of a test's own --------------------------------------


class PrometheusServer:
    """A real ``prometheus`` process (Debian's ``/usr/bin/prometheus``) scraping
    ``jobs`` (job name -> ``host:port`` targets) every ``interval`` seconds,
    its data in ``workdir``; :meth:`query` asks its HTTP API, as Grafana does.
    No binary here: a skip locally, a failure under CI=true (.ci/run installs it)."""

    def __init__(self, workdir: Path, jobs: dict[str, list[str]], interval: float = 1.0) -> None:
        import pytest

        binary = shutil.which("prometheus") or "/usr/bin/prometheus"
        if not os.access(binary, os.X_OK):
            message = "no prometheus binary (Debian: apt-get install prometheus)"
            if IN_CI:
                pytest.fail(message)
            pytest.skip(message)
        self.port = free_port()
        self.dir = workdir / "prometheus"
        self.dir.mkdir()
        scrapes = "".join(
            f"  - job_name: {name}\n    static_configs:\n      - targets: {json.dumps(targets)}\n"
            for name, targets in jobs.items()
        )
        config = self.dir / "prometheus.yml"
        config.write_text(
            # durations in whole milliseconds: Prometheus refuses "0.8s"
            f"global:\n  scrape_interval: {int(interval * 1000)}ms\n"
            f"  scrape_timeout: {int(interval * 800)}ms\n"
            f"scrape_configs:\n{scrapes}"
        )
        self.log_path = self.dir / "prometheus.log"
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(
                [
                    binary,
                    f"--config.file={config}",
                    f"--storage.tsdb.path={self.dir / 'data'}",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                    "--log.level=warn",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        wait_for(self._ready, 30, "prometheus to be ready", interval=0.2)

    def _get(self, path: str) -> Any:
        import urllib.request

        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=5) as answer:
            return json.loads(answer.read()) if path.startswith("/api/") else answer.status

    def _ready(self) -> bool:
        assert self.proc.poll() is None, self.log_path.read_text()[-3000:]
        try:
            return bool(self._get("/-/ready") == 200)
        except OSError:
            return False

    def query(self, expr: str) -> list[tuple[dict[str, str], float]]:
        """An instant query's vector: (labels, value) per series."""
        from urllib.parse import quote as q

        answer = self._get(f"/api/v1/query?query={q(expr)}")
        assert answer["status"] == "success", answer
        return [(r["metric"], float(r["value"][1])) for r in answer["data"]["result"]]

    def scalar(self, expr: str) -> float | None:
        """The one value of an aggregate (None: no series yet)."""
        found = self.query(expr)
        assert len(found) <= 1, found
        return found[0][1] if found else None

    def targets_up(self) -> dict[str, bool]:
        """Each scraped target (``instance``) and whether its last scrape worked."""
        return {labels["instance"]: value == 1 for labels, value in self.query("up")}

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
