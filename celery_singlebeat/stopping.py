"""A stop request (SIGTERM, SIGINT) waits for the tick in progress to end.

``celery beat`` stops on SIGTERM and SIGINT by raising ``SystemExit`` from its
signal handler, wherever the main thread happens to be. Raised inside a tick,
between the claim and the confirm, it leaves claims behind that no one will
publish (the slots go out only after the lease, up to ``L + L/3`` late) or
publishes that no one will confirm (taken over after the lease and published
again: a repeat). A deploy sends SIGTERM to every replica, so that is not rare
enough to accept: :func:`stop_signals_held` keeps the signal until the tick has
published, confirmed or released what it claimed, then lets the handler run.

A tick is short and bounded (its publishing stops at 80 % of the lease, every
statement has a timeout), so the stop waits at most that long. A second signal
while one is held is not kept: it runs the handler at once, as without this.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any, Optional, Union

#: the signals ``celery beat`` (and a terminal, and a kubelet) stops it with
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)

# typing.Union/Optional, not |: evaluated at import, and Python 3.9 is supported
_Handler = Union[Callable[[int, Optional[FrameType]], Any], int, signal.Handlers, None]


def _deliver(signum: int, frame: FrameType | None, handler: _Handler) -> None:
    """Do what ``handler`` (now installed again) would have done for ``signum``."""
    if callable(handler):
        handler(signum, frame)
    elif handler == signal.SIG_DFL:
        signal.raise_signal(signum)


@contextmanager
def stop_signals_held() -> Iterator[None]:
    """Hold SIGTERM and SIGINT for the body's duration; deliver one afterwards.

    Python runs signal handlers in the main thread only, and only the main
    thread may install them: elsewhere (a beat run in a thread) this does
    nothing. Signals that are ignored, or whose handler is not Python's to
    replace, are left alone.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous: dict[int, _Handler] = {}
    pending: list[tuple[int, FrameType | None]] = []
    restored = False

    def restore() -> None:
        nonlocal restored
        if not restored:
            restored = True
            for signum, handler in previous.items():
                signal.signal(signum, handler)

    def hold(signum: int, frame: FrameType | None) -> None:
        if pending:
            # Asked twice: whoever asks again means it; stop now.
            restore()
            pending.clear()
            _deliver(signum, frame, previous[signum])
            return
        pending.append((signum, frame))

    try:
        for stop in STOP_SIGNALS:
            handler = signal.getsignal(stop)
            if handler is None or handler == signal.SIG_IGN:
                continue
            previous[stop] = handler
            signal.signal(stop, hold)
        yield
    finally:
        restore()
        if pending:
            signum, frame = pending.pop()
            _deliver(signum, frame, previous[signum])
