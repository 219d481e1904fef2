"""fatal.py: a configuration error the scheduler raises prints as one line when
nobody catches it; every other exception keeps the interpreter's report."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from celery_singlebeat.beat import fatal
from celery_singlebeat.exceptions import ConfigurationError


def test_a_marked_error_is_one_line_and_others_go_to_the_previous_hook(
    capsys: pytest.CaptureFixture[str],
) -> None:
    error = ConfigurationError("singlebeat_lease=-1: must be positive")
    fatal.stop_beat(error)
    assert sys.excepthook is fatal._excepthook
    sys.excepthook(ConfigurationError, error, None)
    assert capsys.readouterr().err == (
        "celery-singlebeat: configuration error: singlebeat_lease=-1: must be positive\n"
    )
    # unmarked, even of the same class: the hook that was there before
    try:
        raise ConfigurationError("raised by someone else")
    except ConfigurationError as other:
        sys.excepthook(ConfigurationError, other, other.__traceback__)
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err and "raised by someone else" in err


def test_the_process_exits_1_with_the_line_alone() -> None:
    code = textwrap.dedent(
        """
        from celery import Celery
        from celery_singlebeat import SingleBeatScheduler
        app = Celery("x", broker="memory://")
        app.conf.singlebeat_lease = -1
        SingleBeatScheduler(app, lazy=True)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 1
    assert done.stderr == (
        "celery-singlebeat: configuration error: singlebeat_lease=-1: must be positive\n"
    )


def test_code_that_catches_it_sees_the_configuration_error() -> None:
    from celery import Celery

    from celery_singlebeat import SingleBeatScheduler

    app = Celery("x", broker="memory://")
    app.conf.singlebeat_lease = -1
    with pytest.raises(ConfigurationError, match="singlebeat_lease=-1"):
        SingleBeatScheduler(app, lazy=True)
