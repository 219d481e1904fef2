"""A stop request waits for the tick in progress to end.

``celery beat`` handles SIGTERM and SIGINT by closing the scheduler from inside
the signal handler and raising ``SystemExit`` wherever the main thread happens
to be (``celery.apps.beat.Beat.install_sync_handler``). A tick cut there leaves
its slots half done: claimed and not yet published (they wait for the lease and
the next sweep, up to ``L + L/3`` late), or published and not yet confirmed (the
takeover after the lease publishes them again: a repeat). A rolling deploy
stops every replica once, so without this each deploy could repeat or delay the
runs of the ticks it interrupts.

So while a tick runs, both signals are only noted (Python runs every signal
handler in the main thread, whichever thread the kernel delivered the signal
to, so blocking them with a signal mask would not hold them back once beat has
another thread); when the tick returns the original handlers are put back and
a noted stop is raised again, at a point where the tick's slots are published
and confirmed (or released). A tick is milliseconds; its worst case is bounded
by the store's and the broker's timeouts, well inside a pod's termination grace
period (30 s by default). Outside the main thread (a beat run as a thread)
Python delivers no signal there and handlers cannot be set, so nothing is done.
A second stop while one is held is not held: whoever asks again means it, and
the original handler runs at once, as without this.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

#: what Celery's beat and the kubelet send to stop a process
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


@contextmanager
def stop_deferred() -> Iterator[None]:
    """Run the body with SIGTERM and SIGINT noted, not acted on; raise the
    first one noted again, with the original handlers, once the body is done."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    noted: list[int] = []
    previous: dict[int, Any] = {}

    def restore() -> None:
        while previous:
            sig, handler = previous.popitem()
            signal.signal(sig, handler)

    def note(signum: int, frame: FrameType | None) -> None:
        if noted:
            # asked twice: stop now, through the original handler
            noted.clear()
            restore()
            signal.raise_signal(signum)
            return
        noted.append(signum)

    for sig in STOP_SIGNALS:
        handler = signal.getsignal(sig)
        # None: a handler set outside Python, which could not be put back;
        # SIG_IGN: nothing to defer
        if handler is not None and handler != signal.SIG_IGN:
            previous[sig] = signal.signal(sig, note)
    try:
        yield
    finally:
        restore()
        if noted:
            signal.raise_signal(noted[0])


__all__ = ["STOP_SIGNALS", "stop_deferred"]
