"""Hearing of a control change at once, on PostgreSQL: LISTEN/NOTIFY.

Every control write (pause, resume, run now) notifies the prefix's channel in
its own transaction, so the notification is delivered at its commit, to every
listening session. A replica keeps one extra connection that only listens and
reads it without a round trip: :meth:`PostgresControlListener.poll` looks at
what the socket already holds. That is how a replica honours a control within
a second while idle, at no statement at all; without it (MySQL, SQLite, a pooler in
transaction mode that cannot carry LISTEN) a replica reads the change feed
every 0.95 s instead (on MySQL and SQLite, :meth:`.SqlStore.listen` returns
None). A pooler gives no error: the LISTEN succeeds and nothing ever arrives,
so the replica proves the channel with a probe of its own (a notification
with a token only it knows) when it opens it and every minute after, and stops
relying on a channel whose probe does not come back. The contract this keeps
is :class:`~.fleet_store.ControlListener`.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from typing import Any

from ..fleet_store import ControlListener

logger = logging.getLogger("celery_singlebeat.store")


#: the payload of a probe starts with this; a change's notification has none
PROBE_PREFIX = "probe:"


class PostgresControlListener(ControlListener):
    """One listening connection; ``poll`` never blocks and never sends.

    ``send(payload)`` notifies the channel through the store's pool, for
    :meth:`probe`: each listener's probe carries a token of its own, and every
    listener of the fleet ignores the probes of the others.
    """

    def __init__(self, conn: Any, channel: str, send: Callable[[str], None]) -> None:
        #: a psycopg connection of its own (never the pool's)
        self._conn = conn
        self._conn.autocommit = True
        # the identifier comes from a validated table prefix (ASCII, [A-Za-z0-9_])
        self._conn.execute(f'LISTEN "{channel}"')
        self.channel = channel
        self._send = send
        self._token: str | None = None
        self._probe_heard = False

    def poll(self) -> bool:
        """True when at least one change's notification arrived since the last
        poll (probes are not changes: :attr:`probe_heard` tells of this one's).

        Raises whatever the driver raises once the connection is gone: the
        caller closes the listener and opens a new one later.
        """
        pgconn = self._conn.pgconn
        # consume_input only reads what the socket already holds; it does not wait
        pgconn.consume_input()
        heard = False
        while (note := pgconn.notifies()) is not None:
            payload = note.extra.decode("utf-8", "replace")
            if not payload.startswith(PROBE_PREFIX):
                heard = True
            elif payload == self._token:
                self._probe_heard = True
        if pgconn.status != 0:  # not CONNECTION_OK: the server went away
            raise ConnectionError("listening connection lost")
        return heard

    def probe(self) -> None:
        self._token = f"{PROBE_PREFIX}{uuid.uuid4().hex}"
        self._probe_heard = False
        self._send(self._token)

    @property
    def probe_heard(self) -> bool:
        return self._probe_heard

    def close(self) -> None:
        """Close the connection; a second call, or one on a lost connection, is quiet."""
        try:
            self._conn.close()
        except Exception:  # already broken: nothing more to release
            logger.debug("singlebeat: closing the listening connection failed", exc_info=True)
