"""Health probes and metrics of real processes, judged from outside as a
kubelet and a Prometheus server see them.

One process set for every assertion (it takes a while to start): three real
``celery beat`` replicas on PostgreSQL (through a cuttable proxy) and Redis,
each with its HTTP listener and status file; a real prefork worker (``-c 2``)
running SingletonTasks with prometheus_client's multiprocess mode and the
endpoint docs/operations.md shows; and a real ``prometheus`` server scraping
all four. Then:

1. sending: every probe (HTTP and exec) says live and ready;
2. the worker runs SingletonTasks (concurrent keys, a busy key, a repeated
   slot): Prometheus's sums of its counters equal what the record file and
   the worker's log show, and more than one pool child counted;
3. the database is cut for every replica: readiness fails and liveness
   holds, on both probes; the fleet's ``sum(singlebeat_slots_sent_total)``
   in Prometheus equals the messages counted in the broker;
4. it comes back: ready again;
5. one replica is SIGSTOPped and another's loop hangs (its HTTP listener
   still answers): liveness fails within twice its bound on both, the third
   stays live; resumed, they are live again. (A stopped process answers no
   HTTP at all, at once; its exec probe fails once its file is older than the
   bound, and from then on both agree.) A replica stopped gracefully closes
   its listener and marks its status file stopped.

No password given to the replicas reaches a metric label, a probe's answer,
the status file or Prometheus.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import quote

import pytest
from harness import (
    DONE_LINE,
    DROPPED_LINE,
    SKIPPED_LINE,
    BeatProcess,
    PrometheusServer,
    Rig,
    Sender,
    executions,
    free_port,
    log_ids,
    read_records,
    replica_ids_with_shares,
    wait_connected,
    wait_for,
    wait_ready,
)
from sqlalchemy.engine import make_url

from celery_singlebeat.timeline.slots import SLOT_HEADER, slot_header, slot_task_id

#: singlebeat_liveness_timeout of the replicas: the shortest a setting allows is
#: above the 10 s outage backoff; 15 s keeps a margin for this loaded machine
LIVENESS = 15.0
SECRET = "Pr0m-s3cret"
USER_SECRET, QUERY_SECRET, OPTION_SECRET = (f"{SECRET}-{w}" for w in ("user", "query", "option"))
PYTHON = sys.executable


class Probed:
    """One beat replica and the two ways a kubelet can ask it."""

    def __init__(self, beat: BeatProcess, port: int, status_file: Path) -> None:
        self.beat = beat
        self.port = port
        self.status_file = status_file

    def http(self, check: str) -> tuple[int | None, str]:
        """(status, body) of /livez or /readyz; (None, why) when nothing answers
        within 2 s (a stopped process: the kubelet counts it as failing)."""
        url = f"http://127.0.0.1:{self.port}/{check}z"
        try:
            with urllib.request.urlopen(url, timeout=2) as answer:
                return answer.status, answer.read().decode()
        except urllib.error.HTTPError as error:
            return error.code, error.read().decode()
        except OSError as error:
            return None, f"no answer: {error}"

    def exec(self, check: str) -> tuple[int, str]:
        done = subprocess.run(
            [PYTHON, "-m", "celery_singlebeat", "health", f"--{check}",
             "--status-file", str(self.status_file)],
            capture_output=True, text=True, timeout=30,
        )  # fmt: skip
        assert done.stderr == "", done.stderr
        return done.returncode, done.stdout

    def verdict(self, check: str) -> tuple[bool, str]:
        """Both probes' verdict, asserted to agree; (ok, the exec probe's line).

        The exec probe is read between two HTTP reads: when those two differ,
        the state changed while the probes ran (a reconnect between them) and
        they are read again, so that only a real disagreement fails.
        """
        for _ in range(5):
            status, body = self.http(check)
            code, line = self.exec(check)
            assert code in (0, 1) and line.count("\n") == 1, line
            again, _body = self.http(check)
            if (again == 200) is (status == 200):
                break
        assert (status == 200) is (code == 0), (self.beat.name, check, status, body, line)
        if status is not None:
            # the same reason, give or take the seconds between the two reads
            same = re.sub(r"[\d.]+s", "Ns", body) == re.sub(r"[\d.]+s", "Ns", line)
            assert same, (self.beat.name, body, line)
        return code == 0, line


def _worker_files(directory: Path) -> set[str]:
    """The pids whose counter files prometheus_client wrote in its directory."""
    return {m[1] for p in directory.iterdir() if (m := re.fullmatch(r"counter_(\d+)\.db", p.name))}


@pytest.mark.slow
@pytest.mark.postgres
@pytest.mark.redis
def test_probes_and_metrics_of_real_replicas_and_a_prefork_worker_scraped_by_prometheus(
    rig: Rig, pg_url: str, redis_url: str, table_prefix: str
) -> None:
    broker = f"{redis_url}/9"
    pg = make_url(pg_url)
    proxy = rig.proxy((pg.host or "127.0.0.1", pg.port or 5432))
    # the shared PostgreSQL trusts everybody: the passwords are never checked,
    # only carried (the user part, the query, connect_args)
    via_proxy = pg.set(host="127.0.0.1", port=proxy.port, password=USER_SECRET)
    beats_url = via_proxy.update_query_dict({"password": QUERY_SECRET}).render_as_string(
        hide_password=False
    )
    reader, db, env = rig.fleet(
        broker,
        pg_url,
        table_prefix,
        beats_url=beats_url,
        SB_ENTRIES="5",
        SB_ENGINE_OPTIONS=f'{{"connect_args": {{"password": "{OPTION_SECRET}"}}}}',
        SB_HTTP_BIND="127.0.0.1",
        SB_LIVENESS=str(LIVENESS),
    )
    workdir = rig.workdir
    hang_file = workdir / "hang"
    probed: list[Probed] = []
    # beat-c must win a slot to hang: each of the three gets a share of the 5
    ids = replica_ids_with_shares(["beat-a", "beat-b", "beat-c"], 5)
    for name in ("beat-a", "beat-b", "beat-c"):
        port, status_file = free_port(), workdir / f"{name}.status"
        extra = {
            "SB_HTTP_PORT": str(port),
            "SB_STATUS_FILE": str(status_file),
            "SB_REPLICA_ID": ids[name],
        }
        if name == "beat-c":
            extra["SB_HANG_FILE"] = str(hang_file)
        probed.append(Probed(rig.start_beat({**env, **extra}, name), port, status_file))
    stopped, steady, hung = probed
    beats = [p.beat for p in probed]

    # the worker: its own queue, fed by the test; leases in the same tables
    sender = Sender(broker)
    queue = sender.queue()
    record = workdir / "record.jsonl"
    multiproc = workdir / "multiproc"
    multiproc.mkdir()  # empty at start, as the docs ask
    worker_port = free_port()
    worker = rig.start_worker(
        {
            "SB_BROKER": broker,
            "SB_URL": pg_url,
            "SB_PREFIX": table_prefix,
            "SB_QUEUE": queue,
            "SB_TTL": "3",
            "SB_RECORD": str(record),
            "SB_WORKER_METRICS": "1",
            "PROMETHEUS_MULTIPROC_DIR": str(multiproc),
            "SINGLETON_METRICS_PORT": str(worker_port),
        },
        "worker",
        pool="prefork",
        concurrency=2,
    )
    prometheus = PrometheusServer(
        workdir,
        {
            "singlebeat": [f"127.0.0.1:{p.port}" for p in probed],
            "singleton-workers": [f"127.0.0.1:{worker_port}"],
        },
    )
    try:
        wait_connected(beats)
        wait_ready(worker)
        wait_for(lambda: len(reader.messages()) >= 10, 30, "sending")
        wait_for(
            lambda: (up := prometheus.targets_up()) and len(up) == 4 and all(up.values()),
            30,
            "prometheus to scrape all four targets",
            interval=0.3,
        )

        # 1. sending: live and ready, on both probes
        for p in probed:
            assert p.verdict("live")[0], p.beat.log()[-3000:]
            assert p.verdict("ready")[0], p.beat.log()[-3000:]

        # 2. SingletonTasks in two pool children: two keys at once, then one
        # key three times at once (one runs, the others find it busy), then a
        # slot delivered twice (the repeat is dropped)
        for key in ("k1", "k2"):
            sender.send(queue, "singletonapp.hold", 1.5, kwargs={"key": key})
        wait_for(lambda: len(executions(read_records(record))) >= 2, 30, "two executions")
        for _ in range(3):
            sender.send(queue, "singletonapp.hold", 1.5, kwargs={"key": "same"})
        slot_us = db.now_us() // 1_000_000 * 1_000_000
        for _ in range(2):
            sender.send(
                queue,
                "beatapp.probe",
                7,
                task_id=slot_task_id("probe-x", slot_us),
                headers={SLOT_HEADER: slot_header("probe-x", slot_us)},
            )
        wait_for(
            lambda: len(log_ids([worker], DONE_LINE)) >= 7,
            45,
            "the worker to finish all seven calls",
            interval=0.2,
        )
        ran = executions(read_records(record))
        skipped = log_ids([worker], SKIPPED_LINE)
        dropped = log_ids([worker], DROPPED_LINE)
        assert len(ran) + len(skipped) + len(dropped) == 7, worker.log()[-4000:]
        assert len(dropped) == 1 and skipped, (ran, skipped, dropped)
        held = [e for e in ran if e.task == "singletonapp.hold"]

        def worker_counts() -> tuple[float | None, ...]:
            return tuple(
                prometheus.scalar(f"sum({name})")
                for name in (
                    "singlebeat_singleton_acquired_total",
                    'singlebeat_singleton_busy_total{policy="skip"}',
                    "singlebeat_singleton_repeats_dropped_total",
                )
            )

        wanted = (float(len(ran)), float(len(skipped)), 1.0)
        wait_for(lambda: worker_counts() == wanted, 15, f"worker counters {wanted} in prometheus")
        # each 1.5 s run renews its 3 s lease at a third of the TTL, 1 s in; a
        # heartbeat thread that a busy machine runs late past the run's end
        # renews nothing, so only "some renewed" is certain
        renewals = prometheus.scalar("sum(singlebeat_singleton_renewals_total)")
        assert renewals is not None and 1 <= renewals <= 2 * len(held), renewals
        assert prometheus.scalar("sum(singlebeat_singleton_renewal_seconds_count)") == renewals
        assert len({e.pid for e in ran}) >= 2 and len(_worker_files(multiproc)) >= 2

        # 3. the database cut for every replica: not ready, still live; the
        # replicas send nothing, so the broker's count stops
        proxy.cut()
        wait_for(lambda: all(b.lines("unreachable (") for b in beats), 20, "every replica's outage")
        for p in probed:
            ok, line = p.verdict("ready")
            assert not ok and "database unreachable" in line, line
            assert p.verdict("live")[0]

        def settled() -> int | None:
            before = len(reader.messages())
            time.sleep(1.0)  # a replica in an outage publishes nothing: no change
            return before if len(reader.messages()) == before else None

        in_broker = wait_for(settled, 10, "the broker's count to stop growing", interval=0)
        wait_for(
            lambda: prometheus.scalar("sum(singlebeat_slots_sent_total)") == in_broker,
            15,
            f"sum(singlebeat_slots_sent_total) == {in_broker} in prometheus",
            interval=0.3,
        )
        assert prometheus.scalar("sum(singlebeat_outage)") == 3
        assert (prometheus.scalar("sum(singlebeat_database_errors_total)") or 0) >= 3
        assert (prometheus.scalar("sum(singlebeat_dispatch_delay_seconds_count)") or 0) == in_broker
        sent_by = {
            labels["instance"]: value
            for labels, value in prometheus.query("sum by (instance) (singlebeat_slots_sent_total)")
        }
        # each replica's own count (which replicas sent depends on who won)
        assert sum(sent_by.values()) == in_broker and len(sent_by) <= 3, sent_by
        for p in probed:  # still live after the outage's backoff grew
            assert p.verdict("live")[0]

        # 4. back: ready again, on both probes
        proxy.restore()
        wait_for(lambda: all(p.verdict("ready")[0] for p in probed), 30, "ready again", 0.5)
        wait_for(lambda: prometheus.scalar("sum(singlebeat_outage)") == 0, 10, "outage gauges 0")

        # 5. a stopped process and a hung loop: not live within twice the bound
        hang_file.touch()
        wait_for(lambda: "SB-HANGING" in hung.beat.log(), 20, "beat-c's loop to hang")
        stopped.beat.signal(signal.SIGSTOP)
        since = time.monotonic()
        # A stopped process answers no HTTP at once (the kubelet's timeout
        # fails it); its status file goes stale only after the bound: the two
        # agree from then on. The hung one's listener answers all along.
        assert stopped.http("live")[0] is None
        wait_for(lambda: stopped.exec("live")[0] == 1, 2 * LIVENESS, "beat-a's exec probe to fail")
        took = time.monotonic() - since
        assert not stopped.verdict("live")[0]
        wait_for(lambda: not hung.verdict("live")[0], 2 * LIVENESS, "beat-c not live")
        assert stopped.http("live")[0] is None  # still no answer
        status, body = hung.http("live")  # the hung one answers: its loop is stale
        assert status == 503 and re.match(r"failing: not live: last loop [\d.]+s ago", body), body
        ok, line = hung.verdict("ready")
        assert not ok and "not live" in line
        assert steady.verdict("live")[0] and steady.verdict("ready")[0]
        stopped.beat.signal(signal.SIGCONT)
        hang_file.unlink()
        for p in (stopped, hung):
            # the two reads straddle the instant the resumed loop ends its tick:
            # while it turns, one may say stale and the other fresh, so wait for
            # both to say live (verdict() asserts they agree, once they settle)
            wait_for(
                lambda p=p: p.http("live")[0] == 200 and p.exec("live")[0] == 0,
                20,
                f"{p.beat.name} live again",
                0.5,
            )
            assert p.verdict("live")[0]

        # no secret in any label Prometheus stored, nor in what the probes said
        labels = prometheus.query('{__name__=~"singlebeat_.+"}')
        assert labels
        shown = [str(found) for found in labels]
        for p in probed:
            shown += [p.http("live")[1], p.http("ready")[1], p.status_file.read_text()]
            shown += [urllib.request.urlopen(f"http://127.0.0.1:{p.port}/metrics").read().decode()]
        for secret in (SECRET, quote(SECRET)):
            assert not [s for s in shown if secret in s]
            assert not [b.name for b in beats if secret in b.log()]
        assert all(b.alive() for b in beats) and worker.alive()

        # a graceful stop closes the listener and marks the status file stopped
        steady.beat.stop()
        assert steady.beat.proc.returncode == 0, steady.beat.log()[-3000:]
        assert steady.exec("live") == (1, "failing: not live: the scheduler stopped\n")
        assert steady.http("live")[0] is None
        print(
            f"telemetry: {in_broker} slots in the broker = sum(singlebeat_slots_sent_total) "
            f"{sent_by}; worker {wanted}; not live {took:.1f}s after the stop/hang "
            f"(bound {LIVENESS:g}s)"
        )
    finally:
        if hang_file.exists():
            hang_file.unlink()  # a hung tick would hold off the SIGTERM at teardown
        prometheus.close()
        sender.close()
