"""Storage boundary: the :class:`Store` contract and its SQL implementation."""

from .base import Claim, EntryState, SlotKey, Store

__all__ = ["Claim", "EntryState", "SlotKey", "Store"]
