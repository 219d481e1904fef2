"""A PostgreSQL primary with a streaming standby of its own, and a failover.

The topology a managed PostgreSQL (Patroni, CloudNativePG, RDS, Cloud SQL) gives
its clients, built from real processes on this machine so that a failover can be
done to it and measured (``bench_failover.py``; a short acceptance test can use
the same :class:`FailoverPair`):

* a **primary** and a **standby**: two clusters of PostgreSQL 15 (``initdb`` in
  temporary folders, run as the ``postgres`` OS user, on free ports; the shared
  server on 5432 is never touched); the standby is made with
  ``pg_basebackup -R`` and streams the primary's WAL;
* a **link** between them: a :class:`TcpProxy` that the standby's
  ``primary_conninfo`` points at, which delays everything the primary sends to
  the standby by ``lag`` seconds (the WAL stream);
* a **movable address**: a :class:`TcpProxy` that every client connects to,
  pointing at the primary until a failover moves it to the promoted standby.

Two modes:

* ``async``: asynchronous streaming (PostgreSQL's default). A commit returns
  once the primary has it; the standby is ``lag`` behind, and whatever it had
  not received when the primary died is gone after the promotion.
* ``sync``: ``synchronous_standby_names = '*'`` with ``synchronous_commit = on``
  on the primary: a commit returns once the standby has *flushed* its WAL.
  ``on`` and not ``remote_apply``: a promotion replays every WAL record the
  standby flushed before it accepts writes, so a commit the primary confirmed
  survives the failover either way; ``remote_apply`` only adds that reads *on
  the standby* see the commit, and nothing here reads from a standby. After a
  promotion the new primary runs without a synchronous standby until a new one
  streams (Patroni's ``synchronous_mode`` without ``synchronous_mode_strict``
  does the same), else every commit would wait for a standby that is not there.

:meth:`FailoverPair.failover`: the primary's node dies (the address goes silent,
as a lost node does, the link is cut, which drops what was on it, then
``pg_ctl stop -m immediate``), the standby is promoted (``pg_ctl promote``, then
a write must succeed), and the address moves to it, resetting every connection
it carried, as an address that moves does; what clients sent meanwhile was held
and goes to the new primary.
:meth:`FailoverPair.add_standby` then makes a fresh standby of the new primary
(the old primary's data is thrown away, not rejoined).
"""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
# the acceptance harness (its Postgres and TcpProxy) and the tests' conftest
sys.path[:0] = [str(ROOT / "tests" / "acceptance"), str(ROOT / "tests")]

from harness import Postgres, TcpProxy, wait_for  # noqa: E402

MODES = ("async", "sync")


class Node(Postgres):
    """One PostgreSQL cluster of the pair: a primary (:meth:`start`, from
    ``initdb``) or a standby (:meth:`start_standby`, from ``pg_basebackup``)."""

    def __init__(self, name: str) -> None:
        super().__init__(prefix=f"failover-{name}-")
        self.name = name

    @property
    def address(self) -> tuple[str, int]:
        return ("127.0.0.1", self.port)

    def start_standby(self, source_port: int) -> None:
        """Copy the primary reached on ``source_port`` and stream from it there:
        ``-R`` writes ``primary_conninfo`` (that port) and ``standby.signal``."""
        if os.geteuid() == 0:
            shutil.chown(self.dir, "postgres", "postgres")
        self._run(
            "pg_basebackup", "-h", "127.0.0.1", "-p", str(source_port), "-U", "postgres",
            "-D", str(self.data), "-R", "-X", "stream", "-c", "fast", "--no-sync",
        )  # fmt: skip
        self._ctl("start")
        self.version = self._run("postgres", "--version").strip()

    def stop_immediate(self) -> None:
        """Every process of the cluster quits at once, no checkpoint: a crash."""
        self._ctl("stop", "-m", "immediate")

    def promote(self) -> None:
        """End recovery; ``-w``: return once the server says it is promoted."""
        self._run("pg_ctl", "promote", "-D", str(self.data), "-w", "-t", "60")

    def query(self, statement: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        """Run one statement directly (not through any proxy), autocommit."""
        import psycopg

        with psycopg.connect(
            host="127.0.0.1", port=self.port, user="postgres", dbname="postgres",
            autocommit=True, connect_timeout=5,
        ) as conn:  # fmt: skip
            cursor = conn.execute(statement, params or None)
            return list(cursor.fetchall()) if cursor.description else []

    def one(self, statement: str) -> Any:
        return self.query(statement)[0][0]


@dataclass
class Failover:
    """What one :meth:`FailoverPair.failover` did, on this host's wall clock."""

    number: int
    #: the node lost (clients silenced, link cut) and the primary stopped
    #: (``pg_ctl stop -m immediate`` done)
    cut_at: float
    stopped_at: float
    #: the standby accepts writes
    promoted_at: float
    #: the address points at the new primary, old connections reset
    moved_at: float
    #: the standby's distance behind the primary just before the cut: WAL bytes
    #: not yet received (the primary's insert position minus what the standby
    #: had flushed), and the age of the last transaction it had replayed
    behind_bytes: int
    behind_ms: float
    #: the primary's WAL insert position just before the cut and what the
    #: standby had received when it was promoted
    primary_lsn: str
    standby_lsn: str
    #: the new primary's timeline
    timeline: int

    @property
    def unavailable_s(self) -> float:
        """From the primary's death to the address pointing at the new one."""
        return self.moved_at - self.cut_at


class ReplicatedPair:
    """What a primary with a standby of its own shares across databases
    (:class:`FailoverPair` here, ``failover_mariadb.MariaDBPair``): its mode,
    the standby's lag, the link between them and the movable address clients
    use. :meth:`close` stops and removes everything; it also runs at
    interpreter exit, so nothing is left behind when the caller fails."""

    #: the modes the subclass knows
    MODES: tuple[str, ...] = ()

    def __init__(self, mode: str, lag: float) -> None:
        if mode not in self.MODES:
            raise ValueError(f"mode must be one of {self.MODES}, not {mode!r}")
        self.mode = mode
        self.lag = lag
        self.link: TcpProxy | None = None
        self.address: TcpProxy | None = None
        self._closed = False
        atexit.register(self.close)

    def close(self) -> None:
        """Close both proxies, then stop the servers and remove their data;
        idempotent."""
        if self._closed:
            return
        self._closed = True
        for proxy in (self.address, self.link):
            if proxy is not None:
                proxy.close()
        self._close_servers()

    def _close_servers(self) -> None:
        raise NotImplementedError


class FailoverPair(ReplicatedPair):
    """A PostgreSQL primary, its standby, the link between them and the
    movable address clients use (see the module's docstring)."""

    MODES = MODES

    def __init__(self, mode: str, lag: float) -> None:
        super().__init__(mode, lag)
        self.primary: Node | None = None
        self.standby: Node | None = None
        self.failovers: list[Failover] = []
        self._nodes = 0

    @property
    def url(self) -> str:
        """The clients' URL: through the movable address."""
        assert self.address is not None
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.address.port}/postgres"

    @property
    def primary_url(self) -> str:
        """The current primary itself, for the harness's own reads."""
        assert self.primary is not None
        return str(self.primary.url)

    def _node(self) -> Node:
        self._nodes += 1
        return Node(f"pg{self._nodes}")

    def start(self) -> FailoverPair:
        """Start the primary, a streaming standby and the address; returns self."""
        self.primary = self._node()
        self.primary.start()
        self.address = TcpProxy(self.primary.address)
        self.add_standby()
        return self

    def add_standby(self, timeout: float = 120.0) -> None:
        """A fresh standby of the current primary, through a new link; returns
        once it streams (and, in ``sync`` mode, once the primary counts it as
        its synchronous standby)."""
        primary = self.primary
        assert primary is not None and self.standby is None
        self.link = TcpProxy(primary.address, lag=self.lag)
        self.standby = self._node()
        self.standby.start_standby(self.link.port)
        wait_for(
            lambda: primary.query("SELECT 1 FROM pg_stat_replication WHERE state = 'streaming'"),
            timeout,
            f"{self.standby.name} to stream from {primary.name}",
            interval=0.2,
        )
        if self.mode == "sync":
            primary.query("ALTER SYSTEM SET synchronous_standby_names = '*'")
            primary.query("ALTER SYSTEM SET synchronous_commit = 'on'")
            primary.query("SELECT pg_reload_conf()")
            wait_for(
                lambda: primary.query(
                    "SELECT 1 FROM pg_stat_replication WHERE sync_state = 'sync'"
                ),
                timeout,
                f"{self.standby.name} to be {primary.name}'s synchronous standby",
                interval=0.2,
            )

    def failover(self, timeout: float = 60.0) -> Failover:
        """Kill the primary, promote the standby, move the address to it."""
        old, new, link, address = self.primary, self.standby, self.link, self.address
        assert old is not None and new is not None and link is not None and address is not None
        primary_lsn = str(old.one("SELECT pg_current_wal_lsn()"))
        behind_bytes, behind_ms = new.query(
            "SELECT pg_wal_lsn_diff(%s::pg_lsn, pg_last_wal_receive_lsn())::bigint,"
            " coalesce(extract(epoch FROM now() - pg_last_xact_replay_timestamp()) * 1000, 0)",
            (primary_lsn,),
        )[0]
        # The node is lost, all at once: its clients' traffic goes silent (so
        # that nothing commits in the ~0.1 s pg_ctl takes to stop it, which
        # would add to the lag), what is on the link goes with it (cut drops
        # the bytes the lag held), then the server itself.
        cut_at = time.time()
        address.blackhole()
        link.cut()
        old.stop_immediate()
        stopped_at = time.time()
        standby_lsn = str(new.one("SELECT pg_last_wal_receive_lsn()"))
        new.promote()
        if self.mode == "sync":
            # no synchronous standby until add_standby() makes one (see the module)
            new.query("ALTER SYSTEM SET synchronous_standby_names = ''")
            new.query("SELECT pg_reload_conf()")
        wait_for(lambda: _writable(new), timeout, f"{new.name} to accept writes", interval=0.05)
        promoted_at = time.time()
        address.move(new.address)
        address.restore()
        moved_at = time.time()
        # the WAL file name's first 8 hex digits (the last checkpoint's may be older)
        timeline = int(new.one("SELECT substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8)"), 16)
        link.close()
        shutil.rmtree(old.dir, ignore_errors=True)  # stopped already
        self.primary, self.standby, self.link = new, None, None
        record = Failover(
            len(self.failovers) + 1, cut_at, stopped_at, promoted_at, moved_at,
            # read a moment apart: a standby that had everything can read ahead
            max(0, int(behind_bytes or 0)), round(float(behind_ms or 0), 1),
            primary_lsn, standby_lsn, timeline,
        )  # fmt: skip
        self.failovers.append(record)
        return record

    def _close_servers(self) -> None:
        for node in (self.standby, self.primary):
            if node is not None:
                node.close(keep=False)


def _writable(node: Node) -> bool:
    """True once ``node`` commits a transaction that needs an xid (a write)."""
    try:
        return not node.one("SELECT pg_is_in_recovery()") and bool(
            node.one("SELECT txid_current()")
        )
    except Exception:
        return False
