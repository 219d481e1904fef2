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
from celery_singlebeat.stopping import stop_deferred


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


def test_outside_the_main_thread_nothing_is_blocked() -> None:
    blocked: list[set[int]] = []

    def run() -> None:
        with stop_deferred():
            blocked.append(set(signal.pthread_sigmask(signal.SIG_BLOCK, [])))

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    assert signal.SIGTERM not in blocked[0]


def test_the_mask_is_restored_when_the_tick_raises(stop_handler: list[str]) -> None:
    before = set(signal.pthread_sigmask(signal.SIG_BLOCK, []))
    with pytest.raises(RuntimeError), stop_deferred():
        assert signal.SIGTERM in signal.pthread_sigmask(signal.SIG_BLOCK, [])
        raise RuntimeError("a failing tick")
    assert set(signal.pthread_sigmask(signal.SIG_BLOCK, [])) == before
