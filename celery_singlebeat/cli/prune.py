"""``singlebeat prune``: the periodic prune, at once."""

from __future__ import annotations

import click

from .connect import operator_of, settings_of
from .durations import Duration
from .group import singlebeat
from .output import span


@singlebeat.command(name="prune", short_help="Delete old rows now.")
@click.option(
    "--retention",
    type=Duration(),
    default=None,
    help="Keep sent slot rows (and gone replicas' rows) this long "
    "(default: singlebeat_retention, 15m).",
)
@click.option(
    "--run-retention",
    type=Duration(),
    default=None,
    help="Keep SingletonTask run and idle key rows this long "
    "(default: singlebeat_run_retention, 7d).",
)
@click.pass_context
def prune_command(ctx: click.Context, retention: int | None, run_retention: int | None) -> None:
    """Delete old rows now, as the replicas' and workers' periodic prunes do.

    Sent slot rows older than the retention (each entry's high-water mark is
    raised first, so a deleted slot is never sent again), SingletonTask rows
    older than the run retention, replicas stopped or unseen for longer than
    the retention, the catalogs no replica names any more, and run-now
    requests whose slot row is gone. The retentions are checked as the settings are."""
    overrides = {}
    if retention is not None:
        overrides["singlebeat_retention"] = retention / 1_000_000
    if run_retention is not None:
        overrides["singlebeat_run_retention"] = run_retention / 1_000_000
    settings = settings_of(ctx, **overrides)
    with operator_of(ctx, **overrides) as operator:
        report = operator.prune(settings.retention_us, settings.run_retention_us)
    click.echo(
        f"pruned {report.slots:,} slot row(s) sent more than {span(settings.retention_us)} ago, "
        f"{report.singleton_rows:,} SingletonTask row(s) older than "
        f"{span(settings.run_retention_us)}, {report.fleet.replicas:,} replica row(s) gone "
        f"longer than {span(settings.retention_us)}, {report.fleet.catalog:,} catalog row(s) "
        f"no replica names, {report.fleet.requests:,} run-now request(s) of pruned slots"
    )
