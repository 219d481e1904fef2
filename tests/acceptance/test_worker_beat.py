"""``celery worker -B`` in every pod: the beat each worker embeds coordinates
like a ``celery beat`` replica, and one that cannot run stops its worker.

With ``-B`` Celery runs beat in a child process of the worker and ignores its
death, so a bad setting would leave a healthy-looking worker with no beat
(``celery_singlebeat/embedded.py``). The workers here consume a queue nobody
sends to: what the beats publish stays in the broker for the reader to judge.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from harness import (
    US,
    Rig,
    check_slots,
    collect,
    group_env,
    kill_group,
    wait_for,
)

#: every embedded beat must send (below): it sends the entries it proposes
#: first, a binomial share of them (rendezvous hashing of the replica ids);
#: with 24 entries over 3, one without any is a 1-in-5,000 draw (5: 2 in 5)
ENTRIES = 24
PERIOD_US = US
LEASE = 3.0

pytestmark = pytest.mark.slow


@pytest.mark.postgres
@pytest.mark.redis
def test_three_workers_with_embedded_beat_send_every_slot_once(
    rig: Rig, pg_url: str, redis_url: str, table_prefix: str
) -> None:
    broker = f"{redis_url}/2"
    reader, db, env = rig.fleet(
        broker,
        pg_url,
        table_prefix,
        SB_ENTRIES=str(ENTRIES),
        SB_EVERY="1",
        SB_LEASE=str(LEASE),
    )
    workers = [
        rig.start_worker(
            env,
            f"worker-{i}",
            app="beatapp",
            concurrency=1,
            extra=("-B",),
            queues=f"{reader.queue}-idle",
        )
        for i in range(3)
    ]
    wait_for(
        lambda: all("singlebeat: connected to" in w.log() for w in workers),
        60,
        "every embedded beat to connect",
        interval=0.2,
    )
    anchors = db.anchors()
    assert len(anchors) == ENTRIES, anchors
    # active-active: every worker's beat wins slots, as separate beat processes do
    wait_for(
        lambda: all(w.sent_task_ids() for w in workers),
        30,
        "every embedded beat to send",
        interval=0.2,
    )
    # A pod lost with everything in it: the worker and its beat child.
    victim = workers[0]
    kill_group(victim)
    killed_at = db.now_us()
    survivors = workers[1:]
    wait_for(
        lambda: db.now_us() > killed_at + int((LEASE + 3) * US),
        LEASE + 20,
        "the lease of anything the victim held to run out",
        interval=0.2,
    )
    out = collect(
        rig, reader, db, anchors, PERIOD_US, beats=workers, alive=survivors, timeout=LEASE + 10
    )
    report = check_slots(out.messages, out.expected, out.upto_us, out.rows, out.published)
    assert not report.problems, "\n".join(report.problems) + "\n" + rig.group.outputs()
    wanted = sum(len(slots) for slots in out.expected.values())
    assert wanted >= ENTRIES * (LEASE + 3), wanted  # the wait after the kill, at least
    after = [m for m in out.messages if m.at_us > killed_at + int(LEASE * US)]
    assert after, "the surviving workers' beats sent nothing after the kill"


@pytest.mark.parametrize(
    ("settings", "needle"),
    [
        ({"SB_LEASE": "-3"}, "singlebeat_lease=-3.0: must be positive"),
        ({"SB_CREATE_SCHEMA": "0"}, "singlebeat_create_schema is False"),
    ],
    ids=["bad-setting", "no-schema"],
)
def test_an_embedded_beat_that_cannot_run_stops_its_worker(
    rig: Rig, settings: dict[str, str], needle: str, tmp_path: Path, redis_url: str
) -> None:
    env = group_env(
        broker=f"{redis_url}/2",
        db_url=f"sqlite:///{tmp_path}/beat.sqlite",
        prefix="singlebeat_",
        queue="sb-embedded-unused",
        **settings,
    )
    worker = rig.start_worker(env, "worker", app="beatapp", concurrency=1, extra=("-B",))
    # Celery would keep this worker consuming without a beat: it must exit, and
    # with a failure status, so that the pod restarts with the reason in its log.
    code = worker.proc.wait(60)
    log = worker.log()
    # 1: Celery's warm shutdown on SIGINT, after the tasks in progress
    assert code == 1, log[-4000:]
    assert "cannot run" in log and needle in log, log[-4000:]
    assert "Stopping the worker" in log, log[-4000:]
