"""A bound on how long a psycopg 3 statement waits for the server's answer.

libpq has no read timeout. ``tcp_user_timeout`` and TCP keepalives end the wait
only when the peer's kernel stops acknowledging, so a path that still
acknowledges but never answers blocks a tick for ever: a TCP-terminating
middlebox (a service-mesh sidecar, PgBouncer, a cloud SQL proxy) whose far side
went silent, or a server that hangs. PyMySQL has ``read_timeout`` for this;
here psycopg's own wait gets the same deadline, and a statement past it closes
its connection (its state is unknown) and raises :class:`NoAnswer`.
"""

from __future__ import annotations

import inspect
from typing import Any

import psycopg

from ...timeline.timing import ANSWER_TIMEOUT_S

#: the seconds a statement waits for its answer, as PyMySQL's ``read_timeout``
DEFAULT_READ_TIMEOUT_S = ANSWER_TIMEOUT_S


class NoAnswer(psycopg.OperationalError):
    """The server did not answer a statement in time; its connection was closed.

    Not a dead pooled connection: reconnecting at once would meet the same
    silence, so the store reports it as an outage straight away."""

    #: what the store looks for (it does not import psycopg itself)
    singlebeat_no_answer = True


# psycopg 3.3 gave Connection.wait its deadline (`timeout`); 3.2 and older
# (the newest for Python 3.9 is 3.2) have none to lend.
SUPPORTED = "timeout" in inspect.signature(psycopg.Connection.wait).parameters
_WAIT_TIMEOUT: type[BaseException] = getattr(psycopg.errors, "_WaitTimeout", NoAnswer)


class AnswerTimeoutConnection(psycopg.Connection[Any]):
    """A psycopg connection whose every wait for the server ends after
    ``read_timeout`` seconds (set by :func:`connect`)."""

    read_timeout: float = DEFAULT_READ_TIMEOUT_S

    def wait(self, gen: Any, interval: float = 0.1, timeout: float | None = None) -> Any:
        try:
            return super().wait(
                gen, interval=interval, timeout=self.read_timeout if timeout is None else timeout
            )
        except _WAIT_TIMEOUT as exc:
            self.close()
            raise NoAnswer(
                f"no answer from the server within {self.read_timeout:g}s (read_timeout); "
                "connection closed"
            ) from exc


def connect(cargs: Any, cparams: dict[str, Any]) -> psycopg.Connection[Any]:
    """Connect as psycopg would, with ``read_timeout`` taken out of ``cparams``
    (it is no libpq option) and applied to every statement's wait."""
    read_timeout = float(cparams.pop("read_timeout", DEFAULT_READ_TIMEOUT_S))
    conn = AnswerTimeoutConnection.connect(*cargs, **cparams)
    conn.read_timeout = read_timeout
    return conn
