"""``manage.py singlebeat_*``: the CLI's commands over the project's settings.

Each command runs through ``call_command`` (in process, the test database),
its output compared with the CLI's (``singlebeat --url ...``) where they must
agree; one runs as ``python -m django`` in a subprocess, as an operator types
it. Bad input is one line, a non-zero status, and nothing stored.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from io import StringIO
from pathlib import Path

import pytest
from click.testing import CliRunner
from django.conf import settings as django_settings
from django.core.management import CommandError, call_command
from django.test import override_settings

from celery_singlebeat.cli import singlebeat
from celery_singlebeat.schedules.api import Schedules
from celery_singlebeat.store.sql import SqlStore

HERE = Path(__file__).resolve().parent


def run(*args: str) -> str:
    """A command's standard output; its errors raise CommandError."""
    out = StringIO()
    call_command(*args, stdout=out, stderr=StringIO())
    return out.getvalue()


def cli(store: SqlStore, *args: str) -> str:
    """The CLI's output for the same database and tables (``python -m
    celery_singlebeat --url URL --table-prefix P ...``)."""
    url = store.url.render_as_string(hide_password=False)
    result = CliRunner().invoke(
        singlebeat, ["--url", url, "--table-prefix", store.tables.prefix, *args]
    )
    assert result.exit_code == 0, result.output
    return result.output


def refused(*args: str) -> CommandError:
    with pytest.raises(CommandError) as caught:
        run(*args)
    return caught.value


def test_schedules_commands_mirror_the_cli(
    sb_store: SqlStore, schedules_api: Schedules, tmp_path: Path
) -> None:
    added = run("singlebeat_schedules", "add", "tick", "--task", "proj.tick", "--every", "10")
    assert added.startswith("stored 'tick' at revision")
    run("singlebeat_schedules", "add", "nightly", "--task", "proj.report", "--crontab", "0 3 * * *",
        "--tz", "Europe/Paris", "--args", "[1]", "--why", "reports")  # fmt: skip
    listed = run("singlebeat_schedules", "list", "--json")
    assert listed == cli(sb_store, "schedules", "list", "--json")
    assert [e["name"] for e in json.loads(listed)["entries"]] == ["nightly", "tick"]
    table = run("singlebeat_schedules", "list")
    assert table.splitlines()[0].split()[:3] == ["NAME", "TASK", "SCHEDULE"]
    assert "every 10s" in table

    shown = json.loads(run("singlebeat_schedules", "show", "nightly", "--next", "2", "--json"))
    assert shown["args"] == [1] and len(shown["next_runs"]) == 2
    assert "changed 'tick'" in run("singlebeat_schedules", "edit", "tick", "--every", "30")
    assert schedules_api.get("tick").schedule.run_every.total_seconds() == 30
    assert "disabled 'tick'" in run("singlebeat_schedules", "disable", "tick")
    assert not schedules_api.get("tick").enabled
    assert "enabled 'tick'" in run("singlebeat_schedules", "enable", "tick", "--why", "back")
    log = run("singlebeat_schedules", "log", "tick")
    assert log == cli(sb_store, "schedules", "log", "tick")
    actions = [line.split()[2] for line in log.splitlines() if line.startswith("r")]
    assert actions == ["changed", "changed", "changed", "created"]
    assert "back" in log.splitlines()[0]

    exported = tmp_path / "schedules.yaml"
    run("singlebeat_schedules", "export", str(exported))
    assert "proj.report" in exported.read_text()
    assert run("singlebeat_schedules", "rm", "nightly") == "removed 'nightly'\n"
    assert [e.name for e in schedules_api.list()] == ["tick"]
    plan = run("singlebeat_schedules", "import", str(exported), "--dry-run")
    assert "nothing written" in plan and [e.name for e in schedules_api.list()] == ["tick"]
    assert "imported" in run("singlebeat_schedules", "import", str(exported))
    assert [e.name for e in schedules_api.list()] == ["nightly", "tick"]


@pytest.mark.parametrize(
    ("args", "says", "status"),
    [
        (["add", "x", "--task", "t"], "add needs a schedule", 2),
        (["add", "x", "--task", "t", "--crontab", "61 * * * *"], "'x'", 2),
        (["add", "x", "--task", "t", "--every", "5", "--args", "{nope"], "--args", 2),
        (["add", "x", "--task", "t", "--every", "5", "--no-such-option"], "--no-such-option", 2),
        (["edit", "missing", "--every", "5"], "missing", 2),
        (["edit", "kept", "--every", "5", "--if-revision", "99"], "revision", 2),
        (["add", "kept", "--task", "t", "--every", "5"], "exists", 2),
        (["frobnicate"], "frobnicate", 2),
    ],
)
def test_bad_input_is_one_line_and_stores_nothing(
    schedules_api: Schedules, args: list[str], says: str, status: int
) -> None:
    schedules_api.upsert("kept", "proj.tick", {"every": 60})
    before = (schedules_api.list(), schedules_api.log())
    error = refused("singlebeat_schedules", *args)
    assert says in str(error) and "\n" not in str(error)
    assert error.returncode == status
    assert (schedules_api.list(), schedules_api.log()) == before


def test_a_bad_setting_is_named_as_the_project_wrote_it(sb_store: SqlStore) -> None:
    with override_settings(CELERY_SINGLEBEAT_LEASE="soon"):
        error = refused("singlebeat_status")
    assert str(error).startswith("CELERY_SINGLEBEAT_LEASE='soon'") and error.returncode == 1


def test_the_commands_read_the_projects_url(tmp_path: Path) -> None:
    nowhere = tmp_path / "elsewhere.sqlite"
    with override_settings(CELERY_SINGLEBEAT_URL=f"sqlite:///{nowhere}"):
        error = refused("singlebeat_schedules", "list")
    assert str(nowhere) in str(error) and "no such SQLite file" in str(error)
    assert not nowhere.exists()


def test_help_is_clicks_for_each_command(capsys: pytest.CaptureFixture[str]) -> None:
    assert run("singlebeat_schedules", "add", "--help").startswith(
        "Usage: manage.py singlebeat_schedules add [OPTIONS] NAME"
    )
    for command in ("singlebeat_status", "singlebeat_pause", "singlebeat_resume"):
        assert f"manage.py {command} [OPTIONS]" in run(command, "--help")
    # `manage.py help singlebeat_run_now` asks the command's print_help
    from celery_singlebeat.contrib.django.management.commands.singlebeat_run_now import Command

    Command().print_help("manage.py", "singlebeat_run_now")
    assert "Usage: manage.py singlebeat_run_now [OPTIONS] ENTRY" in capsys.readouterr().out


def test_status_and_controls(sb_store: SqlStore) -> None:
    from fleet_rows import FleetRows, every

    rows = FleetRows(sb_store.url.render_as_string(hide_password=False), sb_store.tables.prefix)
    try:
        rows.replica("pod-a:1:aa", seen_us=rows.now_us())
        rows.catalog("pod-a:1:aa", "beat.tick", every(10))
        rows.entry("beat.tick", rows.now_us())
    finally:
        rows.close(drop=False)
    assert "pod-a:1:aa" in run("singlebeat_status")
    paused = run("singlebeat_pause", "beat.tick", "--reason", "maintenance")
    assert "beat.tick" in paused
    status = json.loads(run("singlebeat_status", "--json"))
    assert status.keys() == json.loads(cli(sb_store, "status", "--json")).keys()
    assert [p["entry"] for p in status["pauses"]] == ["beat.tick"]
    assert [e["name"] for e in status["entries"]] == ["beat.tick"]
    # refused while paused: one line, status 1, nothing requested
    error = refused("singlebeat_run_now", "beat.tick")
    assert "paused" in str(error) and "\n" not in str(error) and error.returncode == 1
    assert "resumed 'beat.tick'" in run("singlebeat_resume", "beat.tick")
    requested = json.loads(run("singlebeat_run_now", "beat.tick", "--reason", "now", "--json"))
    assert requested["entry"] == "beat.tick" and requested["reason"] == "now"
    assert json.loads(run("singlebeat_status", "--json"))["pauses"] == []


def _manage(
    store: SqlStore, *args: str, prefix: str | None = None
) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]),
        "DJANGO_SETTINGS_MODULE": "sbproject.settings",
        # the test database, not the one the settings name for a real run
        "SB_DJANGO_NAME": str(store.url.database),
        "SB_DJANGO_PREFIX": prefix or django_settings.CELERY_SINGLEBEAT_TABLE_PREFIX,
    }
    return subprocess.run(
        [sys.executable, "-m", "django", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )


def test_through_a_real_manage_py(sb_store: SqlStore, schedules_api: Schedules) -> None:
    added = _manage(sb_store, "singlebeat_schedules", "add", "sub", "--task", "t", "--every", "7")
    assert added.returncode == 0, added.stderr
    assert added.stdout.startswith("stored 'sub' at revision")
    assert schedules_api.get("sub").task == "t"
    bad = _manage(sb_store, "singlebeat_schedules", "add", "sub2", "--task", "t", "--every", "x")
    assert bad.returncode == 2 and bad.stdout == ""
    assert bad.stderr.startswith("CommandError: ") and bad.stderr.count("\n") == 1, bad.stderr
    assert "--every" in bad.stderr
    assert [e.name for e in schedules_api.list()] == ["sub"]


def test_another_table_prefix_needs_no_migration(sb_store: SqlStore) -> None:
    # the migration names the tables with the setting's prefix, as the models
    # do: makemigrations must not write one into the installed package
    found = _manage(
        sb_store, "makemigrations", "celery_singlebeat", "--check", "--dry-run", prefix="beat_"
    )
    assert found.returncode == 0, found.stdout + found.stderr
    assert "No changes detected" in found.stdout
