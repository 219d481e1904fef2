"""The SQL implementation of the store: PostgreSQL, MySQL/MariaDB and SQLite.

:class:`~.store.SqlStore` serves every contract of :mod:`celery_singlebeat.store`
through one part per contract, each beside its statements:

* ``slots.py`` / ``slot_statements.py``: the beat's slots (:class:`.SlotStore`);
* ``fleet.py`` / ``fleet_statements.py``: the replicas' rows, the pauses they
  read, LISTEN (:class:`.FleetStore`);
* ``leases.py`` / ``lease_statements.py``: SingletonTask's keys and runs
  (:class:`.SingletonStore`);
* ``schedules.py`` / ``schedule_statements.py``: stored schedules
  (:class:`.ScheduleStore`);
* ``store.py`` / ``store_statements.py``: the engine, the schema check, ping,
  and the one-line forwarding of every contract method to its part.

``operator.py`` (with ``operator_statements.py``, ``operator_results.py`` and
``operator_status.py``) is what an operator reads and steers over an
:class:`SqlStore`. Beneath them all: ``host.py`` (what the parts share of the
store), ``dialect.py`` (what the statements modules share), ``executor.py``
(one retry loop for every statement), ``schema.py`` (the tables),
``listening.py`` and ``psycopg_timeout.py``.

The names users and tests import from here are re-exported.
"""

from .fleet import FleetPruned
from .store import SqlStore

__all__ = ["FleetPruned", "SqlStore"]
