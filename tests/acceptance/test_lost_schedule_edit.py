"""A stored schedule's edit, acknowledged, then lost with a failover to an
asynchronous standby: the database's promise, not ours (issue 30, item 7).

The topology is ``benchmarks/failover.py``'s :class:`FailoverPair`: a real
PostgreSQL primary, a streaming standby of its own behind a link the test can
silence, and a movable address every client connects to. The standby first
replays everything (a condition on its WAL position), then its link goes
silent, so that the next edit commits on the primary alone, as it does when
an asynchronous standby lags; ``Schedules`` acknowledges it. After the
failover (the primary dies, the standby is promoted, the address moves) a new
``Schedules`` on the same address sees the database the standby made:

* ``get`` returns the older definition, and ``log`` has no line of the lost
  edit;
* :func:`kept`, the check docs/schedules.md shows users (the history's line
  at the edit's revision, written at the edit's instant), says the edit is
  gone; the revision alone is not enough, since the next edit takes the lost
  one's number;
* an edit whose own transaction waits for a synchronous standby
  (``SET LOCAL synchronous_commit = on`` through ``connection=``) survives
  the same failover, while the edit after it, which did not wait, is lost.

docs/guarantees.md ("Stored schedules: edits while beat runs") and
docs/schedules.md ("An edit lost with a failover") name this file.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from datetime import timedelta

import pytest
from conftest import IN_CI, direct_engine
from harness import ROOT, wait_for

sys.path.insert(0, str(ROOT / "benchmarks"))

from failover import FailoverPair

from celery_singlebeat import Schedules, StoredEntry
from celery_singlebeat.timeline.clock import datetime_to_us

NAME = "report"
EVERY = timedelta(seconds=60)


@pytest.fixture
def pair() -> Iterator[FailoverPair]:
    """An asynchronous primary and standby of the test's own (no lag: the
    test silences the link when it wants the standby behind). No PostgreSQL
    binaries here: a skip locally, a failure under CI=true."""
    pair = FailoverPair("async", lag=0.0)
    try:
        pair.start()
    except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
        pair.close()
        message = f"no PostgreSQL primary with a streaming standby: {exc}"
        if IN_CI:
            pytest.fail(f"{message} (CI=true: a missing binary is a failure)")
        pytest.skip(message)
    try:
        yield pair
    finally:
        pair.close()


def caught_up(pair: FailoverPair) -> None:
    """Wait until the standby has replayed every WAL record the primary wrote."""
    primary, standby = pair.primary, pair.standby
    assert primary is not None and standby is not None
    lsn = str(primary.one("SELECT pg_current_wal_lsn()"))
    wait_for(
        lambda: standby.query("SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn", (lsn,))[0][0],
        30,
        f"the standby to replay the primary's WAL up to {lsn}",
        interval=0.05,
    )


def kept(schedules: Schedules, edit: StoredEntry) -> bool:
    """Whether the database still has the write that returned ``edit``: the
    history's line at its revision, written at its instant (docs/schedules.md,
    "An edit lost with a failover", shows users this check)."""
    assert edit.revision is not None and edit.updated is not None
    at_us = datetime_to_us(edit.updated)
    return any(
        row.revision == edit.revision and row.at_us == at_us for row in schedules.log(edit.name)
    )


@pytest.mark.slow
def test_an_acknowledged_edit_lost_with_a_failover_to_an_async_standby_is_gone_from_get_and_log(
    pair: FailoverPair, table_prefix: str
) -> None:
    with Schedules(pair.url, by="alice", table_prefix=table_prefix) as editor:
        v1 = editor.upsert(NAME, "reports.nightly", EVERY, kwargs={"v": 1}, why="v1")
        caught_up(pair)
        assert pair.link is not None
        pair.link.blackhole()  # the standby hears nothing more
        v2 = editor.update(NAME, kwargs={"v": 2}, why="v2")
        # acknowledged: committed on the primary, and the API said so
        assert v2.kwargs == {"v": 2} and v2.revision is not None and v1.revision is not None
        assert v2.revision > v1.revision
        assert editor.get(NAME).kwargs == {"v": 2} and kept(editor, v2)

    record = pair.failover()
    assert record.behind_bytes > 0, record  # the standby lacked the tail

    with Schedules(pair.url, by="alice", table_prefix=table_prefix) as after:
        entry = after.get(NAME)
        assert (entry.kwargs, entry.revision, entry.updated) == ({"v": 1}, v1.revision, v1.updated)
        log = after.log(NAME)
        assert [(row.revision, row.why) for row in log] == [(v1.revision, "v1")]
        # what a user checks with the entry the edit returned
        assert kept(after, v1) and not kept(after, v2)

        # The next edit takes the lost one's revision number (the promoted
        # database's counter never counted it): the number alone would say
        # the lost edit was kept, the instant tells them apart.
        v3 = after.update(NAME, kwargs={"v": 3}, why="v3")
        assert v3.revision == v2.revision
        assert [row.why for row in after.log(NAME)] == ["v3", "v1"]
        assert kept(after, v3) and not kept(after, v2)


@pytest.mark.slow
def test_an_edit_whose_transaction_waits_for_a_synchronous_standby_survives_the_failover(
    pair: FailoverPair, table_prefix: str
) -> None:
    """``synchronous_standby_names`` set, ``synchronous_commit = local`` for
    the cluster (nothing else waits), ``SET LOCAL synchronous_commit = on``
    in the edit's own transaction (``connection=``): that edit returns once
    the standby has flushed it. The edit after it, without, is lost."""
    primary = pair.primary
    assert primary is not None
    primary.query("ALTER SYSTEM SET synchronous_standby_names = '*'")
    primary.query("ALTER SYSTEM SET synchronous_commit = 'local'")
    primary.query("SELECT pg_reload_conf()")
    wait_for(
        lambda: primary.query("SELECT 1 FROM pg_stat_replication WHERE sync_state = 'sync'"),
        30,
        "the standby to be the primary's synchronous standby",
        interval=0.1,
    )
    engine = direct_engine(pair.url)
    try:
        with Schedules(pair.url, by="alice", table_prefix=table_prefix) as editor:
            editor.upsert(NAME, "reports.nightly", EVERY, kwargs={"v": 1}, why="v1")
            with engine.begin() as conn:
                conn.exec_driver_sql("SET LOCAL synchronous_commit = on")
                v2 = editor.update(NAME, kwargs={"v": 2}, why="v2", connection=conn)
            assert pair.link is not None
            pair.link.blackhole()
            # the cluster's default: returns without the standby
            v3 = editor.update(NAME, kwargs={"v": 3}, why="v3")
            assert v3.revision is not None and v2.revision is not None
            assert v3.revision > v2.revision
    finally:
        engine.dispose()

    record = pair.failover()
    assert record.behind_bytes > 0, record

    with Schedules(pair.url, table_prefix=table_prefix) as after:
        entry = after.get(NAME)
        assert (entry.kwargs, entry.revision) == ({"v": 2}, v2.revision)
        assert [row.why for row in after.log(NAME)] == ["v2", "v1"]
        assert kept(after, v2) and not kept(after, v3)
