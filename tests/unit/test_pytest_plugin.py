"""The pytest plugin, through pytest itself: user test files run by ``pytester``
with the plugin loaded from its ``pytest11`` entry point (nothing here registers
it), including the examples docs/testing.md shows, which live in docs/examples/.
"""

from __future__ import annotations

import subprocess
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from celery_singlebeat.testing.simulation import SentRun, Simulation, assert_runs

pytest_plugins = ["pytester"]

EXAMPLES = Path(__file__).resolve().parents[2] / "docs" / "examples"
UTC = timezone.utc
INI = "[pytest]\nsinglebeat_app = exampleapp:app\n"
#: the inner runs skip the plugins they do not use: hypothesis's costs about 2 s
#: of start-up per run, pytest-celery's (and the docker one it brings) 1 s
BASE = ("-p", "no:cacheprovider", "-p", "no:hypothesispytest", "-p", "no:docker_tools")
LEAN = (*BASE, "-p", "no:celery")


def copy_examples(pytester: pytest.Pytester, *names: str) -> None:
    for name in ("exampleapp.py", *names):
        pytester.makepyfile(**{name[:-3]: (EXAMPLES / name).read_text()})
    pytester.makeini(INI)


def test_the_schedule_examples_of_the_docs_pass(pytester: pytest.Pytester) -> None:
    copy_examples(pytester, "test_example_schedule.py")
    result = pytester.runpytest(*LEAN)
    result.assert_outcomes(passed=5)


def test_the_singleton_example_of_the_docs_passes(pytester: pytest.Pytester) -> None:
    # pytest-celery's celery_app, an in-process worker (Celery's own stop of it
    # takes about 3.5 s of this test)
    copy_examples(pytester, "test_example_singleton.py")
    result = pytester.runpytest(*BASE)
    result.assert_outcomes(passed=1)


def test_a_wrong_expectation_fails_naming_the_missing_and_unexpected_runs(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(exampleapp=(EXAMPLES / "exampleapp.py").read_text())
    pytester.makeini(INI)
    pytester.makepyfile(
        test_user="""
        from datetime import datetime, timezone
        from celery_singlebeat.testing.simulation import assert_runs

        def test_nightly(singlebeat_simulate):
            # the author wrote the wall time as UTC, and forgot the spring change
            start = datetime(2026, 3, 29, 0, tzinfo=timezone.utc)
            result = singlebeat_simulate(start, start.replace(hour=3))
            expected = [datetime(2026, 3, 29, 2, 30, tzinfo=timezone.utc)]
            assert_runs(result.only("nightly-report"), {"nightly-report": expected})
        """
    )
    result = pytester.runpytest(*LEAN)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "*differ from the expected: 1 missing, 0 doubled, 1 unexpected",
            "*missing    nightly-report @ 2026-03-29 04:30:00 CEST (2026-03-29 02:30:00 UTC)",
            "*unexpected nightly-report @ 2026-03-29 03:30:00 CEST (2026-03-29 01:30:00 UTC)",
        ]
    )


def test_without_an_app_the_fixture_says_how_to_name_one(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_user="""
        def test_it(singlebeat_fleet):
            singlebeat_fleet(2)
        """
    )
    result = pytester.runpytest(*LEAN)
    assert result.ret != 0
    result.stdout.fnmatch_lines(
        ["*set the ini option singlebeat_app = proj.celery:app, mark the test*"]
    )


def test_the_marker_names_the_app_and_the_start(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(exampleapp=(EXAMPLES / "exampleapp.py").read_text())
    pytester.makepyfile(
        test_user="""
        from datetime import datetime, timedelta, timezone
        import pytest

        START = datetime(2026, 7, 1, 8, tzinfo=timezone.utc)

        @pytest.mark.singlebeat(app="exampleapp:app", start=START)
        def test_it(singlebeat_fleet, singlebeat_clock):
            fleet = singlebeat_fleet(1)
            assert fleet.now() == START
            fleet.run_until(START + timedelta(minutes=3, seconds=1))
            assert [r.at for r in fleet.sent if r.entry == "poll-partner"] == [
                START + timedelta(minutes=k) for k in (1, 2, 3)
            ]
        """
    )
    pytester.runpytest(*LEAN).assert_outcomes(passed=1)


def test_a_doubled_run_is_named_with_who_sent_it_and_when() -> None:
    # Built by hand: the scheduler does not double a run in a simulation; this
    # is the message a real regression would get.
    at = datetime(2026, 1, 5, 10, 5, tzinfo=UTC)

    def sent(replica: str, after: float) -> SentRun:
        return SentRun("job", at, at + timedelta(seconds=after), replica, "id", "t", "celery")

    result = Simulation(
        at - timedelta(minutes=5), at, 2, (sent("replica-1", 0), sent("replica-2", 20)), (), {}
    )
    with pytest.raises(AssertionError) as failure:
        assert_runs(result, {"job": [at]})
    assert str(failure.value).splitlines()[1:] == [
        "  doubled    job @ 2026-01-05 10:05:00 UTC: sent 2 times (by replica-1 at "
        "10:05:00.000000 UTC, by replica-2 at 10:05:20.000000 UTC)"
    ]


def test_loading_the_plugin_imports_only_pytest() -> None:
    code = (
        "import sys; import celery_singlebeat.pytest_plugin; "
        "print(sorted({m.split('.')[0] for m in sys.modules} & "
        "{'celery', 'kombu', 'sqlalchemy', 'billiard'}))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "[]"
