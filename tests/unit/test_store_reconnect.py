"""The store's SqlExecutor.run after a pooled connection died: a server restarting refuses
new connections for a moment, and that moment is not an outage.

No service: a SQLite store whose connections are replaced by a script of
failures (the shapes SQLAlchemy raises: a statement on a connection it then
invalidates, and a connect that fails)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError

from celery_singlebeat.exceptions import SchemaError, StoreUnavailable
from celery_singlebeat.store.sql import SqlStore, executor


class _Gone(Exception):
    """Stands in for the driver's error."""


def _dead_connection() -> DBAPIError:
    return DBAPIError(
        "SELECT 1", {}, _Gone("server closed the connection"), connection_invalidated=True
    )


def _refused() -> DBAPIError:
    return DBAPIError(None, None, _Gone("connection refused"))


def _scripted(store: SqlStore, script: list[str]) -> list[str]:
    """Each connection attempt takes the next step: ``dead`` (connects, its
    statement fails and the connection is invalidated), ``refused`` (the
    connect fails) or ``ok``. Returns the steps taken."""
    taken: list[str] = []

    @contextmanager
    def connect() -> Iterator[None]:
        step = script[len(taken)]
        taken.append(step)
        if step == "refused":
            raise _refused()
        yield None
        if step == "dead":
            raise _dead_connection()

    store.executor.connect = connect  # type: ignore[method-assign,assignment]
    return taken


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SqlStore]:
    store = SqlStore(make_url(f"sqlite:///{tmp_path}/s.sqlite"))
    try:
        yield store
    finally:
        store.close()


def _work(_conn: object) -> str:
    return "done"


def test_a_restart_shorter_than_the_window_is_no_outage(store: SqlStore) -> None:
    # the pooled connection is dead, then the server refuses twice, then is back
    taken = _scripted(store, ["dead", "refused", "refused", "ok"])
    assert store.executor.run("claim", _work) == "done"
    assert taken == ["dead", "refused", "refused", "ok"]


def test_a_refusal_past_the_window_is_an_outage(
    store: SqlStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(executor, "RECONNECT_WINDOW_S", 0.3)
    taken = _scripted(store, ["dead"] + ["refused"] * 100)
    with pytest.raises(StoreUnavailable, match="claim failed"):
        store.executor.run("claim", _work)
    # pauses of 0.05, 0.1, 0.2 s (then the window is over): a few tries, not a spin
    assert 3 <= taken.count("refused") <= 6, taken


def test_a_refused_connect_without_a_dead_one_first_is_an_outage_at_once(
    store: SqlStore,
) -> None:
    # no session was ended: nothing suggests a restart, so no waiting
    taken = _scripted(store, ["refused", "ok"])
    with pytest.raises(StoreUnavailable):
        store.executor.run("claim", _work)
    assert taken == ["refused"]


def test_a_second_dead_connection_within_the_window_is_retried(store: SqlStore) -> None:
    # a new connection made just before the server went down dies too
    taken = _scripted(store, ["dead", "dead", "refused", "ok"])
    assert store.executor.run("claim", _work) == "done"
    assert taken == ["dead", "dead", "refused", "ok"]


class _Silent(Exception):
    """Stands in for psycopg_timeout.NoAnswer (no psycopg needed here)."""

    singlebeat_no_answer = True


def test_no_answer_is_an_outage_at_once_without_reconnecting(store: SqlStore) -> None:
    # the statement timed out and closed its connection (SQLAlchemy calls that
    # invalidated); a new connection would only wait out its connect_timeout
    taken: list[str] = []

    @contextmanager
    def connect() -> Iterator[None]:
        taken.append("silent")
        yield None
        raise DBAPIError("SELECT 1", {}, _Silent("no answer"), connection_invalidated=True)

    store.executor.connect = connect  # type: ignore[method-assign,assignment]
    with pytest.raises(StoreUnavailable, match="no answer"):
        store.executor.run("claim", _work)
    assert taken == ["silent"]


class _Conn:
    """A connection that records the statements a transaction sends; the one
    named by ``fail`` raises (a dead connection's error, or COMMIT's answer lost)."""

    def __init__(self, fail: str | None, sent: list[str]) -> None:
        self.fail = fail
        self.sent = sent

    def exec_driver_sql(self, statement: str) -> None:
        self.sent.append(statement)
        if statement == self.fail:
            raise _dead_connection()


def _transactions(store: SqlStore, fails: list[str | None]) -> list[str]:
    """Each connection's transaction fails at the statement ``fails`` names
    (BEGIN, WORK, COMMIT) or not at all; returns every statement sent."""
    sent: list[str] = []
    taken: list[int] = []

    @contextmanager
    def connect() -> Iterator[_Conn]:
        fail = fails[len(taken)]
        taken.append(1)
        yield _Conn(fail, sent)

    store.executor.connect = connect  # type: ignore[method-assign,assignment]
    return sent


def _control(conn: _Conn) -> str:
    conn.exec_driver_sql("WORK")
    return "done"


def test_a_transaction_on_a_dead_connection_runs_again_whole(store: SqlStore) -> None:
    # the session died before COMMIT: the server rolled it back, nothing was
    # written, so the whole transaction runs again on a new connection
    sent = _transactions(store, ["BEGIN", "WORK", None])
    assert store.executor.run("pause", _control, begin="BEGIN") == "done"
    assert sent == ["BEGIN", "BEGIN", "WORK", "ROLLBACK", "BEGIN", "WORK", "COMMIT"]
    assert store.interruptions == 2


def test_a_lost_commit_answer_is_never_run_again(store: SqlStore) -> None:
    sent = _transactions(store, ["COMMIT", None])
    with pytest.raises(StoreUnavailable, match="answer to COMMIT was lost"):
        store.executor.run("pause", _control, begin="BEGIN")
    assert sent == ["BEGIN", "WORK", "COMMIT"]


def test_a_missing_table_says_to_create_the_schema(store: SqlStore) -> None:
    # the fleet's reads and controls ask for this; the store's statements do not
    def work(_conn: object) -> str:
        raise DBAPIError("SELECT", {}, _Gone("no such table: singlebeat_slots"))

    with pytest.raises(StoreUnavailable):
        store.executor.run("status", work)
    with pytest.raises(SchemaError, match="create-schema"):
        store.executor.run("status", work, schema_errors=True)
