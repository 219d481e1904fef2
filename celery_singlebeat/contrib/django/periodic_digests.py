"""Digests of django-celery-beat's ``PeriodicTask`` table by chunk of ids,
computed in the database, so that a change is found by comparing a few
integers per :data:`CHUNK` rows rather than by reading the rows.

A chunk is the rows whose id is in ``[start, start + CHUNK)`` (``start`` a
multiple of :data:`CHUNK`; ``id - id % CHUNK`` in SQL, no division: MySQL's
``/`` is not an integer division). Each row of a chunk has a *position*
``p = id % CHUNK`` and a *bit* ``1 << p`` (a 64-bit integer: :data:`CHUNK`
is below 63). One ``GROUP BY`` through the ORM gives, per chunk, the
:data:`COLUMNS`, all integers but ``changed`` (integer arithmetic, ``%``,
``<<``, ``CASE``, ``COALESCE``, ``LENGTH``, ``SUM``, ``MAX``: the same on
PostgreSQL, MariaDB/MySQL and SQLite; no hash function):

* ``ids``: the sum of the rows' bits, that is the exact set of the ids the
  chunk holds: a row added or deleted (by any means) always shows;
* ``enabled``, ``one_off``, ``start``, ``expires``: the sums of the bits of
  the rows whose ``enabled``/``one_off`` is true, whose ``start_time``/
  ``expires`` is set. Each is the exact set of those rows, so no combination
  of enable/disable (the admin's actions, two rows swapping their flag, any
  number of rows at once) can leave it unchanged: **no collision is possible
  for these columns**;
* ``schedule`` and ``schedule_w``: the sums of ``code`` and of
  ``(p + 1) * code``, where ``code`` names the row's schedule as this source
  picks it (the first set of ``interval_id * 4``, ``crontab_id * 4 + 1``,
  ``solar_id * 4 + 2``, ``clocked_id * 4 + 3``; distinct for distinct
  schedules). A change of the schedule of one row moves the first sum; of two
  rows, if it leaves the first unchanged (``d`` and ``-d``, a swap), it moves
  the second by ``(p_a - p_b) * d``, never 0 as the positions differ. So a
  schedule foreign key changed in **one or two rows of a chunk is always
  found**; three or more rows of one chunk changed between two looks whose
  changes cancel in both sums at once are left to the backstop (below);
* ``text`` and ``text_w``: the same pair over ``shape``, a weighted sum of
  the lengths of ``name``, ``task``, ``args``, ``kwargs``, ``headers``,
  ``queue``, ``exchange``, ``routing_key`` and the values of ``priority`` and
  ``expire_seconds`` (each column with its own prime weight): a change of the
  length of one of those texts, or of one of those numbers, in one or two
  rows, is found;
* ``changed``: the latest ``date_changed`` (``auto_now``): every ``save()``
  stamps its row, so it moves its chunk's latest stamp (unless the writer's
  clock is behind another row of the chunk; the stamped rows are read besides,
  :mod:`.periodic_tasks`).

What the digests cannot see, by construction: a ``QuerySet.update()`` (no
``save()``, no ``PeriodicTasks`` bump) replacing a text by one of the same
length (``{"v": 1}`` by ``{"v": 2}``), changing ``start_time``/``expires``
from one instant to another, or several columns of one row whose changes
cancel in ``shape``. :class:`.periodic_tasks.PeriodicTaskSource` reads every
row whole again, slowly, as the backstop for those
(``backstop_period``).

``last_run_at`` and ``total_run_count`` are in no digest: the source's own
write-back is never taken for an edit.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

#: ids per chunk: each row is one bit of a 64-bit integer (signed: at most 62
#: bits, kept clear of the sign), so that the bit sums are exact sets
CHUNK = 60

#: what each chunk's digest holds, in this order (the module's docstring)
COLUMNS: tuple[str, ...] = (
    "ids",
    "enabled",
    "one_off",
    "start",
    "expires",
    "schedule",
    "schedule_w",
    "text",
    "text_w",
    "changed",
)

#: the columns whose lengths (texts) or values (numbers) make a row's
#: ``shape``, each with a distinct prime weight, so that one column's change
#: of a row is not undone by another's of the same size
_SHAPE_TEXTS = (
    ("name", 1),
    ("task", 3),
    ("args", 5),
    ("kwargs", 7),
    ("headers", 11),
    ("queue", 13),
    ("exchange", 17),
    ("routing_key", 19),
)
_SHAPE_NUMBERS = (("priority", 23), ("expire_seconds", 29))

#: a chunk's digest, as :data:`COLUMNS`
Digest = tuple[Any, ...]


def chunk_of(pk: int) -> int:
    """The first id of the chunk ``pk`` is in."""
    return pk - pk % CHUNK


def digests(queryset: Any) -> dict[int, Digest]:
    """Each chunk's digest of the rows of ``queryset`` (a ``PeriodicTask``
    query, perhaps filtered by an id range), by the chunk's first id: one
    statement, one row per chunk."""
    from django.db.models import BigIntegerField, Case, F, IntegerField, Max, Q, Sum, Value, When
    from django.db.models.expressions import ExpressionWrapper
    from django.db.models.functions import Cast, Coalesce, Length

    big = BigIntegerField()

    def wrap(expression: Any) -> Any:
        return ExpressionWrapper(expression, output_field=big)

    position = Cast(F("id") % CHUNK, IntegerField())
    # 1 << position: the cast first, or PostgreSQL shifts a 32-bit 1
    bit = wrap(Cast(Value(1), big).bitleftshift(position))
    weight = wrap(position + Value(1))
    code = Coalesce(
        wrap(F("interval_id") * 4),
        wrap(F("crontab_id") * 4 + 1),
        wrap(F("solar_id") * 4 + 2),
        wrap(F("clocked_id") * 4 + 3),
        Value(0),
        output_field=big,
    )
    shape: Any = Value(0)
    for column, factor in _SHAPE_TEXTS:
        shape = shape + Coalesce(Length(column), Value(0)) * factor
    for column, factor in _SHAPE_NUMBERS:
        shape = shape + Coalesce(F(column), Value(0)) * factor
    shape = wrap(shape)

    def bits(condition: Q) -> Any:
        return Sum(Case(When(condition, then=bit), default=Value(0), output_field=big))

    rows = (
        queryset.order_by()
        .annotate(chunk=wrap(F("id") - F("id") % CHUNK))
        .values("chunk")
        .annotate(
            ids=Sum(bit),
            enabled=bits(Q(enabled=True)),
            one_off=bits(Q(one_off=True)),
            start=bits(Q(start_time__isnull=False)),
            expires=bits(Q(expires__isnull=False)),
            schedule=Sum(code),
            schedule_w=Sum(wrap(weight * code)),
            text=Sum(shape),
            text_w=Sum(wrap(weight * shape)),
            changed=Max("date_changed"),
        )
        .values_list("chunk", *COLUMNS)
    )
    return {int(row[0]): _normal(row[1:]) for row in rows}


def _normal(values: tuple[Any, ...]) -> Digest:
    """The sums as ints: PostgreSQL's and MySQL's ``SUM`` of integers is a
    ``NUMERIC``/``DECIMAL`` (a Decimal), SQLite's an int."""
    *sums, changed = values
    return (*(int(value or 0) for value in sums), changed)


def differing(
    held: Mapping[int, Digest], read: Mapping[int, Digest], low: int, high: float
) -> set[int]:
    """The chunks in ``[low, high)`` whose digest read differs from the one
    held (one only of the two: a chunk emptied, or new)."""
    keys = {c for c in held if low <= c < high} | set(read)
    return {c for c in keys if held.get(c) != read.get(c)}


__all__ = ["CHUNK", "COLUMNS", "Digest", "chunk_of", "differing", "digests"]
