"""Counting a benchmark's statements apart from the write-back's pings."""

from __future__ import annotations

import threading
from typing import Any


class Statements:
    """The statements a measurement sends, without the write-back's pings.

    While a worker process remembers runs it wrote within
    ``singlebeat_failover_window``, its heartbeat thread pings the database
    every second (``singleton/writeback.py``), whatever the benchmark does:
    they are the write-back's idle cost, counted apart in :attr:`pings`, not
    any execution's. The lock makes a ping and its count one step, so that a
    reading never sees the statement without the count.
    """

    def __init__(self, store: Any) -> None:
        self.store = store
        self.pings = 0
        self._lock = threading.Lock()
        ping = store.ping
        main = threading.get_ident()

        def counted() -> Any:
            if threading.get_ident() == main:
                return ping()
            with self._lock:
                self.pings += 1
                return ping()

        store.ping = counted

    def sent(self) -> int:
        with self._lock:
            return int(self.store.round_trips) - self.pings

    def close(self) -> None:
        del self.store.ping
