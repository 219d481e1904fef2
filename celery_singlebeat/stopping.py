"""A stop request waits for the tick in progress to end.

``celery beat`` handles SIGTERM and SIGINT by closing the scheduler from inside
the signal handler and raising ``SystemExit`` wherever the main thread happens
to be (``celery.apps.beat.Beat.install_sync_handler``). A tick cut there leaves
its slots half done: claimed and not yet published (they wait for the lease and
the next sweep, up to ``L + L/3`` late), or published and not yet confirmed (the
takeover after the lease publishes them again: a repeat). A rolling deploy
stops every replica once, so without this each deploy could repeat or delay the
runs of the ticks it interrupts.

So the tick runs with both signals blocked in the main thread: a stop that
arrives meanwhile stays pending and is delivered the moment the tick returns,
with its slots published and confirmed (or released). A tick is milliseconds;
its worst case is bounded by the store's and the broker's timeouts, well inside
a pod's termination grace period (30 s by default). Outside the main thread
(a beat run as a thread) Python delivers no signal there, so nothing is needed;
where ``pthread_sigmask`` does not exist (Windows), nothing is done.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager

#: what Celery's beat and the kubelet send to stop a process
STOP_SIGNALS = frozenset({signal.SIGTERM, signal.SIGINT})


@contextmanager
def stop_deferred() -> Iterator[None]:
    """Run the body with SIGTERM and SIGINT held back; deliver them after."""
    mask = getattr(signal, "pthread_sigmask", None)
    if mask is None or threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = mask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        yield
    finally:
        # Unblocking delivers what is pending: Python runs the handler right
        # after this call, at a point where the tick's work is complete.
        mask(signal.SIG_SETMASK, previous)


__all__ = ["STOP_SIGNALS", "stop_deferred"]
