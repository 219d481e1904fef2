"""``celery -A proj singlebeat ...``: administration commands.

Registered as a Celery sub-command through the ``celery.commands`` entry point;
``python -m celery_singlebeat --url URL ...`` runs the same commands without a
Celery app. One module per command family; this one holds the group and what
they share. Nothing here imports Celery (nor do the command modules at import
time): ``python -m celery_singlebeat health`` must start without it, so every
command imports what it needs when it runs.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import click


class Target(NamedTuple):
    """The group's options: which database and tables (None: the app's)."""

    url: str | None
    table_prefix: str | None


#: where the group leaves its Target for the commands (click's Context.meta)
TARGET = "celery_singlebeat.target"


@click.group(name="singlebeat")
@click.option(
    "--url",
    default=None,
    metavar="URL",
    help="Database URL (default: the app's singlebeat_url); needed without `celery -A`.",
)
@click.option(
    "--table-prefix",
    default=None,
    metavar="PREFIX",
    help="Table prefix (default: the app's singlebeat_table_prefix, or singlebeat_).",
)
@click.pass_context
def singlebeat(ctx: click.Context, url: str | None, table_prefix: str | None) -> None:
    """celery-singlebeat administration: see and steer the replicas through
    their shared database."""
    ctx.meta[TARGET] = Target(url, table_prefix)


def _app_of(ctx: click.Context) -> Any:
    """The app named by ``celery -A``, or None.

    Without ``-A`` Celery still hands sub-commands its default app, whose
    settings are all defaults: creating tables for it would silently make a
    SQLite file in the working directory instead of the database meant.
    """
    if ctx.find_root().params.get("app") is None:
        return None
    return getattr(ctx.obj, "app", None)


def target_of(ctx: click.Context) -> Target:
    """The group's --url and --table-prefix."""
    found = ctx.meta.get(TARGET)
    return found if isinstance(found, Target) else Target(None, None)


# the commands register themselves on the group when imported
from . import controls, health, leases, prune, schema, status  # noqa: E402, F401
