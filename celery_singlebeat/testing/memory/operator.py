"""The operator's side of the memory store: the controls it writes and the rows it reads.

What the SQL store's operator (the CLI's ``pause``, ``resume``, ``run``, and
its status tables) does to the same rows, for tests to do by hand:
:class:`MemoryOperator` pauses and resumes entries and asks for a run now,
each one round trip that raises the control version as the SQL controls do,
and reads what the "database" holds (slot, replica, catalog and run rows),
copied under the state's lock without a round trip, so that looking does
not change what a test counts.
"""

from __future__ import annotations

from typing import Any

from ...store.base import CatalogEntry, Pause, SlotKey
from .connection import MemoryConnection
from .state import MemorySlot, SlotRow

__all__ = ["MemoryOperator"]


class MemoryOperator:
    """The operator's controls and reads of :class:`~.store.MemoryStore`,
    which delegates each of them here; they share the store's connection and
    state with the contract parts."""

    def __init__(self, connection: MemoryConnection) -> None:
        self._connection = connection
        self._state = connection.state

    def pause(self, entry: str, until_us: int | None = None, by: str = "test") -> None:
        """What an operator's pause writes (``entry`` "*": every entry)."""
        with self._connection.round_trip("pause") as now:
            self._state.pauses[entry] = Pause(entry, until_us, by, "", now)
            self._connection.controls_version = (self._connection.controls_version or 0) + 1

    def resume(self, entry: str | None = None) -> None:
        """What an operator's resume writes (None: every pause)."""
        with self._connection.round_trip("resume"):
            if entry is None:
                self._state.pauses.clear()
            else:
                self._state.pauses.pop(entry, None)
            self._connection.controls_version = (self._connection.controls_version or 0) + 1

    def request_run(self, entry: str) -> SlotKey:
        """What an operator's run-now writes: an abandoned row at fence 0."""
        with self._connection.round_trip("run now") as now:
            slot_us = now
            while SlotKey(entry, slot_us) in self._state.slots:
                slot_us += 1
            self._state.slot_written(SlotKey(entry, slot_us), now)
            self._state.slots[SlotKey(entry, slot_us)] = MemorySlot(0, "", 0, 0, now)
            self._connection.controls_version = (self._connection.controls_version or 0) + 1
            return SlotKey(entry, slot_us)

    def slot_rows(self) -> list[SlotRow]:
        """Every slot row, ordered by ``(entry, slot_us)`` (not a round trip)."""
        with self._state.lock:
            return [
                SlotRow(
                    key.entry,
                    key.slot_us,
                    row.state,
                    row.owner,
                    row.fence,
                    row.lease_until_us,
                    row.claimed_us,
                    row.sent_us,
                )
                for key, row in sorted(self._state.slots.items())
            ]

    def replica_rows(self) -> dict[str, dict[str, Any]]:
        """Every replica row, as dicts of its columns (not a round trip)."""
        with self._state.lock:
            return {key: dict(row) for key, row in sorted(self._state.replicas.items())}

    def catalog_of(self, replica_id: str) -> dict[str, CatalogEntry]:
        """The catalog a replica published (not a round trip)."""
        with self._state.lock:
            return dict(self._state.catalog.get(replica_id, {}))

    def run_rows(self) -> dict[SlotKey, dict[str, Any]]:
        """Every run row (SingletonTask), as dicts of its columns (not a round trip)."""
        with self._state.lock:
            return {key: dict(vars(row)) for key, row in sorted(self._state.runs.items())}
