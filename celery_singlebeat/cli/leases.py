"""``singlebeat leases`` and ``release``: SingletonTask's keys."""

from __future__ import annotations

import sys

import click

from . import output
from .connect import operator_of
from .group import singlebeat
from .status import json_option, output_instant


@singlebeat.command(name="leases", short_help="SingletonTask keys and their holders.")
@json_option
@click.pass_context
def leases_command(ctx: click.Context, as_json: bool) -> None:
    """SingletonTask keys: who holds each, until when, under which token."""
    with operator_of(ctx) as operator:
        now = operator.now_us()
        leases = operator.leases(now_us=now)
        if as_json:
            output.emit_json(
                {**output_instant("now", now), "leases": [output.lease_json(x) for x in leases]}
            )
            return
        if not leases:
            click.echo("no singleton keys")
            return
        click.echo(
            output.table(
                ["KEY", "STATE", "HOLDER", "TOKEN", "EXPIRES", "ACQUIRED"],
                [
                    (
                        x.key,
                        output.state_cell(x.state),
                        x.holder,
                        str(x.token),
                        "-" if x.state == "released" else output.relative(x.expires_us, now),
                        output.relative(x.acquired_us, now),
                    )
                    for x in leases
                ],
            )
        )


@singlebeat.command(name="release", short_help="Free a SingletonTask key by hand.")
@click.argument("key")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@click.pass_context
def release_command(ctx: click.Context, key: str, yes: bool) -> None:
    """Free singleton KEY now, whoever holds it.

    For a holder that is stuck or gone: another execution may take the key at
    once. The running task is not stopped; its next renewal finds the lease
    lost, and its check()/guard() raise LeaseLost. Asks first, unless --yes."""
    with operator_of(ctx) as operator:
        now = operator.now_us()
        lease = operator.lease(key, now_us=now)
        if lease is None:
            operator.release_lease(key)  # refuses, naming the keys closest to it
            return
        if lease.state != "held":
            click.echo(f"singleton key {key!r} is not held ({lease.state}); nothing to release")
            return
        if not yes:
            if not sys.stdin.isatty():
                raise click.ClickException(
                    f"refusing to release {key!r} without confirmation: no terminal to ask "
                    "on; pass --yes"
                )
            click.confirm(
                f"Release singleton key {key!r}, held by {lease.holder} (token {lease.token}, "
                f"expires {output.relative(lease.expires_us, now)})? Its task keeps running "
                "until its next renewal finds the lease lost",
                abort=True,
            )
        if operator.release_lease(key):
            click.echo(f"released {key!r} (was held by {lease.holder}, token {lease.token})")
        else:
            click.echo(f"singleton key {key!r} was no longer held; nothing released")
