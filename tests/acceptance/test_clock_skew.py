"""Replicas whose clocks are wrong: real ``celery beat`` processes under
libfaketime (Debian's ``faketime`` package), sharing PostgreSQL.

One replica runs 90 s behind from the start, one starts on time and has its
clock stepped 90 s ahead mid-run (what an NTP step or a VM resume does). Every
decision uses the database's clock, so every slot must still reach the broker
exactly once, and no slot may be claimed before it is due on that clock.
"""

from __future__ import annotations

import glob
import re
import signal
from pathlib import Path

import pytest
from conftest import IN_CI, REDIS_URL, require
from harness import US, Rig, check_slots, collect, wait_for

from celery_singlebeat.store.base import EARLY_TOLERANCE_US
from celery_singlebeat.timeline.clock import us_to_datetime

PERIOD_US = US
ENTRIES = 5


def _iso(at_us: int) -> str:
    """A slot instant as the scheduler's log lines show it (ms, UTC, ``Z``)."""
    return us_to_datetime(at_us).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _libfaketime() -> str:
    found = sorted(glob.glob("/usr/lib/*/faketime/libfaketime.so.1"))
    if found:
        return found[0]
    message = "libfaketime is not installed (apt-get install faketime)"
    if IN_CI:
        pytest.fail(message + "; .ci/run installs it")
    pytest.skip(message)


@pytest.mark.slow
def test_skewed_and_stepped_clocks_neither_double_nor_fire_early(
    rig: Rig, pg_url: str, table_prefix: str, tmp_path: Path
) -> None:
    require("redis")
    library = _libfaketime()
    broker = f"{REDIS_URL}/3"
    reader, db, env = rig.fleet(
        broker,
        pg_url,
        table_prefix,
        SB_ENTRIES=str(ENTRIES),
        SB_EVERY="1",
        SB_LEASE="10",
        SB_LOOP="1",
    )
    # libfaketime shifts the monotonic clock too (keeping it real makes its
    # sleep() fail with EINVAL). For the stepped replica that is the harsher
    # case: it also believes its leases ran out, and must stay safe.
    fake = {"LD_PRELOAD": library}
    step_file = tmp_path / "stepped.faketime"
    step_file.write_text("+0\n")
    beats = [
        rig.start_beat(env, "on-time"),
        rig.start_beat({**env, **fake, "FAKETIME": "-90s"}, "behind"),
        rig.start_beat(
            {
                **env,
                **fake,
                "FAKETIME_TIMESTAMP_FILE": str(step_file),
                "FAKETIME_NO_CACHE": "1",
            },
            "stepped",
        ),
    ]
    wait_for(lambda: all("connected to" in b.log() for b in beats), 45, "replicas to connect")
    on_time, behind, stepped = beats
    anchors = db.anchors()
    assert len(anchors) == ENTRIES
    # The behind replica learnt the database is 90 s ahead of its clock.
    # (parsed, not matched as "+9...": 89,999.1 ms is as right as 90,000.4 ms)
    offset = re.search(r"database clock offset ([+-][0-9.]+) ms", behind.log())
    assert offset is not None, behind.log()[-2000:]
    assert abs(float(offset.group(1)) - 90_000) < 2_000, offset.group(0)

    # Which replica wins a tick is a race, so each skewed replica is also made
    # to send alone for a while: the claim it wins must still not be early.
    wait_for(lambda: db.now_us() > min(anchors.values()) + 3 * US, 30, "3 s of sending")
    on_time.stop()
    stepped.signal(signal.SIGSTOP)  # shorter than the lease: it keeps its claims
    alone_from = db.now_us()
    wait_for(
        lambda: len(behind.sent_task_ids()) >= 2 * ENTRIES and db.now_us() > alone_from + 2 * US,
        8,
        "the behind replica to send alone",
    )
    step_file.write_text("+90s\n")
    stepped.signal(signal.SIGCONT)
    behind.stop()
    stepped_at = db.now_us()
    wait_for(lambda: db.now_us() > stepped_at + 6 * US, 30, "6 s after the step")
    out = collect(
        rig,
        reader,
        db,
        anchors,
        PERIOD_US,
        beats=beats,
        alive=[stepped],
        timeout=15,
        upto_us=db.now_us() - US,  # every slot up to here has had time to arrive
    )
    upto, messages, rows = out.upto_us, out.messages, out.rows

    report = check_slots(messages, out.expected, upto, rows, out.published)
    assert not report.problems, "\n".join(report.problems) + "\n" + rig.group.outputs()
    # guarantees.md: a wrong or stepped clock repeats no message. check_slots
    # tolerates a second copy after a takeover; here there must be none.
    assert report.doubled == [], report.doubled
    # Nor any takeover, but one: libfaketime steps the monotonic clock with the
    # wall clock, so a SIGSTOP that caught the stepped replica between a claim and
    # its publish makes it see its publish deadline passed once resumed. It then
    # releases those claims unpublished and its next sweep takes them back. (The
    # replicas stopped by SIGTERM finish their tick first: stopping.py.)
    stepped_id = stepped.replica_id()
    gave_up = bool(stepped.lines("lease ran out before"))
    unexplained = [
        rows[slot]
        for slot in report.taken_over
        if not (
            gave_up
            and rows[slot].owner == stepped_id
            and stepped.lines(f"took back slot {slot[0]}@{_iso(slot[1])}")
        )
    ]
    assert unexplained == [], f"{unexplained}\n{rig.group.outputs()}"
    # Claimed no earlier than due, on the database's clock: nobody fired early.
    early = [r for r in rows.values() if r.claimed_us < r.slot_us - EARLY_TOLERANCE_US]
    assert not early, early[:5]
    # After its step the stepped replica sent every slot, on time.
    after_step = {m.task_id for m in messages if stepped_at + US < m.at_us <= upto}
    assert after_step and after_step <= set(stepped.sent_task_ids())
    late = [
        (m.entry, m.at_us, round(m.received - m.at_us / US, 3))
        for m in messages
        if stepped_at + US < m.at_us and m.received - m.at_us / US > 1.0
    ]
    assert not late, late[:5]
    print(f"taken over {len(report.taken_over)} (taken back by the stepped replica), doubled 0")
