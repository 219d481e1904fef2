"""The clocks of the test tools: :class:`FakeClock`, moved by hand, and the host's.

Both answer what :class:`~celery_singlebeat.testing.MemoryStore` and
:class:`~celery_singlebeat.testing.MemorySource` take as ``now_us``: the
current instant in microseconds since the Unix epoch (UTC). A test passes a
:class:`FakeClock` to move time itself instead of sleeping; without one, the
store and the source read :func:`wall_us`.
"""

from __future__ import annotations

import threading
import time
from datetime import datetime, timedelta, timezone

from ..timeline.clock import datetime_to_us, us_to_datetime

__all__ = ["DEFAULT_START", "FakeClock", "wall_us"]

#: FakeClock's default start: a whole second, so slot instants are round numbers.
DEFAULT_START = datetime(2024, 1, 10, 12, 0, 0, tzinfo=timezone.utc)


class FakeClock:
    """A clock for tests: it stands still until :meth:`advance` moves it.

    Calling it returns the current instant in microseconds since the epoch,
    which is what :class:`~celery_singlebeat.testing.MemoryStore` expects as
    ``now_us``.
    """

    def __init__(self, start: datetime = DEFAULT_START) -> None:
        self._now_us = datetime_to_us(start)
        self._lock = threading.Lock()

    def __call__(self) -> int:
        """The current instant, microseconds since the Unix epoch (UTC)."""
        return self._now_us

    def now(self) -> datetime:
        """The current instant as an aware UTC datetime."""
        return us_to_datetime(self._now_us)

    def advance(self, delta: timedelta) -> datetime:
        """Move the clock forward by ``delta``; returns the new instant."""
        step = int(delta / timedelta(microseconds=1))
        if step < 0:
            raise ValueError(f"advance({delta!r}): a clock only moves forward")
        with self._lock:
            self._now_us += step
        return self.now()

    def set(self, when: datetime) -> None:
        """Jump to ``when`` (an aware datetime), forward or backward."""
        with self._lock:
            self._now_us = datetime_to_us(when)


def wall_us() -> int:
    """This host's wall clock, microseconds since the Unix epoch (UTC): the
    ``now_us`` of a store or source given no :class:`FakeClock`."""
    return time.time_ns() // 1000
