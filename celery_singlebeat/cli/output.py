"""How every command shows what it read: aligned tables for people, one JSON
document for programs (``--json``), from the same objects.

JSON instants come twice, as ``<name>`` (ISO-8601 UTC, microseconds, ``Z``)
and ``<name>_us`` (integer microseconds since the Unix epoch, the tables'
own unit); durations are ``<name>_us`` integers. Tables show instants
relative to the database's clock ("3s ago", "in 12s") and slot instants in UTC
with milliseconds, as the log lines do. Colour only on a terminal, and never
with ``NO_COLOR`` set (https://no-color.org).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, Union

import click

# re-exported: every command shows a slot with it, as the log lines do
from ..timeline.clock import us_to_datetime

if TYPE_CHECKING:
    from ..store.base import Pause
    from ..store.sql.operator_results import EntryStatus, HistoryRow, LeaseStatus, ReplicaStatus

#: a table cell: its text, or its text and a colour (click.style's fg)
Cell = Union[str, tuple[str, str]]

_UNITS = (("d", 86_400_000_000), ("h", 3_600_000_000), ("m", 60_000_000), ("s", 1_000_000))


def colour() -> bool:
    """Whether to colour stdout: a terminal, and NO_COLOR unset or empty."""
    if os.environ.get("NO_COLOR"):
        return False
    return bool(sys.stdout.isatty())


#: the ISO text of each whole second met lately: the instants of one status
#: (100,000 entries) fall on few seconds (entries registered together share
#: anchors, slots of one schedule share instants), and formatting a datetime
#: for each was most of the time of ``status --json``
_SECONDS: dict[int, str] = {}


def iso(instant_us: int | None) -> str | None:
    """ISO-8601 UTC with microseconds (JSON): ``2026-03-01T12:00:00.000000Z``."""
    if instant_us is None:
        return None
    seconds, micro = divmod(instant_us, 1_000_000)
    text = _SECONDS.get(seconds)
    if text is None:
        if len(_SECONDS) > 100_000:
            _SECONDS.clear()
        text = _SECONDS[seconds] = us_to_datetime(seconds * 1_000_000).isoformat(
            timespec="seconds"
        )[:-6]  # without its "+00:00"
    return f"{text}.{micro:06d}Z"


def span(duration_us: int) -> str:
    """A duration in its two largest units: 450ms, 3.2s, 12s, 4m05s, 2h10m, 3d04h."""
    value = abs(duration_us)
    if value < 1_000_000:
        return f"{value // 1000}ms"
    if value < 10_000_000:
        return f"{value / 1_000_000:.1f}s"
    for index, (unit, size) in enumerate(_UNITS):
        if value >= size:
            whole, rest = divmod(value, size)
            if unit == "s":
                return f"{whole}s"
            small, small_size = _UNITS[index + 1]
            return f"{whole}{unit}{rest // small_size:02d}{small}"
    return f"{value}us"  # unreachable: value >= 1 s here


def relative(instant_us: int | None, now_us: int) -> str:
    """ "in 12s", "3s ago" or "now" (within a millisecond), from the database's now."""
    if instant_us is None:
        return "-"
    delta = instant_us - now_us
    if abs(delta) < 1000:
        return "now"
    return f"in {span(delta)}" if delta > 0 else f"{span(delta)} ago"


def paint(text: str, fg: str) -> str:
    """``text`` in colour ``fg`` on a terminal, plain otherwise."""
    return click.style(text, fg=fg) if colour() else text


def table(headers: Sequence[str], rows: Iterable[Sequence[Cell]]) -> str:
    """Columns aligned on the widest cell, headers in bold (on a terminal)."""
    styled = colour()
    cells = [[c if isinstance(c, tuple) else (c, "") for c in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in cells:
        for i, (text, _) in enumerate(row):
            widths[i] = max(widths[i], len(text))

    def line(row: Sequence[tuple[str, str]], bold: bool = False) -> str:
        parts = []
        for i, (text, fg) in enumerate(row):
            padded = text if i == len(row) - 1 else text.ljust(widths[i])
            if styled and (fg or bold):
                padded = click.style(padded, fg=fg or None, bold=bold)
            parts.append(padded)
        return "  ".join(parts).rstrip()

    out = [line([(h, "") for h in headers], bold=True)]
    out.extend(line(row) for row in cells)
    return "\n".join(out)


def emit_json(document: Any) -> None:
    """One JSON document on stdout; indented only for a person at a terminal
    (100,000 entries indented are a third larger, for a program to parse)."""
    indent = 2 if sys.stdout.isatty() else None
    click.echo(json.dumps(document, indent=indent, ensure_ascii=False))


def _stamp(doc: dict[str, Any], name: str, instant_us: int | None) -> None:
    doc[name] = iso(instant_us)
    doc[f"{name}_us"] = instant_us


# -- JSON shapes (docs/cli.md) ---------------------------------------------------


def pause_json(pause: Pause | None) -> dict[str, Any] | None:
    if pause is None:
        return None
    doc: dict[str, Any] = {"entry": pause.entry, "by": pause.by, "reason": pause.reason}
    _stamp(doc, "at", pause.at_us)
    _stamp(doc, "until", pause.until_us)
    return doc


def entry_json(entry: EntryStatus) -> dict[str, Any]:
    # one literal, not a dict filled stamp by stamp: it runs once per entry,
    # 100,000 times in a status --json of a large fleet (a third faster)
    next_us, overdue_us = entry.next_slot_us, entry.overdue_slot_us
    last_us, sent_us = entry.last_slot_us, entry.last_sent_slot_us
    return {
        "name": entry.name,
        "task": entry.task,
        "schedule": entry.schedule,
        "replicas": entry.replicas,
        "next_known": entry.next_known,
        "next_slot": None if next_us is None else iso(next_us),
        "next_slot_us": next_us,
        "overdue": overdue_us is not None,
        "overdue_slot": None if overdue_us is None else iso(overdue_us),
        "overdue_slot_us": overdue_us,
        "last_slot": None if last_us is None else iso(last_us),
        "last_slot_us": last_us,
        "last_state": entry.last_state,
        "last_sent_slot": None if sent_us is None else iso(sent_us),
        "last_sent_slot_us": sent_us,
        "last_sender": entry.last_sender,
        "last_delay_us": entry.last_delay_us,
        "paused": None if entry.pause is None else pause_json(entry.pause),
    }


def replica_json(replica: ReplicaStatus) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "id": replica.id,
        "host": replica.host,
        "pid": replica.pid,
        "version": replica.version,
        "state": replica.state,
    }
    _stamp(doc, "started", replica.started_us)
    _stamp(doc, "seen", replica.seen_us)
    _stamp(doc, "loop", replica.loop_us)
    doc["offset_us"] = replica.offset_us
    doc["tracked"] = replica.tracked
    doc["proposes_first"] = replica.proposes_first
    doc["share"] = replica.share
    doc["heartbeat_us"] = replica.heartbeat_us
    _stamp(doc, "stopped", replica.stopped_us)
    doc["catalog"] = replica.catalog
    doc["lost_writes"] = replica.lost_writes
    return doc


def history_json(row: HistoryRow) -> dict[str, Any]:
    doc: dict[str, Any] = {"entry": row.entry}
    _stamp(doc, "slot", row.slot_us)
    doc.update(state=row.state, holder=row.holder, sender=row.sender, fence=row.fence)
    # 0 once released, and on a run-now request: no instant to show
    doc["lease_until"] = iso(row.lease_until_us) if row.lease_until_us else None
    doc["lease_until_us"] = row.lease_until_us
    _stamp(doc, "claimed", row.claimed_us)
    _stamp(doc, "sent", row.sent_us)
    doc["delay_us"] = row.delay_us
    doc["task_id"] = row.task_id
    doc["requested_by"] = row.requested_by
    doc["request_reason"] = row.request_reason
    _stamp(doc, "requested", row.requested_us)
    return doc


def lease_json(lease: LeaseStatus) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "key": lease.key,
        "state": lease.state,
        "holder": lease.holder,
        "token": lease.token,
    }
    # a released lease has expires_us 0: no instant to show
    doc["expires"] = iso(lease.expires_us) if lease.expires_us else None
    doc["expires_us"] = lease.expires_us
    _stamp(doc, "acquired", lease.acquired_us)
    return doc


# -- words shared by the tables ------------------------------------------------

STATE_COLOURS = {
    "live": "green",
    "lost": "red",
    "stopped": "",
    "sent": "green",
    "claimed": "cyan",
    "abandoned": "red",
    "requested": "yellow",
    "held": "green",
    "expired": "",
    "released": "",
}


def state_cell(state: str) -> Cell:
    return (state, STATE_COLOURS.get(state, ""))


def pause_words(pause: Pause, now_us: int) -> str:
    """ "paused by W, 12m left: reason" (or "until resumed"), for a table cell or a line."""
    scope = " (every entry: '*')" if pause.entry == "*" else ""
    until = "until resumed" if pause.until_us is None else f"{span(pause.until_us - now_us)} left"
    why = f": {pause.reason}" if pause.reason else ""
    return f"paused{scope} by {pause.by}, {until}{why}"
