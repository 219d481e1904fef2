"""Real ``celery beat`` replicas through the outages docs/guarantees.md describes
beyond the short cuts of test_failures and the chaos run: the broker gone for
longer than the missed-run grace, and the database cut between a publish and
its confirm.

As elsewhere, the broker is the judge (a reader takes every message off the
real broker, never through the proxy the replicas use) and the expected slots
come from the database's anchors.
"""

from __future__ import annotations

import re
import signal
import time
from collections import defaultdict
from urllib.parse import urlsplit

import pytest
import sqlalchemy as sa
from harness import (
    US,
    BeatProcess,
    Db,
    Rig,
    SlotRow,
    check_slots,
    collect,
    interval_slots,
    replica_ids_with_shares,
    wait_connected,
    wait_db_time,
    wait_for,
)
from sqlalchemy.engine import make_url

from celery_singlebeat.timeline.slots import slot_task_id

PERIOD_US = US


def _via(url: str, port: int) -> str:
    """``url`` with its host and port replaced by the local proxy's port."""
    parts = urlsplit(url)
    userinfo = parts.netloc.rpartition("@")[0]
    netloc = f"{userinfo}@127.0.0.1:{port}" if userinfo else f"127.0.0.1:{port}"
    return parts._replace(netloc=netloc).geturl()


# -- the broker unreachable for longer than the missed-run grace ----------------

ENTRIES = 3
#: four times the default 5 s grace: a missed-run policy applied to the slots
#: that fell due meanwhile would drop most of them
BROKER_OUTAGE = 20.0
#: sweeps every 2 s (lease / 3), so the catch-up takes several sweeps, not a minute
BROKER_LEASE = 6.0
#: small, so that about 60 piled-up slots need a dozen sweeps
TAKEOVER_BATCH = 5
#: how far apart (database clock) two sweeps' statements may start and still run
#: at the same time, each skipping the rows the other has locked
CONCURRENT_US = US

#: a sweep announcing a slot it takes over (WARNING) or takes back (INFO); the
#: sweep logs all of them together, before it publishes any
ANNOUNCED = re.compile(
    r"singlebeat: replica \S+ took (?:over|back) slot [^@\s]+@\S+ "
    r"\(task id (?P<task_id>[0-9a-f-]{36}), fence (?P<fence>\d+)\)"
)
#: the ERROR lines guarantees.md names for a publish that cannot reach the
#: broker: a publish that fails, the rest of its batch released untried, or a
#: pipelined group (Redis) whose hand-over fails
PUBLISH_FAILED = (
    re.compile(r"publishing slot \S+ \(task \S+\) failed; releasing the claim"),
    re.compile(r"broker unreachable; released \d+ claimed slots without trying them"),
    re.compile(r"handing \d+ messages to the broker failed \(delivery uncertain\)"),
)


def _announced_sweeps(beat: BeatProcess) -> list[list[str]]:
    """The task ids each sweep of ``beat`` took over, one list per sweep: a run
    of consecutive announcement lines (its publishes are logged after them)."""
    sweeps: list[list[str]] = []
    current: list[str] = []
    for line in beat.log().splitlines():
        match = ANNOUNCED.search(line)
        if match:
            current.append(match["task_id"])
        elif current:
            sweeps.append(current)
            current = []
    if current:
        sweeps.append(current)
    return sweeps


@pytest.mark.slow
@pytest.mark.postgres
@pytest.mark.parametrize(
    "broker",
    [
        pytest.param("redis", marks=pytest.mark.redis),
        pytest.param("rabbitmq", marks=pytest.mark.rabbitmq),
    ],
)
def test_broker_outage_longer_than_the_grace_loses_nothing(
    rig: Rig, request: pytest.FixtureRequest, pg_url: str, table_prefix: str, broker: str
) -> None:
    """guarantees.md, *Broker unreachable*: every slot claimed during the outage
    is sent once the broker is back, oldest first, at most
    ``singlebeat_takeover_batch`` per sweep per replica, and the missed-run
    policy does not apply to them. Redis hands messages over in pipelined
    groups (kombu 5.7+), RabbitMQ one publish at a time."""
    if broker == "redis":
        broker_url = f"{request.getfixturevalue('redis_url')}/5"
    else:
        broker_url = request.getfixturevalue("amqp_url")
    address = urlsplit(broker_url)
    proxy = rig.proxy((address.hostname or "127.0.0.1", address.port or 6379))
    reader, db, env = rig.fleet(
        broker_url,
        pg_url,
        table_prefix,
        SB_BROKER=_via(broker_url, proxy.port),
        SB_ENTRIES=str(ENTRIES),
        SB_LEASE=str(BROKER_LEASE),
        SB_TAKEOVER_BATCH=str(TAKEOVER_BATCH),
    )
    beats = [rig.start_beat(env, f"beat-{i}") for i in range(3)]
    wait_connected(beats)
    anchors = db.anchors()
    wait_for(lambda: len(reader.messages()) >= 2 * ENTRIES, 20, "sending before the outage")

    # Cut half-way between two slots (every entry shares the anchor): no
    # hand-over is in flight, so none is left uncertain (delivered in part).
    cut_target = min(anchors.values()) + PERIOD_US // 2
    while cut_target < db.now_us() + 300_000:
        cut_target += PERIOD_US
    wait_db_time(db, cut_target, beats, interval=0.02)
    cut_us = db.now_us()
    cut_at = time.monotonic()
    proxy.cut()

    def failed(beat: BeatProcess) -> list[str]:
        return [
            line
            for line in beat.lines("ERROR/")
            if any(pattern.search(line) for pattern in PUBLISH_FAILED)
        ]

    wait_for(lambda: all(failed(b) for b in beats), BROKER_OUTAGE, "every replica to fail")
    # The outage itself: its length is what is under test.
    time.sleep(max(0.0, cut_at + BROKER_OUTAGE - time.monotonic()))
    restored_us = db.now_us()
    restored_wall = time.time()
    proxy.restore()
    wait_db_time(db, restored_us + 2 * US, beats)
    out = collect(rig, reader, db, anchors, PERIOD_US, beats=beats, alive=beats, timeout=90)
    caught_up = time.time() - restored_wall

    # Every slot from before, during and after the outage reached the broker
    # exactly once: none lost, none doubled.
    report = check_slots(out.messages, out.expected, out.upto_us, out.rows, out.published)
    assert not report.problems, "\n".join(report.problems) + "\n" + rig.group.outputs()
    assert report.doubled == [], report.doubled
    # Nothing reached the broker while it was cut off.
    early = [m for m in out.messages if m.received < restored_wall and m.at_us > cut_us]
    assert early == [], early

    # The outage's slots: claimed on time, published in vain, released and taken
    # over until the broker was back (so fence > 1). The missed-run policy had
    # no say: all of them were sent, 3 entries x ~20 instants.
    rows = out.rows
    during = sorted(
        (at, entry)
        for entry, slots in out.expected.items()
        for at in slots
        if cut_us < at <= restored_us - US
    )
    assert len(during) >= ENTRIES * (BROKER_OUTAGE - 2), len(during)
    assert all(rows[(entry, at)].fence > 1 for at, entry in during)
    for beat in beats:
        assert beat.lines("missed slot(s)") == [], beat.lines("missed slot(s)")

    # Sweeps: every row one take_over statement won shares its owner and its
    # claimed_us (the statement's database time). The last sweep of each
    # outage slot is the one that sent it. A row's last fence can also come from
    # a claim: a replica proposing a slot it (or another) had released wins the
    # row back at the next fence. Only what a sweep announced (task id and
    # fence) counts as a sweep's.
    swept = {
        (match["task_id"], int(match["fence"]))
        for beat in beats
        for line in beat.log().splitlines()
        if (match := ANNOUNCED.search(line))
    }
    sweeps: dict[tuple[str, int], list[SlotRow]] = defaultdict(list)
    for row in rows.values():
        if (slot_task_id(row.entry, row.slot_us), row.fence) in swept:
            sweeps[(row.owner, row.claimed_us)].append(row)
    sizes = sorted(len(rs) for rs in sweeps.values())
    # at most the batch per sweep, and the batch reached: the setting applies
    assert sizes and sizes[-1] == TAKEOVER_BATCH, sizes
    # The catch-up: the sweeps that ran once the broker was back. (A sweep a
    # moment before the restore can also succeed, its publish retried into it.)
    catch_up = {key: rs for key, rs in sweeps.items() if key[1] >= restored_us}
    assert len(catch_up) >= 2 * len(beats), sorted(len(rs) for rs in catch_up.values())
    # "the outage + <= L/3" (guarantees.md): the first sweep after the restore
    # came within a sweep interval (+1 s: a tick's work on a loaded machine);
    # with more than a batch piled up, each replica's sweeps take a batch each,
    # so even one replica alone would have sent them all by ceil(n / batch)
    # more sweeps
    sweep_us = int(BROKER_LEASE / 3 * US)
    first_sweep_us = min(at for _, at in catch_up)
    assert first_sweep_us - restored_us <= sweep_us + US, (first_sweep_us - restored_us) / US
    sweeps_needed = -(-len(during) // TAKEOVER_BATCH)
    last_arrival = max(m.received for m in out.messages if cut_us < m.at_us <= restored_us)
    bound_s = (sweeps_needed + 1) * sweep_us / US + 1.0
    assert last_arrival - restored_wall <= bound_s, (last_arrival - restored_wall, bound_s)
    # Every sweep, during the outage too, announced at most the batch.
    for beat in beats:
        announced = [len(s) for s in _announced_sweeps(beat)]
        assert announced and max(announced) <= TAKEOVER_BATCH, (beat.name, announced)

    # Oldest first. Within one sweep: taken in (slot, entry) order and handed to
    # the broker in that order. Across sweeps (replicas sweep concurrently, each
    # skipping rows another's statement has locked): a sweep takes the oldest
    # slots nobody else holds, so no older slot is still waiting once it ran;
    # every older one was sent by a sweep at most CONCURRENT_US later.
    position = {m.slot: i for i, m in reversed(list(enumerate(out.messages)))}
    claimed_at = {(r.entry, r.slot_us): r.claimed_us for r in rows.values()}
    order = sorted((r.slot_us, r.entry) for r in rows.values() if r.fence > 1)
    for (owner, at_us), taken in sorted(catch_up.items(), key=lambda kv: kv[0][1]):
        slots = sorted((r.slot_us, r.entry) for r in taken)
        arrived = sorted(slots, key=lambda s: position[(s[1], s[0])])
        assert arrived == slots, (owner, at_us, slots, arrived)
        older = [s for s in order if s < slots[-1]]
        late = [s for s in older if claimed_at[(s[1], s[0])] > at_us + CONCURRENT_US]
        assert late == [], (owner, at_us, slots, late)

    # Each replica said what guarantees.md says, and nothing else at ERROR. One
    # publish at a time (RabbitMQ): the failed publish, then the rest of its batch
    # released untried. Pipelined (Redis), a replica whose connection was up
    # logs the failed hand-over of its group instead.
    for beat in beats:
        assert failed(beat), beat.log()[-4000:]
        if broker == "rabbitmq":
            for pattern in PUBLISH_FAILED[:2]:
                assert any(pattern.search(line) for line in failed(beat)), (beat.name, pattern)
        errors = beat.lines("ERROR/") + beat.lines("CRITICAL/")
        assert errors == failed(beat), [e for e in errors if e not in failed(beat)]
    print(
        f"broker outage {BROKER_OUTAGE:g}s: {len(during)} slots fell due, "
        f"{len(catch_up)} catch-up sweeps (sizes {sizes}), all sent {caught_up:.1f}s "
        "after the restore"
    )


# -- the database cut between a publish and its confirm ---------------------------

#: the default lease: the cut and the replica's backoff end well inside it
CONFIRM_LEASE = 15.0
#: how long the proxy refuses the database once the stopped replica resumes
DB_OUTAGE = 2.0


def _sent_us(db: Db, entry: str, slot_us: int) -> int | None:
    """The database time the slot's confirm recorded (None while unconfirmed)."""
    s = db.tables.slots
    with db.engine.connect() as conn:
        value = conn.execute(
            sa.select(s.c.sent_us).where(s.c.entry == entry, s.c.slot_us == slot_us)
        ).scalar_one()
    return None if value is None else int(value)


@pytest.mark.slow
@pytest.mark.postgres
@pytest.mark.redis
def test_database_cut_between_publish_and_confirm_is_confirmed_on_return(
    rig: Rig, pg_url: str, redis_url: str, table_prefix: str
) -> None:
    """guarantees.md, *Database unreachable*, claims in flight: a slot published
    but not yet confirmed when the database went away is kept and confirmed
    first thing when it answers again; shorter than the lease, no repeat."""
    pg = make_url(pg_url)
    proxy = rig.proxy((pg.host or "127.0.0.1", pg.port or 5432))
    proxied = pg.set(host="127.0.0.1", port=proxy.port).render_as_string(hide_password=False)
    reader, db, env = rig.fleet(f"{redis_url}/6", pg_url, table_prefix, SB_LEASE=str(CONFIRM_LEASE))
    # the cut replica must win a slot: each of the three gets a share of the 5
    ids = replica_ids_with_shares(["cut", "beat-0", "beat-1"], 5)
    cut = rig.start_beat(
        {
            **env,
            "SB_URL": proxied,
            "SB_STOP_ON": "published",
            "SB_STOP_ARM": "usr2",
            "SB_REPLICA_ID": ids["cut"],
        },
        "cut",
    )
    others = [
        rig.start_beat({**env, "SB_REPLICA_ID": ids[f"beat-{i}"]}, f"beat-{i}") for i in range(2)
    ]
    beats = [cut, *others]
    wait_connected(beats)
    anchors = db.anchors()
    wait_for(lambda: len(reader.messages()) >= 6, 20, "sending before the cut")

    # Stop the replica right after it handed a slot to the broker, before its
    # confirm; cut its database while it is stopped, then let it go on.
    cut.signal(signal.SIGUSR2)
    stopping = wait_for(
        lambda: re.search(r"SB-STOPPING (\S+) (\S+)", cut.log()), 40, "the replica to publish"
    )
    entry, task_id = stopping[1], stopping[2]
    wait_for(lambda: cut.state() == "T", 5, "SIGSTOP to take effect")
    stopped_us = db.now_us()
    cut_id = cut.replica_id()
    slot = next(
        (entry, at)
        for at in interval_slots(anchors[entry], PERIOD_US, stopped_us + PERIOD_US)
        if slot_task_id(entry, at) == task_id
    )
    assert db.rows()[slot].state == 0, "confirmed before the replica stopped"
    proxy.cut()
    cut.signal(signal.SIGCONT)
    wait_for(lambda: cut.lines("unreachable"), 10, "the replica's confirm to fail")
    assert db.rows()[slot].state == 0, "confirmed through a cut connection"
    time.sleep(DB_OUTAGE)  # the outage itself
    restored_us = db.now_us()
    proxy.restore()
    wait_for(
        lambda: cut.lines("reachable again"),
        15,
        "the replica to reconnect (backoff is capped at 1.5 s)",
        interval=0.2,
    )
    # Well inside the lease: nobody could take the slot over meanwhile.
    assert db.now_us() - slot[1] < CONFIRM_LEASE * US * 0.8
    row = db.rows()[slot]
    assert (row.state, row.fence, row.owner) == (1, 1, cut_id), row
    sent_us = _sent_us(db, *slot)
    assert sent_us is not None and sent_us >= restored_us, (sent_us, restored_us)

    # ...confirmed first thing: before anything the replica claimed afterwards.
    def claimed_since() -> list[int]:
        rows = db.rows().values()
        return [r.claimed_us for r in rows if r.owner == cut_id and r.claimed_us > stopped_us]

    wait_for(claimed_since, 30, "the replica to claim again", interval=0.2)
    out = collect(rig, reader, db, anchors, PERIOD_US, beats=beats, alive=beats, timeout=30)
    later = [
        r.claimed_us for r in out.rows.values() if r.owner == cut_id and r.claimed_us > stopped_us
    ]
    assert later and sent_us <= min(later), (sent_us, sorted(later)[:3])

    copies = [m for m in out.messages if m.slot == slot]
    assert [m.task_id for m in copies] == [task_id], copies
    report = check_slots(out.messages, out.expected, out.upto_us, out.rows, out.published)
    assert not report.problems, "\n".join(report.problems) + "\n" + rig.group.outputs()
    assert report.doubled == [] and report.taken_over == [], report
    assert out.rows[slot] == row
    for other in others:
        assert task_id not in other.log(), f"{other.name} touched the slot"
    errors = [line for line in cut.lines("unreachable") if "ERROR" in line]
    assert len(errors) == 1 and "sends nothing until it is back" in errors[0], errors
    assert len(cut.lines("reachable again")) == 1, cut.log()[-4000:]
    assert cut.lines("was taken over before replica") == []
    print(
        f"confirm cut: {slot[0]}@{slot[1]} confirmed {(sent_us - restored_us) / US:.1f}s "
        "after the restore, fence 1, one copy"
    )
