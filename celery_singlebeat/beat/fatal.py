"""A configuration error ends ``celery beat`` with the one line that says what to fix.

``celery beat`` builds a lazy scheduler for its banner before it sets up logging
and outside any ``try``: a :class:`~celery_singlebeat.exceptions.ConfigurationError`
raised there (a bad setting, an unsupported database URL, a misspelt per-entry
option, an entry name too long) reached the interpreter, which printed some 20
frames of Celery's and click's above the last line, the only one that mattered.

So the scheduler hands such an error to :func:`stop_beat` before raising it.
Under ``celery worker -B`` that stops the worker (:mod:`.embedded`). Otherwise it
marks the error and makes sure :data:`sys.excepthook` (which the interpreter
calls for an exception nobody caught, just before it exits with status 1) prints
a marked error as that one line; every other exception goes to the hook that
was there before. Code that catches the error (an application building the
scheduler itself, a test) sees the same exception as ever: nothing is printed
and nothing exits.
"""

from __future__ import annotations

import sys
from types import TracebackType

from ..exceptions import ConfigurationError
from .embedded import stop_worker

#: the attribute that marks an error for the one-line report
_MARK = "_singlebeat_one_line"


def _excepthook(kind: type[BaseException], value: BaseException, tb: TracebackType | None) -> None:
    if isinstance(value, ConfigurationError) and getattr(value, _MARK, False):
        sys.stderr.write(f"celery-singlebeat: configuration error: {value}\n")
        sys.stderr.flush()
        return
    _previous(kind, value, tb)


_previous = sys.excepthook
_installed = False


def stop_beat(error: ConfigurationError) -> None:
    """Make ``error``, about to be raised, end the process as one line.

    Under ``celery worker -B``: stop the worker (:func:`.embedded.stop_worker`).
    Otherwise: mark ``error`` for the interpreter's hook, installed once per
    process (a hook someone sets later is left alone: chaining to it again could
    loop, should it chain back to ours)."""
    global _previous, _installed
    if stop_worker(error):
        return
    setattr(error, _MARK, True)
    if not _installed:
        _previous, _installed = sys.excepthook, True
        sys.excepthook = _excepthook


__all__ = ["stop_beat"]
