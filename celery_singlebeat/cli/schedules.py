"""``singlebeat schedules ...``: the stored entries from the command line.

``list``, ``show``, ``add``, ``edit``, ``enable``, ``disable``, ``rm``,
``log``, ``export`` and ``import``, each through
:class:`~celery_singlebeat.schedules.api.Schedules` (one transaction per
command). Every replica follows a change within about a second of its commit.

Input that does not fit (an invalid field, an unknown name, a stale
``--if-revision``, a bad import file) is ``Error: ...`` naming the entry and
the field, exit status 2, and changes nothing; a database that cannot be
reached is status 1. Reads take ``--json``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from ..timeline.clock import slot_text
from . import output
from .connect import Refused, store_of
from .group import _app_of, singlebeat
from .status import json_option

if TYPE_CHECKING:
    from ..schedules.api import Schedules
    from ..schedules.entry import StoredEntry


@contextmanager
def schedules_of(ctx: click.Context, by: str | None = None) -> Iterator[Schedules]:
    """The stored entries of the command's database (its tables created when
    missing and ``singlebeat_create_schema`` allows), knowing the app's
    ``beat_schedule`` names, which a stored entry may not take."""
    from ..schedules.api import Schedules

    app = _app_of(ctx)
    static = list((app.conf.beat_schedule or {}) if app is not None else {})
    with store_of(ctx) as (store, settings):
        store.prepare(settings.create_schema)
        schedules = Schedules(store=store, by=by, static_names=static)
        schedules.default_tz = None if app is None else app.timezone
        yield schedules


def _json_arg(value: str | None, option: str) -> Any:
    if value is None:
        return None
    try:
        return json.loads(value)
    except ValueError as exc:
        raise click.BadParameter(f"not JSON: {exc}", param_hint=option) from None


def _schedule_of(
    every: float | None, cron: str | None, tz: str | None, at: str | None
) -> dict[str, Any] | None:
    """The schedule the options give, in the data form of docs/schedules.md."""
    given = [o for o, v in (("--every", every), ("--crontab", cron), ("--at", at)) if v is not None]
    if len(given) > 1:
        raise click.UsageError(f"give one schedule, not {' and '.join(given)}")
    if tz is not None and cron is None:
        raise click.UsageError("--tz goes with --crontab")
    if every is not None:
        return {"every": every}
    if cron is not None:
        return {"crontab": cron, "tz": tz}
    if at is not None:
        return {"at": at}
    return None


def _fields(
    *,
    args: str | None,
    kwargs: str | None,
    times: int | None,
    jitter: float | None,
    start: str | None,
    end: str | None,
    description: str | None,
) -> dict[str, Any]:
    """The entry fields the options set (None: not given)."""
    from ..timeline.clock import parse_instant

    fields: dict[str, Any] = {}
    if args is not None:
        fields["args"] = _json_arg(args, "--args")
    if kwargs is not None:
        fields["kwargs"] = _json_arg(kwargs, "--kwargs")
    if times is not None:
        fields["max_runs"] = times
    if jitter is not None:
        from datetime import timedelta

        fields["jitter"] = timedelta(seconds=jitter)
    for key, value in (("start", start), ("end", end)):
        if value is not None:
            try:
                fields[key] = parse_instant(value)
            except ValueError as exc:
                raise click.BadParameter(str(exc), param_hint=f"--{key}") from None
    if description is not None:
        fields["description"] = description
    return fields


def entry_field_options(f: Any) -> Any:
    """The options that set a stored entry's fields (add, edit, show's preview)."""
    options = [
        click.option("--task", default=None, metavar="TASK", help="The task's registered name."),
        click.option("--every", type=float, default=None, metavar="SECONDS", help="An interval."),
        click.option(
            "--crontab", "cron", default=None, metavar='"m h dom mon dow"', help="A crontab."
        ),
        click.option("--tz", default=None, metavar="ZONE", help="The crontab's time zone."),
        click.option("--at", default=None, metavar="ISO-INSTANT", help="One run at an instant."),
        click.option("--args", default=None, metavar="JSON", help="Positional arguments."),
        click.option("--kwargs", default=None, metavar="JSON", help="Keyword arguments."),
        click.option("--queue", default=None, metavar="Q", help="The queue to send to."),
        click.option(
            "--times", type=click.IntRange(min=1), default=None, metavar="N", help="At most N runs."
        ),
        click.option(
            "--jitter",
            type=float,
            default=None,
            metavar="SECONDS",
            help="A fixed offset per slot, up to this long, the same on every replica.",
        ),
        click.option("--start", default=None, metavar="ISO-INSTANT", help="No run before."),
        click.option("--end", default=None, metavar="ISO-INSTANT", help="No run after."),
        click.option("--description", default=None, metavar="TEXT", help="What it is for."),
    ]
    for option in reversed(options):
        f = option(f)
    return f


why_option = click.option("--why", default="", metavar="TEXT", help="Why, as the history records.")
by_option = click.option(
    "--by", default=None, metavar="WHO", help="Who, as the history records (default: user@host)."
)
revision_option = click.option(
    "--if-revision",
    "if_revision",
    type=int,
    default=None,
    metavar="R",
    help="Only if the entry is still at revision R (else exit 2, nothing changed).",
)


@singlebeat.group(name="schedules", short_help="The entries stored in the database.")
def schedules_group() -> None:
    """Add, edit, enable, disable, remove, list and export the entries stored
    in the database; every replica follows a change within a second."""


# -- reading ------------------------------------------------------------------


def _when(instant: datetime | None) -> str:
    return (
        "-" if instant is None else instant.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%SZ")
    )


def _entry_json(entry: StoredEntry, runs: list[datetime] | None = None) -> dict[str, Any]:
    from ..schedules.document import DOCUMENT_DEFAULTS, entry_to_document

    # every key, defaults included: a script reads one shape whatever the entry
    doc: dict[str, Any] = {"name": entry.name, **DOCUMENT_DEFAULTS, **entry_to_document(entry)}
    doc.update(
        revision=entry.revision,
        created=None if entry.created is None else entry.created.isoformat(),
        updated=None if entry.updated is None else entry.updated.isoformat(),
        created_by=entry.created_by,
        updated_by=entry.updated_by,
        managed_by=entry.managed_by,
    )
    if runs is not None:
        doc["next_runs"] = [r.isoformat() for r in runs]
        # an entry whose runs are all behind it: its single run, its N runs, its end
        doc["done"] = entry.enabled and not runs
    return doc


@schedules_group.command(name="list")
@click.option("--enabled/--disabled", "enabled", default=None, help="Only those enabled, or not.")
@click.option("--managed-by", default=None, metavar="LABEL", help="Only those a file manages.")
@json_option
@click.pass_context
def list_command(
    ctx: click.Context, enabled: bool | None, managed_by: str | None, as_json: bool
) -> None:
    """The stored entries, by name, with their next run."""
    from ..schedules.document import schedule_text

    with schedules_of(ctx) as schedules:
        entries = schedules.list(enabled=enabled, managed_by=managed_by)
        runs = {e.name: schedules.next_runs(e, 1) for e in entries}
    if as_json:
        output.emit_json({"entries": [_entry_json(e, runs[e.name]) for e in entries]})
        return
    if not entries:
        click.echo("no stored entries")
        return
    rows = [
        (
            e.name,
            e.task,
            schedule_text(e),
            "yes" if e.enabled else "no",
            _when(runs[e.name][0]) if runs[e.name] else ("done" if e.enabled else "-"),
            str(e.revision),
            e.updated_by,
        )
        for e in entries
    ]
    click.echo(
        output.table(("NAME", "TASK", "SCHEDULE", "ENABLED", "NEXT", "REVISION", "BY"), rows)
    )


@schedules_group.command(name="show")
@click.argument("name")
@click.option(
    "--next",
    "count",
    type=click.IntRange(min=0),
    default=5,
    metavar="N",
    help="How many next runs to list.",
)
@entry_field_options
@json_option
@click.pass_context
def show_command(ctx: click.Context, /, name: str, count: int, as_json: bool, **given: Any) -> None:
    """One entry and its next N runs: stored, of the app's beat_schedule, or a
    definition not saved yet (pass its options: nothing is written)."""
    from ..exceptions import ScheduleNotFound

    preview = _preview(name, given)
    with schedules_of(ctx) as schedules:
        if preview is not None:
            entry = preview
        else:
            try:
                entry = schedules.get(name)
            except ScheduleNotFound:
                _show_static(ctx, schedules, name, count, as_json)
                return
        runs = schedules.next_runs(entry, count)
    if as_json:
        output.emit_json(_entry_json(entry, runs))
        return
    doc = _entry_json(entry)
    width = max(len(k) for k in doc)
    for key, value in doc.items():
        shown = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
        click.echo(f"{key:<{width}}  {shown}")
    click.echo(f"next {len(runs)} runs:" if runs else "no next run")
    for run in runs:
        click.echo(f"  {_when(run)}")


def _preview(name: str, given: dict[str, Any]) -> StoredEntry | None:
    schedule = _schedule_of(given["every"], given["cron"], given["tz"], given["at"])
    if schedule is None and given["task"] is None:
        return None
    if schedule is None or given["task"] is None:
        raise click.UsageError("a preview needs --task and a schedule (--every, --crontab, --at)")
    from ..schedules.entry import stored_entry

    fields = _fields(
        **{
            k: given[k]
            for k in ("args", "kwargs", "times", "jitter", "start", "end", "description")
        }
    )
    return stored_entry(name, given["task"], schedule, queue=given["queue"], **fields)


def _show_static(
    ctx: click.Context, schedules: Schedules, name: str, count: int, as_json: bool
) -> None:
    from ..exceptions import ScheduleNotFound
    from ..store.sql.operator import Operator
    from ..timeline.clock import us_to_datetime

    app = _app_of(ctx)
    static = (app.conf.beat_schedule or {}) if app is not None else {}
    if name not in static:
        raise ScheduleNotFound(name)
    from celery.beat import ScheduleEntry

    entry = ScheduleEntry(name=name, app=app, **static[name])
    # an interval's grid is the fleet's: its next slot is on it
    anchor = None
    status = {e.name: e for e in Operator(schedules.store).status().entries}  # type: ignore[arg-type]
    next_slot_us = status[name].next_slot_us if name in status else None
    if next_slot_us is not None:
        anchor = us_to_datetime(next_slot_us)
    runs = schedules.next_runs(entry.schedule, count, anchor=anchor)
    if as_json:
        output.emit_json(
            {
                "name": name,
                "task": entry.task,
                "source": "beat_schedule",
                "next_runs": [r.isoformat() for r in runs],
            }
        )
        return
    click.echo(f"name    {name}\ntask    {entry.task}\nsource  beat_schedule (edit it in code)")
    click.echo(f"next {len(runs)} runs:" if runs else "no next run")
    for run in runs:
        click.echo(f"  {_when(run)}")


@schedules_group.command(name="log")
@click.argument("name", required=False)
@click.option("--limit", type=click.IntRange(min=1), default=50, metavar="N")
@json_option
@click.pass_context
def log_command(ctx: click.Context, name: str | None, limit: int, as_json: bool) -> None:
    """The history of changes (of NAME, or of every entry), newest first.
    Arguments are shown by digest only: they may carry secrets."""
    with schedules_of(ctx) as schedules:
        rows = schedules.log(name, limit)
    if as_json:
        output.emit_json(
            {
                "changes": [
                    {
                        "revision": r.revision,
                        "name": r.name,
                        "action": r.action,
                        "by": r.by,
                        "why": r.why,
                        "at": output.iso(r.at_us),
                        "changes": json.loads(r.changes or "{}"),
                    }
                    for r in rows
                ]
            }
        )
        return
    if not rows:
        click.echo("no changes recorded")
        return
    for r in rows:
        click.echo(
            f"r{r.revision}  {slot_text(r.at_us)}  {r.action} {r.name!r} by {r.by}"
            + (f": {r.why}" if r.why else "")
        )
        for field, (old, new) in sorted(json.loads(r.changes or "{}").items()):
            click.echo(f"    {field}: {json.dumps(old)} -> {json.dumps(new)}")


# -- writing ------------------------------------------------------------------


@schedules_group.command(name="add")
@click.argument("name")
@entry_field_options
@click.option("--disabled", is_flag=True, help="Store it without sending it yet.")
@click.option("--replace", is_flag=True, help="Replace an entry of that name (else exit 2).")
@why_option
@by_option
@json_option
@click.pass_context
def add_command(
    ctx: click.Context,
    /,
    name: str,
    disabled: bool,
    replace: bool,
    why: str,
    by: str | None,
    as_json: bool,
    **given: Any,
) -> None:
    """Store a new entry NAME: --task and one of --every, --crontab, --at."""
    if given["task"] is None:
        raise click.UsageError("add needs --task")
    schedule = _schedule_of(given["every"], given["cron"], given["tz"], given["at"])
    if schedule is None:
        raise click.UsageError("add needs a schedule: --every, --crontab or --at")
    from ..schedules.entry import stored_entry

    with schedules_of(ctx, by) as schedules:
        fields = _fields(
            **{
                k: given[k]
                for k in ("args", "kwargs", "times", "jitter", "start", "end", "description")
            }
        )
        entry = stored_entry(
            name, given["task"], schedule, queue=given["queue"], enabled=not disabled, **fields
        )
        saved = schedules.upsert(entry, if_exists="replace" if replace else "error", why=why)
    _report(saved, "stored", as_json)


@schedules_group.command(name="edit")
@click.argument("name")
@entry_field_options
@revision_option
@why_option
@by_option
@json_option
@click.pass_context
def edit_command(
    ctx: click.Context,
    /,
    name: str,
    if_revision: int | None,
    why: str,
    by: str | None,
    as_json: bool,
    **given: Any,
) -> None:
    """Change the fields the options give; the others stay."""
    fields = _fields(
        **{
            k: given[k]
            for k in ("args", "kwargs", "times", "jitter", "start", "end", "description")
        }
    )
    schedule = _schedule_of(given["every"], given["cron"], given["tz"], given["at"])
    if schedule is not None:
        fields["schedule"] = schedule
    if given["task"] is not None:
        fields["task"] = given["task"]
    with schedules_of(ctx, by) as schedules:
        if given["queue"] is not None:
            fields["options"] = {**schedules.get(name).options, "queue": given["queue"]}
        if not fields:
            raise click.UsageError("nothing to change: give at least one option")
        saved = schedules.update(name, if_revision=if_revision, why=why, **fields)
    _report(saved, "changed", as_json)


def change_options(f: Any) -> Any:
    """The options of a change to one stored entry by name (enable, disable,
    rm): the guard revision, why, by whom, and ``--json``."""
    for option in (click.pass_context, json_option, by_option, why_option, revision_option):
        f = option(f)
    return click.argument("name")(f)


def _toggle(ctx: click.Context, name: str, on: bool, change: dict[str, Any]) -> None:
    with schedules_of(ctx, change["by"]) as schedules:
        saved = (schedules.enable if on else schedules.disable)(
            name, if_revision=change["if_revision"], why=change["why"]
        )
    _report(saved, "enabled" if on else "disabled", change["as_json"])


@schedules_group.command(name="enable")
@change_options
def enable_command(ctx: click.Context, /, name: str, **change: Any) -> None:
    """Send NAME again from its next run (the disabled span is not caught up)."""
    _toggle(ctx, name, True, change)


@schedules_group.command(name="disable")
@change_options
def disable_command(ctx: click.Context, /, name: str, **change: Any) -> None:
    """Stop sending NAME from the replicas' next tick; it stays stored."""
    _toggle(ctx, name, False, change)


@schedules_group.command(name="rm")
@change_options
def rm_command(ctx: click.Context, /, name: str, **change: Any) -> None:
    """Remove NAME (its history stays)."""
    with schedules_of(ctx, change["by"]) as schedules:
        schedules.delete(name, if_revision=change["if_revision"], why=change["why"])
    if change["as_json"]:
        output.emit_json({"removed": name})
    else:
        click.echo(f"removed {name!r}")


def _report(entry: StoredEntry, verb: str, as_json: bool) -> None:
    if as_json:
        output.emit_json(_entry_json(entry))
    else:
        click.echo(f"{verb} {entry.name!r} at revision {entry.revision}")


# -- files ----------------------------------------------------------------------


@schedules_group.command(name="export")
@click.argument("file", type=click.Path(dir_okay=False, allow_dash=True))
@click.option("--managed-by", default=None, metavar="LABEL", help="Only those a file manages.")
@click.pass_context
def export_command(ctx: click.Context, file: str, managed_by: str | None) -> None:
    """Write the stored entries to FILE (YAML for .yaml/.yml, else JSON; - for
    standard output), to keep the schedule in git."""
    from ..schedules.files import dump

    with schedules_of(ctx) as schedules:
        entries = schedules.list(managed_by=managed_by)
    text = dump(entries, None if file == "-" else file)
    if file == "-":
        click.echo(text, nl=False)
        return
    Path(file).write_text(text, encoding="utf-8")
    click.echo(f"exported {len(entries)} entries to {file}", err=True)


@schedules_group.command(name="import")
@click.argument("file", type=click.Path(exists=True, dir_okay=False))
@click.option(
    "--prune", is_flag=True, help="Remove the stored entries this file manages and no longer has."
)
@click.option("--dry-run", is_flag=True, help="Print what would change; write nothing.")
@click.option(
    "--as",
    "label",
    default=None,
    metavar="LABEL",
    help="The file's label in managed_by (default: its file name).",
)
@why_option
@by_option
@click.pass_context
def import_command(
    ctx: click.Context,
    file: str,
    prune: bool,
    dry_run: bool,
    label: str | None,
    why: str,
    by: str | None,
) -> None:
    """Make the stored entries what FILE says, in one transaction (all or
    nothing); --dry-run prints the plan as a diff."""
    from ..schedules.files import FileError, describe, parse, plan

    label = label or Path(file).name
    try:
        # read and checked whole before the database is opened
        wanted = parse(Path(file).read_text(encoding="utf-8"), file, label)
    except FileError as exc:
        raise Refused(str(exc)) from None
    with schedules_of(ctx, by) as schedules:
        schedules.check_names(entry.name for entry in wanted)
        steps = plan(wanted, schedules.list(), label, prune)
        for step in steps.steps:
            for line in describe(step):
                click.echo(line)
        if steps.left:
            click.echo(
                f"--prune left {len(steps.left)} entr{'y' if len(steps.left) == 1 else 'ies'} "
                f"that {label} does not manage: {', '.join(steps.left[:10])}"
                + (" ..." if len(steps.left) > 10 else "")
            )
        summary = f"{steps.changes} change{'s' if steps.changes != 1 else ''}"
        if dry_run:
            click.echo(f"dry run: {summary} planned, nothing written")
            return
        if steps.writes:
            schedules.apply(steps.writes, why=why or f"import {label}")
        click.echo(f"imported {file}: {summary}")


__all__ = ["schedules_group"]
