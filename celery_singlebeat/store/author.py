"""Who made a change, when the caller does not say: a leaf, so that the
operator's CLI and the stored schedules' API record the same default."""

from __future__ import annotations

import getpass
import socket

from ..widths import MAX_AUTHOR


def default_author() -> str:
    """``user@host`` of the process, cut to :data:`MAX_AUTHOR` characters."""
    try:
        user = getpass.getuser()
    except Exception:  # no login name (a container without a passwd entry)
        user = "unknown"
    return f"{user}@{socket.gethostname()}"[:MAX_AUTHOR]


__all__ = ["default_author"]
