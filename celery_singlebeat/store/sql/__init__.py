"""The SQL implementation of the store: PostgreSQL, MySQL/MariaDB and SQLite.

:class:`~.store.SqlStore` serves every contract of :mod:`celery_singlebeat.store`;
the names users and tests import from here are re-exported.
"""

from .fleet import FleetPruned
from .store import SqlStore

__all__ = ["FleetPruned", "SqlStore"]
