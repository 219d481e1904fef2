"""A schedule kept in git (``schedules/files.py``), without a database: the
file's text both ways, every kind of bad file, and the plan of an import."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import pytest
from celery.schedules import crontab

from celery_singlebeat import stored_entry
from celery_singlebeat.schedules.files import FileError, describe, dump, parse, plan


def entries() -> list:
    return [
        stored_entry("report", "t.report", crontab(minute="0", hour="3"), kwargs={"f": "pdf"}),
        stored_entry("poll", "t.poll", timedelta(seconds=30), queue="feeds", max_runs=3),
    ]


@pytest.mark.parametrize("path", ["s.yaml", "s.yml", "s.json"])
def test_a_dump_parses_back_to_the_same_entries(path: str) -> None:
    text = dump(entries(), path)
    back = parse(text, path, "s")
    assert sorted(back, key=lambda e: e.name) == sorted(
        (replace(e, managed_by="s") for e in entries()), key=lambda e: e.name
    )
    assert all(e.managed_by == "s" for e in back)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{nope", "not valid JSON"),
        ("[]", "expected a mapping with an 'entries' mapping"),
        ('{"entries": {}, "version": 2}', "version 2: this release reads version 1"),
        ('{"entries": {}, "extra": 1}', "unknown top-level key(s) extra"),
        ('{"entries": {"a": 5}}', "schedule entry 'a': entry: expected a mapping"),
        (
            '{"entries": {"a": {"task": "t"}, "b": {"task": "t", "schedule": {"every": -1}}}}',
            "2 entries refused, nothing imported",
        ),
    ],
)
def test_a_bad_file_is_refused_whole_naming_each_problem(text: str, message: str) -> None:
    with pytest.raises(FileError) as raised:
        parse(text, "s.json", "s")
    assert message in str(raised.value)


def test_the_plan_adds_changes_adopts_keeps_and_prunes_only_what_the_file_manages() -> None:
    report, poll = entries()
    stored = [
        replace(report, revision=4, managed_by=None),
        replace(poll, revision=5, managed_by="s"),
        replace(stored_entry("hand", "t", timedelta(minutes=1)), revision=6),
        replace(stored_entry("gone", "t", timedelta(minutes=1)), revision=7, managed_by="s"),
    ]
    wanted = [
        replace(report, kwargs={"f": "html"}, managed_by="s"),
        replace(poll, managed_by="s"),
        replace(stored_entry("new", "t", timedelta(hours=1)), managed_by="s"),
    ]
    result = plan(wanted, stored, "s", prune=True)
    actions = {s.name: s.action for s in result.steps}
    assert actions == {"report": "change", "poll": "keep", "new": "add", "gone": "remove"}
    assert result.left == ["hand"]
    assert result.changes == 3
    ops = {w.name: (w.op, w.if_revision) for w in result.writes}
    # each change only at the revision the plan was made against
    assert ops == {"report": ("replace", 4), "new": ("create", None), "gone": ("delete", 7)}
    [change] = [s for s in result.steps if s.name == "report"]
    lines = describe(change)
    assert lines[0] == "~ report  (made by hand; the file manages it from now on)"
    assert any("kwargs" in line and "html" in line for line in lines[1:])
    # without --prune nothing is removed, nor reported as left
    assert plan(wanted, stored, "s", prune=False).left == []
