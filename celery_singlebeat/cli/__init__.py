"""``celery -A proj singlebeat ...``: administration commands.

Registered as a Celery sub-command through the ``celery.commands`` entry point;
``python -m celery_singlebeat --url URL ...`` runs the same commands without a
Celery app. One module per command family; the group and what they share live
in :mod:`.group`, which every command module imports, and this module only
assembles them (so no command imports the package that imports it). Nothing
here imports Celery (nor do the command modules at import time): ``python -m
celery_singlebeat health`` must start without it, so every command imports
what it needs when it runs.
"""

from __future__ import annotations

# the commands register themselves on the group when imported
from . import controls, health, leases, prune, schedules, schema, status  # noqa: F401
from .group import TARGET, Target, singlebeat, target_of

__all__ = ["TARGET", "Target", "singlebeat", "target_of"]
