"""``manage.py singlebeat_pause``: ``singlebeat pause`` with the project's settings."""

from __future__ import annotations

from ..bridge import ClickCommand


class Command(ClickCommand):
    """Pause entries (or ``--all``), as ``singlebeat pause``: no replica
    sends them until resumed or ``--until``."""

    help = __doc__
    click_path = ("pause",)
