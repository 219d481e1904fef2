"""``celery -A proj singlebeat ...``: administration commands.

Registered as a Celery sub-command through the ``celery.commands`` entry point;
``python -m celery_singlebeat`` runs the same commands without a Celery app.
"""

from __future__ import annotations

from typing import Any

import click

from .exceptions import SingleBeatError


@click.group(name="singlebeat")
def singlebeat() -> None:
    """celery-singlebeat administration."""


def _app_of(ctx: click.Context) -> Any:
    """The app named by ``celery -A``, or None.

    Without ``-A`` Celery still hands sub-commands its default app, whose
    settings are all defaults: creating tables for it would silently make a
    SQLite file in the working directory instead of the database meant.
    """
    if ctx.find_root().params.get("app") is None:
        return None
    return getattr(ctx.obj, "app", None)


@singlebeat.command(name="create-schema")
@click.option(
    "--url",
    default=None,
    help="Database URL, e.g. a privileged user's (default: the app's singlebeat_url).",
)
@click.option(
    "--table-prefix",
    default=None,
    help="Table prefix (default: the app's singlebeat_table_prefix, or singlebeat_).",
)
@click.pass_context
def create_schema_command(ctx: click.Context, url: str | None, table_prefix: str | None) -> None:
    """Create the coordination tables (idempotent)."""
    from .schema_admin import create_schema

    app = _app_of(ctx)
    if app is None and url is None:
        raise click.UsageError("pass --url, or run as `celery -A proj singlebeat create-schema`")
    try:
        shown = create_schema(url if app is None else app, url=url, table_prefix=table_prefix)
    except SingleBeatError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"celery-singlebeat schema ready in {shown}")
