"""What a batch of schedule writes does to the stored rows, decided once for every store.

:meth:`.ScheduleStore.write_schedules` is implemented twice (SQL in
``sql/schedules.py``, in memory in ``celery_singlebeat.testing``); both read
the rows the batch names, hand them here with the batch's revision and the
database's instant, and write what :func:`plan` returns. So the semantics (what is a create, a
revival, a no-op, a conflict) and the history's diffs cannot differ between
stores. Pure: no I/O, no clock.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from ..exceptions import ScheduleConflict, ScheduleExists, ScheduleNotFound
from ..widths import MAX_AUTHOR, MAX_ENTRY_NAME, MAX_MANAGED_BY, MAX_SCHEDULE_WHY, MAX_TASK
from .values import EDITABLE, SCHEDULE_OPS, ScheduleRow, ScheduleWrite

__all__ = ["Edit", "check_batch", "digest", "plan"]

#: the fields a create or a replace must give (every editable one but the name)
_GIVEN = frozenset(EDITABLE[1:])

#: JSON texts whose parsed value the history shows
_JSON_SHOWN = frozenset({"spec", "options", "policy"})
#: JSON texts the history shows only as a digest: arguments may carry secrets
#: (tokens, addresses) and the history is shown to operators
_JSON_DIGEST = frozenset({"args", "kwargs"})

_STR = ("task", "spec", "args", "kwargs", "options", "description")
_INT = ("jitter_us",)
_OPTIONAL_INT = ("start_us", "end_us", "max_runs")
_OPTIONAL_STR = ("policy", "managed_by")


class Edit(NamedTuple):
    """One write of a batch, decided: what was stored, what is stored after."""

    write: ScheduleWrite
    #: the stored row before (a tombstone too), None when the name had none
    before: ScheduleRow | None
    #: the row after the write (for a write that changes nothing: ``before``)
    after: ScheduleRow
    #: None: the write changes nothing; else ``"created"``, ``"changed"`` or
    #: ``"deleted"``, and the history row's ``changes`` text
    action: str | None
    changes: str


def digest(text: str | None) -> str | None:
    """What the history shows of an ``args`` or ``kwargs`` text: a digest, never the text."""
    if text is None:
        return None
    return "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()[:12]


def check_batch(writes: Sequence[ScheduleWrite], by: str, why: str) -> None:
    """Refuse a batch that no store could write, before any round trip.

    Raises ValueError naming the entry and the field: an unknown operation, a
    name empty or longer than its column, a name twice in one batch (merge
    its writes: one history row per entry and revision), fields missing or
    unknown for the operation, a value of the wrong type, a JSON column that
    is not JSON, ``by`` or ``why`` too long.
    """
    if not isinstance(by, str) or len(by) > MAX_AUTHOR:
        raise ValueError(f"by: expected a text of at most {MAX_AUTHOR} characters")
    if not isinstance(why, str) or len(why) > MAX_SCHEDULE_WHY:
        raise ValueError(f"why: expected a text of at most {MAX_SCHEDULE_WHY} characters")
    seen: set[str] = set()
    for write in writes:
        name = write.name
        if not isinstance(name, str) or not 1 <= len(name) <= MAX_ENTRY_NAME:
            raise ValueError(
                f"schedule entry {str(name)[:40]!r}: name: expected 1 to {MAX_ENTRY_NAME} "
                "characters"
            )
        if name in seen:
            raise ValueError(
                f"schedule entry {name!r}: named twice in one batch; merge its writes into one"
            )
        seen.add(name)
        if write.op not in SCHEDULE_OPS:
            raise ValueError(
                f"schedule entry {name!r}: op {write.op!r}: expected one of "
                f"{', '.join(SCHEDULE_OPS)}"
            )
        if write.if_revision is not None and (
            isinstance(write.if_revision, bool) or not isinstance(write.if_revision, int)
        ):
            raise ValueError(f"schedule entry {name!r}: if_revision: expected an integer")
        given = set(write.fields)
        unknown = given - _GIVEN
        if unknown:
            raise ValueError(
                f"schedule entry {name!r}: unknown or read-only fields {sorted(unknown)}"
            )
        if write.op in ("create", "replace") and given != _GIVEN:
            raise ValueError(
                f"schedule entry {name!r}: a {write.op} gives every field; missing "
                f"{sorted(_GIVEN - given)}"
            )
        if write.op == "delete" and given:
            raise ValueError(f"schedule entry {name!r}: a delete takes no fields")
        for field, value in write.fields.items():
            _check_value(name, field, value)


def _check_value(name: str, field: str, value: Any) -> None:
    def wrong(expected: str) -> ValueError:
        return ValueError(
            f"schedule entry {name!r}: {field}: expected {expected}, got {value!r:.60}"
        )

    if field in _STR and not isinstance(value, str):
        raise wrong("a text")
    if field == "enabled" and not isinstance(value, bool):
        raise wrong("True or False")
    if field in _INT and (isinstance(value, bool) or not isinstance(value, int)):
        raise wrong("an integer")
    if (
        field in _OPTIONAL_INT
        and value is not None
        and (isinstance(value, bool) or not isinstance(value, int))
    ):
        raise wrong("an integer or None")
    if field in _OPTIONAL_STR and value is not None and not isinstance(value, str):
        raise wrong("a text or None")
    if field == "task" and not 1 <= len(value) <= MAX_TASK:
        raise wrong(f"1 to {MAX_TASK} characters")
    if field == "managed_by" and value is not None and len(value) > MAX_MANAGED_BY:
        raise wrong(f"at most {MAX_MANAGED_BY} characters")
    if (field in _JSON_SHOWN or field in _JSON_DIGEST) and value is not None:
        try:
            json.loads(value)
        except ValueError:
            raise wrong("a JSON text") from None


def plan(
    writes: Sequence[ScheduleWrite],
    stored: Mapping[str, ScheduleRow],
    by: str,
    revision: int,
    now_us: int,
) -> list[Edit]:
    """Decide each write of a checked batch (:func:`check_batch`) against
    ``stored`` (the rows the batch names, tombstones included), as one write
    at ``revision`` and the database's ``now_us``.

    Raises :class:`~celery_singlebeat.exceptions.ScheduleExists`,
    :class:`~celery_singlebeat.exceptions.ScheduleNotFound` or
    :class:`~celery_singlebeat.exceptions.ScheduleConflict` for the first
    write refused; the caller then writes nothing of the batch.
    """
    return [_decide(w, stored.get(w.name), by, revision, now_us) for w in writes]


def _decide(
    write: ScheduleWrite, before: ScheduleRow | None, by: str, revision: int, now_us: int
) -> Edit:
    live = before if before is not None and not before.deleted else None
    if write.op == "create" and live is not None:
        raise ScheduleExists(write.name)
    if write.op in ("update", "delete") and live is None:
        raise ScheduleNotFound(write.name)
    if write.if_revision is not None and (live is None or live.revision != write.if_revision):
        raise ScheduleConflict(
            write.name, None if live is None else live.revision, write.if_revision
        )
    stamp: dict[str, Any] = {"revision": revision, "updated_us": now_us, "updated_by": by}
    if live is None:
        # a create, or a replace of a name without a live row: a new row, or
        # the revival of a tombstone (the name's history continues)
        after = ScheduleRow(
            name=write.name,
            **write.fields,
            created_us=now_us,
            created_by=by,
            deleted=False,
            **stamp,
        )
        return Edit(write, before, after, "created", _changes(None, after))
    if write.op == "delete":
        after = live._replace(deleted=True, **stamp)
        return Edit(write, before, after, "deleted", _changes(live, None))
    edited = live._replace(**write.fields)
    if edited[: len(EDITABLE)] == live[: len(EDITABLE)]:
        # the same values again: not a change (no revision, no history row)
        return Edit(write, before, live, None, "")
    after = edited._replace(**stamp)
    return Edit(write, before, after, "changed", _changes(live, after))


def _shown(field: str, value: Any) -> Any:
    if value is None:
        return None
    if field in _JSON_DIGEST:
        return digest(value)
    if field in _JSON_SHOWN:
        return json.loads(value)
    return value


def _changes(old: ScheduleRow | None, new: ScheduleRow | None) -> str:
    """``{"field": [old, new], ...}`` over the editable fields that differ
    (for a create from null, for a delete to null; a null field there is left out)."""
    diff: dict[str, list[Any]] = {}
    for index, field in enumerate(EDITABLE[1:], start=1):
        was = None if old is None else old[index]
        now = None if new is None else new[index]
        if was == now:  # (a create leaves out the fields it sets to null)
            continue
        diff[field] = [_shown(field, was), _shown(field, now)]
    return json.dumps(diff, sort_keys=True, separators=(",", ":"))
