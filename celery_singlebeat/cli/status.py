"""``singlebeat status``, ``history`` and ``replicas``: what the fleet is doing."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

from ..timeline.clock import slot_text
from . import output
from .connect import operator_of
from .durations import InstantOrDuration, When
from .group import _app_of, singlebeat

if TYPE_CHECKING:
    from datetime import datetime

    from ..store.sql.operator import Operator
    from ..store.sql.operator_results import EntryStatus, ReplicaStatus

#: entries a human status shows unless told otherwise (JSON shows all)
STATUS_ROWS = 50

json_option = click.option(
    "--json", "as_json", is_flag=True, help="One JSON document on stdout (docs/cli.md)."
)


@singlebeat.command(name="status", short_help="Entries next due, replicas, pauses.")
@click.option(
    "--limit",
    type=click.IntRange(min=1),
    default=None,
    help=f"Entries to show, next due first (default {STATUS_ROWS}; with --json: all).",
)
@click.option("--all", "show_all", is_flag=True, help="Show every entry.")
@json_option
@click.pass_context
def status_command(ctx: click.Context, limit: int | None, show_all: bool, as_json: bool) -> None:
    """Every entry (next due first), the replicas and the pauses."""
    with operator_of(ctx) as operator:
        status = operator.status()
        entries = with_stored(
            status.entries, operator, status.now_us, _app_of(ctx), len(_live(status.replicas))
        )
        if as_json:
            shown = entries if show_all or limit is None else entries[:limit]
            output.emit_json(
                {
                    **output_instant("now", status.now_us),
                    "summary": _summary(entries, status.replicas, len(status.pauses)),
                    "entries": [output.entry_json(e) for e in shown],
                    "replicas": [output.replica_json(r) for r in status.replicas],
                    "pauses": [output.pause_json(p) for p in status.pauses],
                }
            )
            return
        now = status.now_us
        summary = _summary(entries, status.replicas, len(status.pauses))
        click.echo(
            f"{slot_text(now)} (database clock): "
            f"{summary['replicas_live']} replica(s) live, {summary['replicas_lost']} lost, "
            f"{summary['replicas_stopped']} stopped; {summary['entries']:,} entries, "
            f"{summary['overdue']} overdue, {summary['paused']} paused"
        )
        if summary["lost_writes"]:
            by = ", ".join(f"{r.id} {r.lost_writes:,}" for r in status.replicas if r.lost_writes)
            click.echo(
                output.paint(
                    f"the database lost {summary['lost_writes']:,} sent slot(s) of these "
                    f"replicas after a broken connection ({by}): a failover to a lagging "
                    "standby? They were written again (docs/guarantees.md, Database failover)",
                    "red",
                )
            )
        if not entries:
            click.echo("no entries registered yet")
        else:
            count = len(entries) if show_all else (limit or STATUS_ROWS)
            click.echo()
            click.echo(_entries_table(entries[:count], len(_live(status.replicas)), now))
            if count < len(entries):
                click.echo(
                    f"{count:,} of {len(entries):,} entries shown (next due first); "
                    "--limit N or --all shows more, --json gives every entry"
                )
        click.echo()
        click.echo(_replicas_table(status.replicas, now) if status.replicas else "no replicas")
        if status.pauses:
            click.echo()
            click.echo(
                output.table(
                    ["PAUSED", "BY", "SINCE", "UNTIL", "REASON"],
                    [
                        (
                            ("every entry (*)", "yellow")
                            if p.entry == "*"
                            else (p.entry, "yellow"),
                            p.by,
                            output.relative(p.at_us, now),
                            "until resumed"
                            if p.until_us is None
                            else output.relative(p.until_us, now),
                            p.reason,
                        )
                        for p in status.pauses
                    ],
                )
            )


def with_stored(
    entries: list[EntryStatus], operator: Operator, now_us: int, app: Any, live: int
) -> list[EntryStatus]:
    """``entries`` with the stored entries' task, schedule and next slot, which
    no catalog lists (every replica reads them from their table): the next
    slot as the replicas compute it (``next_runs``), overdue as for the others
    when the first slot after the last claimed one fell due more than
    ``DUE_SLACK_US`` ago, unpaused. Re-sorted next due first."""
    from datetime import timezone

    from ..schedules.columns import entry_from_fields
    from ..schedules.document import schedule_text
    from ..schedules.runs import next_runs
    from ..store.sql.operator_results import DUE_SLACK_US
    from ..timeline.clock import us_to_datetime

    rows, _ = operator.store.schedule_rows()
    if not rows:
        return entries
    stored = {row.name: row for row in rows}
    tz = app.timezone if app is not None else timezone.utc
    out: list[EntryStatus] = []
    for status in entries:
        row = stored.get(status.name)
        if row is None or status.task is not None:
            out.append(status)
            continue
        entry = entry_from_fields(row._asdict())
        text = schedule_text(entry) + ("" if entry.enabled else " (disabled)")
        after_us = status.last_slot_us if status.last_slot_us is not None else now_us
        first_us = _next_us(next_runs(entry, 1, now=us_to_datetime(after_us), tz=tz))
        overdue_us = None
        next_us = first_us
        if first_us is not None and first_us < now_us - DUE_SLACK_US:
            overdue_us = None if status.pause is not None or not entry.enabled else first_us
            next_us = _next_us(next_runs(entry, 1, now=us_to_datetime(now_us), tz=tz))
        out.append(
            status._replace(
                task=entry.task,
                schedule=text,
                # every live replica that follows the stored schedules has it
                replicas=live if entry.enabled else 0,
                next_slot_us=next_us if entry.enabled else None,
                overdue_slot_us=overdue_us,
                next_known=True,
            )
        )
    # as Operator.status sorts: by name, then (stable) overdue by the slot they
    # missed, the others by their next slot, unknown last
    out.sort(key=lambda e: e.name)
    out.sort(key=_due)
    return out


def _next_us(runs: list[datetime]) -> int | None:
    from ..timeline.clock import datetime_to_us

    return datetime_to_us(runs[0]) if runs else None


def _due(entry: EntryStatus) -> tuple[bool, int]:
    due = entry.overdue_slot_us if entry.overdue_slot_us is not None else entry.next_slot_us
    return (due is None, due or 0)


def output_instant(name: str, instant_us: int) -> dict[str, Any]:
    return {name: output.iso(instant_us), f"{name}_us": instant_us}


def _live(replicas: list[ReplicaStatus]) -> list[ReplicaStatus]:
    return [r for r in replicas if r.state == "live"]


def _summary(
    entries: list[EntryStatus], replicas: list[ReplicaStatus], pauses: int
) -> dict[str, int]:
    states = [r.state for r in replicas]
    return {
        "entries": len(entries),
        "overdue": sum(e.overdue_slot_us is not None for e in entries),
        "paused": sum(e.pause is not None for e in entries),
        "pauses": pauses,
        "replicas_live": states.count("live"),
        "replicas_lost": states.count("lost"),
        "replicas_stopped": states.count("stopped"),
        # slots the replicas wrote again after a failover lost them (failover.py)
        "lost_writes": sum(r.lost_writes for r in replicas),
    }


def _next_cell(entry: EntryStatus, now: int) -> output.Cell:
    if entry.overdue_slot_us is not None:
        return (f"overdue {output.span(now - entry.overdue_slot_us)}", "red")
    if entry.next_slot_us is not None and entry.next_slot_us <= now:
        # due within DUE_SLACK_US: a replica is claiming it, or about to
        return ("due now", "cyan")
    if entry.next_slot_us is not None:
        return output.relative(entry.next_slot_us, now)
    return "only replicas know" if entry.task is not None and not entry.next_known else "-"


def _notes(entry: EntryStatus, live: int, now: int) -> output.Cell:
    notes = []
    colour = ""
    if entry.pause is not None:
        notes.append(output.pause_words(entry.pause, now))
        colour = "yellow"
    if entry.task is None:
        notes.append("in no replica's catalog")
    elif entry.replicas == 0:
        notes.append("no live replica has it")
        colour = "red"
    if entry.last_state == "abandoned":
        notes.append("last slot abandoned (lease ran out unsent)")
        colour = "red"
    return ("; ".join(notes), colour)


def _entries_table(entries: list[EntryStatus], live: int, now: int) -> str:
    return output.table(
        ["ENTRY", "TASK", "SCHEDULE", "NEXT", "LAST", "LAST SENT BY", "DELAY", "REPLICAS", "NOTES"],
        [
            (
                e.name,
                e.task or "-",
                e.schedule or "-",
                _next_cell(e, now),
                output.relative(e.last_slot_us, now),
                e.last_sender or "-",
                "-" if e.last_delay_us is None else output.span(e.last_delay_us),
                f"{e.replicas}/{live}",
                _notes(e, live, now),
            )
            for e in entries
        ],
    )


def _replica_state(replica: ReplicaStatus, now: int) -> output.Cell:
    if replica.state == "lost":
        return (f"lost (not seen since {slot_text(replica.seen_us)})", "red")
    if replica.state == "stopped" and replica.stopped_us is not None:
        return f"stopped {output.relative(replica.stopped_us, now)}"
    return output.state_cell(replica.state)


def _replicas_table(replicas: list[ReplicaStatus], now: int) -> str:
    return output.table(
        [
            "REPLICA",
            "HOST",
            "PID",
            "VERSION",
            "STATE",
            "STARTED",
            "SEEN",
            "LAST LOOP",
            "CLOCK OFFSET",
            "TRACKED",
            "PROPOSES FIRST",
        ],
        [
            (
                r.id,
                r.host,
                str(r.pid),
                r.version,
                _replica_state(r, now),
                output.relative(r.started_us, now),
                output.relative(r.seen_us, now),
                output.relative(r.loop_us, now),
                f"{'+' if r.offset_us >= 0 else '-'}{output.span(r.offset_us)}",
                f"{r.tracked:,}",
                "-" if r.share is None else f"{r.proposes_first:,} ({r.share:.0%})",
            )
            for r in replicas
        ],
    )


@singlebeat.command(name="replicas", short_help="The beat processes and their state.")
@json_option
@click.pass_context
def replicas_command(ctx: click.Context, as_json: bool) -> None:
    """The beat processes: live, stopped (graceful), or lost (not seen lately)."""
    with operator_of(ctx) as operator:
        now = operator.now_us()
        replicas = operator.replicas(now_us=now)
        if as_json:
            output.emit_json(
                {
                    **output_instant("now", now),
                    "replicas": [output.replica_json(r) for r in replicas],
                }
            )
            return
        click.echo(_replicas_table(replicas, now) if replicas else "no replicas")


@singlebeat.command(name="history", short_help="Slot rows, newest first.")
@click.argument("entry", required=False)
@click.option(
    "--since",
    type=InstantOrDuration(),
    default=None,
    help="Only slots at or after this instant, or this long ago (15m, 2h, 2026-03-01T12:00Z).",
)
@click.option(
    "--limit", type=click.IntRange(min=1), default=50, show_default=True, help="Rows at most."
)
@json_option
@click.pass_context
def history_command(
    ctx: click.Context, entry: str | None, since: When | None, limit: int, as_json: bool
) -> None:
    """Slot rows, newest first: who claimed, who sent, how late, who asked.

    Only what the database keeps: sent rows for singlebeat_retention, claimed
    rows until they are sent. A row keeps its last owner only."""
    with operator_of(ctx) as operator:
        now = operator.now_us()
        since_us = None
        if since is not None:
            since_us = now - since.value_us if since.relative else since.value_us
        rows = operator.history(entry, since_us=since_us, limit=limit, now_us=now)
        if as_json:
            output.emit_json(
                {**output_instant("now", now), "slots": [output.history_json(r) for r in rows]}
            )
            return
        if not rows:
            click.echo(f"no slot rows{f' of {entry!r}' if entry else ''}")
            return
        click.echo(
            output.table(
                ["SLOT", "ENTRY", "STATE", "BY", "FENCE", "DELAY", "TASK ID", "REQUESTED BY"],
                [
                    (
                        slot_text(r.slot_us),
                        r.entry,
                        output.state_cell(r.state),
                        r.sender or r.holder or "-",
                        str(r.fence),
                        "-" if r.delay_us is None else output.span(r.delay_us),
                        r.task_id,
                        "-"
                        if r.requested_by is None
                        else r.requested_by
                        + (f" ({r.request_reason})" if r.request_reason else ""),
                    )
                    for r in rows
                ],
            )
        )
        if len(rows) == limit:
            click.echo(f"{limit} newest rows shown; --limit N or --since shows others")
