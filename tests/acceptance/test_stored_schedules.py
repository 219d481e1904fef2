"""Stored schedules edited while three real ``celery beat`` replicas run.

The test process is the editor: through ``Schedules`` it adds entries, edits
one (its keyword argument says which version a message was sent under),
disables, enables and deletes them, while the replicas send. Read off the
broker afterwards:

* every slot of every entry is sent once (no two messages for one entry and
  instant), on PostgreSQL, MariaDB and SQLite alike;
* nothing is sent under a definition replaced more than a second before:
  no message of version 1 for a slot after the edit's commit + 1 s, nothing
  of a disabled entry after its commit + 1 s and nothing of the span it was
  disabled, nothing of a deleted one after its delete + 1 s;
* an added entry is in effect within a second: a single run set 1.5 s after
  its commit is sent, once, by one replica;
* a stored entry may not take a ``beat_schedule`` name;
* behind PgBouncer in transaction pooling mode with listening on, a replica
  says once that it reads the change feed every 0.95 s, and each edit's run is
  sent within a second of its commit.
"""

from __future__ import annotations

import time
from collections import Counter
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from harness import US, Rig, wait_connected, wait_for

from celery_singlebeat import Schedules
from celery_singlebeat.exceptions import InvalidEntry
from celery_singlebeat.store.sql.operator import Operator

#: replicas are given up to this long to follow a commit (the promise: 1 s)
EFFECT_US = 1 * US
#: how often the broker's reader looks (QueueReader.poll)
READER_POLL = 0.05


def run_now_within_a_second(schedules: Schedules, reader: Any, entry: str) -> Any:
    """Ask for a run now of ``entry`` and wait for its message: sent within a
    second of the commit (the feed read's bound, on every database), plus a
    quarter second for a tick delayed on a loaded machine. The request."""
    run = Operator(schedules.store).run_now(entry, by="test", reason="now")  # type: ignore[arg-type]
    asked = time.time()
    message = wait_for(
        lambda: next((m for m in reader.messages() if m.at_us == run.slot_us), None),
        10,
        f"the run-now request of {entry!r}",
        interval=0.02,
    )
    assert message.entry == entry
    assert message.received - asked <= 1.25 + READER_POLL, message.received - asked
    return run


def _versions(messages: list, entry: str) -> list[tuple[int, str]]:
    return sorted((m.at_us, m.kwargs) for m in messages if m.entry == entry)


def _edit_cycle(rig: Rig, broker_url: str, db_url: str, prefix: str) -> None:
    reader, db, env = rig.fleet(broker_url, db_url, prefix, SB_ENTRIES="1", SB_EVERY="5")
    beats = [rig.start_beat(env, f"stored-{i}") for i in range(3)]
    wait_connected(beats)
    with Schedules(db_url, table_prefix=prefix, by="test") as schedules:
        with pytest.raises(InvalidEntry, match="probe-0"):
            Schedules(store=schedules.store, static_names=["probe-0"]).upsert(
                "probe-0", "beatapp.probe", timedelta(seconds=1)
            )

        edited = schedules.upsert(
            "edited", "beatapp.probe", timedelta(seconds=1), kwargs={"i": 1}, why="test"
        )
        toggled = schedules.upsert(
            "toggled", "beatapp.probe", timedelta(seconds=1), kwargs={"i": 0}
        )
        doomed = schedules.upsert("doomed", "beatapp.probe", timedelta(seconds=1), kwargs={"i": 0})
        wait_for(
            lambda: {"edited", "toggled", "doomed"} <= {m.entry for m in reader.messages()},
            10,
            "the stored entries to be sent",
            interval=0.1,
        )
        once_at = datetime.now(timezone.utc) + timedelta(seconds=1.5)
        once = schedules.upsert("once", "beatapp.probe", once_at, kwargs={"i": 9})

        wait_for(
            lambda: len([m for m in reader.messages() if m.entry == "edited"]) >= 2,
            10,
            "slots of version 1",
            interval=0.1,
        )
        edited2 = schedules.update("edited", kwargs={"i": 2}, why="version 2")
        assert edited2.revision is not None and edited2.revision > (edited.revision or 0)
        disabled = schedules.disable("toggled")
        off_until = db.now_us() + 3 * US
        wait_for(lambda: db.now_us() >= off_until, 10, "3 s disabled", interval=0.1)
        enabled = schedules.enable("toggled")
        schedules.delete("doomed", why="done with it")
        deleted_at = schedules.log("doomed")[0].at_us
        end_us = db.now_us() + 3 * US
        wait_for(lambda: db.now_us() >= end_us, 10, "slots after the last edit", interval=0.2)
        log = schedules.log("edited")
        assert [row.action for row in log][:2] == ["changed", "created"], log
        assert log[0].why == "version 2" and log[0].by == "test"
        # run now of a stored entry (in no replica's catalog): sent within a
        # second of the commit on every database, the feed read's bound
        run_now_within_a_second(schedules, reader, "toggled")
    for beat in beats:
        beat.stop()
    messages = reader.finish()

    # each slot once, whichever replica sent it
    counts = Counter(m.slot for m in messages)
    assert not [slot for slot, n in counts.items() if n > 1], "a slot was sent twice"

    def us(instant: datetime | None) -> int:
        assert instant is not None
        return int(instant.timestamp() * US)

    # nothing under a definition replaced more than a second before
    stale = [
        (at_us, kw)
        for at_us, kw in _versions(messages, "edited")
        if "'i': 1" in kw and at_us > us(edited2.updated) + EFFECT_US
    ]
    assert not stale, f"version 1 sent after the edit: {stale}"
    assert any("'i': 2" in kw for _, kw in _versions(messages, "edited")), "version 2 never sent"
    toggled_at = [at for at, _ in _versions(messages, "toggled")]
    off_span = (us(disabled.updated) + EFFECT_US, us(enabled.updated))
    assert not [at for at in toggled_at if off_span[0] < at <= off_span[1]], "sent while disabled"
    assert [at for at in toggled_at if at > off_span[1]], "not sent again once enabled"
    doomed_at = [at for at, _ in _versions(messages, "doomed")]
    assert doomed.revision is not None and doomed_at
    assert not [at for at in doomed_at if at > deleted_at + EFFECT_US], "sent after its delete"
    # the single run: once, at its instant
    assert [at for at, _ in _versions(messages, "once")] == [us(once_at)], messages
    assert once.max_runs == 1 or once.max_runs is None
    assert toggled.revision is not None


@pytest.mark.slow
@pytest.mark.postgres
@pytest.mark.redis
@pytest.mark.shared_postgres
def test_stored_entries_edited_while_replicas_run_postgres(
    rig: Rig, pg_url: str, redis_url: str, table_prefix: str
) -> None:
    _edit_cycle(rig, f"{redis_url}/6", pg_url, table_prefix)


@pytest.mark.slow
@pytest.mark.mysql
@pytest.mark.redis
def test_stored_entries_edited_while_replicas_run_mariadb(
    rig: Rig, mysql_url: str, redis_url: str, table_prefix: str
) -> None:
    _edit_cycle(rig, f"{redis_url}/6", mysql_url, table_prefix)


@pytest.mark.slow
@pytest.mark.redis
def test_stored_entries_edited_while_replicas_run_sqlite(
    rig: Rig, tmp_path: Path, redis_url: str, table_prefix: str
) -> None:
    _edit_cycle(rig, f"{redis_url}/6", f"sqlite:///{tmp_path / 'stored.db'}", table_prefix)


@pytest.mark.slow
@pytest.mark.postgres
@pytest.mark.redis
@pytest.mark.shared_postgres
def test_a_single_run_is_sent_once_when_its_sender_is_killed_after_the_claim(
    rig: Rig, pg_url: str, redis_url: str, table_prefix: str
) -> None:
    """Three replicas; the one that claims the single run freezes there
    (SIGSTOP) and is SIGKILLed; another takes the claim over once its lease
    (3 s) runs out and sends it: once, at its instant, under its own task id."""
    import re
    import signal

    reader, db, env = rig.fleet(
        f"{redis_url}/6",
        pg_url,
        table_prefix,
        SB_ENTRIES="0",
        SB_LEASE="3",
        SB_LOOP="1",
        SB_STOP_ON="claimed",
        SB_STOP_ARM="usr2",
    )
    beats = [rig.start_beat(env, f"once-{i}") for i in range(3)]
    wait_connected(beats)
    for beat in beats:
        beat.signal(signal.SIGUSR2)  # armed: stop at the next slot it claims
    with Schedules(pg_url, table_prefix=table_prefix, by="test") as schedules:
        at = datetime.now(timezone.utc) + timedelta(seconds=2)
        schedules.upsert("once", "beatapp.probe", at, args=[1])
        frozen = wait_for(
            lambda: next((b for b in beats if re.search(r"SB-STOPPING once ", b.log())), None),
            15,
            "a replica to claim the single run and freeze",
            interval=0.1,
        )
        wait_for(lambda: frozen.state() == "T", 5, "the claimer to freeze")
        survivors = [b for b in beats if b is not frozen]
        for beat in survivors:
            beat.signal(signal.SIGUSR1)  # disarmed: they must send it
        frozen.kill()
        killed_at = db.now_us()
        wait_for(
            lambda: [m for m in reader.messages() if m.entry == "once"],
            20,
            "a survivor to take the claim over and send it",
            interval=0.2,
        )
        # a lease and more past the takeover: nothing else of it comes
        settle_us = killed_at + 8 * US
        wait_for(lambda: db.now_us() >= settle_us, 15, "a lease past the takeover", interval=0.2)
    for beat in survivors:
        beat.stop()
    sent = [m for m in reader.finish() if m.entry == "once"]
    at_us = int(at.timestamp() * US)
    assert [m.at_us for m in sent] == [at_us], sent
    row = db.rows()[("once", at_us)]
    assert row.fence >= 2, row  # taken over, not sent by the killed claimer


@pytest.mark.slow
@pytest.mark.postgres
@pytest.mark.redis
def test_an_idle_fleet_behind_pgbouncer_follows_a_change_within_a_second(
    rig: Rig, pgbouncer_url: str, redis_url: str, table_prefix: str
) -> None:
    """Behind PgBouncer in transaction pooling mode a replica's LISTEN
    succeeds and hears nothing. Each replica finds that out by its probe and
    reads the change feed every 0.95 s instead of every 5 s. With nothing due
    (no claim brings the versions back), a run-now request and an entry added
    to run 1.5 s after its commit still go out on time, once."""
    reader, _db, env = rig.fleet(f"{redis_url}/6", pgbouncer_url, table_prefix, SB_ENTRIES="0")
    beats = [rig.start_beat(env, f"pooled-{i}") for i in range(2)]
    wait_connected(beats)
    wait_for(
        lambda: all("hears nothing" in b.log() for b in beats),
        15,
        "both replicas to find their LISTEN deaf",
        interval=0.2,
    )
    with Schedules(pgbouncer_url, table_prefix=table_prefix, by="test") as schedules:
        schedules.upsert("rare", "beatapp.probe", timedelta(hours=1), kwargs={"i": 0})
        at = datetime.now(timezone.utc) + timedelta(seconds=1.5)
        schedules.upsert("once", "beatapp.probe", at, kwargs={"i": 1})
        wait_for(
            lambda: [m for m in reader.messages() if m.entry == "once"],
            10,
            "the single run",
            interval=0.05,
        )
        run = run_now_within_a_second(schedules, reader, "rare")
    for beat in beats:
        beat.stop()
    messages = reader.finish()
    assert [m.at_us for m in messages if m.entry == "once"] == [int(at.timestamp() * US)]
    assert [m.at_us for m in messages if m.entry == "rare"] == [run.slot_us]


#: the lines a replica logs when it stops relying on its listening connection
#: and reads the change feed every 0.95 s: its probe did not come back, or a
#: version moved with nothing heard (engine/controls.py, engine/feed.py)
READS_EVERY_PERIOD = ("hears nothing", "heard no notification for a change")


@pytest.mark.slow
@pytest.mark.postgres
@pytest.mark.redis
def test_edits_behind_pgbouncer_with_listening_on_take_effect_within_a_second(
    rig: Rig, pgbouncer_url: str, redis_url: str, table_prefix: str
) -> None:
    """One real replica through PgBouncer in transaction pooling mode with
    ``singlebeat_listen`` on: its LISTEN succeeds and hears nothing. It says so
    in one line and reads the change feed every 0.95 s, not every 5 s. Three
    edits of an hourly entry each move its start to half a second after the
    commit, so that each edit's run is due before a replica reading every
    0.95 s can have seen it: each is sent, under the new definition, within a
    second of its commit (plus a quarter second for a tick delayed on a
    loaded machine, as ``run_now_within_a_second``), where a replica left on
    the 5 s backstop would send it up to 5 s late."""
    reader, _db, env = rig.fleet(
        f"{redis_url}/6", pgbouncer_url, table_prefix, SB_ENTRIES="0", SB_LISTEN="1"
    )
    beat = rig.start_beat(env, "pooled-edits")
    wait_connected([beat])
    wait_for(
        lambda: any(line in beat.log() for line in READS_EVERY_PERIOD),
        15,
        "the replica to find its LISTEN deaf",
        interval=0.1,
    )
    late: list[float] = []
    with Schedules(pgbouncer_url, table_prefix=table_prefix, by="test") as schedules:
        schedules.upsert("edited", "beatapp.probe", timedelta(hours=1), kwargs={"i": 0})
        for version in range(1, 4):
            start = datetime.now(timezone.utc) + timedelta(seconds=0.5)
            row = schedules.update("edited", start=start, kwargs={"i": version})
            assert row.updated is not None and row.updated < start
            committed = row.updated.timestamp()
            message = wait_for(
                lambda v=version: next(
                    (m for m in reader.messages() if f"'i': {v}" in m.kwargs), None
                ),
                10,
                f"the run of version {version}",
                interval=0.02,
            )
            assert message.at_us == int(start.timestamp() * US)
            late.append(message.received - committed)
    beat.stop()
    messages = [m for m in reader.finish() if m.entry == "edited"]
    assert len(messages) == 3, messages  # one run per edit, nothing of version 0
    assert max(late) <= 1.25 + READER_POLL, late
    log = beat.log()
    assert sum(log.count(line) for line in READS_EVERY_PERIOD) == 1, log
    assert "notifications again" not in log, log
