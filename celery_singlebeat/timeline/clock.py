"""The database's clock, as seen from this process, and instants as text.

Every comparison that decides *who may send* (lease expiry, dueness of a
slot) uses the database's clock, never the pod's: pods disagree on the time,
the database is the one place they share. Each round trip returns the
database's ``now``; this module keeps the offset between that and the local
wall clock, so the scheduler can ask "what time is it on the database?"
between round trips without asking the database.

An instant is an integer of microseconds since the Unix epoch (``*_us``) or
an aware ``datetime``; the conversions between the two, an instant read from
ISO 8601 text (:func:`parse_instant`) and a slot's instant as the log lines
and the CLI show it (:func:`slot_text`) are here, the lowest module every
layer may import, so that each is written once.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import datetime, timedelta, timezone

US = 1_000_000

_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def us_to_datetime(value_us: int) -> datetime:
    """An aware UTC datetime for a count of microseconds since the Unix epoch."""
    # Integer arithmetic: a float of seconds loses microseconds far from 1970.
    return _EPOCH + timedelta(microseconds=value_us)


def datetime_to_us(value: datetime) -> int:
    """Microseconds since the Unix epoch for an aware datetime."""
    if value.tzinfo is None:
        raise ValueError(f"naive datetime {value!r}: pass an aware datetime")
    delta = value - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * US + delta.microseconds


class NaiveInstantError(ValueError):
    """ISO 8601 text without its UTC offset: refused, since the pod's time zone
    and the fleet's may differ (:func:`parse_instant`)."""


def parse_instant(text: str) -> datetime:
    """An aware datetime from ISO 8601 text (``Z`` accepted on Python 3.9 too);
    ValueError for text that is none, :class:`NaiveInstantError` for a naive
    one (its caller words each for its reader)."""
    value = text.strip()
    if value.endswith(("Z", "z")):
        value = value[:-1] + "+00:00"
    parsed = datetime.fromisoformat(value)
    if parsed.tzinfo is None or parsed.utcoffset() is None:
        raise NaiveInstantError(f"{text!r} has no UTC offset")
    return parsed


def slot_text(slot_us: int) -> str:
    """A slot's instant as the log lines and the CLI show it: ISO-8601 UTC,
    milliseconds, ``Z``."""
    return us_to_datetime(slot_us).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class DatabaseClock:
    """Estimates the database's current time from observed round trips.

    The estimate is ``local wall clock + offset``; the offset is taken from the
    round trip with the smallest latency among the recent ones (the midpoint of
    a short round trip bounds the error by half its latency). Observations are
    thread-safe because the SingletonTask heartbeat and the scheduler may share
    one store.
    """

    #: forget the best sample after this many seconds: clocks drift and NTP steps.
    max_sample_age_s = 60.0

    def __init__(
        self,
        wall: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._wall = wall
        self._monotonic = monotonic
        self._lock = threading.Lock()
        self._offset_us: int | None = None
        self._best_latency_us = 0
        self._best_at = 0.0

    @property
    def synchronised(self) -> bool:
        """True once at least one round trip told us the database's time."""
        return self._offset_us is not None

    @property
    def offset_us(self) -> int:
        """Database time minus local wall time, in microseconds (0 before any sample)."""
        return self._offset_us or 0

    def local_us(self) -> int:
        """The local wall clock in microseconds since the epoch."""
        return int(self._wall() * US)

    def observe(self, db_now_us: int, sent_local_us: int, received_local_us: int) -> None:
        """Record that the database said ``db_now_us`` during a round trip.

        ``sent_local_us``/``received_local_us`` are the local wall clock just
        before sending and just after receiving the answer.
        """
        latency = max(0, received_local_us - sent_local_us)
        offset = db_now_us - (sent_local_us + received_local_us) // 2
        now = self._monotonic()
        with self._lock:
            stale = now - self._best_at > self.max_sample_age_s
            # Each sample bounds the true offset within +-latency/2 of its own
            # estimate. A sample whose bound excludes the kept offset means one of
            # the clocks stepped (NTP, VM resume): believe the new one at once
            # rather than send with a wrong notion of "now" for up to a minute.
            stepped = (
                self._offset_us is not None
                and abs(offset - self._offset_us) > (latency + self._best_latency_us) // 2 + 1000
            )
            if self._offset_us is None or stale or stepped or latency <= self._best_latency_us:
                self._offset_us = offset
                self._best_latency_us = latency
                self._best_at = now

    def now_us(self) -> int:
        """The estimated database time, microseconds since the epoch."""
        return self.local_us() + self.offset_us

    def now(self) -> datetime:
        """The estimated database time as an aware UTC datetime."""
        return us_to_datetime(self.now_us())
