"""The JSON log configuration docs/operations.md shows ("Log records"), run as
written (beatapp ``SB_JSON_LOG=1``) in two real ``celery beat`` replicas: every
line is one JSON object, and each message in the broker has exactly one "won"
or "took over" record whose fields name it.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import pytest
from harness import US, Rig, check_slots, collect, wait_connected, wait_db_time

from celery_singlebeat.timeline.clock import us_to_datetime
from celery_singlebeat.timeline.slots import slot_task_id

SENT = ("won", "took_over")


def _iso(slot_us: int) -> str:
    return us_to_datetime(slot_us).isoformat(timespec="milliseconds").replace("+00:00", "Z")


@pytest.mark.slow
@pytest.mark.postgres
@pytest.mark.redis
def test_json_log_records_name_every_message_sent(
    rig: Rig, pg_url: str, redis_url: str, table_prefix: str
) -> None:
    reader, db, env = rig.fleet(
        f"{redis_url}/3", pg_url, table_prefix, SB_ENTRIES="3", SB_JSON_LOG="1"
    )
    beats = [rig.start_beat(env, f"beat-{i}") for i in range(2)]
    wait_connected(beats)
    anchors = db.anchors()
    wait_db_time(db, db.now_us() + 5 * US, beats)
    out = collect(rig, reader, db, anchors, US, beats=beats, alive=beats, timeout=30)
    report = check_slots(out.messages, out.expected, out.upto_us, out.rows, out.published)
    assert not report.problems, "\n".join(report.problems) + "\n" + rig.group.outputs()

    sent: Counter[tuple[str, int, str]] = Counter()
    for beat in beats:
        records: list[dict[str, Any]] = []
        for line in beat.log().splitlines():
            if line.startswith("{"):
                records.append(json.loads(line))  # a line that does not parse fails here
            else:  # the banner is print()ed; no log line may escape the formatter
                assert "singlebeat:" not in line, line
        replica = beat.replica_id()
        assert replica is not None, beat.log()[-3000:]
        won_lines = [r for r in records if f"replica {replica} won slot " in r["message"]]
        assert all(r.get("decision") == "won" for r in won_lines), won_lines[:3]
        for r in (r for r in records if r.get("decision") in SENT):
            assert r["logger"] == "celery_singlebeat.scheduler" and r["level"] == "INFO", r
            assert r["replica"] == replica, r
            entry, slot_us, task_id = r["entry"], r["slot_us"], r["task_id"]
            assert isinstance(slot_us, int) and r["slot"] == _iso(slot_us), r
            assert task_id == slot_task_id(entry, slot_us), r
            assert isinstance(r["fence"], int) and r["fence"] >= 1, r
            assert f"{entry}@{r['slot']}" in r["message"] and task_id in r["message"], r
            sent[(entry, slot_us, task_id)] += 1
    # exactly the messages the broker holds, one record each
    assert sent == Counter((m.entry, m.at_us, m.task_id) for m in out.messages)
    assert sum(len(slots) for slots in out.expected.values()) >= 3 * 4
