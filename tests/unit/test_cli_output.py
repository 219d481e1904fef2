"""The CLI's formatting and parsing (no database): instants, durations,
relative times, tables and colour."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from celery_singlebeat.cli import output
from celery_singlebeat.cli.durations import instant_us, parse_duration
from celery_singlebeat.timeline.clock import US, us_to_datetime


@given(st.integers(-(2**50), 2**52))
def test_iso_is_isoformat_with_z(value_us: int) -> None:
    expected = us_to_datetime(value_us).isoformat(timespec="microseconds")
    assert output.iso(value_us) == expected.replace("+00:00", "Z")
    assert instant_us(output.iso(value_us) or "") == value_us


@pytest.mark.parametrize(
    ("text", "us"),
    [
        ("90", 90 * US),
        ("1.5", 1_500_000),
        ("500ms", 500_000),
        ("90s", 90 * US),
        ("15m", 900 * US),
        ("1h30m", 5400 * US),
        ("2d", 172_800 * US),
        ("1w", 604_800 * US),
        (" 1H ", 3600 * US),
    ],
)
def test_durations(text: str, us: int) -> None:
    assert parse_duration(text) == us


@pytest.mark.parametrize("text", ["", "0", "0s", "5x", "m", "1h 30m", "-5s", "1.2.3s"])
def test_bad_durations(text: str) -> None:
    with pytest.raises(ValueError):
        parse_duration(text)


def test_instants_need_an_offset() -> None:
    assert instant_us("1970-01-01T00:00:01Z") == US
    assert instant_us("1970-01-01T01:00:01+01:00") == US
    with pytest.raises(ValueError, match="no UTC offset: add Z or"):
        instant_us("1970-01-01T00:00:01")
    with pytest.raises(ValueError, match="neither a duration"):
        instant_us("tomorrow")


@pytest.mark.parametrize(
    ("us", "text"),
    [
        (450_000, "450ms"),
        (3_200_000, "3.2s"),
        (12 * US, "12s"),
        (245 * US, "4m05s"),
        (7800 * US, "2h10m"),
        (273_600 * US, "3d04h"),
    ],
)
def test_spans(us: int, text: str) -> None:
    assert output.span(us) == text
    assert output.relative(us, 0) == f"in {text}"
    assert output.relative(0, us) == f"{text} ago"


def test_relative_now_and_unknown() -> None:
    assert output.relative(500, 0) == "now"
    assert output.relative(None, 0) == "-"


def test_tables_align_and_colour_only_on_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    rows = [("a", ("live", "green"), "x"), ("long-name", "lost", "")]
    monkeypatch.setattr("sys.stdout.isatty", lambda: False, raising=False)
    assert output.table(["NAME", "STATE", "NOTE"], rows).splitlines() == [
        "NAME       STATE  NOTE",
        "a          live   x",
        "long-name  lost",
    ]
    monkeypatch.setattr("sys.stdout.isatty", lambda: True, raising=False)
    monkeypatch.delenv("NO_COLOR", raising=False)
    assert "\x1b[32m" in output.table(["NAME", "STATE", "NOTE"], rows)
    monkeypatch.setenv("NO_COLOR", "1")
    assert "\x1b[" not in output.table(["NAME", "STATE", "NOTE"], rows)
