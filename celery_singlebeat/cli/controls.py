"""``singlebeat pause``, ``resume`` and ``run``: steering the fleet.

Each is one transaction in the shared database (``store/sql/operator.py``),
which the replicas notice at their next heartbeat (at once on PostgreSQL,
which notifies them).
"""

from __future__ import annotations

import click

from ..store.author import default_author
from ..timeline.clock import slot_text
from . import output
from .connect import operator_of
from .durations import InstantOrDuration, When
from .group import singlebeat
from .status import json_option

by_option = click.option(
    "--by", default=None, metavar="WHO", help="Who asks, as recorded (default: user@host)."
)
reason_option = click.option(
    "--reason", default="", metavar="TEXT", help="Why, as recorded and shown by status."
)


def _entries_or_all(entries: tuple[str, ...], every: bool, verb: str) -> None:
    if every and entries:
        raise click.UsageError(f"{verb} either ENTRY... or --all, not both")
    if not every and not entries:
        raise click.UsageError(f"name the entries to {verb}, or pass --all")


@singlebeat.command(name="pause", short_help="Stop sending entries (or all) for a while.")
@click.argument("entries", nargs=-1)
@click.option("--all", "every", is_flag=True, help="Pause every entry (the pause '*').")
@click.option(
    "--until",
    type=InstantOrDuration(),
    default=None,
    help="End the pause by itself: a duration from now (30m) or an instant "
    "(2026-03-01T12:00Z). Default: until resumed.",
)
@reason_option
@by_option
@json_option
@click.pass_context
def pause_command(
    ctx: click.Context,
    entries: tuple[str, ...],
    every: bool,
    until: When | None,
    reason: str,
    by: str | None,
    as_json: bool,
) -> None:
    """Stop sending ENTRY... (or every entry) until resumed or --until.

    A paused entry's slots are not claimed; a slot already in flight is not
    recalled. Every entry named must be in the catalog of a live replica."""
    from ..store.base import PAUSE_ALL

    _entries_or_all(entries, every, "pause")
    names = [PAUSE_ALL] if every else list(entries)
    with operator_of(ctx) as operator:
        result = operator.pause(
            names,
            None if until is None or until.relative else until.value_us,
            by or default_author(),
            reason,
            for_us=until.value_us if until is not None and until.relative else None,
        )
        if as_json:
            output.emit_json(
                {
                    "paused": [output.pause_json(p) for p in result.pauses],
                    "controls_version": result.controls_version,
                }
            )
            return
        for pause in result.pauses:
            what = "every entry ('*')" if pause.entry == PAUSE_ALL else repr(pause.entry)
            until_text = (
                "until resumed"
                if pause.until_us is None
                else f"until {slot_text(pause.until_us)} "
                f"({output.relative(pause.until_us, pause.at_us)})"
            )
            click.echo(f"paused {what} {until_text}")


@singlebeat.command(name="resume", short_help="Lift pauses.")
@click.argument("entries", nargs=-1)
@click.option("--all", "every", is_flag=True, help="Lift every pause, '*' included.")
@json_option
@click.pass_context
def resume_command(
    ctx: click.Context, entries: tuple[str, ...], every: bool, as_json: bool
) -> None:
    """Lift the pause of ENTRY... (or every pause).

    An entry stays paused while the pause of every entry ('*') is in force;
    `resume '*'` or `resume --all` lifts that one."""
    _entries_or_all(entries, every, "resume")
    with operator_of(ctx) as operator:
        result = operator.resume(None if every else list(entries))
        if as_json:
            output.emit_json(
                {
                    "resumed": result.resumed,
                    "not_paused": result.not_paused,
                    "still_paused_by": output.pause_json(result.still_paused_by),
                    "controls_version": result.controls_version,
                }
            )
            return
        if every:
            click.echo(
                f"lifted {len(result.resumed)} pause(s)"
                + (f": {', '.join(result.resumed)}" if result.resumed else "")
            )
            return
        for name in result.resumed:
            click.echo(f"resumed {name!r}")
        for name in result.not_paused:
            click.echo(f"{name!r} was not paused")
        held = result.still_paused_by
        if held is not None:
            click.echo(
                f"still paused: {output.pause_words(held, result.now_us)} "
                "(resume --all, or resume '*', lifts that pause)"
            )


@singlebeat.command(name="run", short_help="Send an entry once, now.")
@click.argument("entry")
@reason_option
@by_option
@json_option
@click.pass_context
def run_command(ctx: click.Context, entry: str, reason: str, by: str | None, as_json: bool) -> None:
    """Send ENTRY once, now, besides its schedule.

    A replica that has the entry sends it at its next sweep (within a third of
    singlebeat_lease), with the entry's task, arguments and options, under the
    task id printed here. Refused while the entry is paused."""
    with operator_of(ctx) as operator:
        result = operator.run_now(entry, by or default_author(), reason)
        if as_json:
            output.emit_json(
                {
                    "entry": result.entry,
                    "slot": output.iso(result.slot_us),
                    "slot_us": result.slot_us,
                    "task_id": result.task_id,
                    "requested_by": result.requested_by,
                    "reason": result.reason,
                    "requested": output.iso(result.requested_us),
                    "requested_us": result.requested_us,
                    "controls_version": result.controls_version,
                }
            )
            return
        click.echo(
            f"requested a run of {result.entry!r}: slot {slot_text(result.slot_us)}, "
            f"task id {result.task_id}; a replica that has it sends it at its next sweep"
        )
