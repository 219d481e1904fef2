"""The SQL statements of SingletonTask's keys and runs, per dialect.

Kept apart from the beat's statements (``slot_statements.py``,
``fleet_statements.py``): the sets share only the database clock expression
(``dialect.py``). ``{l}``/``{r}``/``{m}`` are the
locks, runs and meta table names; ``{now}`` is the database's clock in
microseconds, read once per statement so that every comparison in a statement
uses one instant.

PostgreSQL answers every operation in one statement (data-modifying CTEs
with RETURNING), plus a read of the holder when an acquisition lost the key
to a concurrent one; SQLite in one, plus a read when an acquisition finds the
key busy; MySQL/MariaDB, which lack RETURNING, write then read the row back.
"""

from __future__ import annotations

from dataclasses import dataclass

from .dialect import LITE_NOW, MY_NOW, PG_NOW, family_of, render


@dataclass(frozen=True)
class LeaseDialect:
    """Statement texts for one database family."""

    #: True: acquire/renew/begin_run return rows directly (RETURNING).
    returning: bool
    acquire: str
    #: reads a key's row (MySQL: after acquire; others: who holds a busy key
    #: when the acquire's answer could not tell).
    lease_row: str
    renew: str
    release: str
    holds: str
    begin_run: str
    #: reads a run row back (MySQL, after begin_run).
    run_row: str
    renew_run: str
    finish_run: str
    abandon_run: str
    prune_runs: str
    prune_locks: str
    prune_turn: str
    #: a run row written again after a failover (Store.reassert_runs): inserted
    #: only when missing, then finished when it still runs under the same run_id
    reinsert_run: str
    refinish_run: str
    #: the retake of an expired row written again (Store.reassert_runs)
    retake_run: str = ""
    #: begin_run + acquire in one statement ("": the store makes two calls)
    begin_slot: str = ""
    #: finish_run/abandon_run + release in one statement ("": two calls)
    end_slot: str = ""


#: the tables the placeholders of these statements name
TABLES = {"l": "locks", "r": "runs", "m": "meta"}


# A running row whose expiry passed may be retaken (its worker died).
_PG_TAKE = "(r.state = 0 AND r.expires_us < EXCLUDED.started_us)"

_PG_LEASE_UPSERT = """
            INSERT INTO {{l}} AS l (name, token, owner, grant_id, expires_us, acquired_us)
            SELECT :key, n.us, :owner, :grant, n.us + :ttl_us, n.us FROM n {where}
            ON CONFLICT (name) DO UPDATE
                SET token = GREATEST(l.token + 1, EXCLUDED.acquired_us),
                    owner = EXCLUDED.owner, grant_id = EXCLUDED.grant_id,
                    expires_us = EXCLUDED.expires_us, acquired_us = EXCLUDED.acquired_us
                WHERE l.expires_us < EXCLUDED.acquired_us
            RETURNING l.token, l.expires_us"""

# the lease part of begin_slot runs only when the run part started the run
_PG_IF_STARTED = "WHERE EXISTS (SELECT 1 FROM up WHERE up.run_id = :run_id)"

_PG_RUN_UPSERT = f"""
            INSERT INTO {{r}} AS r (entry, slot_us, run_id, state, owner, task_id,
                                   expires_us, started_us, attempts, repeats)
            SELECT :entry, :slot_us, :run_id, 0, :owner, :task_id, n.us + :ttl_us, n.us, 1, 0
            FROM n
            ON CONFLICT (entry, slot_us) DO UPDATE SET
                run_id = CASE WHEN {_PG_TAKE} THEN EXCLUDED.run_id ELSE r.run_id END,
                owner = CASE WHEN {_PG_TAKE} THEN EXCLUDED.owner ELSE r.owner END,
                task_id = CASE WHEN {_PG_TAKE} THEN EXCLUDED.task_id ELSE r.task_id END,
                expires_us = CASE WHEN {_PG_TAKE} THEN EXCLUDED.expires_us
                                  ELSE r.expires_us END,
                started_us = CASE WHEN {_PG_TAKE} THEN EXCLUDED.started_us
                                  ELSE r.started_us END,
                attempts = CASE WHEN {_PG_TAKE} THEN r.attempts + 1 ELSE r.attempts END,
                repeats = CASE WHEN {_PG_TAKE} THEN r.repeats ELSE r.repeats + 1 END,
                last_repeat_us = CASE WHEN {_PG_TAKE} THEN r.last_repeat_us
                                      ELSE EXCLUDED.started_us END
            RETURNING r.run_id, r.state, r.owner, r.outcome"""

POSTGRESQL = LeaseDialect(
    returning=True,
    acquire=f"""
        WITH n AS MATERIALIZED (SELECT {{now}} AS us),
        got AS ({_PG_LEASE_UPSERT.format(where="")}
        )
        SELECT n.us, got.token, got.expires_us, cur.owner, cur.expires_us
        FROM n LEFT JOIN got ON true LEFT JOIN {{l}} cur ON cur.name = :key""",
    # cur above is the row as the statement's snapshot saw it: when a concurrent
    # acquirer won meanwhile, it is missing or free, and the holder is read here
    lease_row="""
        SELECT {now}, l.token, l.expires_us, l.owner, l.grant_id
        FROM (SELECT 1 AS one) d LEFT JOIN {l} l ON l.name = :key""",
    renew="""
        WITH n AS MATERIALIZED (SELECT {now} AS us),
        r AS (
            UPDATE {l} l SET expires_us = n.us + :ttl_us FROM n
            WHERE l.name = :key AND l.token = :token AND l.expires_us > 0
            RETURNING l.expires_us
        )
        SELECT n.us, r.expires_us FROM n LEFT JOIN r ON true""",
    release="""
        UPDATE {l} SET expires_us = 0
        WHERE name = :key AND token = :token AND expires_us > 0""",
    holds="""
        WITH n AS MATERIALIZED (SELECT {now} AS us)
        SELECT n.us, (SELECT count(*) FROM {l} l
                      WHERE l.name = :key AND l.token = :token AND l.expires_us > n.us)
        FROM n""",
    begin_run=f"""
        WITH n AS MATERIALIZED (SELECT {{now}} AS us),
        up AS ({_PG_RUN_UPSERT}
        )
        SELECT n.us, up.run_id, up.state, up.owner, up.outcome FROM n LEFT JOIN up ON true""",
    run_row="",
    renew_run="""
        UPDATE {r} SET expires_us = {now} + :ttl_us
        WHERE entry = :entry AND slot_us = :slot_us AND run_id = :run_id AND state = 0""",
    finish_run="""
        UPDATE {r} SET state = 1, finished_us = {now}, outcome = :outcome
        WHERE entry = :entry AND slot_us = :slot_us AND run_id = :run_id AND state = 0""",
    # attempts first (MySQL assigns left to right): a start whose body did not
    # run (the key busy, the database lost) takes back its count, once
    abandon_run="""
        UPDATE {r} SET attempts = CASE WHEN expires_us > 0 THEN attempts - :unrun
                                       ELSE attempts END,
                       expires_us = 0
        WHERE entry = :entry AND slot_us = :slot_us AND run_id = :run_id AND state = 0""",
    prune_runs="""
        DELETE FROM {r}
        WHERE (state = 1 AND finished_us < {now} - :retention_us)
           OR (state = 0 AND expires_us < {now} AND started_us < {now} - :retention_us)""",
    # the token, not only acquired_us: hand-overs within one microsecond (or a
    # clock stepped back) leave it ahead of the clock, and a row must not go
    # until the next acquisition's now is sure to exceed it
    prune_locks="""
        DELETE FROM {l}
        WHERE expires_us < {now} AND acquired_us < {now} - :retention_us
          AND token < {now} - :retention_us""",
    prune_turn="""
        UPDATE {m} SET value_us = {now} + :every_us
        WHERE key = 'prune_singletons' AND value_us <= {now}""",
    reinsert_run="""
        INSERT INTO {r} (entry, slot_us, run_id, state, owner, task_id, expires_us,
                         started_us, finished_us, outcome, attempts, repeats)
        VALUES (:entry, :slot_us, :run_id, :state, :owner, :task_id, :expires_us,
                :started_us, :finished_us, :outcome, 1, 0)
        ON CONFLICT (entry, slot_us) DO NOTHING""",
    refinish_run="""
        UPDATE {r} SET state = 1, finished_us = :finished_us, outcome = :outcome
        WHERE entry = :entry AND slot_us = :slot_us AND run_id = :run_id AND state = 0""",
    # the row as it was before the record's start retook it: another run,
    # still running, expired before that start (what begin_run retakes)
    retake_run="""
        UPDATE {r} SET attempts = attempts + 1, run_id = :run_id, state = :state,
                       owner = :owner, task_id = :task_id, expires_us = :expires_us,
                       started_us = :started_us, finished_us = :finished_us,
                       outcome = :outcome
        WHERE entry = :entry AND slot_us = :slot_us AND state = 0 AND run_id <> :run_id
          AND started_us < :started_us AND expires_us < :started_us""",
    # the lease is taken only when this call started the run (a repeat takes
    # nothing); cur, as in acquire, is the key's row as the snapshot saw it
    begin_slot=f"""
        WITH n AS MATERIALIZED (SELECT {{now}} AS us),
        up AS ({_PG_RUN_UPSERT}
        ),
        got AS ({_PG_LEASE_UPSERT.format(where=_PG_IF_STARTED)}
        )
        SELECT n.us, up.run_id, up.state, up.owner, up.outcome,
               got.token, got.expires_us, cur.owner, cur.expires_us
        FROM n LEFT JOIN up ON true LEFT JOIN got ON true
        LEFT JOIN {{l}} cur ON cur.name = :key""",
    end_slot="""
        WITH n AS MATERIALIZED (SELECT {now} AS us),
        fin AS (
            UPDATE {r} r SET state = CASE WHEN :abandon THEN 0 ELSE 1 END,
                finished_us = CASE WHEN :abandon THEN r.finished_us ELSE n.us END,
                outcome = CASE WHEN :abandon THEN r.outcome ELSE :outcome END,
                expires_us = CASE WHEN :abandon THEN 0 ELSE r.expires_us END
            FROM n
            WHERE r.entry = :entry AND r.slot_us = :slot_us AND r.run_id = :run_id
              AND r.state = 0
            RETURNING 1 AS done
        ),
        rel AS (
            UPDATE {l} l SET expires_us = 0
            WHERE l.name = :key AND l.token = :token AND l.expires_us > 0
            RETURNING 1 AS done
        )
        SELECT n.us, (SELECT count(*) FROM fin), (SELECT count(*) FROM rel) FROM n""",
)

# MySQL evaluates ON DUPLICATE KEY UPDATE assignments left to right, each
# seeing the ones before: the marker column (grant_id, run_id) is set first
# from the old row, and the other columns follow the marker.
MYSQL = LeaseDialect(
    returning=False,
    acquire="""
        INSERT INTO {l} (name, token, owner, grant_id, expires_us, acquired_us)
        VALUES (:key, {now}, :owner, :grant, {now} + :ttl_us, {now})
        ON DUPLICATE KEY UPDATE
            grant_id = IF(expires_us < VALUES(acquired_us), VALUES(grant_id), grant_id),
            token = IF(grant_id = VALUES(grant_id), GREATEST(token + 1, VALUES(acquired_us)),
                       token),
            owner = IF(grant_id = VALUES(grant_id), VALUES(owner), owner),
            expires_us = IF(grant_id = VALUES(grant_id), VALUES(expires_us), expires_us),
            acquired_us = IF(grant_id = VALUES(grant_id), VALUES(acquired_us), acquired_us)""",
    lease_row=POSTGRESQL.lease_row,
    renew="""
        UPDATE {l} SET expires_us = {now} + :ttl_us
        WHERE name = :key AND token = :token AND expires_us > 0""",
    release="""
        UPDATE {l} SET expires_us = 0
        WHERE name = :key AND token = :token AND expires_us > 0""",
    holds="""
        SELECT {now}, (SELECT count(*) FROM {l} l
                       WHERE l.name = :key AND l.token = :token AND l.expires_us > {now})""",
    begin_run="""
        INSERT INTO {r} (entry, slot_us, run_id, state, owner, task_id,
                         expires_us, started_us, attempts, repeats)
        VALUES (:entry, :slot_us, :run_id, 0, :owner, :task_id, {now} + :ttl_us, {now}, 1, 0)
        ON DUPLICATE KEY UPDATE
            repeats = IF(state = 0 AND expires_us < VALUES(started_us), repeats, repeats + 1),
            last_repeat_us = IF(state = 0 AND expires_us < VALUES(started_us), last_repeat_us,
                                VALUES(started_us)),
            run_id = IF(state = 0 AND expires_us < VALUES(started_us), VALUES(run_id), run_id),
            owner = IF(run_id = VALUES(run_id), VALUES(owner), owner),
            task_id = IF(run_id = VALUES(run_id), VALUES(task_id), task_id),
            attempts = IF(run_id = VALUES(run_id), attempts + 1, attempts),
            started_us = IF(run_id = VALUES(run_id), VALUES(started_us), started_us),
            expires_us = IF(run_id = VALUES(run_id), VALUES(expires_us), expires_us)""",
    run_row="""
        SELECT {now}, r.run_id, r.state, r.owner, r.outcome
        FROM (SELECT 1 AS one) d
        LEFT JOIN {r} r ON r.entry = :entry AND r.slot_us = :slot_us""",
    renew_run=POSTGRESQL.renew_run,
    finish_run=POSTGRESQL.finish_run,
    abandon_run=POSTGRESQL.abandon_run,
    prune_runs=POSTGRESQL.prune_runs,
    prune_locks=POSTGRESQL.prune_locks,
    prune_turn="""
        UPDATE {m} SET value_us = {now} + :every_us
        WHERE `key` = 'prune_singletons' AND value_us <= {now}""",
    reinsert_run="""
        INSERT IGNORE INTO {r} (entry, slot_us, run_id, state, owner, task_id, expires_us,
                                started_us, finished_us, outcome, attempts, repeats)
        VALUES (:entry, :slot_us, :run_id, :state, :owner, :task_id, :expires_us,
                :started_us, :finished_us, :outcome, 1, 0)""",
    refinish_run=POSTGRESQL.refinish_run,
    retake_run=POSTGRESQL.retake_run,
)

_LITE_TAKE = "(state = 0 AND expires_us < excluded.started_us)"

SQLITE = LeaseDialect(
    returning=True,
    acquire="""
        INSERT INTO {l} AS l (name, token, owner, grant_id, expires_us, acquired_us)
        VALUES (:key, {now}, :owner, :grant, {now} + :ttl_us, {now})
        ON CONFLICT (name) DO UPDATE
            SET token = max(l.token + 1, excluded.acquired_us),
                owner = excluded.owner, grant_id = excluded.grant_id,
                expires_us = excluded.expires_us, acquired_us = excluded.acquired_us
            WHERE l.expires_us < excluded.acquired_us
        RETURNING {now}, token, expires_us, owner, expires_us""",
    lease_row=MYSQL.lease_row,
    renew="""
        UPDATE {l} SET expires_us = {now} + :ttl_us
        WHERE name = :key AND token = :token AND expires_us > 0
        RETURNING {now}, expires_us""",
    release=POSTGRESQL.release,
    holds=MYSQL.holds,
    begin_run=f"""
        INSERT INTO {{r}} (entry, slot_us, run_id, state, owner, task_id,
                          expires_us, started_us, attempts, repeats)
        VALUES (:entry, :slot_us, :run_id, 0, :owner, :task_id, {{now}} + :ttl_us, {{now}}, 1, 0)
        ON CONFLICT (entry, slot_us) DO UPDATE SET
            run_id = CASE WHEN {_LITE_TAKE} THEN excluded.run_id ELSE run_id END,
            owner = CASE WHEN {_LITE_TAKE} THEN excluded.owner ELSE owner END,
            task_id = CASE WHEN {_LITE_TAKE} THEN excluded.task_id ELSE task_id END,
            expires_us = CASE WHEN {_LITE_TAKE} THEN excluded.expires_us ELSE expires_us END,
            started_us = CASE WHEN {_LITE_TAKE} THEN excluded.started_us ELSE started_us END,
            attempts = CASE WHEN {_LITE_TAKE} THEN attempts + 1 ELSE attempts END,
            repeats = CASE WHEN {_LITE_TAKE} THEN repeats ELSE repeats + 1 END,
            last_repeat_us = CASE WHEN {_LITE_TAKE} THEN last_repeat_us
                                  ELSE excluded.started_us END
        RETURNING {{now}}, run_id, state, owner, outcome""",
    run_row=MYSQL.run_row,
    renew_run=POSTGRESQL.renew_run,
    finish_run=POSTGRESQL.finish_run,
    abandon_run=POSTGRESQL.abandon_run,
    prune_runs=POSTGRESQL.prune_runs,
    prune_locks=POSTGRESQL.prune_locks,
    prune_turn=POSTGRESQL.prune_turn,
    reinsert_run=POSTGRESQL.reinsert_run,
    refinish_run=POSTGRESQL.refinish_run,
    retake_run=POSTGRESQL.retake_run,
)

_FAMILIES = {
    "postgresql": (POSTGRESQL, PG_NOW),
    "mysql": (MYSQL, MY_NOW),
    "sqlite": (SQLITE, LITE_NOW),
}


def lease_dialect_for(backend: str, prefix: str) -> LeaseDialect:
    """The statements for an SQLAlchemy backend name, with table names filled in."""
    family, now = _FAMILIES[family_of(backend)]
    return render(family, prefix, TABLES, now=now)
