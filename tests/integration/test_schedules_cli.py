"""``singlebeat schedules ...`` through click's CliRunner on SQLite, PostgreSQL
and MariaDB: each command's output and JSON, the history, export and import
(with its dry run and prune), and bad input: ``Error: ...`` naming the entry
and the field, exit status 2, and the store unchanged."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner, Result
from sqlalchemy.engine import make_url

from celery_singlebeat import Schedules
from celery_singlebeat.cli import singlebeat


@pytest.fixture
def target(db_url: str, table_prefix: str) -> Iterator[list[str]]:
    """The group's options for the database; its tables created."""
    with Schedules(db_url, table_prefix=table_prefix):
        pass
    yield ["--url", db_url, "--table-prefix", table_prefix]


def cli(target: list[str], *args: str) -> Result:
    return CliRunner().invoke(singlebeat, [*target, "schedules", *args], catch_exceptions=False)


def as_json(result: Result) -> Any:
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def test_add_list_show_edit_toggle_log_rm(target: list[str]) -> None:
    added = cli(
        target,
        "add",
        "report",
        "--task",
        "proj.report",
        "--crontab",
        "0 3 * * *",
        "--tz",
        "Europe/Paris",
        "--kwargs",
        '{"format": "pdf"}',
        "--why",
        "new",
        "--by",
        "alice",
    )
    assert added.exit_code == 0, added.output
    assert "stored 'report' at revision" in added.output
    cli(target, "add", "poll", "--task", "proj.poll", "--every", "30", "--queue", "feeds")

    listed = as_json(cli(target, "list", "--json"))["entries"]
    assert [e["name"] for e in listed] == ["poll", "report"]
    report = listed[1]
    assert report["task"] == "proj.report" and report["updated_by"] == "alice"
    assert report["schedule"] == {"crontab": "0 3 * * *", "tz": "Europe/Paris"}
    assert len(report["next_runs"]) == 1
    table = cli(target, "list")
    assert "REVISION" in table.output and "0 3 * * * (Europe/Paris)" in table.output

    shown = as_json(cli(target, "show", "report", "--next", "3", "--json"))
    runs = shown["next_runs"]
    assert len(runs) == 3 and all(r.endswith(("T02:00:00+00:00", "T01:00:00+00:00")) for r in runs)

    revision = shown["revision"]
    edited = as_json(
        cli(
            target,
            "edit",
            "report",
            "--kwargs",
            '{"format": "html"}',
            "--if-revision",
            str(revision),
            "--json",
        )
    )
    assert edited["kwargs"] == {"format": "html"} and edited["revision"] > revision
    poll = as_json(cli(target, "edit", "poll", "--every", "60", "--json"))
    assert poll["options"] == {"queue": "feeds"} and poll["schedule"] == {"every": 60.0}

    assert as_json(cli(target, "disable", "report", "--json"))["enabled"] is False
    assert [e["name"] for e in as_json(cli(target, "list", "--disabled", "--json"))["entries"]] == [
        "report"
    ]
    assert as_json(cli(target, "enable", "report", "--json"))["enabled"] is True

    log = as_json(cli(target, "log", "report", "--json"))["changes"]
    assert [c["action"] for c in log] == ["changed", "changed", "changed", "created"]
    assert log[-1]["why"] == "new" and log[-1]["by"] == "alice"
    # arguments by digest only
    assert str(log[2]["changes"]["kwargs"][0]).startswith("sha256:")
    assert "pdf" not in cli(target, "log", "report").output

    removed = cli(target, "rm", "report", "--why", "done")
    assert removed.exit_code == 0 and "removed 'report'" in removed.output
    assert [e["name"] for e in as_json(cli(target, "list", "--json"))["entries"]] == ["poll"]


def test_a_definition_not_saved_is_previewed_and_nothing_written(target: list[str]) -> None:
    shown = as_json(
        cli(target, "show", "draft", "--task", "t", "--every", "90", "--times", "2", "--json")
    )
    assert len(shown["next_runs"]) == 2 and shown["revision"] is None
    assert as_json(cli(target, "list", "--json"))["entries"] == []


@pytest.mark.parametrize(
    ("args", "names"),
    [
        (["add", "bad", "--task", "t", "--crontab", "0 25 * * *"], ["'bad'", "hour", "25"]),
        (
            ["add", "bad", "--task", "t", "--crontab", "0 3 * * *", "--tz", "Mars/Olympus"],
            ["'bad'", "tz", "Mars/Olympus"],
        ),
        (
            [
                "add",
                "bad",
                "--task",
                "t",
                "--every",
                "10",
                "--start",
                "2027-01-02T00:00Z",
                "--end",
                "2027-01-01T00:00Z",
            ],
            ["'bad'", "end"],
        ),
        (["add", "x" * 300, "--task", "t", "--every", "10"], ["name", "255"]),
        (["add", "bad", "--task", "t", "--every", "10", "--kwargs", "[1, 2]"], ["kwargs"]),
        (["add", "bad", "--task", "t", "--every", "10", "--kwargs", "{nope"], ["--kwargs", "JSON"]),
        (["add", "keep", "--task", "t", "--every", "10"], ["'keep'", "exists"]),
        (["edit", "keep", "--every", "5", "--if-revision", "999"], ["'keep'", "999"]),
        (["edit", "ghost", "--every", "5"], ["'ghost'"]),
        (["rm", "ghost"], ["'ghost'"]),
        (["enable", "ghost"], ["'ghost'"]),
    ],
)
def test_bad_input_is_one_line_exit_2_and_changes_nothing(
    target: list[str], args: list[str], names: list[str]
) -> None:
    cli(target, "add", "keep", "--task", "t", "--every", "10")
    before = as_json(cli(target, "list", "--json"))
    result = cli(target, *args)
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    for name in names:
        assert name in result.output, result.output
    assert as_json(cli(target, "list", "--json")) == before


def test_export_import_dry_run_prune(target: list[str], tmp_path: Path) -> None:
    cli(target, "add", "hand", "--task", "t.hand", "--every", "60")
    cli(target, "add", "report", "--task", "t.report", "--every", "30")
    path = tmp_path / "schedules.yaml"
    exported = cli(target, "export", str(path))
    assert exported.exit_code == 0
    document = yaml.safe_load(path.read_text())
    assert set(document["entries"]) == {"hand", "report"} and document["version"] == 1

    # the file manages report (changed), adds cleanup; hand stays the hand's
    del document["entries"]["hand"]
    document["entries"]["report"]["schedule"] = {"every": 45}
    document["entries"]["cleanup"] = {"task": "t.cleanup", "schedule": {"crontab": "*/5 * * * *"}}
    path.write_text(yaml.safe_dump(document))
    before = as_json(cli(target, "list", "--json"))
    dry = cli(target, "import", str(path), "--prune", "--dry-run")
    assert dry.exit_code == 0, dry.output
    assert "+ cleanup" in dry.output and "~ report  (made by hand" in dry.output
    assert "--prune left 1 entry that schedules.yaml does not manage: hand" in dry.output
    assert "dry run: 2 changes planned, nothing written" in dry.output
    assert as_json(cli(target, "list", "--json")) == before

    applied = cli(target, "import", str(path), "--prune")
    assert applied.exit_code == 0 and "2 changes" in applied.output
    entries = {e["name"]: e for e in as_json(cli(target, "list", "--json"))["entries"]}
    assert set(entries) == {"hand", "report", "cleanup"}
    assert entries["cleanup"]["managed_by"] == "schedules.yaml"
    assert entries["hand"]["managed_by"] is None
    # the same file again: nothing to do
    again = cli(target, "import", str(path), "--prune")
    assert "0 changes" in again.output

    # removed from the file: pruned, since the file manages it
    del document["entries"]["cleanup"]
    path.write_text(yaml.safe_dump(document))
    pruned = cli(target, "import", str(path), "--prune")
    assert "- cleanup" in pruned.output
    assert {e["name"] for e in as_json(cli(target, "list", "--json"))["entries"]} == {
        "hand",
        "report",
    }


def test_an_import_with_a_bad_entry_writes_nothing(target: list[str], tmp_path: Path) -> None:
    path = tmp_path / "bad.json"
    path.write_text(
        json.dumps(
            {
                "version": 1,
                "entries": {
                    "fine": {"task": "t", "schedule": {"every": 10}},
                    "broken": {"task": "t", "schedule": {"crontab": "61 * * * *"}},
                    "worse": {"task": "t", "schedule": {"every": 10}, "colour": "red"},
                },
            }
        )
    )
    result = cli(target, "import", str(path))
    assert result.exit_code == 2, result.output
    assert "2 entries refused, nothing imported" in result.output
    assert "'broken'" in result.output and "minute" in result.output
    assert "'worse'" in result.output and "colour" in result.output
    assert as_json(cli(target, "list", "--json"))["entries"] == []


def test_status_pause_and_run_now_treat_stored_entries_as_others(
    target: list[str], db_url: str, table_prefix: str
) -> None:
    from celery_singlebeat.store.sql import SqlStore

    cli(target, "add", "stored-job", "--task", "t.job", "--every", "3600")
    store = SqlStore(make_url(db_url), table_prefix=table_prefix)
    try:
        # a replica registered it (no catalog lists a stored entry)
        store.register(["stored-job"], "pod-a:1:aa")
        status = CliRunner().invoke(singlebeat, [*target, "status", "--json"])
        assert status.exit_code == 0, status.output
        [entry] = [e for e in json.loads(status.output)["entries"] if e["name"] == "stored-job"]
        assert entry["task"] == "t.job" and entry["schedule"] == "every 3600s"
        assert entry["next_slot_us"] is not None
        # pause and run-now accept it, though no replica's catalog lists it
        paused = CliRunner().invoke(singlebeat, [*target, "pause", "stored-job"])
        assert paused.exit_code == 0, paused.output
        CliRunner().invoke(singlebeat, [*target, "resume", "stored-job"])
        ran = CliRunner().invoke(singlebeat, [*target, "run", "stored-job"])
        assert ran.exit_code == 0, ran.output
        # and a replica with no catalog at all takes the request
        taken = store.take_over("pod-b:2:bb", 15_000_000, 10)
        assert [c.entry for c in taken] == ["stored-job"]
        # a deleted stored entry is refused like an unknown one
        cli(target, "rm", "stored-job")
        refused = CliRunner().invoke(singlebeat, [*target, "run", "stored-job"])
        assert refused.exit_code == 1 and "no live replica has the entry" in refused.output
    finally:
        store.close()


def test_an_entry_whose_runs_are_behind_it_is_done(target: list[str]) -> None:
    cli(target, "add", "past", "--task", "t", "--at", "2020-01-01T00:00:00Z")
    cli(target, "add", "off", "--task", "t", "--at", "2020-01-01T00:00:00Z", "--disabled")
    cli(target, "add", "live", "--task", "t", "--every", "60")
    entries = {e["name"]: e for e in as_json(cli(target, "list", "--json"))["entries"]}
    assert entries["past"]["done"] is True and entries["past"]["next_runs"] == []
    assert entries["off"]["done"] is False
    assert entries["live"]["done"] is False
    rows = {line.split()[0]: line for line in cli(target, "list").output.splitlines()[1:]}
    assert " done " in rows["past"] and " done " not in rows["off"]
    assert " done " not in rows["live"]
