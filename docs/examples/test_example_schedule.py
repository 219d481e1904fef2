"""Which runs the schedule of exampleapp.py sends: docs/testing.md.

The ini option ``singlebeat_app = exampleapp:app`` names the app.
"""

from datetime import datetime, timedelta, timezone

from celery_singlebeat.testing.simulation import ReplicaKilled, assert_runs

UTC = timezone.utc


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)


def test_the_nightly_report_skipped_by_the_spring_change_runs_at_0330(singlebeat_simulate):
    # 2026-03-29, Europe/Berlin: 02:00 CET -> 03:00 CEST; 02:30 does not exist
    result = singlebeat_simulate(utc(2026, 3, 29, 0), utc(2026, 3, 29, 2), replicas=2)
    assert_runs(result.only("nightly-report"), {"nightly-report": [utc(2026, 3, 29, 1, 30)]})


def test_the_nightly_report_runs_once_in_the_repeated_autumn_hour(singlebeat_simulate):
    # 2026-10-25: 03:00 CEST -> 02:00 CET; 02:30 happens at 00:30 and 01:30 UTC
    result = singlebeat_simulate(utc(2026, 10, 25, 0), utc(2026, 10, 25, 2), replicas=2)
    assert_runs(result.only("nightly-report"), {"nightly-report": [utc(2026, 10, 25, 0, 30)]})


def test_the_missed_run_policies_after_the_whole_fleet_was_down(singlebeat_simulate):
    start = utc(2026, 1, 5, 10)
    minute = timedelta(minutes=1)
    # both replicas killed at 10:07:30, both back at 10:32
    down, up = start + 7.5 * minute, start + 32 * minute
    result = singlebeat_simulate(
        start,
        start + 40 * minute,
        replicas=2,
        events=[ReplicaKilled(1, down, restart_at=up), ReplicaKilled(2, down, restart_at=up)],
    )
    every_5 = [start + k * 5 * minute for k in range(1, 9)]  # 10:05 .. 10:40
    assert_runs(
        result,
        {
            # all: every missed run (10:10 .. 10:30), sent when the fleet came back
            "meter-usage": every_5,
            # coalesce: of the missed 10:10 .. 10:30, only the latest, once
            "refresh-rates": [start + 5 * minute, start + 30 * minute, *every_5[6:]],
            # skip: none of the missed 10:08 .. 10:31
            "poll-partner": [start + k * minute for k in (*range(1, 8), *range(32, 41))],
        },
    )
    late = {(run.entry, run.at, run.sent_at) for run in result.runs if run.sent_at >= up
            and run.at < up}
    assert {(entry, at) for entry, at, sent_at in late} == {
        *(("meter-usage", at) for at in every_5[1:6]),
        ("refresh-rates", start + 30 * minute),
    }
    assert {sent_at for _, _, sent_at in late} == {up}  # at once, by the new processes
    # what the policies dropped, as the replicas reported it (slots_skipped)
    assert {(s.entry, s.slots) for s in result.skipped} == {
        ("poll-partner", 24),  # 10:08 .. 10:31
        ("refresh-rates", 4),  # 10:10 .. 10:25
    }


def test_one_replica_killed_the_others_send_everything_on_time(singlebeat_simulate):
    start = utc(2026, 1, 5, 10)
    result = singlebeat_simulate(
        start, start + timedelta(minutes=20), replicas=3,
        events=[ReplicaKilled(1, start + timedelta(minutes=7))],
    )
    assert result.of("poll-partner") == [start + timedelta(minutes=k) for k in range(1, 21)]
    assert result.doubled() == {}
    assert all(run.sent_at - run.at < timedelta(seconds=1) for run in result.runs)
    assert not any(run.replica == "replica-1" and run.at > start + timedelta(minutes=7)
                   for run in result.runs)


def test_stepping_a_fleet_by_hand(singlebeat_fleet, singlebeat_store):
    fleet = singlebeat_fleet(2)
    fleet.tick()  # the first tick registers the entries: anchors at the clock's start
    fleet.advance(timedelta(minutes=1))
    fleet.tick()
    assert [(run.entry, run.at) for run in fleet.sent] == [
        ("poll-partner", fleet.now())
    ]
    assert [row.entry for row in singlebeat_store.slot_rows()] == ["poll-partner"]
