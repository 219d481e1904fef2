"""A schedule kept in git: stored entries exported to and imported from a file.

The file is YAML (``.yaml``, ``.yml``) or JSON (anything else)::

    version: 1
    entries:
      nightly-report:
        task: reports.nightly
        schedule: {crontab: "0 3 * * *", tz: Europe/Paris}
        kwargs: {format: pdf}

An import applies the file in one transaction, all or nothing, after every
entry of it was validated (every problem of every entry is reported at once,
naming the entry and the field). Each entry it writes is *managed by* the
file (its label: the file's name, or ``--as``); ``--prune`` removes the stored
entries that label manages and the file no longer has, never an entry made by
hand or managed by another file, and says how many it left. A dry run prints
the same plan and writes nothing.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from ..exceptions import InvalidEntry, ScheduleError
from ..store.values import ScheduleWrite
from .columns import entry_to_fields
from .document import entry_from_document, entry_to_document
from .entry import StoredEntry

#: the format this release writes and reads
FILE_VERSION = 1

#: the fields a plan compares (what the store keeps by itself is not the file's)
_KEPT_BY_STORE = ("revision", "created_us", "updated_us", "created_by", "updated_by")


class FileError(ScheduleError):
    """The file cannot be read as a schedule (its syntax, its shape, its entries)."""


class Step(NamedTuple):
    """One line of an import's plan."""

    action: str  # "add" | "change" | "remove" | "keep"
    name: str
    #: for a change: field -> (stored, file)
    fields: Mapping[str, tuple[Any, Any]] = {}
    #: a note shown with the line (an entry made by hand that the file adopts)
    note: str = ""


class Plan(NamedTuple):
    """What an import would do, and what it leaves alone."""

    steps: list[Step]
    writes: list[ScheduleWrite]
    #: names --prune did not remove because the file does not manage them
    left: list[str]

    @property
    def changes(self) -> int:
        return sum(1 for s in self.steps if s.action != "keep")


def _yaml() -> Any:
    try:
        import yaml
    except ImportError:  # pragma: no cover - PyYAML is a dependency
        raise FileError("reading YAML needs PyYAML (pip install pyyaml)") from None
    return yaml


def is_yaml(path: str | Path) -> bool:
    return str(path).lower().endswith((".yaml", ".yml"))


def dump(entries: Sequence[StoredEntry], path: str | Path | None = None) -> str:
    """The file's text for ``entries`` (YAML when ``path`` says so, else JSON)."""
    document = {
        "version": FILE_VERSION,
        "entries": {e.name: entry_to_document(e) for e in sorted(entries, key=lambda e: e.name)},
    }
    if path is not None and is_yaml(path):
        return str(_yaml().safe_dump(document, sort_keys=True, allow_unicode=True))
    return json.dumps(document, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def parse(text: str, path: str | Path, label: str) -> list[StoredEntry]:
    """The entries of a file's text, each managed by ``label``; a FileError
    listing every problem (each naming its entry and field) otherwise."""
    try:
        document = _yaml().safe_load(text) if is_yaml(path) else json.loads(text)
    except Exception as exc:  # the parser's own message says where
        raise FileError(f"{path}: not valid {'YAML' if is_yaml(path) else 'JSON'}: {exc}") from None
    if not isinstance(document, dict) or not isinstance(document.get("entries"), dict):
        raise FileError(f"{path}: expected a mapping with an 'entries' mapping of name -> entry")
    version = document.get("version", FILE_VERSION)
    if version != FILE_VERSION:
        raise FileError(f"{path}: version {version!r}: this release reads version {FILE_VERSION}")
    unknown = sorted(set(document) - {"version", "entries"})
    if unknown:
        raise FileError(f"{path}: unknown top-level key(s) {', '.join(map(str, unknown))}")
    entries: list[StoredEntry] = []
    problems: list[str] = []
    for name, doc in document["entries"].items():
        try:
            if not isinstance(doc, dict):
                raise InvalidEntry(str(name), "entry", "expected a mapping of fields")
            entry = entry_from_document(str(name), dict(doc))
        except (InvalidEntry, ScheduleError) as exc:
            problems.append(str(exc))
            continue
        entries.append(_managed(entry, label))
    if problems:
        raise FileError(
            f"{path}: {len(problems)} entr{'y' if len(problems) == 1 else 'ies'} refused, "
            "nothing imported:\n  " + "\n  ".join(problems)
        )
    return entries


def _managed(entry: StoredEntry, label: str) -> StoredEntry:
    from dataclasses import replace

    return replace(entry, managed_by=label)


def _comparable(entry: StoredEntry) -> dict[str, Any]:
    fields = entry_to_fields(entry)
    for key in _KEPT_BY_STORE:
        fields.pop(key, None)
    return fields


def plan(
    wanted: Sequence[StoredEntry], stored: Sequence[StoredEntry], label: str, prune: bool
) -> Plan:
    """The writes that make the store hold ``wanted`` (and, with ``prune``,
    drop what ``label`` manages that ``wanted`` lacks)."""
    current = {e.name: e for e in stored}
    steps: list[Step] = []
    writes: list[ScheduleWrite] = []
    for entry in sorted(wanted, key=lambda e: e.name):
        fields = _comparable(entry)
        fields.pop("name", None)
        old = current.get(entry.name)
        if old is None:
            steps.append(Step("add", entry.name))
            writes.append(ScheduleWrite("create", entry.name, fields, None))
            continue
        before = _comparable(old)
        delta = {k: (before.get(k), v) for k, v in fields.items() if before.get(k) != v}
        if not delta:
            steps.append(Step("keep", entry.name))
            continue
        note = ""
        if old.managed_by != label:
            note = (
                "made by hand; the file manages it from now on"
                if old.managed_by is None
                else f"managed by {old.managed_by} until now"
            )
        steps.append(Step("change", entry.name, delta, note))
        # only at the revision the plan was made against: an edit in between
        # fails the import rather than being overwritten unseen
        writes.append(ScheduleWrite("replace", entry.name, fields, old.revision))
    left: list[str] = []
    if prune:
        names = {e.name for e in wanted}
        for name, old in sorted(current.items()):
            if name in names:
                continue
            if old.managed_by == label:
                steps.append(Step("remove", name))
                writes.append(ScheduleWrite("delete", name, {}, old.revision))
            else:
                left.append(name)
    return Plan(steps, writes, left)


def describe(step: Step) -> list[str]:
    """The plan's lines for one step, as a diff reads."""
    if step.action == "add":
        return [f"+ {step.name}"]
    if step.action == "remove":
        return [f"- {step.name}"]
    if step.action == "keep":
        return []
    head = f"~ {step.name}" + (f"  ({step.note})" if step.note else "")
    lines = [head]
    for field, (old, new) in sorted(step.fields.items()):
        lines.append(f"    {field}: {_short(old)} -> {_short(new)}")
    return lines


def _short(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
    return text if len(text) <= 80 else text[:77] + "..."


__all__ = ["FILE_VERSION", "FileError", "Plan", "Step", "describe", "dump", "parse", "plan"]
