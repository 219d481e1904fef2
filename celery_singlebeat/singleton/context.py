"""``self.singleton``: what a running SingletonTask knows about its lease."""

from __future__ import annotations

import logging
import threading
from datetime import datetime
from typing import Any, NamedTuple

from ..exceptions import LeaseLost
from ..store.singleton_store import SingletonStore
from ..timeline.clock import us_to_datetime
from ..timeline.slots import SLOT_HEADER
from .writeback import through_reconnect

logger = logging.getLogger("celery_singlebeat.singleton")

_local = threading.local()


class SlotInfo(NamedTuple):
    """The scheduler slot a message was sent for."""

    entry: str
    slot_us: int

    @property
    def at(self) -> datetime:
        return us_to_datetime(self.slot_us)


class Singleton:
    """The lease of one running execution (``self.singleton`` in the task body).

    ``token`` is the fencing token: it grows every time the key changes hands,
    so a write that carries it can be refused by the database once a newer
    holder exists (see ``docs/singleton.md``, "Fencing"). ``lost`` turns true
    when the heartbeat finds the lease taken over, or cannot renew it before
    it expires; the task body is never interrupted, it decides by calling
    :meth:`check` (no round trip) or :meth:`guard` (one round trip).
    """

    def __init__(
        self,
        store: SingletonStore,
        task_name: str,
        key: str,
        token: int,
        task_id: str,
        slot: SlotInfo | None,
    ) -> None:
        self.task_name = task_name
        self.key = key
        self.token = token
        self.task_id = task_id
        self.slot = slot
        self._store = store
        self._lost = threading.Event()
        self.lost_reason: str | None = None

    def __repr__(self) -> str:
        state = f" lost: {self.lost_reason}" if self.lost else ""
        return f"<Singleton {self.key!r} token={self.token}{state}>"

    @property
    def lost(self) -> bool:
        """True once this execution is known to have lost its lease."""
        return self._lost.is_set()

    def mark_lost(self, reason: str) -> None:
        if not self._lost.is_set():
            self.lost_reason = reason
            self._lost.set()

    def check(self) -> None:
        """Raise :class:`.LeaseLost` if the heartbeat found the lease lost.

        Costs nothing; between heartbeats (every third of the TTL) a loss is
        not known yet, which is what :meth:`guard` is for."""
        if self.lost:
            raise LeaseLost(f"singleton key {self.key!r}: {self.lost_reason}")

    def holds(self) -> bool:
        """Ask the database whether this lease still holds (one round trip)."""
        return not self.lost and through_reconnect(
            lambda: self._store.lease_holds(self.key, self.token)
        )

    def guard(self) -> None:
        """Raise :class:`.LeaseLost` unless the database says the lease holds now.

        One round trip. Call it right before a write that must not come from a
        stale holder; for writes to the same database, putting ``token`` in the
        write itself (a fenced update) closes the remaining gap."""
        self.check()
        if not self.holds():
            self.mark_lost("the database no longer shows this token holding the key")
            self.check()


def push(singleton: Singleton) -> None:
    stack = getattr(_local, "stack", None)
    if stack is None:
        stack = _local.stack = []
    stack.append(singleton)


def pop() -> None:
    _local.stack.pop()


def current(task_name: str) -> Singleton | None:
    """The innermost running singleton of ``task_name`` in this thread."""
    for singleton in reversed(getattr(_local, "stack", None) or ()):
        if singleton.task_name == task_name:
            return singleton  # type: ignore[no-any-return]
    return None


def slot_of(request: Any) -> SlotInfo | None:
    """The slot a scheduler-sent message carries (None for other messages)."""
    header = getattr(request, SLOT_HEADER, None)
    if header is None:
        header = (getattr(request, "headers", None) or {}).get(SLOT_HEADER)
    if not isinstance(header, dict):
        return None
    entry, at_us = header.get("entry"), header.get("at_us")
    if not isinstance(entry, str) or not isinstance(at_us, int) or isinstance(at_us, bool):
        logger.warning("singlebeat: ignoring a malformed %s header: %r", SLOT_HEADER, header)
        return None
    return SlotInfo(entry, at_us)
