"""A replica cut off from the database for longer than the others' retention.

While it is away the others' periodic prune deletes its replica row and the
catalog no other replica names (``Store.prune_fleet``): from then on, run-now
and pause of its entries are refused ("no live replica's catalog lists it").
When it reconnects it writes both again, so the operators' controls work as
soon as it is back (issue 23: before, it wrote its catalog once per process
and the refusals lasted until it restarted).

Real ``celery beat`` through a TCP proxy to PostgreSQL; the prune is the one
the other replicas run, called with a retention shorter than the cut.
"""

from __future__ import annotations

import time

import pytest
from fleet_rows import FleetRows
from harness import US, Rig, wait_connected, wait_for
from sqlalchemy.engine import make_url

from celery_singlebeat.exceptions import ControlError
from celery_singlebeat.store.sql.operator import Operator

RARE = "rare-0"
#: the retention the others prune with: shorter than the cut below
RETENTION_S = 2.0
CUT_S = RETENTION_S + 2.0


def _refused(operator: Operator, entry: str) -> str | None:
    """None when a run-now of ``entry`` is accepted, else the refusal."""
    try:
        operator.run_now(entry, by="test", reason="issue 23")
    except ControlError as exc:
        return str(exc)
    return None


@pytest.mark.slow
@pytest.mark.postgres
@pytest.mark.redis
def test_a_replica_cut_off_past_the_retention_writes_its_rows_again(
    rig: Rig, pg_url: str, redis_url: str, table_prefix: str
) -> None:
    pg = make_url(pg_url)
    proxy = rig.proxy((pg.host or "127.0.0.1", pg.port or 5432))
    proxied = pg.set(host="127.0.0.1", port=proxy.port).render_as_string(hide_password=False)
    reader, _db, env = rig.fleet(
        f"{redis_url}/5", pg_url, table_prefix, beats_url=proxied, SB_ENTRIES="1", SB_RARE="1"
    )
    beat = rig.start_beat(env, "cut")
    wait_connected([beat])
    rows = FleetRows(pg_url, table_prefix)
    try:
        operator = Operator(rows.store)
        replica = wait_for(beat.replica_id, 10, "the replica's id in its log")
        wait_for(
            lambda: [r.id for r in operator.status().replicas if r.state == "live"] == [replica],
            15,
            "the replica's heartbeat",
            interval=0.2,
        )

        proxy.cut()
        wait_for(lambda: beat.lines("unreachable"), 20, "the replica to notice the cut")
        cut_at = time.monotonic()
        pruned = wait_for(
            lambda: (
                time.monotonic() - cut_at >= CUT_S
                and (report := operator.prune_fleet(int(RETENTION_S * US))).replicas == 1
                and report
            ),
            CUT_S + 10,
            "the others' prune to delete the cut-off replica's row",
            interval=0.2,
        )
        assert pruned.catalog == 2, pruned  # probe-0 and rare-0: its catalog is gone
        assert operator.status().replicas == []
        refusal = _refused(operator, RARE)
        assert refusal is not None and "no live replica has the entry" in refusal, refusal

        restored_at = time.monotonic()
        proxy.restore()
        wait_for(lambda: beat.lines("reachable again"), 10, "the replica to reconnect")
        # Its catalog and row again within its first tick back: run-now accepted,
        # and the run sent (a sweep takes the request).
        wait_for(
            lambda: _refused(operator, RARE) is None, 5, "run-now to be accepted", interval=0.1
        )
        accepted_after = time.monotonic() - restored_at
        wait_for(
            lambda: [m for m in reader.messages() if m.entry == RARE],
            20,
            "the run-now request to be sent",
            interval=0.2,
        )
        [row] = [r for r in operator.status().replicas if r.id == replica]
        assert row.state == "live", row
        print(f"cut off {CUT_S:g}s, pruned; run-now accepted {accepted_after:.2f}s after restore")
    finally:
        rows.close(drop=False)  # the rig drops the tables
