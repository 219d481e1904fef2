"""Operating a fleet of three real beat replicas (PostgreSQL, Redis) from the CLI.

``python -m celery_singlebeat --url ... pause / resume / run / status /
history / replicas``, as an operator types them, against replicas sending
two entries every second and one every hour (``rare-0``, the entry run now).
The broker is the judge:

* from the commit of a pause on, no replica sends the entry; the slots of
  the paused span are never sent; after the resume, the next slot goes out on
  time;
* ``run`` sends exactly one extra message, with its own task id, within a
  second of the command's commit on PostgreSQL (LISTEN/NOTIFY), or within a
  sweep behind PgBouncer in transaction mode (no LISTEN there);
* a run-now whose claimer is SIGKILLed before publishing is taken over and
  still sent exactly once;
* ``status --json`` and ``history --json`` agree with the broker's messages,
  and ``replicas --json`` shows the killed replica lost, the others stopped
  once they are.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections import Counter
from typing import Any

from harness import US, Rig, wait_connected, wait_for

from celery_singlebeat.timeline.slots import slot_task_id

LEASE = 5.0
PAUSED = "probe-0"
RARE = "rare-0"
#: the reader takes messages off the broker every 50 ms
READER_POLL = 0.05
#: how much earlier than its instant a replica may propose a slot (its
#: estimate of the database clock), and how much later the replicas that are
#: not the entry's first propose it (sharing.FALLBACK_DELAY_US), in µs
PROPOSE_ERROR = 100_000
FALLBACK = 250_000


def cli(url: str, prefix: str, *args: str, ok: bool = True) -> dict[str, Any]:
    """One CLI command with --json, as a process; its JSON answer."""
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "celery_singlebeat",
            "--url",
            url,
            "--table-prefix",
            prefix,
            *args,
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if ok:
        assert done.returncode == 0, f"{args}: {done.returncode}\n{done.stdout}\n{done.stderr}"
        assert "Traceback" not in done.stderr
        return dict(json.loads(done.stdout))
    return {"returncode": done.returncode, "stderr": done.stderr}


def test_pause_resume_and_run_now_from_the_cli_with_three_replicas(
    rig: Rig, pg_url: str, redis_url: str, table_prefix: str
) -> None:
    reader, db, env = rig.fleet(
        redis_url,
        pg_url,
        table_prefix,
        SB_ENTRIES="2",
        SB_EVERY="1",
        SB_RARE="1",
        SB_LEASE=str(LEASE),
        SB_LOOP="1",
        SB_STOP_ON="claimed",
        SB_STOP_ARM="usr2",
    )
    reader.start()
    beats = [rig.start_beat(env, f"beat-{i}") for i in range(3)]
    wait_connected(beats)
    wait_for(lambda: len(reader.messages()) >= 6, 20, "sending before the pause")
    # every replica has heartbeaten: all three live
    wait_for(
        lambda: (
            [r["state"] for r in cli(pg_url, table_prefix, "replicas")["replicas"]] == ["live"] * 3
        ),
        15,
        "three live replicas",
        interval=0.5,
    )

    # -- pause: from its commit on, no replica sends the entry -----------------
    asked = db.now_us()
    paused = cli(pg_url, table_prefix, "pause", PAUSED, "--reason", "incident 42")
    committed = db.now_us()
    assert [p["entry"] for p in paused["paused"]] == [PAUSED]
    # the entry's slots go on being due every second for 4 s while paused
    wait_for(lambda: db.now_us() >= committed + 4 * US, 10, "4 s of pause")
    status = cli(pg_url, table_prefix, "status", "--all")
    entry = next(e for e in status["entries"] if e["name"] == PAUSED)
    assert entry["paused"] and entry["paused"]["reason"] == "incident 42"

    # -- resume: the next slot goes out on time -------------------------------
    resume_asked = db.now_us()
    cli(pg_url, table_prefix, "resume", PAUSED)
    resumed = db.now_us()
    wait_for(
        lambda: any(m.entry == PAUSED and m.at_us > resumed for m in reader.messages()),
        5,
        "the first slot after the resume",
    )
    sent = [m for m in reader.messages() if m.entry == PAUSED]
    # A slot is refused when it is proposed while paused. Its first replica
    # proposes it at its instant (its clock estimate is off by far less than
    # PROPOSE_ERROR), the others FALLBACK later: so none due after the pause's
    # commit is sent, and none due before the resume was asked but for the last
    # FALLBACK + PROPOSE_ERROR before it.
    during = [
        m
        for m in sent
        if committed + PROPOSE_ERROR < m.at_us < resume_asked - FALLBACK - PROPOSE_ERROR
    ]
    assert not during, f"sent while paused: {during}"
    first = min((m for m in sent if m.at_us > resumed), key=lambda m: m.at_us)
    assert first.at_us <= resumed + US + US // 2, "the next slot after the resume was skipped"
    assert first.received * US - first.at_us < 1.0 * US, "the first slot after resume was late"
    # the other entry ran on through the pause
    other = sorted(m.at_us for m in reader.messages() if m.entry == "probe-1")
    assert len([s for s in other if asked < s <= resumed]) >= 4

    # -- run now: one extra message, its own task id, within a second --------
    before = Counter(m.entry for m in reader.messages())[RARE]
    run = cli(pg_url, table_prefix, "run", RARE, "--reason", "catch-up")
    returned = time.time()
    assert run["task_id"] == slot_task_id(RARE, run["slot_us"])
    # within a second on every path: LISTEN where it reaches the replica, the
    # feed read (every 0.95 s) behind PgBouncer, where it does not; plus a
    # quarter second for a tick delayed on a loaded 2-core machine (CI runs
    # four test workers): was a sweep (5 s) before the feed read
    bound = 1.25
    message = wait_for(
        lambda: next((m for m in reader.messages() if m.task_id == run["task_id"]), None),
        LEASE + 10,
        "the run-now message",
        interval=0.02,
    )
    assert message.received - returned <= bound + READER_POLL, (
        f"run-now sent {message.received - returned:.2f}s after the commit (bound {bound}s)"
    )
    assert (message.entry, message.at_us) == (RARE, run["slot_us"])

    # -- run now, its claimer killed before it publishes: taken over, sent once
    for name in ("probe-0", "probe-1"):
        cli(pg_url, table_prefix, "pause", name, "--reason", "quiet for the kill")
    for beat in beats:  # the replica that claims the next slot stops right there
        beat.signal(signal.SIGUSR2)
    killed_run = cli(pg_url, table_prefix, "run", RARE)
    stopped = wait_for(
        lambda: next((b for b in beats if b.state() == "T"), None), 10, "the claimer to stop"
    )
    for beat in beats:
        if beat is not stopped:
            beat.signal(signal.SIGUSR1)  # the taker must not stop too
    assert f"SB-STOPPING {RARE} {killed_run['task_id']}" in stopped.log()
    stopped.kill()
    alive = [b for b in beats if b is not stopped]
    wait_for(
        lambda: any(m.task_id == killed_run["task_id"] for m in reader.messages()),
        LEASE + 10,
        "the taken-over run-now",
    )
    for name in ("probe-0", "probe-1"):
        cli(pg_url, table_prefix, "resume", name)
    settle_until = db.now_us() + 2 * US
    wait_for(lambda: db.now_us() >= settle_until, 10, "a settled broker")

    # -- what the CLI reports agrees with the broker -------------------------
    history = cli(pg_url, table_prefix, "history", "--limit", "100000")["slots"]
    status = cli(pg_url, table_prefix, "status", "--all")
    replicas = {r["id"]: r for r in cli(pg_url, table_prefix, "replicas")["replicas"]}
    for beat in alive:
        beat.stop(15)
    messages = reader.finish()
    counts = Counter(m.task_id for m in messages)
    assert counts[run["task_id"]] == 1 and counts[killed_run["task_id"]] == 1
    assert Counter(m.entry for m in messages)[RARE] == before + 2
    repeats = {t: n for t, n in counts.items() if n > 1}
    assert not repeats, f"sent twice: {repeats}"

    sent_rows = {(h["entry"], h["slot_us"]) for h in history if h["state"] == "sent"}
    received = {m.slot for m in messages}
    # every slot the history says sent is in the broker, and the reverse, up to
    # the moment history was read (later slots may be sent after it)
    read_at = max(h["slot_us"] for h in history)
    assert sent_rows == {s for s in received if s[1] <= read_at} - _unconfirmed(history)
    by_name = {e["name"]: e for e in status["entries"]}
    for name in ("probe-1", RARE):
        last = max(m.at_us for m in messages if m.entry == name and m.at_us <= read_at)
        assert by_name[name]["last_sent_slot_us"] >= last
    killed_row = next(h for h in history if h["slot_us"] == killed_run["slot_us"])
    assert killed_row["fence"] == 2 and killed_row["requested_by"]
    assert killed_row["sender"] != stopped.replica_id()
    states = {beat.replica_id(): replicas[str(beat.replica_id())]["state"] for beat in beats}
    assert states[stopped.replica_id()] in ("live", "lost")  # killed: not stopped
    after = {r["id"]: r["state"] for r in cli(pg_url, table_prefix, "replicas")["replicas"]}
    assert [after[str(b.replica_id())] for b in alive] == ["stopped", "stopped"]
    assert after[str(stopped.replica_id())] != "stopped"


def _unconfirmed(history: list[dict[str, Any]]) -> set[tuple[str, int]]:
    """Slots published but not (yet) recorded as sent when history was read."""
    return {(h["entry"], h["slot_us"]) for h in history if h["state"] != "sent"}


def test_bad_input_is_one_line_and_changes_nothing(
    rig: Rig, pg_url: str, redis_url: str, table_prefix: str
) -> None:
    """A control for a name no live replica has is refused, naming the close
    names; nothing is written (the control version does not move)."""
    _reader, _db, env = rig.fleet(redis_url, pg_url, table_prefix, SB_ENTRIES="2", SB_RARE="1")
    beat = rig.start_beat(env, "beat")
    wait_connected([beat])
    wait_for(
        lambda: cli(pg_url, table_prefix, "replicas")["replicas"], 15, "a replica row", interval=0.5
    )
    before = cli(pg_url, table_prefix, "status")
    for args in (("pause", "probe-O"), ("run", "rare-1"), ("resume", "nope")):
        answer = cli(pg_url, table_prefix, *args, ok=False)
        assert answer["returncode"] == 1, answer
        lines = answer["stderr"].strip().splitlines()
        assert len(lines) == 1 and args[1] in lines[0], answer
        assert "Traceback" not in answer["stderr"]
    assert "probe-0" in cli(pg_url, table_prefix, "pause", "probe-O", ok=False)["stderr"]
    after = cli(pg_url, table_prefix, "status")
    assert after.get("summary", {}).get("pauses") == before.get("summary", {}).get("pauses")
    beat.stop(15)
