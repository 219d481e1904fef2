"""``manage.py singlebeat_run_now``: ``singlebeat run`` with the project's settings."""

from __future__ import annotations

from ..bridge import ClickCommand


class Command(ClickCommand):
    """Send an entry once, now, as ``singlebeat run``."""

    help = __doc__
    click_path = ("run",)
