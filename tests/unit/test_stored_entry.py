"""The stored entry as a value: its checks, its data forms, its runs.

Every refusal names the entry and the field (``schedule entry 'x':
crontab.hour: 25 is out of range 0-23``); every form round-trips exactly (the
store compares texts to skip writes that change nothing); the definition the
engine gets and ``next_runs`` compute the instants the slot maths does, the
daylight-saving rules of ``test_dst.py`` included.
"""

from __future__ import annotations

import json
import pickle
from datetime import datetime, timedelta, timezone
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from celery.schedules import crontab, schedule, solar
from hypothesis import given, settings
from hypothesis import strategies as st
from test_dst import CHANGES, SINGLE_RUNS, Change, crontab_fields, expected_runs

from celery_singlebeat.config import BUILTIN_MISSED_POLICY
from celery_singlebeat.engine.catalog import describe
from celery_singlebeat.exceptions import InvalidEntry, ScheduleError
from celery_singlebeat.schedules import (
    At,
    StoredEntry,
    StoredSchedule,
    definition_of,
    entry_from_document,
    entry_from_fields,
    entry_to_document,
    entry_to_fields,
    next_runs,
    schedule_from_data,
    schedule_to_data,
    stored_entry,
    with_changes,
)
from celery_singlebeat.schedules.checks import (
    MAX_ARGUMENTS_BYTES,
    MAX_HEADERS_BYTES,
    compact_json,
)
from celery_singlebeat.schedules.columns import WRITTEN_FIELDS
from celery_singlebeat.schedules.runs import definition_of_row
from celery_singlebeat.sources import check_definition
from celery_singlebeat.store.values import EDITABLE, ScheduleRow
from celery_singlebeat.timeline.clock import US, datetime_to_us, us_to_datetime
from celery_singlebeat.timeline.slots import MissedPolicy, sequence_for

UTC = timezone.utc
NOW = datetime(2026, 3, 1, 12, tzinfo=UTC)
PARIS = ZoneInfo("Europe/Paris")
DEFAULT = MissedPolicy("coalesce", 5 * US, 100)


def entry(schedule: Any = None, **kwargs: Any) -> StoredEntry:
    return stored_entry(
        kwargs.pop("name", "x"),
        kwargs.pop("task", "proj.tasks.report"),
        schedule if schedule is not None else timedelta(minutes=5),
        now=NOW,
        **kwargs,
    )


def refused(schedule: Any = None, **kwargs: Any) -> InvalidEntry:
    with pytest.raises(InvalidEntry) as caught:
        entry(schedule, **kwargs)
    return caught.value


# -- refusals: each names the entry and the field -----------------------------------


def test_the_message_names_the_entry_and_the_field() -> None:
    error = refused({"crontab": "0 25 * * *"})
    assert str(error) == "schedule entry 'x': crontab.hour: 25 is out of range 0-23"
    assert (error.entry, error.field) == ("x", "crontab.hour")
    assert isinstance(error, ScheduleError) and isinstance(error, ValueError)
    again = pickle.loads(pickle.dumps(error))
    assert (str(again), again.entry, again.field) == (str(error), "x", "crontab.hour")


def test_every_problem_of_an_entry_is_listed_in_one_error() -> None:
    error = refused(
        {"crontab": "61 25 * * *", "tz": "Mars/Olympus"},
        task="has space",
        kwargs={"when": datetime(2026, 1, 1)},
        priority=300,
        start=NOW,
        end=NOW - timedelta(1),
    )
    assert [field for field, _ in error.problems] == [
        "task",
        "crontab.minute",
        "crontab.hour",
        "schedule.tz",
        "kwargs",
        "options.priority",
        "end",
    ]
    assert str(error).startswith("schedule entry 'x': task: ")
    assert (
        "; crontab.minute: 61 is out of range 0-59; crontab.hour: 25 is out of range 0-23"
        in str(error)
    )


@pytest.mark.parametrize(
    ("text", "field", "reason"),
    [
        ("60 * * * *", "crontab.minute", "60 is out of range 0-59"),
        ("* 24 * * *", "crontab.hour", "24 is out of range 0-23"),
        ("* 1-30 * * *", "crontab.hour", "30 is out of range 0-23"),
        ("* * 0 * *", "crontab.day_of_month", "0 is out of range 1-31"),
        ("* * 32 * *", "crontab.day_of_month", "32 is out of range 1-31"),
        ("* * * 13 *", "crontab.month_of_year", "13 is out of range 1-12"),
        ("* * * 0 *", "crontab.month_of_year", "0 is out of range 1-12"),
        ("* * * * 7", "crontab.day_of_week", "7 is out of range 0-6"),
        ("* * * * funday", "crontab.day_of_week", "'funday' is not a valid day_of_week"),
        ("*/0 * * * *", "crontab.minute", "'*/0' is not a valid minute"),
        ("* * 31 2 *", "crontab", "day_of_month"),
        ("* * * *", "schedule.crontab", "has 4 fields; expected 5"),
    ],
)
def test_a_crontab_field_out_of_range_is_named(text: str, field: str, reason: str) -> None:
    error = refused({"crontab": text})
    assert error.field == field
    assert reason in str(error)


def test_a_celery_crontab_is_checked_as_its_text() -> None:
    # Celery refuses hour=25 itself; a crontab it accepted is read back by fields
    made = entry(crontab(minute="*/15", hour=[1, 3], day_of_week="mon-fri"))
    assert schedule_to_data(made.schedule) == {"crontab": "*/15 1,3 * * mon-fri", "tz": None}


@pytest.mark.parametrize(
    ("schedule", "field", "reason"),
    [
        ({"crontab": "* * * * *", "tz": "Nowhere/City"}, "schedule.tz", "unknown time zone"),
        ({"every": 0.0005}, "schedule.every", "shorter than 1 ms"),
        ({"every": "often"}, "schedule.every", "not a number of seconds"),
        ({"every": True}, "schedule.every", "not a number of seconds"),
        (timedelta(microseconds=10), "schedule", "shorter than 1 ms"),
        (schedule(timedelta(0)), "schedule", "shorter than 1 ms"),
        (datetime(2026, 12, 24, 18), "schedule", "naive"),
        ({"at": "2026-12-24T18:00:00"}, "schedule.at", "UTC offset"),
        ({"at": "Christmas"}, "schedule.at", "ISO 8601"),
        ({"solar": "teatime", "lat": 0, "lon": 0}, "schedule.solar", "not a solar event"),
        ({"solar": "sunset", "lat": 91, "lon": 0}, "schedule.lat", "latitude"),
        ({"solar": "sunset", "lat": 0, "lon": -181}, "schedule.lon", "longitude"),
        ({"every": 5, "crontab": "* * * * *"}, "schedule", "exactly one of"),
        ({}, "schedule", "exactly one of"),
        ({"every": 5, "tz": "UTC"}, "schedule.tz", "unknown key"),
        ("every day", "schedule", "neither a crontab"),
        (object(), "schedule", "unsupported schedule type object"),
        (True, "schedule", "unsupported schedule type bool"),
    ],
)
def test_a_wrong_schedule_is_named(schedule: Any, field: str, reason: str) -> None:
    error = refused(schedule)
    assert error.field == field, str(error)
    assert reason in str(error)


def test_a_crontab_in_a_zone_without_a_name_is_refused() -> None:
    fixed = crontab(minute=0)
    fixed.tz = timezone(timedelta(hours=2))
    assert refused(fixed).field == "schedule.tz"


@pytest.mark.parametrize(
    ("kwargs", "field", "reason"),
    [
        ({"name": ""}, "name", "not a non-empty string"),
        ({"name": "é" * 128}, "name", "256 bytes long; at most 255"),
        ({"name": "two\nlines"}, "name", "control character"),
        ({"task": ""}, "task", "not a task name"),
        ({"task": "a b"}, "task", "whitespace"),
        ({"task": "t" * 256}, "task", "at most 255"),
        ({"args": "abc"}, "args", "not a list"),
        ({"args": [{1, 2}]}, "args", "args[0] is a set"),
        ({"args": [float("nan")]}, "args", "JSON cannot hold"),
        ({"kwargs": [1]}, "kwargs", "not a mapping"),
        ({"kwargs": {1: "a"}}, "kwargs", "key 1"),
        ({"kwargs": {"a": {"b": object()}}}, "kwargs", "kwargs['a']['b'] is a object"),
        ({"args": ["a" * MAX_ARGUMENTS_BYTES]}, "args", "at most 65,536 together"),
        (
            {
                "kwargs": {"k": "a" * (MAX_ARGUMENTS_BYTES // 2)},
                "args": ["b" * (MAX_ARGUMENTS_BYTES // 2)],
            },
            "kwargs",
            "together",
        ),
        ({"options": {"countdown": 5}}, "options.countdown", "unknown option"),
        ({"options": ["queue"]}, "options", "not a mapping"),
        ({"queue": ""}, "options.queue", "not a name"),
        ({"exchange": 5}, "options.exchange", "not a name"),
        ({"routing_key": "r" * 256}, "options.routing_key", "not a name"),
        ({"priority": 256}, "options.priority", "0 to 255"),
        ({"priority": -1}, "options.priority", "0 to 255"),
        ({"priority": True}, "options.priority", "0 to 255"),
        ({"expires": 0}, "options.expires", "seconds > 0"),
        ({"expires": "soon"}, "options.expires", "seconds > 0"),
        ({"headers": ["h"]}, "options.headers", "not a mapping"),
        ({"headers": {"h": {1, 2}}}, "options.headers", "headers['h'] is a set"),
        ({"headers": {"h": "x" * MAX_HEADERS_BYTES}}, "options.headers", "at most 16,384"),
        ({"options": {"queue": "a"}, "queue": "b"}, "options.queue", "given twice"),
        ({"enabled": "yes"}, "enabled", "True or False"),
        ({"start": datetime(2026, 1, 1)}, "start", "naive"),
        ({"start": "tomorrow"}, "start", "ISO 8601"),
        ({"end": 5}, "end", "not an instant"),
        ({"start": NOW, "end": NOW}, "end", "is not after start"),
        ({"max_runs": 0}, "max_runs", "integer >= 1"),
        ({"max_runs": True}, "max_runs", "integer >= 1"),
        ({"max_runs": 2.5}, "max_runs", "integer >= 1"),
        ({"missed": "sometimes"}, "missed.policy", "expected one of coalesce, skip, all"),
        ({"missed": {"grace": -1}}, "missed.grace", "positive"),
        ({"missed": {"max": 0}}, "missed.max", "integer >= 1"),
        ({"missed": {"policy": "all", "when": 1}}, "missed", "unknown key(s) when"),
        ({"missed": 5}, "missed", "not a missed-run policy"),
        ({"missed": MissedPolicy("never", US, 1)}, "missed.policy", "never"),
        ({"jitter": -1}, "jitter", "0 or more"),
        ({"jitter": "1s"}, "jitter", "timedelta or a number"),
        (
            {"jitter": timedelta(minutes=5)},
            "jitter",
            "not shorter than the shortest gap between two runs (300 s)",
        ),
        ({"description": "d" * 1001}, "description", "at most 1,000"),
        ({"description": None}, "description", "not a string"),
        ({"managed_by": ""}, "managed_by", "non-empty"),
        ({"managed_by": "f" * 256}, "managed_by", "at most 255"),
    ],
)
def test_a_wrong_field_is_named(kwargs: dict[str, Any], field: str, reason: str) -> None:
    error = refused(None, **kwargs)
    assert error.field == field, str(error)
    assert reason in str(error), str(error)
    assert str(error).startswith("schedule entry ")


def test_a_long_name_is_shown_by_its_start() -> None:
    error = refused(None, name="n" * 300)
    assert str(error) == f"schedule entry '{'n' * 60}...': name: is 300 bytes long; at most 255"
    assert error.entry == "n" * 300


@pytest.mark.parametrize(
    ("schedule", "jitter", "allowed"),
    [
        (crontab(minute="*/5"), timedelta(minutes=5), False),
        (crontab(minute="*/5"), timedelta(minutes=5) - timedelta(microseconds=1), True),
        # 0 and 30 past: the shortest gap is 30 minutes, not the hour
        ({"crontab": "0,30 9 * * *"}, timedelta(minutes=30), False),
        ({"crontab": "0,30 9 * * *"}, timedelta(minutes=29), True),
        (At(NOW + timedelta(days=1)), timedelta(days=365), True),
        (timedelta(seconds=10), timedelta(seconds=9.999999), True),
    ],
)
def test_the_jitter_is_shorter_than_the_shortest_gap(
    schedule: Any, jitter: timedelta, allowed: bool
) -> None:
    if allowed:
        assert entry(schedule, jitter=jitter).jitter == jitter
    else:
        assert refused(schedule, jitter=jitter).field == "jitter"


def test_a_solar_jitter_is_bounded_by_its_days() -> None:
    sunset = solar("sunset", 48.85, 2.35)
    assert entry(sunset, jitter=timedelta(hours=23)).jitter == timedelta(hours=23)
    assert refused(sunset, jitter=timedelta(hours=24)).field == "jitter"


# -- normalisation -----------------------------------------------------------------


def test_the_forms_of_a_schedule() -> None:
    every = {"every": 30.0}
    assert schedule_to_data(entry(timedelta(seconds=30)).schedule) == every
    assert schedule_to_data(entry(30).schedule) == every
    assert schedule_to_data(entry(schedule(30)).schedule) == every
    assert schedule_to_data(entry({"every": 30}).schedule) == every
    assert schedule_to_data(entry("*/5 * * * *").schedule) == {"crontab": "*/5 * * * *", "tz": None}
    paris = crontab(minute=0, hour=9)
    paris.tz = PARIS
    assert schedule_to_data(entry(paris).schedule) == {"crontab": "0 9 * * *", "tz": "Europe/Paris"}
    assert schedule_to_data(entry({"crontab": "0 9 * * *", "tz": "utc"}).schedule)["tz"] == "UTC"
    christmas = datetime(2026, 12, 24, 18, tzinfo=PARIS)
    for form in (christmas, "2026-12-24T18:00:00+01:00", "2026-12-24T17:00:00Z", At(christmas)):
        assert entry(form).schedule == At(christmas)
    assert schedule_to_data(At(christmas)) == {"at": "2026-12-24T17:00:00+00:00"}
    assert schedule_to_data(entry(solar("sunrise", 48.85, 2.35)).schedule) == {
        "solar": "sunrise",
        "lat": 48.85,
        "lon": 2.35,
    }


def test_arguments_are_kept_as_json_gives_them_back() -> None:
    made = entry(args=[1, (2, 3), {"a": (4,)}], kwargs={"k": (5, 6)})
    assert made.args == (1, [2, 3], {"a": [4]})
    assert made.kwargs == {"k": [5, 6]}
    assert entry_from_fields(entry_to_fields(made)) == made


def test_options_given_one_by_one_or_as_a_mapping() -> None:
    made = entry(options={"queue": "q"}, priority=5, expires=timedelta(minutes=1), headers={"h": 1})
    assert made.options == {"queue": "q", "priority": 5, "expires": 60.0, "headers": {"h": 1}}
    assert entry(options={"queue": "q"}, queue="q").options == {"queue": "q"}


def test_instants_are_kept_in_utc() -> None:
    made = entry(start="2026-03-01T10:00:00+01:00", end=datetime(2026, 4, 1, tzinfo=PARIS))
    assert made.start == datetime(2026, 3, 1, 9, tzinfo=UTC) and made.start.tzinfo is UTC
    assert made.end == datetime(2026, 3, 31, 22, tzinfo=UTC)


@pytest.mark.parametrize(
    ("missed", "policy"),
    [
        (None, None),
        (
            "skip",
            MissedPolicy("skip", BUILTIN_MISSED_POLICY.grace_us, BUILTIN_MISSED_POLICY.max_missed),
        ),
        ({"policy": "all", "grace": 30, "max": 3}, MissedPolicy("all", 30 * US, 3)),
        ({"grace": timedelta(minutes=1)}, MissedPolicy("coalesce", 60 * US, 100)),
        (
            {"singlebeat_missed_policy": "all", "singlebeat_missed_max": 7},
            MissedPolicy("all", 5 * US, 7),
        ),
        (MissedPolicy("skip", 2 * US, 1), MissedPolicy("skip", 2 * US, 1)),
    ],
)
def test_the_missed_run_policy_forms(missed: Any, policy: MissedPolicy | None) -> None:
    assert entry(missed=missed).missed == policy


def test_equality_counts_the_crontabs_own_zone() -> None:
    # Celery's crontab.__eq__ ignores tz; two entries that run at different
    # instants are not equal
    assert entry("0 9 * * *") == entry("0 9 * * *")
    assert entry({"crontab": "0 9 * * *", "tz": "Europe/Paris"}) != entry("0 9 * * *")
    assert entry(description="a") != entry(description="b")
    with pytest.raises(TypeError):
        hash(entry())


# -- with_changes ------------------------------------------------------------------


def test_with_changes_edits_some_fields_and_checks_the_whole() -> None:
    saved = entry_from_fields(
        {
            **entry_to_fields(entry(queue="q", priority=3)),
            "revision": 7,
            "created_us": 5,
            "updated_us": 6,
        }
    )
    edited = with_changes(saved, description="nightly", priority=None, routing_key="r")
    assert edited.description == "nightly"
    assert edited.options == {"queue": "q", "routing_key": "r"}
    assert (edited.revision, edited.created, edited.updated) == (
        7,
        us_to_datetime(5),
        us_to_datetime(6),
    )
    assert with_changes(saved, options={}).options == {}
    assert (
        with_changes(saved, schedule="0 * * * *", now=NOW).schedule == entry("0 * * * *").schedule
    )
    # a jitter right for the old schedule, wrong for the new one
    jittered = entry(timedelta(hours=1), jitter=timedelta(minutes=10))
    with pytest.raises(InvalidEntry) as caught:
        with_changes(jittered, schedule=timedelta(minutes=10), now=NOW)
    assert caught.value.field == "jitter"
    for read_only in ("name", "revision", "updated_by"):
        with pytest.raises(TypeError, match=read_only):
            with_changes(saved, **{read_only: "x"})
    with pytest.raises(InvalidEntry, match=r"options\.priority"):
        with_changes(saved, priority=999)


# -- the data forms, both ways -----------------------------------------------------

cron_minute = st.sampled_from(["*", "0", "*/5", "15,45", "0-30/10", "59"])
cron_hour = st.sampled_from(["*", "0", "*/3", "9-17", "23"])
cron_dom = st.sampled_from(["*", "1", "1,15", "28"])
cron_month = st.sampled_from(["*", "1", "3-10", "12"])
cron_dow = st.sampled_from(["*", "mon-fri", "0", "6", "sun,sat"])
zones = st.sampled_from([None, "UTC", "Europe/Paris", "America/New_York", "Asia/Kolkata"])
schedule_data = st.one_of(
    st.builds(lambda us: {"every": us / US}, st.integers(min_value=1000, max_value=10**15)),
    st.builds(
        lambda *fields: {"crontab": " ".join(fields[:5]), "tz": fields[5]},
        cron_minute,
        cron_hour,
        cron_dom,
        cron_month,
        cron_dow,
        zones,
    ),
    st.builds(
        lambda event, lat, lon: {"solar": event, "lat": lat, "lon": lon},
        st.sampled_from(["sunrise", "sunset", "dawn_civil", "solar_noon"]),
        st.floats(min_value=-60, max_value=60, allow_nan=False),
        st.floats(min_value=-180, max_value=180, allow_nan=False),
    ),
    st.builds(
        lambda us: {"at": us_to_datetime(us).isoformat()},
        st.integers(min_value=0, max_value=4_000_000_000 * US),
    ),
)


@settings(max_examples=200, deadline=None)
@given(data=schedule_data)
def test_the_schedules_data_form_round_trips_exactly(data: dict[str, Any]) -> None:
    schedule = schedule_from_data(data, "x")
    assert schedule_to_data(schedule) == data
    again = schedule_from_data(json.loads(compact_json(schedule_to_data(schedule))), "x")
    assert schedule_to_data(again) == data
    assert entry(schedule) == entry(again)


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=8,
)


@settings(max_examples=150, deadline=None)
@given(
    data=schedule_data.filter(lambda d: "solar" not in d),
    args=st.lists(json_values, max_size=3),
    kwargs=st.dictionaries(st.text(max_size=5), json_values, max_size=3),
    start=st.none() | st.integers(min_value=0, max_value=2_000_000_000 * US),
    max_runs=st.none() | st.integers(min_value=1, max_value=10**6),
    jitter_us=st.integers(min_value=0, max_value=999),
    missed=st.none()
    | st.builds(
        MissedPolicy,
        st.sampled_from(["coalesce", "skip", "all"]),
        st.integers(1, 10**12),
        st.integers(1, 1000),
    ),
    enabled=st.booleans(),
    description=st.text(max_size=30),
    managed_by=st.none() | st.text(min_size=1, max_size=20),
)
def test_an_entry_round_trips_through_its_fields_and_its_document(
    data: dict[str, Any],
    args: list[Any],
    kwargs: dict[str, Any],
    start: int | None,
    max_runs: int | None,
    jitter_us: int,
    missed: MissedPolicy | None,
    enabled: bool,
    description: str,
    managed_by: str | None,
) -> None:
    made = stored_entry(
        "entry é",
        "proj.task",
        data,
        args=args,
        kwargs=kwargs,
        queue="q",
        priority=9,
        start=None if start is None else us_to_datetime(start),
        end=None if start is None else us_to_datetime(start + 1),
        max_runs=max_runs,
        jitter=timedelta(microseconds=jitter_us),
        missed=missed,
        enabled=enabled,
        description=description,
        managed_by=managed_by,
        now=NOW,
    )
    fields = entry_to_fields(made)
    assert set(fields) == set(WRITTEN_FIELDS)
    assert entry_from_fields(fields) == made
    # an unchanged entry encodes to the same texts, however it was rebuilt
    assert entry_to_fields(entry_from_fields(json.loads(json.dumps(fields)))) == fields
    document = json.loads(json.dumps(entry_to_document(made)))
    back = entry_from_document("entry é", document, managed_by=managed_by, now=NOW)
    assert back == made


def test_the_fields_are_the_columns_a_row_leads_with() -> None:
    # checked_row takes a row's written columns by position
    assert WRITTEN_FIELDS == EDITABLE


def test_the_fields_are_compact_sorted_json() -> None:
    made = entry(
        {"crontab": "0 9 * * *", "tz": "Europe/Paris"}, kwargs={"b": 1, "a": "é"}, missed="all"
    )
    fields = entry_to_fields(made)
    assert fields["spec"] == '{"crontab":"0 9 * * *","tz":"Europe/Paris"}'
    assert fields["kwargs"] == '{"a":"é","b":1}'
    assert fields["policy"] == '{"grace":5.0,"max":100,"policy":"all"}'
    assert (fields["start_us"], fields["jitter_us"], fields["managed_by"]) == (None, 0, None)


def test_fields_read_back_with_what_the_store_keeps() -> None:
    fields = {
        **entry_to_fields(entry()),
        "revision": 42,
        "created_us": 1_000_000,
        "updated_us": 2_000_000,
        "created_by": "alice",
        "updated_by": "bob",
    }
    read = entry_from_fields(fields)
    assert read.saved and read.revision == 42
    assert (read.created, read.updated) == (us_to_datetime(10**6), us_to_datetime(2 * 10**6))
    assert (read.created_by, read.updated_by) == ("alice", "bob")
    assert not entry().saved


def test_a_bad_row_is_named_too() -> None:
    fields = entry_to_fields(entry())
    with pytest.raises(InvalidEntry, match="schedule entry 'x': args: not JSON"):
        entry_from_fields({**fields, "args": "[1,"})
    with pytest.raises(InvalidEntry, match=r"crontab\.hour"):
        entry_from_fields({**fields, "spec": '{"crontab":"0 99 * * *","tz":null}'})


def test_a_row_read_back_is_checked_as_a_write() -> None:
    # The read path parses each schedule text once and takes the arguments as
    # their texts give them; what a write refuses, a row is refused for too.
    fields = entry_to_fields(entry())
    for column, text in (("args", "[NaN]"), ("kwargs", '{"a":Infinity}')):
        with pytest.raises(InvalidEntry, match=rf"{column}: not JSON: .*not a JSON number"):
            entry_from_fields({**fields, column: text})
    with pytest.raises(InvalidEntry, match=r"args: .* is not a list"):
        entry_from_fields({**fields, "args": '{"a":1}'})
    with pytest.raises(InvalidEntry, match=r"kwargs: .* is not a mapping"):
        entry_from_fields({**fields, "kwargs": "[1]"})
    big = json.dumps(["x" * 40_000])
    with pytest.raises(InvalidEntry, match="args and kwargs take"):
        entry_from_fields({**fields, "args": big, "kwargs": json.dumps({"y": "z" * 30_000})})
    # a text that is not compact may be over the cap while its value is not
    spaced = json.dumps(["x" * 1000] + [1] * 16_000, indent=4)
    assert len(spaced) > MAX_ARGUMENTS_BYTES
    assert len(entry_from_fields({**fields, "args": spaced}).args) == 16_001
    with pytest.raises(InvalidEntry) as raised:
        entry_from_fields(
            {**fields, "name": "bad\tname", "spec": '{"every":0}', "kwargs": "{", "task": ""}
        )
    assert [f for f, _ in raised.value.problems] == ["name", "task", "schedule.every", "kwargs"]


def test_a_document_leaves_defaults_out_and_refuses_unknown_keys() -> None:
    assert entry_to_document(entry()) == {"task": "proj.tasks.report", "schedule": {"every": 300.0}}
    document = entry_to_document(
        entry(
            "0 9 * * *",
            start=NOW,
            missed={"policy": "skip"},
            jitter=timedelta(seconds=1.5),
            enabled=False,
        )
    )
    assert document == {
        "task": "proj.tasks.report",
        "schedule": {"crontab": "0 9 * * *", "tz": None},
        "enabled": False,
        "start": "2026-03-01T12:00:00+00:00",
        "missed": {"policy": "skip", "grace": 5.0, "max": 100},
        "jitter": 1.5,
    }
    with pytest.raises(InvalidEntry) as caught:
        entry_from_document("x", {"task": "t", "schedule": {"every": 5}, "queue": "q", "cron": 1})
    assert [f for f, _ in caught.value.problems] == ["cron", "queue"]
    assert "unknown key" in str(caught.value)
    with pytest.raises(InvalidEntry, match="schedule entry 'x': schedule: missing"):
        entry_from_document("x", {"task": "t"})
    with pytest.raises(InvalidEntry, match="not a mapping"):
        entry_from_document("x", ["t"])


# -- the engine's definition -------------------------------------------------------


def saved(
    made: StoredEntry, revision: int = 3, created: datetime = NOW, updated: datetime = NOW
) -> StoredEntry:
    return entry_from_fields(
        {
            **entry_to_fields(made),
            "revision": revision,
            "created_us": datetime_to_us(created),
            "updated_us": datetime_to_us(updated),
        }
    )


def test_the_definition_the_engine_tracks() -> None:
    made = saved(
        entry({"crontab": "*/5 * * * *", "tz": "Europe/Paris"}, args=[1], queue="q", max_runs=3)
    )
    definition = definition_of(made, DEFAULT, UTC)
    assert definition.name == "x" and definition.task == "proj.tasks.report"
    assert (definition.args, definition.kwargs, dict(definition.options)) == (
        (1,),
        {},
        {"queue": "q"},
    )
    assert definition.policy is DEFAULT
    assert definition.tz == PARIS
    assert (definition.revision, definition.source, definition.since_us) == (
        "3",
        "stored schedules",
        datetime_to_us(NOW),
    )
    assert isinstance(definition.schedule, StoredSchedule)
    check_definition(definition, definition.tz, datetime_to_us(NOW))
    # the engine's sequence: the first 3 runs from creation
    sequence = sequence_for(definition.schedule, 0, definition.tz)
    runs = [sequence.next_after(datetime_to_us(NOW) - 1)]
    while runs[-1] is not None:
        runs.append(sequence.next_after(runs[-1]))
    assert runs[:-1] == [datetime_to_us(NOW + timedelta(minutes=m)) for m in (0, 5, 10)]
    row = describe(definition.name, definition.task, definition.schedule, definition.tz)
    assert row.schedule == "crontab(*/5 * * * *) Europe/Paris, at most 3 runs"


@pytest.mark.parametrize(
    "made",
    [
        entry(),
        entry({"crontab": "*/5 * * * *", "tz": "Europe/Paris"}, args=[1], queue="q", max_runs=3),
        entry("0 9 * * 1-5", kwargs={"a": [1, {"b": None}]}, missed="all", jitter=30),
        entry(timedelta(hours=2), start=NOW, end=NOW + timedelta(days=3), priority=3),
        entry(NOW + timedelta(days=1), headers={"h": "v"}, expires=60, description="once"),
    ],
    ids=["interval", "bounded-crontab", "jittered", "started", "once"],
)
def test_a_row_gives_the_definition_its_entry_gives(made: StoredEntry) -> None:
    # the engine reads rows straight into definitions (runs.definition_of_row);
    # the API reads them into entries: one definition either way
    row = ScheduleRow(
        **entry_to_fields(made),
        revision=7,
        created_us=datetime_to_us(NOW),
        updated_us=datetime_to_us(NOW) + 5,
        created_by="a",
        updated_by="b",
    )
    from_row = definition_of_row(row, DEFAULT, PARIS)
    assert from_row == definition_of(entry_from_fields(row._asdict()), DEFAULT, PARIS)
    assert from_row.revision == "7" and from_row.since_us == datetime_to_us(NOW) + 5


def test_the_definitions_policy_and_zone_defaults() -> None:
    own = MissedPolicy("all", 5 * US, 100)
    assert definition_of(saved(entry(missed=own)), DEFAULT, UTC).policy == own
    assert definition_of(saved(entry(missed="coalesce")), DEFAULT, UTC).policy is DEFAULT
    assert definition_of(saved(entry("0 9 * * *")), DEFAULT, PARIS).tz is PARIS
    assert definition_of(entry(), DEFAULT, UTC).since_us is None  # not saved: no bound
    assert definition_of(entry(), DEFAULT, UTC).revision == ""
    assert definition_of(saved(entry()), DEFAULT, UTC, label="db").source == "db"


def test_a_crontab_without_its_own_zone_is_described_in_the_apps() -> None:
    made = saved(entry("0 9 * * *"))
    definition = definition_of(made, DEFAULT, ZoneInfo("Asia/Tokyo"))
    row = describe("x", "t", definition.schedule, definition.tz)
    assert row.schedule == "crontab(0 9 * * *) Asia/Tokyo"
    # describing did not give the stored crontab a zone of its own
    assert schedule_to_data(made.schedule)["tz"] is None


# -- next_runs ---------------------------------------------------------------------


def test_next_runs_of_each_kind() -> None:
    assert next_runs(timedelta(minutes=10), 2, now=NOW) == [
        NOW + timedelta(minutes=10),
        NOW + timedelta(minutes=20),
    ]
    assert next_runs(schedule(600), 1, now=NOW, anchor=NOW - timedelta(minutes=3)) == [
        NOW + timedelta(minutes=7)
    ]
    assert next_runs(crontab(minute=0, hour=9), 2, now=NOW, tz=PARIS) == [
        datetime(2026, 3, 2, 8, tzinfo=UTC),
        datetime(2026, 3, 3, 8, tzinfo=UTC),
    ]
    assert next_runs(NOW + timedelta(hours=1), 5, now=NOW) == [NOW + timedelta(hours=1)]
    assert next_runs(NOW - timedelta(hours=1), 5, now=NOW) == []
    assert next_runs({"crontab": "30 * * * *"}, 1, now=NOW) == [NOW + timedelta(minutes=30)]
    sunsets = next_runs(solar("sunset", 48.85, 2.35), 2, now=NOW)
    assert [s.date().day for s in sunsets] == [1, 2] and all(s.hour == 17 for s in sunsets)
    assert all(r.tzinfo is UTC for r in sunsets)
    assert next_runs(timedelta(minutes=10), 0, now=NOW) == []
    with pytest.raises(ValueError):
        next_runs(timedelta(minutes=10), -1, now=NOW)


def test_next_runs_of_a_stored_entry_follow_its_bounds() -> None:
    # an own zone beats the app's
    paris = entry({"crontab": "0 9 * * *", "tz": "Europe/Paris"})
    assert next_runs(paris, 1, now=NOW, tz=ZoneInfo("Asia/Tokyo")) == [
        datetime(2026, 3, 2, 8, tzinfo=UTC)
    ]
    # an interval with a start runs at the start, and until the end
    bounded = entry(
        timedelta(hours=1),
        start=NOW + timedelta(minutes=30),
        end=NOW + timedelta(hours=2, minutes=30),
    )
    assert next_runs(bounded, 10, now=NOW) == [NOW + timedelta(minutes=m) for m in (30, 90, 150)]
    # at most 2 runs: from now when not saved, from its creation once saved
    limited = entry(timedelta(hours=1), max_runs=2)
    assert next_runs(limited, 10, now=NOW) == [NOW + timedelta(hours=1), NOW + timedelta(hours=2)]
    created = saved(limited, created=NOW - timedelta(hours=1, minutes=30))
    assert next_runs(created, 10, now=NOW, anchor=NOW - timedelta(hours=1, minutes=30)) == [
        NOW + timedelta(minutes=30)
    ]
    # one run
    assert next_runs(entry(NOW + timedelta(days=1)), 3, now=NOW) == [NOW + timedelta(days=1)]
    # jitter: the same instants as the engine's, within [0, jitter) of each
    jittered = saved(entry("*/10 * * * *", jitter=timedelta(minutes=2)))
    runs = next_runs(jittered, 6, now=NOW)
    nominal = next_runs(crontab(minute="*/10"), 6, now=NOW - timedelta(microseconds=1))
    assert all(timedelta(0) <= r - n < timedelta(minutes=2) for r, n in zip(runs, nominal))
    assert runs == next_runs(jittered, 6, now=NOW)
    definition = definition_of(jittered, DEFAULT, UTC)
    sequence = sequence_for(definition.schedule, 0, definition.tz)
    engine, at = [], datetime_to_us(NOW)
    for _ in range(6):
        at = sequence.next_after(at)  # type: ignore[assignment]
        engine.append(us_to_datetime(at))
    assert engine == runs
    # disabled: none
    assert next_runs(entry(enabled=False), 3, now=NOW) == []


# -- daylight saving: the rules of test_dst.py -------------------------------------

PARIS_CHANGES = [
    Change("Europe/Paris", c.at, c.spring) for c in CHANGES if c.zone == "Europe/Berlin"
]
NEW_YORK_CHANGES = [c for c in CHANGES if c.zone == "America/New_York"]


@pytest.mark.parametrize("change", PARIS_CHANGES + NEW_YORK_CHANGES, ids=lambda c: c.id)
@pytest.mark.parametrize("name", sorted(crontab_fields()))
def test_a_stored_crontab_across_a_daylight_saving_change(change: Change, name: str) -> None:
    """The instants of a stored crontab in its own zone are those the documented
    rules give for a static crontab (``test_dst.expected_runs``), through the
    engine's definition and through next_runs."""
    fields = crontab_fields()[name]
    static = crontab(**fields)
    texts = " ".join(
        str(fields.get(f, "*"))
        for f in ("minute", "hour", "day_of_month", "month_of_year", "day_of_week")
    )
    stored = saved(entry({"crontab": texts, "tz": change.zone}))
    start = change.at - timedelta(hours=12)
    end = change.at + timedelta(hours=12)
    expected = sorted(expected_runs(static, change.tz, datetime_to_us(start), datetime_to_us(end)))
    runs = [r for r in next_runs(stored, 200, now=start, tz=UTC) if r <= end]
    assert [datetime_to_us(r) for r in runs] == expected
    definition = definition_of(stored, DEFAULT, UTC)
    sequence = sequence_for(definition.schedule, 0, definition.tz)
    walked, at = [], datetime_to_us(start)
    while True:
        at = sequence.next_after(at)  # type: ignore[assignment]
        if at is None or at > datetime_to_us(end):
            break
        walked.append(at)
    assert walked == expected
    berlin_id = change.id.replace("Paris", "Berlin")
    if name in SINGLE_RUNS.get(berlin_id, {}):
        assert expected == SINGLE_RUNS[berlin_id][name]
