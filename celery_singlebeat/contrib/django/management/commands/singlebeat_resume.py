"""``manage.py singlebeat_resume``: ``singlebeat resume`` with the project's settings."""

from __future__ import annotations

from ..bridge import ClickCommand


class Command(ClickCommand):
    """Lift pauses, as ``singlebeat resume``."""

    help = __doc__
    click_path = ("resume",)
