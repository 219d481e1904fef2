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


@singlebeat.command(name="create-schema")
@click.option("--url", default=None, help="Database URL (default: the app's singlebeat_url).")
@click.option("--table-prefix", default=None, help="Table prefix (default: singlebeat_).")
@click.pass_context
def create_schema_command(ctx: click.Context, url: str | None, table_prefix: str | None) -> None:
    """Create the coordination tables (idempotent)."""
    from .schema_admin import create_schema

    target: Any = url
    if target is None:
        app = getattr(ctx.obj, "app", None)
        if app is None:
            raise click.UsageError("pass --url, or run as `celery -A proj singlebeat ...`")
        target = app
    try:
        shown = create_schema(target, table_prefix=table_prefix)
    except SingleBeatError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"celery-singlebeat schema ready in {shown}")
