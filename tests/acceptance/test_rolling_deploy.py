"""A rolling deploy that changes an entry's interval, with real beat replicas:
while both versions run side by side the union of their schedules runs, each
instant once; an instant only the new version has runs exactly while a replica
of that version runs, and never before the first one started or after the last
one stopped (docs/guarantees.md, "Replicas with different schedules").

``roll-0`` is every 2 s in version 1 and every 1 s in version 2 (beatapp's
``SB_ROLL``); both share the stored anchor, so version 1's instants are every
other instant of version 2's. The broker is the judge.
"""

from __future__ import annotations

from collections import Counter

from harness import US, BeatProcess, Db, Rig, check_slots, interval_slots, publish_counts, wait_for

ROLL = "roll-0"
LEASE = 5.0
#: a replica proposes its version's instants once it has connected (its first
#: tick follows at once; the log is polled every 0.2 s)
SETTLE_US = US
#: and has claimed an instant by this long after it at the latest, when it is
#: not the entry's first replica (the 250 ms fallback delay, jitter, a round trip)
CLAIM_US = US
#: a replica that starts plans from the latest slot the fleet claimed (version
#: 1 claims one every 2 s), and a slot within the grace is still on time: version
#: 2 may send an instant of its own from up to 2 s before it connected
START_SLACK_US = 3 * US


def _connected(beat: BeatProcess, db: Db) -> int:
    wait_for(
        lambda: "connected to" in beat.log() or not beat.alive(), 45, f"{beat.name} to connect"
    )
    assert beat.alive(), beat.log()[-3000:]
    return db.now_us()


def _wait_db_time(db: Db, until_us: int) -> None:
    wait_for(lambda: db.now_us() >= until_us, (until_us - db.now_us()) / US + 10, "db time")


def test_rolling_deploy_runs_the_union_of_both_schedules(
    rig: Rig, pg_url: str, redis_url: str, table_prefix: str
) -> None:
    reader, db, env = rig.fleet(
        redis_url,
        pg_url,
        table_prefix,
        SB_ENTRIES="1",
        SB_ROLL="1",
        SB_LEASE=str(LEASE),
        SB_LOOP="1",
    )
    v1 = {"SB_ROLL": "1"}
    v2 = {"SB_ROLL": "2"}
    #: each version-2 process: (started, connected, stopped) on the database's clock
    lives: list[list[int]] = []

    def start_v2(name: str) -> BeatProcess:
        spawned = db.now_us()
        beat = rig.start_beat({**env, **v2}, name)
        lives.append([spawned, _connected(beat, db), 0])
        return beat

    def stop(beat: BeatProcess) -> None:
        for life, proc in zip(lives, v2_procs):
            if proc is beat:
                life[2] = db.now_us()
        beat.stop(15)

    a = rig.start_beat({**env, **v1}, "a-v1")
    b = rig.start_beat({**env, **v1}, "b-v1")
    _connected(a, db)
    _connected(b, db)
    _wait_db_time(db, db.now_us() + 6 * US)  # version 1 alone
    v2_procs: list[BeatProcess] = []
    # the new version joins: one replica of each side by side for a while
    v2_procs.append(start_v2("c-v2"))
    _wait_db_time(db, db.now_us() + 6 * US)
    # the rest of the fleet rolls over, one at a time
    a.stop(15)
    v2_procs.append(start_v2("a-v2"))
    b.stop(15)
    v2_procs.append(start_v2("b-v2"))
    _wait_db_time(db, db.now_us() + 4 * US)  # version 2 alone
    # and back: one version-1 replica joins, then every version-2 one leaves
    d = rig.start_beat({**env, **v1}, "d-v1")
    _connected(d, db)
    for beat in v2_procs:
        stop(beat)
        _wait_db_time(db, db.now_us() + 2 * US)
    _wait_db_time(db, db.now_us() + 8 * US)  # version 1 alone again
    upto = db.now_us() - 2 * US
    anchor = db.anchors()[ROLL]

    every_2 = set(interval_slots(anchor, 2 * US, upto))
    only_v2 = [s for s in interval_slots(anchor, US, upto) if s not in every_2]

    def ran(s: int) -> bool:
        return any(
            connected + SETTLE_US <= s and s + CLAIM_US <= stopped
            for _, connected, stopped in lives
        )

    def may_have_run(s: int) -> bool:
        return any(spawned - START_SLACK_US <= s <= stopped + US for spawned, _, stopped in lives)

    required = sorted(every_2 | {s for s in only_v2 if ran(s)})
    optional = {s for s in only_v2 if not ran(s) and may_have_run(s)}
    probe_anchor = db.anchors()["probe-0"]
    wait_for(
        lambda: {(ROLL, s) for s in required} <= {m.slot for m in reader.messages()},
        LEASE + 15,
        "every required instant in the broker",
    )
    rig.group.stop_all()
    messages = reader.finish()
    sent = {m.slot[1] for m in messages if m.entry == ROLL}
    expected = {
        ROLL: required + sorted(optional & sent),
        "probe-0": interval_slots(probe_anchor, US, upto),
    }
    report = check_slots(messages, expected, upto, db.rows(), publish_counts(rig.group.procs))
    assert not report.problems, "\n".join(report.problems) + "\n" + rig.group.outputs()
    # both sides of the union, each for a real stretch of the run
    ran_only_v2 = [s for s in only_v2 if ran(s)]
    assert len(ran_only_v2) >= 6, (len(ran_only_v2), lives)
    assert len(every_2) >= 14, len(every_2)
    # outside every version-2 process's life, its instants are no slot at all
    never = [s for s in only_v2 if not may_have_run(s)]
    assert len(never) >= 3, never
    assert not (set(never) & sent), sorted(set(never) & sent)
    # and nothing was sent twice: no replica died holding a claim here
    copies = Counter(m.slot for m in messages)
    assert max(copies.values()) == 1, [s for s, n in copies.items() if n > 1]
