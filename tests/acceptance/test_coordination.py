"""Real ``celery beat`` replicas sharing one database: every slot reaches the
broker exactly once, all replicas send (active-active), and a SIGKILLed replica
costs neither a slot nor a duplicate beyond the documented takeover case.

The broker is the judge: no worker runs, so each message stays in its queue and
a reader takes them all off; the expected slots come from the database (each
entry's anchor + k * period), not from how long the test slept.
"""

from __future__ import annotations

import json
import re
import signal
from pathlib import Path

import pytest
from harness import (
    TAKEOVER_SLACK,
    US,
    BeatProcess,
    Db,
    QueueReader,
    Rig,
    check_slots,
    check_takeovers,
    collect,
    max_gaps,
    unsent_claims,
    wait_for,
)

from celery_singlebeat.engine.sharing import FALLBACK_DELAY_US, first_replicas
from celery_singlebeat.timeline.clock import us_to_datetime
from celery_singlebeat.timeline.slots import slot_task_id

#: each replica proposes the entries it is first for at once and the others
#: 250 ms later (rendezvous hashing of the replica ids, whose split is
#: binomial): with 24 entries over 3 replicas, one with no entry of its own,
#: which then never sends while the others keep up, is a 1-in-5,000 draw
#: (with 5 entries it was 2 in 5)
ENTRIES = 24
PERIOD = 1.0
PERIOD_US = int(PERIOD * US)
#: short lease so an abandoned claim is taken over within seconds
LEASE = 3.0
LEASE_US = int(LEASE * US)
#: how late an arrival may be measured: reader poll (0.05 s) plus scheduling
#: jitter of three beats and the test on a shared 2-core machine
SLACK = 0.5


def _wait_db_time(db: Db, until_us: int, beats: list[BeatProcess]) -> None:
    """Wait until the database's clock passes ``until_us``; every replica must live."""

    def passed() -> bool:
        dead = [b.name for b in beats if not b.alive()]
        assert not dead, f"beat died: {dead}"
        return db.now_us() >= until_us

    wait_for(passed, (until_us - db.now_us()) / US + 10, "the database clock", interval=0.2)


def _start_replicas(
    rig: Rig, env: dict[str, str], db: Db, count: int, entries: int = ENTRIES
) -> tuple[list[BeatProcess], dict[str, int]]:
    beats = [rig.start_beat(env, f"beat-{i}") for i in range(count)]
    wait_for(
        lambda: all("connected to" in b.log() for b in beats),
        45,
        "every replica to connect",
        interval=0.2,
    )
    anchors = db.anchors()
    assert len(anchors) == entries, anchors
    return beats, anchors


def _last_sender(beats: list[BeatProcess], reader: QueueReader) -> BeatProcess | None:
    """The replica that logged publishing the newest slot in the broker."""
    messages = reader.messages()
    if not messages:
        return None
    newest = max(m.at_us for m in messages)
    ids = {m.task_id for m in messages if m.at_us == newest}
    for beat in beats:
        if ids & set(beat.sent_task_ids()):
            return beat
    return None


def run_replicas_then_kill(
    rig: Rig,
    *,
    db_url: str,
    broker_url: str,
    prefix: str,
    steady_s: float,
    after_kill_s: float,
    require_all_active: bool,
    die_after: str,
) -> str:
    """Three replicas for ``steady_s``, then SIGKILL the last sender while it
    holds a claim it has not confirmed, ``after_kill_s`` more; assert
    exactly-once delivery and return a one-line summary.

    A SIGKILL at a random instant almost never lands between claim and confirm
    (a few ms per second), which is the case worth testing; so the victim is
    armed (SIGUSR2) to freeze itself right after it next wins a slot, having
    ``die_after`` = ``claimed`` (not yet published) or ``published`` it, and
    is killed there."""
    reader, db, env = rig.fleet(
        broker_url,
        db_url,
        prefix,
        SB_ENTRIES=str(ENTRIES),
        SB_EVERY=str(PERIOD),
        SB_LEASE=str(LEASE),
        SB_LOOP="1",
        SB_STOP_ON=die_after,
        SB_STOP_ARM="usr2",
    )
    beats, anchors = _start_replicas(rig, env, db, 3)
    _wait_db_time(db, db.now_us() + int(steady_s * US), beats)

    if require_all_active:
        # Each tick one replica's claim wins every due slot, so whether all three
        # won within 20 ticks is luck (~1 % on a loaded machine); up to 20 more
        # ticks make a replica that never wins a real finding, not chance.
        wait_for(
            lambda: all(b.sent_task_ids() for b in beats),
            steady_s,
            "every replica to send (active-active)",
            interval=0.2,
        )
    sent_before = {b.name: len(b.sent_task_ids()) for b in beats}

    victim = wait_for(lambda: _last_sender(beats, reader), 5, "the last sender")
    victim_id = victim.replica_id()
    victim.signal(signal.SIGUSR2)
    # ~3 ticks on average: each tick one of the three replicas wins
    frozen = wait_for(
        lambda: re.search(r"SB-STOPPING (\S+) (\S+)", victim.log()), 30, "the victim to win"
    )
    wait_for(lambda: victim.state() == "T", 5, "the victim to freeze")
    # What it leaves: the slot it froze on and whatever else that claim won.
    abandoned = unsent_claims(db, victim_id)
    killed_at = db.now_us()
    victim.kill()
    survivors = [b for b in beats if b is not victim]
    held_entry, held_task_id = frozen[1], frozen[2]

    # Long enough for a claim the victim left behind to expire and be taken over.
    _wait_db_time(db, killed_at + int(after_kill_s * US), survivors)
    out = collect(
        rig, reader, db, anchors, PERIOD_US, beats=beats, alive=survivors, timeout=LEASE + 10
    )
    upto, expected, messages, rows, published = (
        out.upto_us,
        out.expected,
        out.messages,
        out.rows,
        out.published,
    )
    wanted = {(e, at) for e, slots in expected.items() for at in slots}

    report = check_slots(messages, expected, upto, rows, published)
    assert not report.problems, "\n".join(report.problems) + "\n" + rig.group.outputs()
    # Every slot the victim left claimed was sent by a survivor, with the same id;
    # a second copy exists only where the victim had published before it died.
    victim_sent = set(victim.sent_task_ids())
    for entry, at in report.taken_over:
        row = rows[(entry, at)]
        assert row.state == 1 and row.owner != victim_id, row
        task_id = slot_task_id(entry, at)
        takers = [b.name for b in survivors if f"took over slot {entry}@" in b.log()]
        assert takers, f"{entry}@{at} taken over but no survivor logged it"
        copies = sum(1 for m in messages if m.slot == (entry, at))
        assert copies == (2 if task_id in victim_sent else 1), (entry, at, copies)
    for slot in report.doubled:
        assert slot_task_id(*slot) in victim_sent, slot
    # guarantees.md: each was sent after its lease, at most L + L/3 after its instant.
    late, takeovers = check_takeovers(messages, rows, abandoned, report.taken_over, LEASE_US)
    assert not late, "\n".join(late) + "\n" + rig.group.outputs()
    # The slot the victim died holding is among them: it arrived once the lease
    # ran out, published (again, if the victim had already) with its own id.
    held = [s for s in report.taken_over if s[0] == held_entry]
    assert [slot_task_id(*s) for s in held] == [held_task_id], (held, held_task_id)
    held_copies = [m for m in messages if m.task_id == held_task_id]
    assert len(held_copies) == (2 if die_after == "published" else 1), held_copies
    assert (held_task_id in victim_sent) == (die_after == "published")
    assert held_copies[-1].received > killed_at / US, "the takeover's copy came before the kill"

    # Sending went on: per entry, consecutive on-path slots arrived at most two
    # intervals apart (one abandoned slot in between is the worst case).
    gaps = max_gaps(messages, rows)
    too_long = {e: round(g, 2) for e, g in gaps.items() if g > 2 * PERIOD + SLACK}
    assert not too_long, f"sending stalled: {too_long}"
    total = {b.name: len(b.sent_task_ids()) for b in beats}
    summary = (
        f"{len(wanted)} slots once each; sent per replica before kill {sent_before}, "
        f"total {total}; killed {victim.name} after it {die_after} {held_entry}; "
        f"taken over {len(report.taken_over)}, "
        f"of which published twice (same id) {len(report.doubled)}; "
        f"longest gap {max(gaps.values()):.2f}s; takeovers in the broker "
        f"{', '.join(f'{t.delay():.3f}' for t in takeovers)}s after their instants "
        f"(bound {(LEASE_US + LEASE_US // 3) / US:g}s + {TAKEOVER_SLACK:g}s)"
    )
    print(summary)
    return summary


@pytest.mark.slow
@pytest.mark.postgres
@pytest.mark.redis
def test_three_replicas_postgres_redis_every_slot_once_and_sigkill(
    rig: Rig, pg_url: str, redis_url: str, table_prefix: str
) -> None:
    run_replicas_then_kill(
        rig,
        db_url=pg_url,
        broker_url=f"{redis_url}/1",
        prefix=table_prefix,
        steady_s=20,
        after_kill_s=LEASE + 3,
        require_all_active=True,
        die_after="published",
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    ("database", "broker", "die_after"),
    [
        # the URL comes from request.getfixturevalue: tests/conftest.py cannot see it
        pytest.param("postgres", "rabbitmq", "claimed", marks=pytest.mark.shared_postgres),
        ("mysql", "redis", "published"),
        ("sqlite", "redis", "claimed"),
    ],
    ids=["postgres-rabbitmq", "mariadb-redis", "sqlite-redis"],
)
def test_three_replicas_other_backends(
    rig: Rig,
    request: pytest.FixtureRequest,
    tmp_path: Path,
    table_prefix: str,
    database: str,
    broker: str,
    die_after: str,
) -> None:
    if database == "sqlite":
        db_url = f"sqlite:///{tmp_path}/singlebeat.sqlite"
    else:
        db_url = request.getfixturevalue("pg_url" if database == "postgres" else "mysql_url")
    if broker == "redis":
        broker_url = f"{request.getfixturevalue('redis_url')}/2"
    else:
        broker_url = request.getfixturevalue("amqp_url")
    run_replicas_then_kill(
        rig,
        db_url=db_url,
        broker_url=broker_url,
        prefix=table_prefix,
        steady_s=5,
        after_kill_s=LEASE + 2,
        # a few ticks only: too few to demand that each replica won one
        require_all_active=False,
        die_after=die_after,
    )


@pytest.mark.postgres
@pytest.mark.redis
def test_log_names_replica_slot_and_task_id_and_masks_the_password(
    rig: Rig, redis_url: str, pg_url: str, table_prefix: str
) -> None:
    # PostgreSQL here trusts local connections, so any password is accepted:
    # the URL's user part and its query string carry one, connect_args a
    # third; none may ever be printed.
    secret = "Pa55-w0rd-s3cr3t"
    user, query, option = (f"{secret}-{where}" for where in ("user", "query", "option"))
    plain = pg_url.replace("postgres@", f"postgres:{user}@", 1)
    url = f"{plain}{'&' if '?' in plain else '?'}password={query}&application_name=sb-test"
    assert user in url and query in url
    reader, db, env = rig.fleet(
        f"{redis_url}/3",
        pg_url,
        table_prefix,
        beats_url=url,
        SB_ENTRIES="2",
        SB_LEASE=str(LEASE),
        SB_ENGINE_OPTIONS=json.dumps({"connect_args": {"password": option}}),
    )
    beat = rig.start_beat(env, "beat")
    wait_for(lambda: len(beat.sent_task_ids()) >= 4, 30, "four published slots", interval=0.2)
    rig.group.stop_all()
    messages = reader.finish()
    log = beat.log()

    # what the lines show is the URL with each secret masked, the rest kept
    masked = url.replace(user, "***").replace(query, "***")
    assert "application_name=sb-test" in masked
    banner = re.search(r"\. singlebeat -> (\S+)", log)
    startup = re.search(r"coordinating 2 entries through (\S+) ", log)
    assert banner and startup, log
    assert banner[1] == startup[1] == masked, log
    assert secret not in log
    assert all(secret not in raw for raw in reader.raw)

    # One replica id, host:pid:suffix, the same in the banner and every line.
    replica = beat.replica_id()
    assert replica is not None and re.fullmatch(rf"[^:\s]+:{beat.pid}:[0-9a-f]{{6}}", replica)
    banner_replica = re.search(r"\. replica -> (\S+)", log)
    assert banner_replica and banner_replica[1] == replica, log

    by_id = {m.task_id: m for m in messages}
    lines = re.findall(
        r"replica (\S+) won slot ([^@\s]+)@(\S+): sent beatapp\.probe \(task id (\S+)\)", log
    )
    assert len(lines) >= 4, log
    anchors = db.anchors()
    for line_replica, entry, at, task_id in lines:
        assert line_replica == replica
        message = by_id[task_id]  # what the log names is what reached the broker
        assert message.entry == entry and task_id == slot_task_id(entry, message.at_us)
        assert (message.at_us - anchors[entry]) % US == 0, "slot off the anchor grid"
        # the log shows the slot to the millisecond, in UTC
        assert at.endswith("Z") and at[:23] in us_to_datetime(message.at_us).isoformat(
            timespec="milliseconds"
        )


@pytest.mark.postgres
@pytest.mark.redis
def test_a_gracefully_stopped_replica_hands_its_share_over_at_the_next_heartbeat(
    rig: Rig, pg_url: str, redis_url: str, table_prefix: str
) -> None:
    """Three replicas share 12 entries; one is stopped (SIGTERM). Its row is
    marked stopped as it closes, so the two others drop it at their next
    heartbeat (every lease/3: 1 s here) and propose its entries first from then
    on: its slots leave at their instant, not the fallback delay (250 ms) after
    it, although its slot rows and heartbeat are only a second old (sharing by
    slot rows under 10 s old kept its share behind the fallback for 10 s)."""
    entries = 12
    reader, db, env = rig.fleet(
        f"{redis_url}/4",
        pg_url,
        table_prefix,
        SB_ENTRIES=str(entries),
        SB_EVERY=str(PERIOD),
        SB_LEASE=str(LEASE),
        SB_LOOP="1",
    )
    beats, anchors = _start_replicas(rig, env, db, 3, entries)
    wait_for(
        lambda: all(b.lines("sees 3 live replica(s)") for b in beats),
        15,
        "every replica to see the three live",
        interval=0.2,
    )
    ids = {b.name: b.replica_id() for b in beats}
    live = sorted(str(i) for i in ids.values())
    first = first_replicas(anchors, live)
    # the victim: the replica with the most entries of its own (its ids decide)
    victim = max(beats, key=lambda b: sum(1 for r in first.values() if r == ids[b.name]))
    survivors = [b for b in beats if b is not victim]
    share = {e for e, r in first.items() if r == ids[victim.name]}
    assert share, (anchors, live)

    victim.stop()
    stopped_us = db.now_us()
    assert victim.proc.returncode == 0, victim.log()
    wait_for(
        lambda: all(b.lines("sees 2 live replica(s)") for b in survivors),
        # a heartbeat each (1 s), and slack for a loaded machine: half of the
        # 10 s that sharing among recent slot owners took
        5.0,
        "the survivors to drop the stopped replica",
        interval=0.1,
    )
    # Its entries' slots from 2 s after the stop (a heartbeat and a tick) over 5 s
    since_us, upto_us = stopped_us + 2 * US, stopped_us + 7 * US
    _wait_db_time(db, upto_us + US, survivors)
    out = collect(
        rig, reader, db, anchors, PERIOD_US, beats=beats, alive=survivors, timeout=LEASE + 10
    )
    report = check_slots(out.messages, out.expected, out.upto_us, out.rows, out.published)
    assert not report.problems, "\n".join(report.problems) + "\n" + rig.group.outputs()
    theirs = [
        row
        for (entry, slot_us), row in out.rows.items()
        if entry in share and since_us <= slot_us <= upto_us
    ]
    assert len(theirs) >= 4 * len(share), theirs
    assert all(row.state == 1 and row.owner != ids[victim.name] for row in theirs), theirs
    delays = sorted(row.claimed_us - row.slot_us for row in theirs)
    on_time = [d for d in delays if d < FALLBACK_DELAY_US]
    # A first proposer claims within a few ms; a fallback never before 250 ms.
    # Three in four leave room for a starved tick on a loaded machine.
    assert len(on_time) >= 0.75 * len(delays), delays
    print(
        f"{len(share)} of {entries} entries were the stopped replica's; their "
        f"{len(delays)} slots 2-7 s after the stop claimed {delays[len(delays) // 2] / 1000:.1f} "
        f"ms after their instant (median), {len(on_time)} before the fallback delay"
    )
