"""Sizes several layers share: a leaf, so that none imports another for a number.

The store's columns are as wide as these (``store/schema.py``), the entry
sources and the stored schedules refuse what would not fit.
"""

from __future__ import annotations

#: the longest entry name, in UTF-8 bytes (the slot tables' ``entry`` column)
MAX_ENTRY_NAME = 255

__all__ = ["MAX_ENTRY_NAME"]
