"""``singlebeat create-schema``."""

from __future__ import annotations

import click

from ..exceptions import SingleBeatError
from .group import _app_of, singlebeat, target_of


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
    from ..store.admin import create_schema

    app = _app_of(ctx)
    # its own options, else the group's (python -m celery_singlebeat --url URL create-schema)
    group = target_of(ctx)
    url = url if url is not None else group.url
    table_prefix = table_prefix if table_prefix is not None else group.table_prefix
    if app is None and url is None:
        raise click.UsageError("pass --url, or run as `celery -A proj singlebeat create-schema`")
    try:
        shown = create_schema(url if app is None else app, url=url, table_prefix=table_prefix)
    except SingleBeatError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"celery-singlebeat schema ready in {shown}")
