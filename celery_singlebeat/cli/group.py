"""The ``singlebeat`` click group and what its commands share: the target
database (``--url``, ``--table-prefix``) and the Celery app of ``celery -A``.

Every command module imports its group from here and registers itself on it;
``cli/__init__.py`` only imports them all, so no command imports the package
that imports it. Nothing here imports Celery (``python -m celery_singlebeat
health`` must start without it).
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
