"""``manage.py singlebeat_status``: ``singlebeat status`` with the project's settings."""

from __future__ import annotations

from ..bridge import ClickCommand


class Command(ClickCommand):
    """The fleet's status, as ``singlebeat status`` prints it: every entry
    (next due first), the replicas and the pauses; ``--json`` for one document."""

    help = __doc__
    click_path = ("status",)
