"""The short form of the chaos run (``benchmarks/chaos.py``): 5 real beat
replicas (two with clocks 90 s off under libfaketime), 2 real workers of
SingletonTasks, a PostgreSQL cluster and a Redis server of the run's own, and
every fault of the long form at least once, on a fixed seed: a replica
SIGKILLed and restarted, replicas paused past their lease right after a claim
and right after a publish, a rolling restart between two versions of one
entry's schedule, a PostgreSQL restart, a 30 s PostgreSQL outage, a failover
of the PostgreSQL primary to its asynchronous standby (its link 300 ms
behind) and a broker restart; meanwhile a third lane edits stored entries
(new schedules and arguments, disable and enable, delete and add again,
single runs and entries limited to N runs, an edit right before the
failover's cut). No slot may execute twice, and every slot outside the outage
must execute; no stored entry's slot may go out under a definition replaced
more than a second before it, and each limited entry must run exactly as
many times as asked.
"""

from __future__ import annotations

import shutil
import sys
from datetime import datetime, timezone
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import IN_CI

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import chaos  # noqa: E402

#: seconds of faults: the first round of each lane (every kind once) fits
DURATION = 75.0
SEED = 7
LEASE = 5.0


def _missing() -> str | None:
    if chaos.libfaketime() is None:
        return "libfaketime is not installed (apt-get install faketime)"
    if shutil.which("redis-server") is None:
        return "redis-server is not installed"
    return None


@pytest.mark.slow
def test_chaos_short_form(tmp_path: Path) -> None:
    missing = _missing()
    if missing:
        if IN_CI:
            pytest.fail(missing)
        pytest.skip(missing)
    report = chaos.run(
        chaos.Config(duration=DURATION, seed=SEED, lease=LEASE, workdir=tmp_path, quiet=True)
    )
    print(report.text)
    kinds = {f["kind"] for f in report.faults}
    assert kinds >= {
        "kill",
        "pause",
        "rolling restart",
        "postgres restart",
        "postgres outage",
        "postgres failover",
        "broker restart",
    }, report.text
    assert report.executed_twice == 0, report.text
    # the failover really lost writes (the standby was behind), and what the
    # replicas did about them held: nothing ran twice around it
    (failover,) = report.failovers
    assert failover["behind_bytes"] > 0 or failover["behind_ms"] > 0, report.text
    assert failover["executed_twice"] == 0, report.text
    assert report.lost == 0, report.text
    assert report.unexpected == 0, report.text
    assert report.early == 0, report.text
    # nothing left later than lease + lease/3 (+1 s) after its instant unless the
    # database or the broker failed meanwhile (abandoned claims included; the
    # seed's takeovers all come near such faults, test_failures.py holds the
    # bound on its own)
    assert report.bound_s == pytest.approx(LEASE + LEASE / 3 + 1, abs=1e-5), report.text
    assert report.over_bound == 0, report.text
    assert report.worst_takeover_s <= report.bound_s, report.text
    # the rolling restart ran both versions side by side, and the union ran:
    # the every-1-s version's own instants while one of its replicas ran
    assert report.roll_required > 0, report.text
    assert not report.problems, report.text
    assert report.due_required > 100 and report.executed >= report.due_required, report.text
    # the outage really left slots to the missed-run policy, and it sent some
    assert any(w["slots_due"] > 0 for w in report.policy_windows), report.text
    # both skewed replicas ran with their clocks 90 s off
    offsets = [abs(float(v.split()[0])) for v in report.clock_offsets.values()]
    assert len(offsets) == 2 and all(80_000 < o < 100_000 for o in offsets), report.text
    # the editor lane edited stored entries through every fault, a failover's
    # cut included: nothing went out under a definition replaced more than a
    # second before, no stored slot twice or lost, each limited entry exactly
    # as many times as asked (the missed-run policy's share of an outage aside)
    edits = report.edits
    assert edits.committed >= 15 and edits.due > 30, report.text
    assert edits.at_failover, report.text
    assert edits.outdated == 0, report.text
    assert edits.premature == 0 and edits.not_a_slot == 0, report.text
    assert edits.executed_twice == 0, report.text
    assert edits.lost == 0, report.text
    assert edits.limited and edits.limited_wrong == 0, report.text
    assert {x["entry"][:4] for x in edits.limited} >= {"once", "max-"}, report.text
    # the workers ran this checkout
    assert report.code_under_test == [str(ROOT / "celery_singlebeat" / "__init__.py")], report.text


def test_an_instant_only_one_version_has_is_required_while_a_replica_of_it_runs() -> None:
    run = chaos.Chaos.__new__(chaos.Chaos)
    us = chaos.US
    run.lives = {
        # version 2 from t=10 s (connected at 12 s) until stopped at 30 s
        "r0.2": chaos.Life("2", 10 * us, connected_us=12 * us, ended_us=30 * us),
        "r1.1": chaos.Life("1", 0, connected_us=2 * us),
    }
    run.faults = [chaos.Fault("pause", "r0", "", 20 * us, end_us=25 * us, proc="r0.2")]
    run.holds = {}
    run.outages = {}
    upto = 100 * us
    # running and connected throughout: must run
    assert run.version_ran("2", 14 * us, 16 * us, upto)
    # before it connected, while it was paused, after it stopped: need not
    assert not run.version_ran("2", 11 * us, 13 * us, upto)
    assert not run.version_ran("2", 21 * us, 23 * us, upto)
    assert not run.version_ran("2", 31 * us, 33 * us, upto)
    # version 1 ran from 2 s to the end
    assert run.version_ran("1", 50 * us, 60 * us, upto)
    # may have: it had started (or started within the grace after the instant),
    # or had stopped less than a second before it
    assert run.version_may_have_run("2", 5 * us, upto)
    assert run.version_may_have_run("2", 30 * us + us // 2, upto)
    # no process of that version anywhere near: the instant is no slot
    assert not run.version_may_have_run("2", 3 * us, upto)
    assert not run.version_may_have_run("2", 32 * us, upto)


def test_a_hold_after_a_broken_connection_extends_when_a_version_must_run() -> None:
    """A replica held after a reconnect proposes its fallbacks when the hold
    ends: an instant only its version has is required only if it ran past
    that; stopped during the hold, it may or may not have sent it."""
    run = chaos.Chaos.__new__(chaos.Chaos)
    us = chaos.US
    run.faults = []
    log = (
        "[2026-12-03 08:00:42,000: INFO/MainProcess] singlebeat: replica vm:1:a reconnected "
        "to the database; its fallback proposals and sweeps wait 7.0s for the other "
        "replicas to write what they sent\n"
    )
    proc = SimpleNamespace(name="r0.1")
    holds = chaos.Chaos.read_holds([(proc, log)])  # type: ignore[list-item]
    run.outages = {}
    start = int(datetime(2026, 12, 3, 8, 0, 42).timestamp() * us)
    assert holds == {"r0.1": [(start, start + 7 * us)]}
    upto = start + 100 * us
    # the only process of version 2: held for 7 s, stopped 6 s into the hold
    run.lives = {"r0.1": chaos.Life("2", 0, connected_us=start - 40 * us, ended_us=start + 6 * us)}
    slot = start + 2 * us
    run.holds = {}
    assert run.version_ran("2", slot - us, slot + us, upto)  # without the hold: required
    run.holds = holds
    assert not run.version_ran("2", slot - us, slot + us, upto)
    # running past the hold's end (and the claim after it): required
    run.lives["r0.1"].ended_us = start + 9 * us
    assert run.version_ran("2", slot - us, slot + us, upto)
    # a hold that ended before the instant changes nothing
    later = start + 20 * us
    run.lives["r0.1"].ended_us = later + 2 * us
    assert run.version_ran("2", later - us, later + us, upto)


def test_a_replica_still_retrying_after_an_outage_need_not_send_its_versions_instants() -> None:
    """Seed 2 at 0af79c4 reported an every-1-s ``roll-0`` instant lost, 6.1 s
    after a 30 s outage, during the rolling restart back to every 2 s that
    had begun in it: the only version-2 replicas left were still in their
    outage backoff (up to 10 s after the database is back), connected long
    before as far as the judge knew. A replica retrying sends nothing; back
    within the grace of the instant it proposes it, as a fallback only after
    the hold that follows its reconnect."""
    run = chaos.Chaos.__new__(chaos.Chaos)
    us = chaos.US
    run.faults = []
    down = "2026-12-03 08:00:12,000"
    log = (
        f"[{down}: ERROR/MainProcess] singlebeat: database postgresql+psycopg://x@h/db "
        "unreachable (claim failed: OperationalError: connection refused); replica vm:1:a "
        "sends nothing until it is back, retrying with backoff up to 10s\n"
        "[2026-12-03 08:00:52,000: INFO/MainProcess] singlebeat: replica vm:1:a reconnected "
        "to the database; its fallback proposals and sweeps wait 7.0s for the other "
        "replicas to write what they sent\n"
    )
    proc = SimpleNamespace(name="r1.1")
    logs = [(proc, log)]
    run.holds = chaos.Chaos.read_holds(logs)  # type: ignore[arg-type]
    run.outages = chaos.Chaos.read_outages(logs)  # type: ignore[arg-type]
    t0 = int(datetime(2026, 12, 3, 8, 0, 0).timestamp() * us)
    back = t0 + 52 * us
    assert run.outages == {"r1.1": [(t0 + 10 * us, back)]}  # less the reconnect window
    upto = t0 + 200 * us
    # the database back for everyone at 48 s; the instant at 49 s, 3 s before
    # this replica reconnected: proposed as a fallback when its hold ends (59 s)
    run.lives = {"r1.1": chaos.Life("2", 0, connected_us=t0 - 60 * us, ended_us=t0 + 51 * us)}
    slot = t0 + 49 * us
    # stopped before it reconnected
    assert not run.version_ran("2", slot - us, slot + us, upto, True)
    # as the judge had it, blind to the replica's own outage: required, "lost"
    assert run.version_ran("2", slot - us, slot + us, upto)
    run.lives["r1.1"].ended_us = back + 6 * us
    assert not run.version_ran("2", slot - us, slot + us, upto, True)  # stopped inside the hold
    run.lives["r1.1"].ended_us = back + 9 * us
    assert run.version_ran("2", slot - us, slot + us, upto, True)  # ran past it: required
    # back more than the grace after the instant: the missed-run policy's
    early = t0 + 45 * us
    assert not run.version_ran("2", early - us, early + us, upto, True)
    # an instant after the reconnect's hold: as for any running replica
    after = back + 20 * us
    run.lives["r1.1"].ended_us = after + 2 * us
    assert run.version_ran("2", after - us, after + us, upto, True)


#: the end of a real worker log from a 10-minute run (seed 1): kombu's Redis
#: transport failing inside Celery's consumer at a broker restart
KOMBU_EXIT = """\
[2026-12-01 12:03:37,106: WARNING/MainProcess] consumer: Connection to broker lost. \
Trying to re-establish the connection... (network:ConnectionError)
[2026-12-01 12:03:37,108: INFO/MainProcess] Restoring 1 unacknowledged message(s)
[2026-12-01 12:03:37,108: CRITICAL/MainProcess] Unrecoverable error: \
AttributeError("'NoneType' object has no attribute 'hostname'")
Traceback (most recent call last):
  File "/x/.venv/lib/python3.11/site-packages/celery/worker/worker.py", line 271, in start
    self.blueprint.start(self)
  File "/x/.venv/lib/python3.11/site-packages/kombu/transport/redis.py", line 1959, in _connparams
    'host': conninfo.hostname or '127.0.0.1',
AttributeError: 'NoneType' object has no attribute 'hostname'
"""


def test_a_worker_celery_gave_up_on_is_told_from_one_the_package_broke() -> None:
    reason = chaos.celery_gave_up(KOMBU_EXIT)
    assert reason == "AttributeError(\"'NoneType' object has no attribute 'hostname'\")"
    # the same exit through a frame of celery_singlebeat stays a failure of the run
    ours = KOMBU_EXIT.replace(
        'File "/x/.venv/lib/python3.11/site-packages/celery/worker/worker.py"',
        f'File "{ROOT / "celery_singlebeat" / "singleton" / "task.py"}"',
    )
    assert chaos.celery_gave_up(ours) is None
    # so does any other exit: a crash, a SystemExit, a kill
    assert chaos.celery_gave_up("[...] worker: Warm shutdown (MainProcess)\n") is None
    # a child's task failing on the same broker restart, logged after it
    # through the package's frames, is not the main process's error (a seed-1
    # run stopped so, both workers at once, at 94e2301)
    child = (
        "[2026-12-04 00:16:19,600: WARNING/ForkPoolWorker-1] Task singletonapp.slot_probe"
        "[81ac1d5a] reject requeue=False: Error 111 connecting to 127.0.0.1:59541.\n"
        "Traceback (most recent call last):\n"
        f'  File "{ROOT / "celery_singlebeat" / "singleton" / "task.py"}", line 373, in _busy\n'
        "celery.exceptions.Reject: (OperationalError('Error 111'), False)\n"
    )
    assert chaos.celery_gave_up(KOMBU_EXIT + child) == reason
    assert chaos.celery_gave_up(ours + child) is None


def _resp(*args: bytes) -> bytes:
    return b"*%d\r\n" % len(args) + b"".join(b"$%d\r\n%s\r\n" % (len(a), a) for a in args)


def test_a_message_redis_gave_out_and_no_worker_registered_is_the_brokers_loss(
    tmp_path: Path,
) -> None:
    def message(task_id: str) -> bytes:
        return b'{"headers": {"id": "%s"}, "properties": {"delivery_tag": "t-%s"}}' % (
            task_id.encode(),
            task_id.encode(),
        )

    log = b"".join(
        [
            b"#annotation line\r\n",
            _resp(b"SELECT", b"0"),
            _resp(b"LPUSH", b"q", message("done")),
            _resp(b"LPUSH", b"q", message("gone")),
            _resp(b"LPUSH", b"q", message("queued")),
            _resp(b"RPOP", b"q"),  # "done": a worker registers it
            _resp(b"MULTI"),
            _resp(b"HSET", b"unacked", b"t-done", b"[" + message("done") + b"]"),
            _resp(b"EXEC"),
            _resp(b"RPOP", b"q"),  # "gone": popped, never registered
            _resp(b"LPUSH", b"other", message("elsewhere")),
            _resp(b"RPOP", b"other"),
        ]
    )
    folder = tmp_path / "redis" / "appendonlydir"
    folder.mkdir(parents=True)
    (folder / "appendonly.aof.1.incr.aof").write_bytes(log)
    (folder / "appendonly.aof.manifest").write_text(
        "file appendonly.aof.1.base.rdb seq 1 type b\nfile appendonly.aof.1.incr.aof seq 1 type i\n"
    )
    redis = chaos.Redis(tmp_path)
    wanted = {"done", "gone", "queued", "elsewhere", "never-pushed"}
    assert redis.popped_unregistered("q", wanted) == {"gone"}


def test_the_editor_lanes_verdict_reads_versions_from_the_history() -> None:
    """An entry's versions from the history of the database (an edit that
    raised but committed included): a send under a version replaced more
    than a second before its slot is outdated, a slot of the version in
    force lost or doubled is counted, and a limited entry that ran fewer
    times than asked is wrong."""
    from datetime import timedelta

    from chaos_edits import EDITOR, TASK, Attempt, EditsReport, judge

    from celery_singlebeat import stored_entry
    from celery_singlebeat.schedules import with_changes
    from celery_singlebeat.store.values import ScheduleLogRow

    us = chaos.US
    t0 = 1_800_000_000 * us
    v1 = stored_entry("ed-0", TASK, timedelta(seconds=1), args=[4000], kwargs={"v": 1})
    v2 = with_changes(v1, kwargs={"v": 2})
    v3 = with_changes(v2, kwargs={"v": 3}, enabled=False)
    once = stored_entry("once-0", TASK, datetime.fromtimestamp(1_800_000_005, tz=timezone.utc))
    limited = stored_entry("max-1", TASK, timedelta(seconds=1), max_runs=3)
    attempts = [
        Attempt(1, "ed-0", "create", t0, v1),
        Attempt(2, "ed-0", "kwargs", t0 + 10 * us, v2),
        # raised (the answer was lost), yet the history has it: committed
        Attempt(3, "ed-0", "disable", t0 + 20 * us, v3, error="OperationalError: gone"),
        Attempt(4, "once-0", "once", t0 + us, once),
        Attempt(5, "max-1", "limited", t0 + 2 * us, limited),
        Attempt(6, "ed-0", "kwargs", t0 + 25 * us, v2, error="OperationalError: refused"),
    ]

    def row(rev: int, name: str, action: str, what: str, at_us: int) -> ScheduleLogRow:
        return ScheduleLogRow(rev, name, action, EDITOR, f"chaos v{rev} {what}", at_us, "{}")

    history = [
        row(1, "ed-0", "created", "create", t0),
        row(2, "ed-0", "changed", "kwargs", t0 + 10 * us + us // 2),
        row(3, "ed-0", "changed", "disable", t0 + 20 * us + us // 2),
        row(4, "once-0", "created", "once", t0 + us),
        row(5, "max-1", "created", "limited", t0 + 2 * us),
    ]
    # t0+10, due under v1, sent after the edit under v2 (a retried publish)
    runs = [(k, 1) for k in range(1, 13) if k not in (5, 10)] + [(6, 1), (10, 2)]
    runs += [(k, 2) for k in range(13, 23)]
    records = [
        {
            "event": "start",
            "task": TASK,
            "task_id": f"{k}-{n}",
            "pid": 1,
            "token": n,
            "slot": ["ed-0", t0 + k * us],
            "at": (t0 + k * us) / us + 0.01,
            "v": v,
        }
        for n, (k, v) in enumerate(runs)
    ]
    records += [
        {"event": "start", "task": TASK, "task_id": f"{name}-{k}", "pid": 1, "token": 0,
         "slot": [name, t0 + k * us], "at": 0.0, "v": v}
        for name, k, v in (("once-0", 5, 4), ("max-1", 3, 5), ("max-1", 4, 5))
    ]  # fmt: skip

    def verdict(held: bool) -> EditsReport:
        return judge(
            attempts,
            history,
            records,
            [],
            [],
            t0 + 30 * us,
            t0,
            lambda s: True,
            lambda s: set(),
            lambda lo, hi: held,
            21 * us,
        )

    report = verdict(held=False)
    assert report.committed == 5 and report.uncertain_committed == 1 and report.failed == 1
    # v1 sent for t0+12 (replaced at 10.5 s), v2 for t0+22 (disabled at 20.5 s)
    assert report.outdated == 2, report.problems
    assert report.executed_twice == 1 and report.lost == 1, report.problems
    # v1 from t0+2 to t0+10, v2 from t0+12 to t0+20: the second after each
    # commit may go either way
    assert report.due == 18
    assert report.premature == 0 and report.not_a_slot == 0, report.problems
    assert report.late_newer == 1
    assert [(x["entry"], x["asked"], x["executed"]) for x in report.limited] == [
        ("once-0", 1, 1),
        ("max-1", 3, 2),
    ]
    assert report.limited_wrong == 1 and not report.ok
    # t0+5 was due 5.5 s before v2 replaced v1: a fault in force then may
    # have held its claim past the edit, and v2 sends nothing before its commit
    held = verdict(held=True)
    assert held.lost == 0 and held.dropped_with_version == 1, held.problems


def test_a_write_a_failover_lost_is_in_force_until_the_cut() -> None:
    """Seed 7 of issue 30: ed-0 v2 returned, then a failover lost it (the
    history of the new primary has only v1). Its slots are v2's until the
    old primary's last answer, the cut; from then on the database that
    answers has v1, so a slot due between the cut and the moved address goes
    out under v1 (it was judged outdated, v2 counted in force until the
    move); v1 for a slot a second and more before the cut is outdated."""
    from datetime import timedelta

    from chaos_edits import EDITOR, TASK, Attempt, judge

    from celery_singlebeat import stored_entry
    from celery_singlebeat.schedules import with_changes
    from celery_singlebeat.store.values import ScheduleLogRow

    us = chaos.US
    t0 = 1_800_000_000 * us
    v1 = stored_entry("ed-0", TASK, timedelta(seconds=1), args=[4000], kwargs={"v": 1})
    v2 = with_changes(v1, kwargs={"v": 2})
    lost = Attempt(2, "ed-0", "kwargs", t0 + 10 * us, v2)
    lost.done_us = t0 + 10 * us + 5_000
    history = [ScheduleLogRow(1, "ed-0", "created", EDITOR, "chaos v1 create", t0, "{}")]
    cut, moved = t0 + 14 * us + 800_000, t0 + 15 * us + 50_000

    def verdict(sent: dict[int, int]) -> list[str]:
        records = [
            {"event": "start", "task": TASK, "task_id": str(k), "pid": 1, "token": k,
             "slot": ["ed-0", t0 + k * us], "at": 0.0, "v": v}
            for k, v in sent.items()
        ]  # fmt: skip
        report = judge(
            [Attempt(1, "ed-0", "create", t0, v1), lost],
            history,
            records,
            [],
            [(cut, moved)],
            t0 + 20 * us,
            t0,
            lambda s: True,
            lambda s: set(),
            lambda lo, hi: False,
            21 * us,
        )
        return [p for p in report.problems if p.startswith("outdated")]

    # v1 up to 10, v2 from 11 to 14, the slot at 15 (after the cut, before
    # the move) under v1, then v1
    good = {k: 1 for k in range(1, 11)} | {k: 2 for k in range(11, 15)} | {15: 1, 16: 1}
    assert verdict(good) == []
    # v1 for the slot at 13, when the old primary had v2 for 3 s
    assert len(verdict(good | {13: 1})) == 1


def test_a_slot_held_by_a_fault_until_its_entry_was_deleted_is_dropped_with_it() -> None:
    """Seed 6 of issue 30: a replica paused right after claiming ed-0's slot
    at t0+5; the entry was deleted 30 s later, before any takeover, and a
    claim not yet published is not sent once its entry is gone. With a
    fault in force at the slot it is dropped with its version; without one
    (nothing held its claim) it is lost."""
    from datetime import timedelta

    from chaos_edits import EDITOR, TASK, Attempt, judge

    from celery_singlebeat import stored_entry
    from celery_singlebeat.store.values import ScheduleLogRow

    us = chaos.US
    t0 = 1_800_000_000 * us
    v1 = stored_entry("ed-0", TASK, timedelta(seconds=1), args=[4000], kwargs={"v": 1})
    history = [
        ScheduleLogRow(1, "ed-0", "created", EDITOR, "chaos v1 create", t0, "{}"),
        ScheduleLogRow(2, "ed-0", "deleted", EDITOR, "chaos v2 delete", t0 + 35 * us, "{}"),
    ]
    attempts = [Attempt(1, "ed-0", "create", t0, v1), Attempt(2, "ed-0", "delete", t0, None)]
    records = [
        {"event": "start", "task": TASK, "task_id": str(k), "pid": 1, "token": k,
         "slot": ["ed-0", t0 + k * us], "at": 0.0, "v": 1}
        for k in range(1, 35) if k != 5
    ]  # fmt: skip

    def verdict(fault_at: int | None) -> tuple[int, int]:
        report = judge(
            attempts, history, records, [], [], t0 + 40 * us, t0,
            lambda s: False, lambda s: set(),
            lambda lo, hi: fault_at is not None and lo <= fault_at <= hi,
            9 * us,
        )  # fmt: skip
        return report.lost, report.dropped_with_version

    assert verdict(t0 + 5 * us + 50_000) == (0, 1)
    assert verdict(None) == (1, 0)
    # a fault long after the slot held nothing of it
    assert verdict(t0 + 30 * us) == (1, 0)
