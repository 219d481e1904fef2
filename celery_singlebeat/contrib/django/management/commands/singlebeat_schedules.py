"""``manage.py singlebeat_schedules``: ``singlebeat schedules`` with the project's settings."""

from __future__ import annotations

from ..bridge import ClickCommand


class Command(ClickCommand):
    """The stored schedules, as ``singlebeat schedules``: list, show, add,
    edit, enable, disable, rm, log, export, import."""

    help = __doc__
    click_path = ("schedules",)
