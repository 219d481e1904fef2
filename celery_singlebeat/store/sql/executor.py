"""How the SQL store and the operator send statements: one executor, one retry loop.

Both :class:`~.store.SqlStore` (the replicas' and workers' statements, through
its parts) and :class:`~.operator.Operator` (the operator's reads and
controls) send their work through :meth:`SqlExecutor.run`: a connection from
the engine's pool, the work on it, and what each driver error means decided
in one place:

* a deadlock, a serialization failure or a lock timeout (the database refused
  to decide *this time*, nothing was written) is retried after a short random
  pause, up to :data:`MAX_ATTEMPTS` times;
* a pooled connection found dead (a database restart, a proxy's idle timeout)
  is replaced, and new connections are tried for :data:`RECONNECT_WINDOW_S`
  before the failure counts as an outage;
* a statement that got no answer (``psycopg_timeout``) is an outage at once:
  a new connection would wait out its connect timeout in vain;
* anything else becomes :class:`~celery_singlebeat.exceptions.StoreUnavailable`,
  its text scrubbed of the store's secrets.

Work is either autocommit statements (the store's: each one decides alone, so
running it again after a dead connection is what the store's contract allows)
or one transaction (the fleet's controls): a transaction is run again whole
after any of the failures above *before* its COMMIT was sent, never after
(the answer lost, the change may or may not have been made, and the error
says so).
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from sqlalchemy import text
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import DBAPIError, IntegrityError, SQLAlchemyError
from sqlalchemy.sql.elements import TextClause

from ...exceptions import ConnectionReplaced, SchemaError, StoreUnavailable
from ...redact import Secrets

logger = logging.getLogger("celery_singlebeat.store")

T = TypeVar("T")

# PostgreSQL SQLSTATEs and MySQL error numbers that mean "try the same statement
# again": the database refused to decide *this time*, nothing was written.
_PG_RETRY = {"40P01", "40001", "55P03"}
_MY_RETRY = {1213, 1205}

#: deadlock retries before a statement is reported as failed.
MAX_ATTEMPTS = 5

#: after a pooled connection turned out dead, how long new connections are
#: tried before the failure counts as an outage (seconds, monotonic clock). A
#: server restarting (``pg_ctl restart -m fast``) ends every session and then
#: refuses connections, or answers "the database system is starting up", for a
#: moment: a single immediate reconnect met exactly that and reported an outage.
RECONNECT_WINDOW_S = 2.0
#: the first pause between those reconnects; it doubles, up to RECONNECT_PAUSE_MAX_S
RECONNECT_PAUSE_S = 0.05
RECONNECT_PAUSE_MAX_S = 0.4

#: what a missing table's error tells the operator
CREATE_SCHEMA_HINT = (
    "the celery-singlebeat tables are missing or older than this release: create them "
    "with `celery -A proj singlebeat create-schema` (or `python -m celery_singlebeat "
    "--url URL create-schema`)"
)


class SqlExecutor:
    """Runs work on the engine's connections; wraps every driver error once."""

    def __init__(self, engine: Engine, secrets: Secrets) -> None:
        self.engine = engine
        self.backend = engine.url.get_backend_name()
        #: what the store connects with, to scrub from the errors it wraps
        self.secrets = secrets
        #: raise ConnectionReplaced instead of sending work on the new
        #: connection that replaced a broken one (the scheduler and
        #: SingletonTask's runtime set it through ``SqlStore.stop_at_reconnect``,
        #: the contract's ``StoreConnection.stop_at_reconnect``)
        self.stop_at_reconnect = False
        #: how many times work found its connection broken (``Store.interruptions``)
        self.interruptions = 0
        self._texts: dict[str, TextClause] = {}

    @contextmanager
    def connect(self) -> Iterator[Connection]:
        """A connection from the pool (the seam the reconnect tests script)."""
        with self.engine.connect() as conn:
            yield conn

    def text(self, statement: str) -> TextClause:
        """The statement as a SQLAlchemy clause, made once: parsing its text
        (bind parameters) on every call was a measurable part of a round trip."""
        clause = self._texts.get(statement)
        if clause is None:
            clause = self._texts[statement] = text(statement)
        return clause

    def retryable(self, exc: DBAPIError) -> bool:
        """Whether the database refused to decide this time (deadlock,
        serialization failure, lock timeout; SQLite: locked or busy)."""
        orig = exc.orig
        if self.backend == "postgresql":
            return getattr(orig, "sqlstate", None) in _PG_RETRY
        if self.backend in ("mysql", "mariadb"):
            args: tuple[Any, ...] = tuple(getattr(orig, "args", ()))
            return bool(args) and args[0] in _MY_RETRY
        return "locked" in str(orig).lower() or "busy" in str(orig).lower()

    def unavailable(self, what: str, exc: SQLAlchemyError) -> StoreUnavailable:
        """The outage a driver error means, its text scrubbed of the store's
        secrets: a driver may repeat its connection parameters in a message, and
        the scheduler, the worker and the CLI all print this one. (Raised from
        ``self.secrets.cause(exc)``, which drops the chain when it repeats one.)"""
        return StoreUnavailable(self.secrets.scrub(f"{what} failed: {describe(exc)}"))

    def schema_error(self, what: str, exc: DBAPIError) -> SchemaError:
        """A missing table's error, saying how to create the schema."""
        return SchemaError(self.secrets.scrub(f"{what}: {describe(exc)}; {CREATE_SCHEMA_HINT}"))

    def run(
        self,
        what: str,
        work: Callable[[Connection], T],
        *,
        begin: str | None = None,
        retry_conflict: bool = False,
        schema_errors: bool = False,
    ) -> T:
        """``work`` on a connection, retried and wrapped as the module says.

        ``begin``: the statement that opens a transaction; the work then runs
        inside it and is committed, or rolled back and changes nothing.
        ``retry_conflict``: a unique violation (a concurrent writer took the
        key the work chose) is retried like a deadlock. ``schema_errors``: a
        missing table raises :class:`SchemaError` naming the fix, not
        ``StoreUnavailable``.
        """
        attempt = 0
        #: set once a pooled connection was found dead: until when to reconnect
        reconnect_until: float | None = None
        pause = RECONNECT_PAUSE_S
        broken = False
        while True:
            attempt += 1
            connected = False
            committing = False
            try:
                with self.connect() as conn:
                    connected = True
                    if broken and self.stop_at_reconnect:
                        # connected again, maybe to another server: the caller
                        # writes back what it sent before this work goes
                        raise ConnectionReplaced(
                            f"{what}: the connection to the database broke; reconnected"
                        )
                    if begin is None:
                        return work(conn)
                    conn.exec_driver_sql(begin)
                    try:
                        result = work(conn)
                    except BaseException:
                        _roll_back(conn)
                        raise
                    committing = True
                    conn.exec_driver_sql("COMMIT")
                    return result
            except DBAPIError as exc:
                if schema_errors and missing_table(exc):
                    raise self.schema_error(what, exc) from None
                no_answer = getattr(exc.orig, "singlebeat_no_answer", False)
                if not connected or exc.connection_invalidated or no_answer:
                    # the answer, if any, may come from another server next time
                    self.interruptions += 1
                    broken = True
                if committing:
                    error = self.unavailable(what, exc)
                    raise StoreUnavailable(
                        f"{error}; the answer to COMMIT was lost: the change may or may "
                        "not have been made"
                    ) from self.secrets.cause(exc)
                if no_answer:
                    # the server (or the path to it) went silent: a new
                    # connection would wait out its connect_timeout in vain
                    raise self.unavailable(what, exc) from self.secrets.cause(exc)
                if exc.connection_invalidated and reconnect_until is None:
                    # A pooled connection that died while idle (database restart,
                    # proxy timeout): the pool is invalidated, try again on a new
                    # connection before calling it an outage.
                    logger.debug("singlebeat: %s: stale connection, reconnecting", what)
                    reconnect_until = time.monotonic() + RECONNECT_WINDOW_S
                    continue
                lost = not connected or exc.connection_invalidated
                left = reconnect_until - time.monotonic() if reconnect_until is not None else 0.0
                if lost and left > 0:
                    # the server that ended the session may be restarting: wait a
                    # moment for it, rather than report an outage that is none
                    logger.debug(
                        "singlebeat: %s: reconnect failed (%s)",
                        what,
                        self.secrets.scrub(describe(exc)),
                    )
                    time.sleep(min(pause, left))
                    pause = min(pause * 2, RECONNECT_PAUSE_MAX_S)
                    continue
                conflict = retry_conflict and isinstance(exc, IntegrityError)
                if (self.retryable(exc) or conflict) and attempt < MAX_ATTEMPTS:
                    logger.debug(
                        "singlebeat: %s: retrying after %s", what, self.secrets.scrub(str(exc.orig))
                    )
                    time.sleep(random.uniform(0.001, 0.02) * attempt)
                    continue
                raise self.unavailable(what, exc) from self.secrets.cause(exc)
            except SQLAlchemyError as exc:
                self.interruptions += 1
                raise self.unavailable(what, exc) from self.secrets.cause(exc)


def describe(exc: SQLAlchemyError) -> str:
    """One line without the statement text or its parameters (which may be long)."""
    orig = getattr(exc, "orig", None)
    message = str(orig if orig is not None else exc).strip().splitlines()
    return f"{type(orig or exc).__name__}: {message[0] if message else ''}"


def missing_table(exc: DBAPIError) -> bool:
    """Whether a driver error says a table does not exist."""
    orig = exc.orig
    if getattr(orig, "sqlstate", None) == "42P01":  # PostgreSQL undefined_table
        return True
    args: tuple[Any, ...] = tuple(getattr(orig, "args", ()))
    if args and args[0] == 1146:  # MySQL/MariaDB ER_NO_SUCH_TABLE
        return True
    return "no such table" in str(orig).lower()  # SQLite


def _roll_back(conn: Connection) -> None:
    """End the transaction a failed work began, before the connection goes
    back to a pool of autocommit connections, where an open transaction would
    hold its locks and swallow the next user's statements. (The pool's reset on
    return ends it too, with each driver; this does not rely on that.) A
    connection that cannot roll back is dropped."""
    try:
        conn.exec_driver_sql("ROLLBACK")
    except Exception:
        conn.invalidate()
