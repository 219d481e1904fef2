"""The operator CLI (``celery_singlebeat/cli``) through click's CliRunner against
SQLite, PostgreSQL and MariaDB: what each command prints, its JSON, and every
kind of bad input: one line on stderr, exit status 1 (2 for a usage error),
no traceback. The same commands as real processes, with secrets in the URL:
``tests/acceptance/test_cli_processes.py``.
"""

from __future__ import annotations

import getpass
import json
import re
import socket
import sqlite3
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result
from conftest import PG_URL
from fleet_rows import FleetRows, cron, every
from sqlalchemy.engine import make_url

from celery_singlebeat.cli import singlebeat
from celery_singlebeat.store.sql.operator import Operator
from celery_singlebeat.timeline.clock import US, datetime_to_us

A, B, C = "pod-a:11:aa", "pod-b:12:bb", "pod-c:13:cc"
MINUTE = 60 * US


def make_fleet(url: str, prefix: str) -> FleetRows:
    """A fleet: A live, B lost, C stopped; 'report' and 'nightly' on A and B,
    'lonely' on B only, 'orphan' in no catalog; slot rows; two lease rows."""
    made = FleetRows(url, prefix)
    now = made.now_us()
    made.replica(A, seen_us=now, tracked=3, proposes_first=2)
    made.replica(B, seen_us=now - MINUTE)
    made.replica(C, seen_us=now - 2 * US, stopped_us=now - 2 * US)
    for name in ("report", "nightly", "lonely", "orphan"):
        made.entry(name, now - 95 * US)
    for replica in (A, B):
        made.catalog(replica, "report", every(10), task="proj.report", schedule="every 10s")
        made.catalog(replica, "nightly", cron("0", "3"), task="proj.nightly", schedule="at 3")
    made.catalog(B, "lonely", every(10))
    made.slot("report", now - 5 * US, owner=A, sent_us=now - 5 * US + 4000)
    made.slot("report", now - 15 * US, owner=B, fence=2, sent_us=now - 15 * US + 2000)
    made.lock("proj.billing", owner="w1", token=now, expires_us=now + MINUTE, acquired_us=now)
    made.lock("proj.old", owner="w2", token=now - 9, expires_us=now - US, acquired_us=now - MINUTE)
    return made


@pytest.fixture
def rows(db_url: str, table_prefix: str) -> Iterator[FleetRows]:
    made = make_fleet(db_url, table_prefix)
    yield made
    made.close()


@pytest.fixture(scope="module")
def sqlite_fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FleetRows]:
    """One SQLite fleet for the refusals, which change nothing (A stays live
    for the few seconds they take)."""
    made = make_fleet(f"sqlite:///{tmp_path_factory.mktemp('cli')}/fleet.sqlite", "sb_")
    yield made
    made.close()


def run(rows: FleetRows, *args: str, input: str | None = None) -> Result:
    """``python -m celery_singlebeat --url URL --table-prefix P ARGS`` in-process."""
    argv = ["--url", rows.url, "--table-prefix", rows.prefix, *args]
    return CliRunner().invoke(singlebeat, argv, input=input, prog_name="singlebeat")


def ok(result: Result) -> str:
    assert result.exit_code == 0, (result.output, result.exception)
    assert result.stderr == "", result.stderr
    return result.stdout


def failed(result: Result, status: int = 1) -> str:
    """The error line of a failed command: one line, on stderr, no traceback."""
    assert result.exit_code == status, (result.output, result.exception)
    assert result.stdout == "", result.stdout
    assert "Traceback" not in result.stderr
    # a usage error has click's usage text first; the error itself is one line
    lines = result.stderr.strip().splitlines()
    assert lines[-1].startswith("Error: "), result.stderr
    if status == 1:
        assert len(lines) == 1, result.stderr
    return lines[-1]


def as_json(result: Result) -> Any:
    return json.loads(ok(result))


def instant_ok(doc: dict[str, Any], name: str) -> None:
    """Each instant twice: ISO-8601 UTC and µs, saying the same."""
    value, exact = doc[name], doc[f"{name}_us"]
    if exact is None:
        assert value is None
        return
    assert value.endswith("Z")
    assert datetime_to_us(datetime.fromisoformat(value[:-1] + "+00:00")) == exact


def test_status_shows_entries_replicas_and_pauses(rows: FleetRows) -> None:
    Operator(rows.store).pause(["report"], None, "ops@host", "migration")
    out = ok(run(rows, "status"))
    header, table, *_others = out.split("\n\n")
    assert "(database clock): 1 replica(s) live, 1 lost, 1 stopped; 4 entries" in header
    lines = {line.split()[0]: line for line in table.splitlines() if line.strip()}
    assert "paused by ops@host, until resumed: migration" in lines["report"]
    assert "pod-a:11:aa" in lines["report"] and "4ms" in lines["report"]  # last sender, delay
    assert "no live replica has it" in lines["lonely"]
    assert "in no replica's catalog" in lines["orphan"]
    assert re.search(r"^pod-b:12:bb .*lost \(not seen since \S+Z\)", out, re.M), out
    assert re.search(r"^pod-c:13:cc .*stopped \S+ ago", out, re.M), out
    assert re.search(r"^PAUSED +BY.*\nreport +ops@host", out, re.M), out
    assert "\x1b[" not in out  # no colour off a terminal

    shown = ok(run(rows, "status", "--limit", "2"))
    assert "2 of 4 entries shown (next due first); --limit N or --all" in shown
    assert "entries shown" not in ok(run(rows, "status", "--all"))

    doc = as_json(run(rows, "status", "--json"))
    instant_ok(doc, "now")
    assert doc["summary"] == {
        "entries": 4,
        "overdue": 1,  # lonely: never run, only a lost replica has it
        "paused": 1,
        "pauses": 1,
        "replicas_live": 1,
        "replicas_lost": 1,
        "replicas_stopped": 1,
        "lost_writes": 0,
    }
    entries = {e["name"]: e for e in doc["entries"]}
    report = entries["report"]
    assert (report["task"], report["schedule"], report["replicas"]) == (
        "proj.report",
        "every 10s",
        1,
    )
    assert (report["last_sender"], report["last_delay_us"], report["last_state"]) == (
        A,
        4000,
        "sent",
    )
    assert report["paused"]["by"] == "ops@host" and report["paused"]["until"] is None
    for entry in doc["entries"]:
        for name in ("next_slot", "overdue_slot", "last_slot", "last_sent_slot"):
            instant_ok(entry, name)
    assert entries["lonely"]["overdue"] is True and entries["orphan"]["task"] is None
    assert [r["state"] for r in doc["replicas"]] == ["live", "lost", "stopped"]
    instant_ok(doc["replicas"][0], "seen")
    assert [p["entry"] for p in doc["pauses"]] == ["report"]
    # JSON gives every entry whatever the table would show
    assert len(as_json(run(rows, "status", "--json"))["entries"]) == 4
    assert len(as_json(run(rows, "status", "--json", "--limit", "1"))["entries"]) == 1


def test_history_replicas_and_leases(rows: FleetRows) -> None:
    out = ok(run(rows, "history"))
    assert out.splitlines()[0].split() == [
        "SLOT",
        "ENTRY",
        "STATE",
        "BY",
        "FENCE",
        "DELAY",
        "TASK",
        "ID",
        "REQUESTED",
        "BY",
    ]
    first, second = out.splitlines()[1:3]
    assert first.split()[1:7] == ["report", "sent", A, "1", "4ms", first.split()[6]]
    assert second.split()[1:5] == ["report", "sent", B, "2"]

    asked = as_json(run(rows, "run", "report", "--reason", "catch up", "--by", "ops", "--json"))
    doc = as_json(run(rows, "history", "report", "--json"))
    assert [s["state"] for s in doc["slots"]] == ["requested", "sent", "sent"]
    newest = doc["slots"][0]
    assert (newest["requested_by"], newest["request_reason"]) == ("ops", "catch up")
    assert newest["task_id"] == asked["task_id"] and newest["slot_us"] == asked["slot_us"]
    for slot in doc["slots"]:
        for name in ("slot", "claimed", "sent", "requested"):
            instant_ok(slot, name)
    assert newest["lease_until"] is None and newest["lease_until_us"] == 0
    instant_ok(doc["slots"][1], "lease_until")
    assert len(as_json(run(rows, "history", "--limit", "1", "--json"))["slots"]) == 1
    assert as_json(run(rows, "history", "--since", "10s", "--json"))["slots"][-1]["fence"] == 1
    assert len(as_json(run(rows, "history", "--since", "1h", "--json"))["slots"]) == 3
    assert "2 newest rows shown" in ok(run(rows, "history", "--limit", "2"))
    assert ok(run(rows, "history", "nobody")) == "no slot rows of 'nobody'\n"

    replicas = as_json(run(rows, "replicas", "--json"))["replicas"]
    assert [(r["id"], r["state"]) for r in replicas] == [(A, "live"), (B, "lost"), (C, "stopped")]
    assert replicas[0]["share"] == pytest.approx(2 / 3) and replicas[0]["heartbeat_us"] == 5 * US
    assert replicas[0]["catalog"] == A  # the rows helper names each replica's catalog after it
    assert re.search(r"^pod-a:11:aa +pod-a +11 +0\.1\.0 +live", ok(run(rows, "replicas")), re.M)

    leases = as_json(run(rows, "leases", "--json"))["leases"]
    assert [(x["key"], x["state"], x["holder"]) for x in leases] == [
        ("proj.billing", "held", "w1"),
        ("proj.old", "expired", "w2"),
    ]
    instant_ok(leases[0], "expires")
    assert re.search(r"^proj.billing +held +w1 +\d+ +in \S+", ok(run(rows, "leases")), re.M)


def test_pause_resume_and_run(rows: FleetRows) -> None:
    paused = as_json(
        run(rows, "pause", "report", "nightly", "--until", "30m", "--reason", "db", "--json")
    )
    assert [p["entry"] for p in paused["paused"]] == ["report", "nightly"]
    first = paused["paused"][0]
    assert first["until_us"] - first["at_us"] == 30 * MINUTE and first["reason"] == "db"
    assert first["by"] == f"{getpass.getuser()}@{socket.gethostname()}"  # the default
    instant_ok(first, "until")
    version = paused["controls_version"]
    assert rows.controls_version() == version

    unknown = failed(run(rows, "pause", "reprot"))
    assert unknown == (
        "Error: no live replica has the entry 'reprot' (did you mean 'report'?); nothing changed"
    )
    assert "would end in the past" in failed(
        run(rows, "pause", "report", "--until", "2001-01-01T00:00Z")
    )
    refused = failed(run(rows, "run", "report"))
    assert refused.startswith("Error: entry 'report' is paused by ") and ": db:" in refused

    assert ok(run(rows, "resume", "report")) == "resumed 'report'\n"
    out = ok(run(rows, "pause", "--all", "--until", "2099-01-01T00:00:00Z", "--by", "ops"))
    assert re.fullmatch(
        r"paused every entry \('\*'\) until 2099-01-01T00:00:00.000Z \(in \S+\)\n", out
    )
    still = ok(run(rows, "resume", "report"))
    assert "'report' was not paused" in still and "still paused: paused (every entry" in still
    doc = as_json(run(rows, "resume", "--all", "--json"))
    assert sorted(doc["resumed"]) == ["*", "nightly"] and doc["still_paused_by"] is None

    asked = as_json(run(rows, "run", "report", "--by", "ops", "--json"))
    assert asked["entry"] == "report" and asked["requested_by"] == "ops"
    instant_ok(asked, "slot")
    line = ok(run(rows, "run", "report"))
    assert line.startswith("requested a run of 'report': slot ") and "task id " in line
    assert rows.controls_version() == version + 6


@pytest.mark.parametrize(
    ("args", "status", "says"),
    [
        (("pause", "reprot"), 1, "no live replica has the entry 'reprot' (did you mean 'report'?)"),
        (("pause", "lonely"), 1, "no live replica has the entry 'lonely'"),
        (("pause", "report", "--all"), 2, "pause either ENTRY... or --all, not both"),
        (("pause",), 2, "name the entries to pause, or pass --all"),
        (("pause", "report", "--until", "5x"), 2, "'5x' is neither a duration"),
        (("pause", "report", "--until", "2026-03-01T12:00"), 2, "has no UTC offset"),
        (("pause", "report", "--until", "2001-01-01T00:00Z"), 1, "would end in the past"),
        (("pause", "report", "--reason", "x" * 501), 1, "reason: 501 characters"),
        (("resume",), 2, "name the entries to resume, or pass --all"),
        (("resume", "nope"), 1, "no live replica has the entry 'nope'"),
        (("run", "nope"), 1, "no live replica has the entry 'nope'"),
        (("run",), 2, "Missing argument 'ENTRY'"),
        (("history", "--limit", "0"), 2, "--limit"),
        (("history", "--since", "yesterday"), 2, "'yesterday' is neither a duration"),
        (("status", "--limit", "-1"), 2, "--limit"),
        (("release", "proj.bililng", "--yes"), 1, "did you mean 'proj.billing'"),
        (("release", "proj.billing"), 1, "no terminal to ask on; pass --yes"),
        (
            ("prune", "--retention", "1s"),
            1,
            "singlebeat_retention (1s) must be at least four times",
        ),
        (("prune", "--retention", "0"), 2, "a duration must be positive"),
        (
            ("prune", "--run-retention", "10m"),
            1,
            "singlebeat_run_retention (600s) must be at least",
        ),
        (("bogus",), 2, "No such command 'bogus'"),
    ],
)
def test_bad_input_is_one_line_and_changes_nothing(
    sqlite_fleet: FleetRows, args: tuple[str, ...], status: int, says: str
) -> None:
    # the checks are the database's on every backend (test_fleet.py): one is enough here
    version = sqlite_fleet.controls_version()
    line = failed(run(sqlite_fleet, *args), status)
    assert says in line, line
    assert sqlite_fleet.controls_version() == version
    assert sqlite_fleet.select(sqlite_fleet.tables.pauses) == []


def test_release_and_prune(rows: FleetRows) -> None:
    out = ok(run(rows, "release", "proj.billing", "--yes"))
    assert re.fullmatch(r"released 'proj.billing' \(was held by w1, token \d+\)\n", out), out
    assert Operator(rows.store).lease("proj.billing").state == "released"  # type: ignore[union-attr]
    again = ok(run(rows, "release", "proj.billing", "--yes"))
    assert again == "singleton key 'proj.billing' is not held (released); nothing to release\n"
    assert "is not held (expired)" in ok(run(rows, "release", "proj.old"))

    now = rows.now_us()
    old = now - 16 * MINUTE
    rows.slot("report", old, owner=A, sent_us=old + 1000)
    rows.replica("gone:1:xx", seen_us=old)
    rows.catalog("gone:1:xx", "report", every(10))
    out = ok(run(rows, "prune"))
    assert out.startswith("pruned 1 slot row(s) sent more than 15m00s ago, 0 SingletonTask row(s)")
    assert "1 replica row(s) gone longer than 15m00s, 1 catalog row(s) no replica names" in out
    assert "pruned 0 slot row(s) sent more than 1h00m" in ok(
        run(rows, "prune", "--retention", "1h")
    )


def test_a_database_without_the_schema_says_to_create_it(db_url: str, table_prefix: str) -> None:
    if db_url.startswith("sqlite"):
        sqlite3.connect(make_url(db_url).database or "").close()  # the file, without tables
    argv = ["--url", db_url, "--table-prefix", table_prefix]
    for command in (["status"], ["pause", "x"], ["history"], ["leases"]):
        line = failed(CliRunner().invoke(singlebeat, [*argv, *command]))
        assert "create-schema" in line and "tables are missing" in line, line


def test_where_the_database_is_cannot_be_wrong_silently(tmp_path: Path) -> None:
    runner = CliRunner()
    # no app and no --url: a usage error, not the SQLite default in the working directory
    line = failed(runner.invoke(singlebeat, ["status"]), 2)
    assert "pass --url URL" in line
    missing = tmp_path / "typo.sqlite"
    line = failed(runner.invoke(singlebeat, ["--url", f"sqlite:///{missing}", "status"]))
    assert "no such SQLite file" in line and "create-schema" in line
    assert not missing.exists(), "a read must not create the database file"
    line = failed(runner.invoke(singlebeat, ["--url", "nonsense:://x", "status"]))
    assert "cannot parse the database URL" in line
    line = failed(runner.invoke(singlebeat, ["--url", "oracle://u:pw@h/db", "status"]))
    assert "unsupported database 'oracle'" in line and ":pw@" not in line
    line = failed(runner.invoke(singlebeat, ["--url", "postgresql+nodrv://u:pw9@h/d", "status"]))
    assert "cannot open it: NoSuchModuleError" in line and "pw9" not in line
    # unreachable, with a password in the URL and in its query string
    url = make_url(PG_URL).set(password="S3cret-pw", port=1)
    url = url.update_query_dict({"password": "Q-s3cret"})
    line = failed(runner.invoke(singlebeat, ["--url", url.render_as_string(False), "replicas"]))
    assert "S3cret-pw" not in line and "Q-s3cret" not in line
    shown = f"{url.drivername}://{url.username}:***@127.0.0.1:1/{url.database}?password=***"
    assert line.startswith(f"Error: database {shown}: "), line
    assert "Connection refused" in line


def test_create_schema_takes_the_group_url(tmp_path: Path, table_prefix: str) -> None:
    url = f"sqlite:///{tmp_path}/made.sqlite"
    runner = CliRunner()
    out = ok(
        runner.invoke(singlebeat, ["--url", url, "--table-prefix", table_prefix, "create-schema"])
    )
    assert out == f"celery-singlebeat schema ready in {url}\n"
    doc = json.loads(
        ok(
            runner.invoke(
                singlebeat, ["--url", url, "--table-prefix", table_prefix, "status", "--json"]
            )
        )
    )
    assert doc["entries"] == [] and doc["replicas"] == []


def test_status_says_when_a_failover_lost_writes(db_url: str, table_prefix: str) -> None:
    rows = FleetRows(db_url, table_prefix)
    try:
        now = rows.now_us()
        rows.replica("pod-b:2:bb", seen_us=now)
        assert "the database lost" not in ok(run(rows, "status"))
        rows.replica("pod-a:1:aa", seen_us=now, lost_writes=3)
        out = ok(run(rows, "status"))
        assert (
            "the database lost 3 sent slot(s) of these replicas after a broken connection "
            "(pod-a:1:aa 3): a failover to a lagging standby?" in out
        ), out
        doc = as_json(run(rows, "status", "--json"))
        assert doc["summary"]["lost_writes"] == 3
        assert [(r["id"], r["lost_writes"]) for r in doc["replicas"]] == [
            ("pod-a:1:aa", 3),
            ("pod-b:2:bb", 0),
        ]
    finally:
        rows.close()
