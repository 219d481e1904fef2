"""What the parts of the SQL store share of it: one executor, one clock, the
readings its contracts expose.

:class:`~.store.SqlStore` serves each contract through a part of its own
(:class:`~.slots.SqlSlots`, :class:`~.fleet.SqlFleet`,
:class:`~.leases.SqlLeases`, :class:`~.schedules.SqlSchedules`). Each part
holds the store as an :class:`SqlHost`: every statement goes through the
store's one :class:`~.executor.SqlExecutor` (one retry loop, one error
wrapping), every answer that carries the database's clock teaches the store's
:class:`~celery_singlebeat.timeline.clock.DatabaseClock`, and what a statement
brings back beside its rows (the control version, the open claims, the stored
schedules' revision) is kept where the contracts say a reader finds it: on
the store. Named here so that no part imports ``store.py``, which imports
them all.
"""

from __future__ import annotations

from typing import Any, Protocol

from sqlalchemy.engine import Connection, Engine

from ...redact import Secrets
from ...timeline.clock import DatabaseClock
from ..values import StalledRuns
from .executor import SqlExecutor
from .schema import Tables


class SqlHost(Protocol):
    """What the parts of :class:`~.store.SqlStore` use of it."""

    #: the SQLAlchemy backend name: postgresql, mysql, mariadb, sqlite
    backend: str
    engine: Engine
    #: what every connection is opened with (the listener's too)
    connect_args: dict[str, Any]
    executor: SqlExecutor
    secrets: Secrets
    tables: Tables
    clock: DatabaseClock
    #: :attr:`.FleetStore.controls_version`
    controls_version: int | None
    #: :attr:`.FleetStore.open_claims`
    open_claims: int | None
    #: :attr:`.ScheduleStore.schedule_revision`
    schedule_revision: int | None
    #: :attr:`.SlotStore.stalled_runs`: the takeover and the heartbeat read it
    stalled_runs: StalledRuns


def fetch(host: SqlHost, conn: Connection, statement: str, /, **params: Any) -> list[Any]:
    """Execute, read all rows, and feed the database clock from column 0.
    (Positional first: a statement may bind a parameter named ``host``.)"""
    sent = host.clock.local_us()
    rows = conn.execute(host.executor.text(statement), params).all()
    received = host.clock.local_us()
    if rows and rows[0][0] is not None:
        host.clock.observe(int(rows[0][0]), sent, received)
    return list(rows)


def note_controls(host: SqlHost, rows: list[Any]) -> list[Any]:
    """Keep the control version a statement read in its last column."""
    if rows and rows[0][-1] is not None:
        host.controls_version = int(rows[0][-1])
    return rows
