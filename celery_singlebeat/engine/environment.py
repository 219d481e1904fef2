"""The process's clocks and randomness, as the engine receives them.

Every step reads the monotonic clock (when to sweep, the publish deadline, the
hold), the wall clock (checking a new entry's schedule) and a random source
(wake-up jitter, the outage backoff's jitter) through one
:class:`Environment`, passed in when the engine is built. Tests, the
simulation (:mod:`celery_singlebeat.testing.simulation`) and the benchmarks pass their
own (a fake clock, a seeded generator) instead of patching module globals, so
two simulated fleets can run in one process and no patch leaks into another
test.

The database's clock is another matter: the store estimates it
(:mod:`celery_singlebeat.timeline.clock`) and every decision about a slot uses it.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import NamedTuple


class Environment(NamedTuple):
    """The clocks and the random source of one replica."""

    #: seconds on a clock that never steps (sweeps, deadlines, the hold)
    monotonic: Callable[[], float]
    #: seconds since the epoch on this host's clock (only to check a schedule
    #: can say when it runs next; never to decide a slot)
    time: Callable[[], float]
    #: jitter: the wake-up delay's and the outage backoff's
    random: random.Random


#: the real clocks and a generator seeded by the operating system
SYSTEM = Environment(monotonic=time.monotonic, time=time.time, random=random.Random())

__all__ = ["SYSTEM", "Environment"]
