"""SingletonTask: leases on keys, heartbeats, fencing tokens and per-slot dedupe."""

from __future__ import annotations

from .context import Singleton, SlotInfo
from .task import SingletonTask

__all__ = ["Singleton", "SingletonTask", "SlotInfo"]
