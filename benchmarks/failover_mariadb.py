"""A MariaDB primary with a replica of its own, and a failover.

``failover.py``'s topology for MariaDB (what a Galera-less MariaDB behind
MaxScale, or a managed MariaDB with a replica, gives its clients), built from
real processes on this machine, with the same interface as its
:class:`~failover.FailoverPair` so that ``bench_failover.py --database mariadb``
drives it unchanged:

* a **primary** and a **replica**: two ``mariadbd`` servers of their own
  (``mariadb-install-db`` in temporary folders, free ports; the shared server
  on 3306 is never touched), binary log on, GTIDs in strict mode, and
  ``log_slave_updates`` so that a promoted replica's binary log holds every
  transaction it applied and a replica of *it* can continue by GTID; the
  replica is made from a ``mariadb-dump --single-transaction --gtid`` of the
  primary and replicates with ``MASTER_USE_GTID=slave_pos``;
* a **link** between them: a :class:`TcpProxy` that the replica's ``CHANGE
  MASTER TO`` points at, which delays everything the primary sends it (the
  binary log events) by ``lag`` seconds;
* a **movable address**: a :class:`TcpProxy` that every client connects to,
  pointing at the primary until a failover moves it to the promoted replica.

Two modes:

* ``async``: asynchronous replication (MariaDB's default). A commit returns
  once the primary has it; the replica is ``lag`` behind, and whatever it had
  not received when the primary died is gone after the promotion.
* ``semisync``: ``rpl_semi_sync_master_enabled`` on the primary and
  ``rpl_semi_sync_slave_enabled`` on the replica, with
  ``rpl_semi_sync_master_wait_point = AFTER_SYNC``: the primary writes a
  transaction to its binary log, waits for the replica to acknowledge that it
  wrote it to its relay log, and only then commits it in the engine (where
  other sessions see it) and answers the client. So nothing a client was told
  is committed, nor anything another session read, can be missing from the
  replica; the relay log is applied before the promotion (:meth:`failover`).
  ``rpl_semi_sync_master_timeout`` is set to an hour here. With the default of
  10 s, a primary that waits that long for an acknowledgement (the replica
  slow, restarting, or the link down) *silently switches to asynchronous
  replication* (``Rpl_semi_sync_master_status`` OFF) and commits without one
  until the replica catches up: the guarantee only holds while the replica
  keeps answering within the timeout, and a failover soon after such a spell
  loses writes as ``async`` does. The failover record keeps the primary's
  ``Rpl_semi_sync_master_status`` and ``Rpl_semi_sync_master_no_tx`` at the cut,
  to show that it did not happen during a run. As ``failover.py`` does for
  PostgreSQL, a promoted replica runs without a semi-synchronous replica until
  :meth:`MariaDBPair.add_standby` makes one (else every commit would wait for
  a replica that is not there: ``rpl_semi_sync_master_wait_no_slave``).

:meth:`MariaDBPair.failover`: the primary's node dies (the address goes
silent, the link is cut, which drops what was on it, then ``kill -9``), the
replica applies what its relay log holds, stops replicating (``STOP SLAVE;
RESET SLAVE ALL``), turns ``read_only`` off, must accept a write, and the
address moves to it. :meth:`MariaDBPair.add_standby` then makes a fresh
replica of the new primary (the old primary's data is thrown away).
"""

from __future__ import annotations

import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from bisect import bisect_right
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

# failover.py puts the acceptance harness on sys.path
from failover import Failover, ReplicatedPair  # noqa: E402
from harness import TcpProxy, free_port, wait_for  # noqa: E402

MODES = ("async", "semisync")
#: the database clients use (created on the first primary, replicated from there)
DATABASE = "test"
#: rpl_semi_sync_master_timeout in ms: an hour, longer than any run, so that the
#: primary never falls back to asynchronous replication during one (module doc)
SEMISYNC_TIMEOUT_MS = 3_600_000
#: how often the primary's binary log position is sampled, to date what the
#: replica lacked at a failover (behind_ms)
SAMPLE_S = 0.02


def _binary(name: str) -> str:
    found = shutil.which(name) or shutil.which(f"/usr/sbin/{name}")
    if not found:
        raise RuntimeError(f"no {name} on PATH or in /usr/sbin")
    return found


def _seq(gtid_list: str, domain: int = 0) -> int:
    """The sequence number of ``domain`` in a GTID list ("0-1-42,1-2-7"); 0 if
    absent. Strict mode and one domain: sequence numbers count transactions."""
    for gtid in filter(None, (g.strip() for g in (gtid_list or "").split(","))):
        d, _server, seq = gtid.split("-")
        if int(d) == domain:
            return int(seq)
    return 0


class Node:
    """One ``mariadbd`` of the pair, on a datadir of its own; clients and the
    harness reach it by TCP on 127.0.0.1 as root without a password."""

    def __init__(self, name: str, server_id: int, mode: str) -> None:
        self.name = name
        self.server_id = server_id
        self.mode = mode
        self.dir = Path(tempfile.mkdtemp(prefix=f"failover-{name}-"))
        self.data = self.dir / "data"
        self.socket = self.dir / "mariadb.sock"
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.version = ""

    @property
    def address(self) -> tuple[str, int]:
        return ("127.0.0.1", self.port)

    @property
    def url(self) -> str:
        return f"mysql+pymysql://root@127.0.0.1:{self.port}/{DATABASE}"

    def start(self, *, read_only: bool) -> None:
        """A fresh datadir and the server on it, ready for TCP clients."""
        done = subprocess.run(
            [
                _binary("mariadb-install-db"), "--no-defaults", f"--datadir={self.data}",
                "--user=root", "--auth-root-authentication-method=socket", "--skip-test-db",
            ],
            capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        if done.returncode:
            raise RuntimeError(f"mariadb-install-db failed:\n{done.stdout}\n{done.stderr}")
        (self.dir / "tmp").mkdir()
        options = [
            "--no-defaults", "--user=root", f"--datadir={self.data}", f"--port={self.port}",
            "--bind-address=127.0.0.1", f"--socket={self.socket}",
            # a tmpdir of its own: a starting mariadbd deletes every #sql* file
            # in its tmpdir as its own leftovers, and with /tmp shared, a replica
            # starting (add_standby) deleted a running primary's temporary table
            # mid-UPDATE ("Error on delete of '/tmp/#sql-update-...MAI'")
            f"--tmpdir={self.dir / 'tmp'}",
            f"--pid-file={self.dir / 'mariadbd.pid'}", f"--log-error={self.dir / 'error.log'}",
            f"--server-id={self.server_id}", "--log-bin=binlog", "--binlog-format=ROW",
            "--gtid-strict-mode=1", "--log-slave-updates=1", "--gtid-domain-id=0",
            # relay log applied at once, and the replica never fetches again after
            # STOP SLAVE by chance: failover() decides what it had
            "--relay-log=relay", "--skip-slave-start",
            f"--read-only={int(read_only)}",
            # durability against a crash of the process, not of the machine:
            # kill -9 keeps what was written to the OS (sync_binlog=0), and no
            # test here loses the OS; a small server, two run at once on 2 cores
            "--sync-binlog=0", "--innodb-flush-log-at-trx-commit=2",
            "--innodb-buffer-pool-size=64M", "--innodb-log-file-size=32M",
            "--skip-name-resolve", "--max-connections=300", "--performance-schema=0",
            # both roles' semi-sync settings on every node: a replica becomes
            # a primary at a failover (master_enabled is switched at run time)
            f"--rpl-semi-sync-slave-enabled={int(self.mode == 'semisync')}",
            "--rpl-semi-sync-master-wait-point=AFTER_SYNC",
            f"--rpl-semi-sync-master-timeout={SEMISYNC_TIMEOUT_MS}",
        ]  # fmt: skip
        with (self.dir / "stdout.log").open("wb") as out:
            self.proc = subprocess.Popen(
                [_binary("mariadbd"), *options],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        wait_for(self._answers, 60, f"{self.name} to accept connections", interval=0.1)
        # TCP root for the clients and the harness, not in the binary log: every
        # node makes its own, so no replica replays another's
        self._socket_sql(
            "SET sql_log_bin = 0; CREATE USER IF NOT EXISTS 'root'@'%';"
            " GRANT ALL ON *.* TO 'root'@'%' WITH GRANT OPTION; SET sql_log_bin = 1"
        )
        self.version = str(self.one("SELECT CONCAT('MariaDB ', VERSION())"))

    def _answers(self) -> bool:
        if self.proc is not None and self.proc.poll() is not None:
            log = (self.dir / "error.log").read_text(errors="replace")[-3000:]
            raise RuntimeError(f"{self.name}: mariadbd exited {self.proc.returncode}:\n{log}")
        try:
            self._socket_sql("SELECT 1")
            return True
        except RuntimeError:
            return False

    def _socket_sql(self, sql: str) -> str:
        """Run ``sql`` with the mariadb client over the Unix socket (root by
        unix_socket authentication, before the TCP user exists)."""
        done = subprocess.run(
            [_binary("mariadb"), f"--socket={self.socket}", "-uroot", "-N", "-e", sql],
            capture_output=True, timeout=120, check=False,
        )  # fmt: skip
        if done.returncode:
            raise RuntimeError(f"{self.name}: {sql!r} failed: {done.stderr.decode()}")
        return done.stdout.decode()

    def load(self, dump: bytes) -> None:
        """Load a dump outside this server's binary log: a replica's GTID
        history must be its primary's alone, or a replica of *it* (after the
        next failover) would meet transactions its new primary never had."""
        done = subprocess.run(
            [
                _binary("mariadb"), f"--socket={self.socket}", "-uroot",
                "--init-command=SET sql_log_bin = 0",
            ],
            capture_output=True, input=dump, timeout=300, check=False,
        )  # fmt: skip
        if done.returncode:
            raise RuntimeError(f"{self.name}: loading a dump failed: {done.stderr.decode()}")

    def connect(self, timeout: float = 5.0) -> Any:
        import pymysql

        return pymysql.connect(
            host="127.0.0.1", port=self.port, user="root", autocommit=True,
            connect_timeout=timeout, read_timeout=60, write_timeout=60,
        )  # fmt: skip

    def query(self, statement: str, params: tuple[Any, ...] = ()) -> list[dict[str, Any]]:
        """Run one statement directly (not through any proxy); rows as dicts."""
        import pymysql.cursors

        conn = self.connect()
        try:
            with conn.cursor(pymysql.cursors.DictCursor) as cursor:
                cursor.execute(statement, params or None)
                return list(cursor.fetchall()) if cursor.description else []
        finally:
            conn.close()

    def one(self, statement: str) -> Any:
        return next(iter(self.query(statement)[0].values()))

    def status(self, name: str) -> str:
        rows = self.query("SHOW GLOBAL STATUS LIKE %s", (name,))
        return str(rows[0]["Value"]) if rows else ""

    def slave_status(self) -> dict[str, Any]:
        rows = self.query("SHOW SLAVE STATUS")
        return rows[0] if rows else {}

    def binlog_bytes(self, upto_file: str, upto_pos: int, from_file: str, from_pos: int) -> int:
        """Bytes of this server's binary log from one position to another, the
        files between counted by their size on disk (still there after kill -9)."""
        if from_file == upto_file:
            return max(0, upto_pos - from_pos)
        if not from_file:  # nothing received yet: from the first file's start
            from_file, from_pos = sorted(p.name for p in self.data.glob("binlog.[0-9]*"))[0], 0
        total, file = -from_pos, from_file
        while file != upto_file:
            total += (self.data / file).stat().st_size
            stem, number = file.rsplit(".", 1)
            file = f"{stem}.{int(number) + 1:0{len(number)}d}"
        return max(0, total + upto_pos)

    def binlog_end(self) -> tuple[str, int, str]:
        """The end of this (stopped) server's binary log: its last file, that
        file's size (the position after its last event) and the last GTID in it
        (or in the file's opening GTID list, when no transaction followed)."""
        index = (self.data / "binlog.index").read_text().split()
        last = Path(index[-1]).name
        size = (self.data / last).stat().st_size
        done = subprocess.run(
            [_binary("mariadb-binlog"), str(self.data / last)],
            capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        # a last event cut off mid-write ends the output with an error: the
        # events before it are what counts
        found = re.findall(r"GTID (\d+-\d+-\d+)|Gtid list \[([^\]]*)\]", done.stdout)
        gtid = ""
        for one, listed in found:
            if one:
                gtid = one
            elif listed.strip():
                gtid = listed.split(",")[-1].strip()
        return last, size, gtid

    def kill(self) -> None:
        """SIGKILL: the process is gone at once, nothing flushed or closed."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(30)

    def close(self) -> None:
        self.kill()
        shutil.rmtree(self.dir, ignore_errors=True)


class _Sampler:
    """Samples the primary's binary log GTID position every :data:`SAMPLE_S`,
    so that a failover can tell since when the primary had been committing
    what the replica never received. MariaDB 10.11 keeps no sub-second commit
    time a replica could be compared with (PostgreSQL's
    ``pg_last_xact_replay_timestamp``); a 20 ms sample is precise enough for a
    lag of hundreds of milliseconds."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self.times: list[float] = []
        self.seqs: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        conn = None
        while not self._stop.is_set():
            try:
                if conn is None:
                    conn = self.node.connect(timeout=1)
                with conn.cursor() as cursor:
                    cursor.execute("SELECT @@global.gtid_binlog_pos")
                    seq = _seq(str(cursor.fetchone()[0]))
                if not self.seqs or seq != self.seqs[-1]:
                    self.times.append(time.time())
                    self.seqs.append(seq)
            except Exception:
                conn = None
            self._stop.wait(SAMPLE_S)
        if conn is not None:
            conn.close()

    def first_seen_after(self, seq: int) -> float | None:
        """When the primary was first seen past ``seq`` (None: never)."""
        i = bisect_right(self.seqs, seq)
        return self.times[i] if i < len(self.seqs) else None

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)


@dataclass
class MariaDBFailover(Failover):
    """:class:`~failover.Failover` for MariaDB: ``primary_lsn`` /
    ``standby_lsn`` are binary log coordinates of the primary (``file:pos``, the
    replica's being what it had received), ``behind_bytes`` the distance
    between them, ``timeline`` the new primary's ``server_id`` (the GTIDs it
    writes carry it). ``behind_ms``: how long before the cut the primary had
    first been seen committing a transaction the replica never received, from
    :class:`_Sampler` (0 when it had them all, and also when what it lacked
    was committed within the last sample, 20 ms: see behind_transactions)."""

    #: the primary's @@gtid_binlog_pos at the cut, the replica's received
    #: (Gtid_IO_Pos) and applied (@@gtid_slave_pos, once its relay log was
    #: applied) positions
    primary_gtid: str
    received_gtid: str
    applied_gtid: str
    #: transactions the primary had committed to its binary log that the
    #: replica had not received / did not apply
    behind_transactions: int
    lost_transactions: int
    #: semisync: the primary's Rpl_semi_sync_master_status (ON: still waiting
    #: for acknowledgements) and Rpl_semi_sync_master_no_tx (commits it made
    #: without one) at the cut; "" / 0 in async mode
    semisync_status: str
    semisync_no_tx: int


class MariaDBPair(ReplicatedPair):
    """A MariaDB primary, its replica, the link between them and the movable
    address clients use (see the module's docstring)."""

    MODES = MODES

    def __init__(self, mode: str, lag: float) -> None:
        super().__init__(mode, lag)
        self.primary: Node | None = None
        self.standby: Node | None = None
        self.failovers: list[MariaDBFailover] = []
        self._sampler: _Sampler | None = None
        self._nodes: list[Node] = []

    @property
    def url(self) -> str:
        """The clients' URL: through the movable address."""
        assert self.address is not None
        return f"mysql+pymysql://root@127.0.0.1:{self.address.port}/{DATABASE}"

    @property
    def primary_url(self) -> str:
        """The current primary itself, for the harness's own reads."""
        assert self.primary is not None
        return self.primary.url

    def _node(self, *, read_only: bool) -> Node:
        node = Node(f"maria{len(self._nodes) + 1}", len(self._nodes) + 1, self.mode)
        self._nodes.append(node)
        node.start(read_only=read_only)
        return node

    def start(self) -> MariaDBPair:
        """Start the primary, a replica and the address; returns self."""
        self.primary = self._node(read_only=False)
        self.primary.query(f"CREATE DATABASE IF NOT EXISTS `{DATABASE}`")
        self.address = TcpProxy(self.primary.address)
        self._sampler = _Sampler(self.primary)
        self.add_standby()
        return self

    def add_standby(self, timeout: float = 120.0) -> None:
        """A fresh replica of the current primary through a new link, from a
        consistent dump and its GTID position; returns once it replicates (in
        ``semisync`` mode, once the primary counts it as a semi-sync replica)."""
        primary = self.primary
        assert primary is not None and self.standby is None
        replica = self._node(read_only=True)
        dump = subprocess.run(
            [
                _binary("mariadb-dump"), "-h", "127.0.0.1", "-P", str(primary.port), "-uroot",
                "--single-transaction", "--gtid", "--master-data=2", "--databases", DATABASE,
            ],
            capture_output=True, timeout=timeout, check=False,
        )  # fmt: skip
        if dump.returncode:
            raise RuntimeError(f"mariadb-dump of {primary.name} failed: {dump.stderr.decode()}")
        found = re.search(rb"SET GLOBAL gtid_slave_pos='([^']*)'", dump.stdout)
        if found is None:
            raise RuntimeError(f"mariadb-dump of {primary.name}: no gtid_slave_pos in the dump")
        replica.load(dump.stdout)
        self.link = TcpProxy(primary.address, lag=self.lag)
        replica.query("RESET MASTER")
        replica.query("SET GLOBAL gtid_slave_pos = %s", (found.group(1).decode(),))
        replica.query(
            "CHANGE MASTER TO MASTER_HOST='127.0.0.1', MASTER_PORT=%s, MASTER_USER='root',"
            " MASTER_CONNECT_RETRY=1, MASTER_USE_GTID=slave_pos",
            (self.link.port,),
        )
        if self.mode == "semisync":
            # before the replica connects: it asks for semi-sync when it does,
            # and commits meanwhile wait for it (wait_no_slave)
            primary.query("SET GLOBAL rpl_semi_sync_master_enabled = 1")
        replica.query("START SLAVE")
        self.standby = replica

        def replicating() -> bool:
            st = replica.slave_status()
            if st.get("Last_IO_Error") or st.get("Last_SQL_Error"):
                raise RuntimeError(
                    f"{replica.name}: {st.get('Last_IO_Error')} {st.get('Last_SQL_Error')}"
                )
            return st.get("Slave_IO_Running") == "Yes" and st.get("Slave_SQL_Running") == "Yes"

        wait_for(replicating, timeout, f"{replica.name} to replicate {primary.name}", interval=0.1)
        if self.mode == "semisync":
            wait_for(
                lambda: (
                    primary.status("Rpl_semi_sync_master_clients") not in ("", "0")
                    and primary.status("Rpl_semi_sync_master_status") == "ON"
                ),
                timeout,
                f"{replica.name} to be {primary.name}'s semi-sync replica",
                interval=0.1,
            )

    def _drain(self, replica: Node, timeout: float) -> None:
        """Wait until the replica applied every transaction its relay log holds
        whole (a transaction cut off mid-way by the link's cut is not applied:
        the primary never finished sending it, it is lost as unreceived)."""

        def applied() -> bool:
            st = replica.slave_status()
            if not st:
                return True
            if st.get("Last_SQL_Error"):
                raise RuntimeError(f"{replica.name}: {st['Last_SQL_Error']}")
            if st.get("Slave_SQL_Running") != "Yes":
                return True
            received, done = (
                str(st.get("Gtid_IO_Pos") or ""),
                replica.one("SELECT @@global.gtid_slave_pos"),
            )
            idle = str(st.get("Slave_SQL_Running_State", "")).startswith(
                "Slave has read all relay log"
            )
            return idle and _seq(str(done)) >= _seq(received)

        try:
            wait_for(applied, timeout, f"{replica.name} to apply its relay log", interval=0.02)
        except AssertionError as exc:
            print(f"failover_mariadb: {exc}; promoting it anyway", file=sys.stderr)

    def failover(self, timeout: float = 60.0) -> MariaDBFailover:
        """Kill the primary, promote the replica, move the address to it."""
        old, new, link, address = self.primary, self.standby, self.link, self.address
        assert old is not None and new is not None and link is not None and address is not None
        # read before the cut: once the link is cut, a semi-sync primary's
        # commits wait for an acknowledgement holding the binary log's lock,
        # and SHOW MASTER STATUS (even some status reads) waits behind them
        semisync_status = old.status("Rpl_semi_sync_master_status") if self.mode != "async" else ""
        no_tx = int(old.status("Rpl_semi_sync_master_no_tx") or 0) if self.mode != "async" else 0
        # The node is lost, all at once: its clients' traffic goes silent, what
        # is on the link goes with it (cut drops the bytes the lag held), then
        # the server itself. Its final position is read off its binary log
        # afterwards (binlog_end): what kill -9 left there.
        cut_at = time.time()
        address.blackhole()
        link.cut()
        old.kill()
        stopped_at = time.time()
        if self._sampler is not None:
            self._sampler.stop()
        received = new.slave_status()
        received_gtid = str(received.get("Gtid_IO_Pos") or "")
        standby_file = str(received.get("Master_Log_File") or "")
        standby_pos = int(received.get("Read_Master_Log_Pos") or 0)
        self._drain(new, 30.0)
        applied_gtid = str(new.one("SELECT @@global.gtid_slave_pos"))
        new.query("STOP SLAVE")
        new.query("RESET SLAVE ALL")
        new.query("SET GLOBAL read_only = 0")
        wait_for(lambda: _writable(new), timeout, f"{new.name} to accept writes", interval=0.05)
        promoted_at = time.time()
        address.move(new.address)
        address.restore()
        moved_at = time.time()
        primary_file, primary_pos, primary_gtid = old.binlog_end()
        behind_bytes = old.binlog_bytes(primary_file, primary_pos, standby_file, standby_pos)
        missing_since = (
            self._sampler.first_seen_after(_seq(received_gtid)) if self._sampler else None
        )
        link.close()
        old.close()
        self.primary, self.standby, self.link = new, None, None
        self._sampler = _Sampler(new)
        record = MariaDBFailover(
            number=len(self.failovers) + 1, cut_at=cut_at, stopped_at=stopped_at,
            promoted_at=promoted_at, moved_at=moved_at, behind_bytes=behind_bytes,
            behind_ms=round(max(0.0, cut_at - missing_since) * 1000, 1) if missing_since else 0.0,
            primary_lsn=f"{primary_file}:{primary_pos}",
            standby_lsn=f"{standby_file}:{standby_pos}", timeline=new.server_id,
            primary_gtid=primary_gtid, received_gtid=received_gtid, applied_gtid=applied_gtid,
            behind_transactions=max(0, _seq(primary_gtid) - _seq(received_gtid)),
            lost_transactions=max(0, _seq(primary_gtid) - _seq(applied_gtid)),
            semisync_status=semisync_status, semisync_no_tx=no_tx,
        )  # fmt: skip
        self.failovers.append(record)
        return record

    def _close_servers(self) -> None:
        if self._sampler is not None:
            self._sampler.stop()
        for node in self._nodes:
            node.close()


def _writable(node: Node) -> bool:
    """True once ``node`` is no replica, not read-only, and commits a write
    (into a table of the harness's own, outside the clients' tables)."""
    try:
        if node.slave_status() or int(node.one("SELECT @@global.read_only")):
            return False
        node.query("CREATE TABLE IF NOT EXISTS `test`.`failover_probe` (n INT PRIMARY KEY)")
        node.query("REPLACE INTO `test`.`failover_probe` VALUES (1)")
        return True
    except Exception:
        return False
