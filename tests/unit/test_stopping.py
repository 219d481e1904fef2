"""A stop (SIGTERM, SIGINT) that arrives inside a tick is delivered after it,
with the tick's slots published and confirmed: Celery's beat raises
SystemExit from its signal handler wherever the main thread is, and a tick cut
between claim and confirm delays or repeats its slots (stopping.py)."""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any

import pytest
from test_scheduler import Harness, every, harness_for  # noqa: F401 - fixture

from celery_singlebeat import signals
from celery_singlebeat.beat.stopping import STOP_SIGNALS, stop_deferred


class Stopped(Exception):
    """Raised by the test's SIGTERM handler, as Celery's raises SystemExit."""


@pytest.fixture
def stop_handler() -> Iterator[list[str]]:
    """SIGTERM raises Stopped, after noting what the store held at that moment."""
    seen: list[str] = []
    previous = signal.getsignal(signal.SIGTERM)

    def handler(signum: int, frame: FrameType | None) -> None:
        seen.append("delivered")
        raise Stopped()

    signal.signal(signal.SIGTERM, handler)
    try:
        yield seen
    finally:
        signal.signal(signal.SIGTERM, previous)


@pytest.mark.parametrize("at", ["slot_claimed", "slot_published"])
def test_a_stop_inside_a_tick_waits_until_its_slots_are_confirmed(
    harness_for: Callable[..., Harness],  # noqa: F811
    stop_handler: list[str],
    at: str,
) -> None:
    harness = harness_for({"job": every(1)})
    replica = harness.replica()
    replica.tick()  # registers the entry
    harness.clock.advance(every(1)["schedule"])

    def stop_now(**details: Any) -> None:
        os.kill(os.getpid(), signal.SIGTERM)
        stop_handler.append(f"{at} returned")

    hook = getattr(signals, at)
    hook.connect(stop_now, weak=False)
    try:
        with pytest.raises(Stopped):
            replica.tick()
    finally:
        hook.disconnect(stop_now)
    # the signal waited for the tick: the slot went out and was confirmed first
    assert stop_handler == [f"{at} returned", "delivered"]
    assert [m.entry for m in harness.drain()] == ["job"]
    assert [(row.state, row.fence) for row in harness.store.slot_rows()] == [(1, 1)]


def test_a_stop_is_held_back_even_when_another_thread_receives_it(
    stop_handler: list[str],
) -> None:
    """The kernel gives a process-directed signal to any thread that does not
    block it; Python runs the handler in the main thread all the same."""
    idle = threading.Event()
    other = threading.Thread(target=idle.wait, daemon=True)
    other.start()
    try:
        with pytest.raises(Stopped), stop_deferred():
            os.kill(os.getpid(), signal.SIGTERM)
            for _ in range(1000):  # bytecode boundaries where a handler could run
                pass
            stop_handler.append("body done")
    finally:
        idle.set()
        other.join()
    assert stop_handler == ["body done", "delivered"]


def test_outside_the_main_thread_nothing_changes() -> None:
    seen: list[object] = []
    before = signal.getsignal(signal.SIGTERM)

    def run() -> None:
        with stop_deferred():
            seen.append(signal.getsignal(signal.SIGTERM))

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    assert seen == [before]


def test_the_handlers_are_restored_when_the_tick_raises(stop_handler: list[str]) -> None:
    before = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
    with pytest.raises(RuntimeError), stop_deferred():
        assert signal.getsignal(signal.SIGTERM) is not before[signal.SIGTERM]
        raise RuntimeError("a failing tick")
    assert {sig: signal.getsignal(sig) for sig in STOP_SIGNALS} == before
    assert stop_handler == []


def test_a_second_stop_while_one_is_held_stops_at_once(stop_handler: list[str]) -> None:
    with pytest.raises(Stopped), stop_deferred():
        os.kill(os.getpid(), signal.SIGTERM)
        stop_handler.append("first held")
        os.kill(os.getpid(), signal.SIGTERM)
        for _ in range(1000):
            pass
        stop_handler.append("never reached")
    assert stop_handler == ["first held", "delivered"]
    # and the original handler is back
    assert signal.getsignal(signal.SIGTERM) is not None
    assert signal.getsignal(signal.SIGTERM).__name__ == "handler"
