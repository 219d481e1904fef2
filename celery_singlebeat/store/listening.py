"""Hearing of a control change at once, on PostgreSQL: LISTEN/NOTIFY.

Every control write (pause, resume, run now) notifies the prefix's channel in
its own transaction, so the notification is delivered at its commit, to every
listening session. A replica keeps one extra connection that only listens and
reads it without a round trip: :meth:`PostgresControlListener.poll` looks at
what the socket already holds. That is how a replica honours a control within
a second while idle, at no statement at all; without it (MySQL, SQLite, a pooler in
transaction mode that cannot carry LISTEN) a replica learns of a change at its
next claim or heartbeat, the latter every lease/3 (on MySQL and SQLite,
:meth:`.SqlStore.listen` returns None). The contract this keeps is
:class:`~.fleet_store.ControlListener`.
"""

from __future__ import annotations

import logging
from typing import Any

from .fleet_store import ControlListener

logger = logging.getLogger("celery_singlebeat.store")


class PostgresControlListener(ControlListener):
    """One listening connection; ``poll`` never blocks and never sends."""

    def __init__(self, conn: Any, channel: str) -> None:
        #: a psycopg connection of its own (never the pool's)
        self._conn = conn
        self._conn.autocommit = True
        # the identifier comes from a validated table prefix (ASCII, [A-Za-z0-9_])
        self._conn.execute(f'LISTEN "{channel}"')
        self.channel = channel

    def poll(self) -> bool:
        """True when at least one notification arrived since the last poll.

        Raises whatever the driver raises once the connection is gone: the
        caller closes the listener and opens a new one later.
        """
        pgconn = self._conn.pgconn
        # consume_input only reads what the socket already holds; it does not wait
        pgconn.consume_input()
        heard = False
        while pgconn.notifies() is not None:
            heard = True
        if pgconn.status != 0:  # not CONNECTION_OK: the server went away
            raise ConnectionError("listening connection lost")
        return heard

    def close(self) -> None:
        """Close the connection; a second call, or one on a lost connection, is quiet."""
        try:
            self._conn.close()
        except Exception:  # already broken: nothing more to release
            logger.debug("singlebeat: closing the listening connection failed", exc_info=True)
