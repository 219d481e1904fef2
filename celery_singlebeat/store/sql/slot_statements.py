"""The SQL of the beat's slots (``slots.py``), per dialect.

Register entries, claim due slots, confirm them sent, write them again after
a failover, release them, take abandoned ones over, prune old rows, and read
who owned recent ones. A claim and a takeover refuse in SQL what is paused
(``{p}``), early, at or below the high-water mark, or proposed under a stored
definition that was replaced since: no replica is trusted to check. Table
names: ``{e}`` entries, ``{s}`` slots, ``{m}`` meta, ``{k}`` catalog rows,
``{p}`` pauses, ``{d}`` schedules, ``{l}`` the schedule log, ``{u}``
SingletonTask's run rows (a takeover also sends again a sent slot whose run
stalled, :meth:`.SlotStore.take_over`).

``:slots`` is one JSON parameter (``dialect.py`` says why): ``[[entry,
slot_us, fence], ...]``, or for a claim ``[[entry, slot_us, revision,
written_us], ...]``.
"""

from __future__ import annotations

from dataclasses import dataclass

from .dialect import (
    CONTROLS,
    LITE_NOW,
    MY_CONTROLS,
    MY_NOW,
    PG_NOW,
    family_of,
    render,
)


@dataclass(frozen=True)
class SlotDialect:
    """Statement texts of the slots for one database family."""

    #: True when claim/take_over return rows directly (RETURNING); False when a
    #: second statement reads the rows marked with the batch id (MySQL).
    returning: bool
    register_insert: str
    register_select: str
    claim: str
    take_over: str
    #: MySQL only (its take_over is one single-table UPDATE, which can join
    #: nothing): the stalled slots (:func:`_stalled`), marked with the same
    #: ``:batch``; "" where ``take_over`` takes both kinds in one statement
    take_over_stalled: str
    confirm: str
    #: insert ``:slots`` as sent by ``:owner`` where missing, mark them sent where
    #: still claimed by ``:owner`` at that fence (Store.reassert); MySQL marks
    #: the rows it wrote with ``:batch`` and reads them with ``select_batch``
    reassert: str
    select_batch: str
    release: str
    prune_turn: str
    prune_mark: str
    prune_delete: str
    recent_owners: str


#: the tables the placeholders of these statements name
TABLES = {
    "e": "entries",
    "s": "slots",
    "m": "meta",
    "k": "catalog",
    "p": "pauses",
    "d": "schedules",
    "l": "schedule_log",
    "u": "runs",
}


def _paused(entry: str, now: str) -> str:
    """True when ``entry`` (an SQL expression) is paused at ``now``: its own
    pause or the pause of every entry ("*"), either without end or ending later."""
    return f"""EXISTS (SELECT 1 FROM {{p}} p WHERE p.entry IN ({entry}, '*')
                   AND (p.until_us IS NULL OR p.until_us > {now}))"""


def _stored(entry: str) -> str:
    """True when ``entry`` is an enabled stored entry: every replica that
    follows the stored schedules has it (they are in no catalog), so any may
    take its run-now request (a replica that does not follow them leaves the
    slot to the others, as an entry it does not have)."""
    return f"""EXISTS (SELECT 1 FROM {{d}} d WHERE d.name = {entry}
                       AND d.deleted = 0 AND d.enabled = 1)"""


def _stale(entry: str, revision: str, written: str, latest: str) -> str:
    """True when ``entry`` is a stored entry proposed under the write
    ``revision`` made at ``written`` (SQL expressions; revision 0 for an entry
    of no stored schedule) and its row says the definition was replaced more
    than ``:stale_us`` before ``latest``: edited to another revision,
    disabled or deleted (a tombstone has its own revision), or written again
    under the same number by a promoted standby that lacked the write (so the
    row's instant differs).
    ``latest`` is the later of the database's now and the slot's instant: a
    slot may be claimed up to EARLY_TOLERANCE_US before its instant, and no
    slot whose instant is more than ``:stale_us`` after the replacement may
    go out under the replaced definition. The replacement is the first write
    after the claimer's, which need not be the row's last: the history says
    when each came (a replica paused through an edit and a delete claimed,
    as it woke, under the first definition while the row held a write a few
    ms old: the chaos run, issue 30). The row's own instant still counts for
    a history the prune has emptied."""
    return f"""({revision} > 0 AND EXISTS (SELECT 1 FROM {{d}} d WHERE d.name = {entry}
                   AND (d.revision <> {revision} OR d.updated_us <> {written})
                   AND (d.updated_us + :stale_us < {latest}
                        OR EXISTS (SELECT 1 FROM {{l}} l WHERE l.name = d.name
                                   AND l.at_us > {written}
                                   AND l.at_us + :stale_us < {latest}))))"""


def _unseen(entry: str, latest: str) -> str:
    """True when ``entry`` is a stored entry with a write the taker has not
    read (a revision above ``:seen``, the revision it has read the stored
    schedules up to; ``:seen`` < 0 when it follows none: nothing is refused)
    made more than ``:stale_us`` before ``latest`` (SQL: the later of now and
    the slot's instant). The first unread write counts, from the history;
    the row's own instant too, for a history the prune has emptied.
    :meth:`.SlotStore.take_over` says why."""
    return f"""(:seen >= 0 AND EXISTS (SELECT 1 FROM {{d}} d WHERE d.name = {entry}
                   AND d.revision > :seen
                   AND (d.updated_us + :stale_us < {latest}
                        OR EXISTS (SELECT 1 FROM {{l}} l WHERE l.name = d.name
                                   AND l.revision > :seen
                                   AND l.at_us + :stale_us < {latest}))))"""


def _stalled(now: str) -> str:
    """The conditions (over run row ``r`` and slot row ``s``) of a sent slot
    whose SingletonTask run stalled: the run still running, its expiry lapsed
    more than the grace (``:lease_us``, the beat lease) ago but within the
    retention (``:window_us``; an expiry of 0 is a run abandoned for a retry,
    whose message is on its way: below the window, never taken), started at
    most ``:resends`` times (the cap), and the slot sent, last handed over
    more than the grace ago (a slot sent again waits that long for a worker to
    start it), within the retention, of an entry not paused. The search starts
    from the run rows: ``ix_<prefix>runs_open`` (state, expires_us) bounds it to
    the runs that lapsed in the window, a handful, whatever the tables hold."""
    return f"""r.state = 0 AND r.attempts <= :resends
              AND r.expires_us > {now} - :window_us AND r.expires_us < {now} - :lease_us
              AND s.entry = r.entry AND s.slot_us = r.slot_us
              AND s.state = 1 AND s.claimed_us < {now} - :lease_us
              AND s.slot_us > {now} - :window_us
              AND NOT {_paused("s.entry", now)}"""


_PG_SLOTS = """(SELECT v ->> 0 AS entry, CAST(v ->> 1 AS BIGINT) AS slot_us,
                       CAST(v ->> 2 AS BIGINT) AS fence
                FROM jsonb_array_elements(CAST(:slots AS jsonb)) AS j(v)) c"""

#: the claim's slots: each with the write it is proposed under (Store.claim)
_PG_CLAIM_SLOTS = """(SELECT v ->> 0 AS entry, CAST(v ->> 1 AS BIGINT) AS slot_us,
                       CAST(v ->> 2 AS BIGINT) AS revision, CAST(v ->> 3 AS BIGINT) AS written_us
                FROM jsonb_array_elements(CAST(:slots AS jsonb)) AS j(v)) c"""

POSTGRESQL = SlotDialect(
    returning=True,
    register_insert=f"""
        WITH n AS MATERIALIZED (SELECT {PG_NOW} AS us)
        INSERT INTO {{e}} (name, anchor_us, registered_by)
        SELECT c.name, n.us, :owner
        FROM jsonb_array_elements_text(CAST(:names AS jsonb)) AS c(name) CROSS JOIN n
        ORDER BY c.name
        ON CONFLICT (name) DO NOTHING""",
    register_select=f"""
        WITH n AS MATERIALIZED (SELECT {PG_NOW} AS us)
        SELECT n.us, e.name, e.anchor_us,
               GREATEST(e.last_slot_us,
                        (SELECT max(s.slot_us) FROM {{s}} s WHERE s.entry = e.name))
        FROM n LEFT JOIN (
            {{e}} e JOIN jsonb_array_elements_text(CAST(:names AS jsonb)) AS c(name)
            ON c.name = e.name
        ) ON true""",
    claim=f"""
        WITH n AS MATERIALIZED (SELECT {PG_NOW} AS us, {CONTROLS} AS cv),
        won AS (
            INSERT INTO {{s}} AS s (entry, slot_us, state, owner, fence, lease_until_us, claimed_us)
            SELECT DISTINCT c.entry, c.slot_us, 0, :owner, 1, n.us + :lease_us, n.us
            FROM {_PG_CLAIM_SLOTS}
            JOIN {{e}} e ON e.name = c.entry
            CROSS JOIN n
            WHERE c.slot_us > COALESCE(e.last_slot_us, -1) AND c.slot_us <= n.us + :early_us
              AND NOT {_paused("c.entry", "n.us")}
              AND NOT {_stale("c.entry", "c.revision", "c.written_us", "GREATEST(n.us, c.slot_us)")}
            ORDER BY c.entry, c.slot_us
            ON CONFLICT (entry, slot_us) DO UPDATE
                SET owner = EXCLUDED.owner, fence = s.fence + 1,
                    lease_until_us = EXCLUDED.lease_until_us, claimed_us = EXCLUDED.claimed_us
                WHERE s.state = 0
                  AND (s.lease_until_us < EXCLUDED.claimed_us OR s.owner = EXCLUDED.owner)
            RETURNING s.entry, s.slot_us, s.fence
        )
        SELECT n.us, won.entry, won.slot_us, won.fence, n.cv FROM n LEFT JOIN won ON true""",
    take_over=f"""
        WITH n AS MATERIALIZED (SELECT {PG_NOW} AS us),
        victims AS (
            SELECT s.entry, s.slot_us FROM {{s}} s
            WHERE s.state = 0 AND s.lease_until_us < (SELECT us FROM n)
              AND NOT {_paused("s.entry", "(SELECT us FROM n)")}
              AND (s.fence > 0 OR EXISTS (SELECT 1 FROM {{k}} k
                                          WHERE k.catalog = :catalog AND k.entry = s.entry)
                   OR {_stored("s.entry")})
              AND NOT {_unseen("s.entry", "GREATEST((SELECT us FROM n), s.slot_us)")}
            ORDER BY s.slot_us, s.entry
            LIMIT :limit
            FOR UPDATE OF s SKIP LOCKED
        ),
        stalled AS (
            SELECT s.entry, s.slot_us FROM {{u}} r, {{s}} s
            WHERE {_stalled("(SELECT us FROM n)")}
              AND NOT {_unseen("s.entry", "GREATEST((SELECT us FROM n), s.slot_us)")}
            ORDER BY s.slot_us, s.entry
            LIMIT :limit
            FOR UPDATE OF s SKIP LOCKED
        ),
        chosen AS (
            SELECT entry, slot_us FROM victims UNION ALL SELECT entry, slot_us FROM stalled
            ORDER BY slot_us, entry
            LIMIT :limit
        ),
        taken AS (
            UPDATE {{s}} s SET state = 0, owner = :owner, fence = s.fence + 1,
                lease_until_us = n.us + :lease_us, claimed_us = n.us
            FROM chosen, n
            WHERE s.entry = chosen.entry AND s.slot_us = chosen.slot_us
            RETURNING s.entry, s.slot_us, s.fence
        )
        SELECT n.us, taken.entry, taken.slot_us, taken.fence FROM n LEFT JOIN taken ON true""",
    take_over_stalled="",
    confirm=f"""
        WITH n AS MATERIALIZED (SELECT {PG_NOW} AS us),
        done AS (
            UPDATE {{s}} s SET state = 1, sent_us = COALESCE(s.sent_us, n.us)
            FROM {_PG_SLOTS}, n
            WHERE s.entry = c.entry AND s.slot_us = c.slot_us AND s.fence = c.fence
              AND s.owner = :owner
            RETURNING s.entry, s.slot_us, s.fence
        )
        SELECT n.us, done.entry, done.slot_us, done.fence FROM n LEFT JOIN done ON true""",
    reassert=f"""
        WITH n AS MATERIALIZED (SELECT {PG_NOW} AS us),
        again AS (
            INSERT INTO {{s}} AS s (entry, slot_us, state, owner, fence, lease_until_us,
                claimed_us, sent_us)
            SELECT c.entry, c.slot_us, 1, :owner, c.fence, 0, n.us, n.us
            FROM {_PG_SLOTS} CROSS JOIN n
            ON CONFLICT (entry, slot_us) DO UPDATE
                SET state = 1, sent_us = COALESCE(s.sent_us, EXCLUDED.sent_us)
                WHERE s.state = 0 AND s.owner = EXCLUDED.owner AND s.fence = EXCLUDED.fence
            RETURNING s.entry, s.slot_us, s.fence
        )
        SELECT n.us, again.entry, again.slot_us, again.fence FROM n LEFT JOIN again ON true""",
    select_batch="",
    release=f"""
        UPDATE {{s}} s SET lease_until_us = CASE WHEN :retry_us = 0 THEN 0
            ELSE {PG_NOW} + :retry_us END
        FROM {_PG_SLOTS}
        WHERE s.entry = c.entry AND s.slot_us = c.slot_us AND s.fence = c.fence
          AND s.owner = :owner AND s.state = 0""",
    prune_turn=f"""
        UPDATE {{m}} SET value_us = {PG_NOW} + :every_us
        WHERE key = 'prune' AND value_us <= {PG_NOW}""",
    prune_mark=f"""
        UPDATE {{e}} e SET last_slot_us = GREATEST(e.last_slot_us, m.mx)
        FROM (SELECT entry, max(slot_us) AS mx FROM {{s}}
              WHERE state = 1 AND slot_us < {PG_NOW} - :retention_us
              GROUP BY entry) m
        WHERE e.name = m.entry AND (e.last_slot_us IS NULL OR e.last_slot_us < m.mx)""",
    prune_delete=f"""
        DELETE FROM {{s}} s USING {{e}} e
        WHERE e.name = s.entry AND s.state = 1
          AND s.slot_us < {PG_NOW} - :retention_us AND s.slot_us <= e.last_slot_us""",
    recent_owners=f"""
        WITH n AS MATERIALIZED (SELECT {PG_NOW} AS us)
        SELECT n.us, o.owner FROM n LEFT JOIN (
            SELECT DISTINCT s.owner FROM {{s}} s, n WHERE s.slot_us > n.us - :window_us
        ) o ON true""",
)

_MY_SLOTS = """JSON_TABLE(:slots, '$[*]' COLUMNS (
                entry VARCHAR(255) CHARACTER SET utf8mb4 PATH '$[0]',
                slot_us BIGINT PATH '$[1]',
                fence BIGINT PATH '$[2]')) c"""


MYSQL = SlotDialect(
    returning=False,
    register_insert=f"""
        INSERT INTO {{e}} (name, anchor_us, registered_by)
        SELECT c.name, {MY_NOW}, :owner
        FROM JSON_TABLE(:names, '$[*]' COLUMNS (
            name VARCHAR(255) CHARACTER SET utf8mb4 PATH '$')) c
        ORDER BY c.name
        ON DUPLICATE KEY UPDATE name = {{e}}.name""",
    register_select=f"""
        SELECT {MY_NOW}, e.name, e.anchor_us,
               GREATEST(COALESCE(e.last_slot_us, -1),
                        COALESCE((SELECT max(s.slot_us) FROM {{s}} s WHERE s.entry = e.name), -1))
        FROM (SELECT 1 AS one) d LEFT JOIN (
            {{e}} e JOIN JSON_TABLE(:names, '$[*]' COLUMNS (
                name VARCHAR(255) CHARACTER SET utf8mb4 PATH '$')) c
            ON c.name COLLATE utf8mb4_bin = e.name
        ) ON true""",
    claim=f"""
        INSERT INTO {{s}} (entry, slot_us, state, owner, fence, lease_until_us, claimed_us, batch)
        SELECT DISTINCT c.entry, c.slot_us, 0, :owner, 1, {MY_NOW} + :lease_us, {MY_NOW}, :batch
        FROM JSON_TABLE(:slots, '$[*]' COLUMNS (
                entry VARCHAR(255) CHARACTER SET utf8mb4 PATH '$[0]',
                slot_us BIGINT PATH '$[1]',
                revision BIGINT PATH '$[2]',
                written_us BIGINT PATH '$[3]')) c
        JOIN {{e}} e ON e.name = c.entry COLLATE utf8mb4_bin
        WHERE c.slot_us > COALESCE(e.last_slot_us, -1)
          AND c.slot_us <= {MY_NOW} + :early_us
          AND NOT {_paused("c.entry COLLATE utf8mb4_bin", MY_NOW)}
          AND NOT {
        _stale(
            "c.entry COLLATE utf8mb4_bin",
            "c.revision",
            "c.written_us",
            f"GREATEST({MY_NOW}, c.slot_us)",
        )
    }
        ORDER BY c.entry, c.slot_us
        ON DUPLICATE KEY UPDATE
            batch = IF(state = 0 AND (lease_until_us < VALUES(claimed_us) OR owner = VALUES(owner)),
                       VALUES(batch), batch),
            owner = IF(batch <=> VALUES(batch), VALUES(owner), owner),
            fence = IF(batch <=> VALUES(batch), fence + 1, fence),
            lease_until_us = IF(batch <=> VALUES(batch), VALUES(lease_until_us), lease_until_us),
            claimed_us = IF(batch <=> VALUES(batch), VALUES(claimed_us), claimed_us)""",
    take_over=f"""
        UPDATE {{s}} SET batch = :batch, owner = :owner, fence = fence + 1,
            lease_until_us = {MY_NOW} + :lease_us, claimed_us = {MY_NOW}
        WHERE state = 0 AND lease_until_us < {MY_NOW}
          AND NOT {_paused("{s}.entry", MY_NOW)}
          AND (fence > 0 OR EXISTS (SELECT 1 FROM {{k}} k
                                    WHERE k.catalog = :catalog AND k.entry = {{s}}.entry)
               OR {_stored("{s}.entry")})
          AND NOT {_unseen("{s}.entry", f"GREATEST({MY_NOW}, {{s}}.slot_us)")}
        ORDER BY slot_us, entry
        LIMIT :limit""",
    # A multi-table UPDATE takes no LIMIT: the derived table picks the oldest
    # (materialized, as its LIMIT requires, so it may read the slots it
    # updates), and the UPDATE checks again under the row lock what a
    # concurrent sweep may have changed since (it reads the latest version).
    take_over_stalled=f"""
        UPDATE {{s}} t JOIN (
            SELECT s.entry, s.slot_us FROM {{u}} r JOIN {{s}} s
            ON {_stalled(MY_NOW)}
            WHERE NOT {_unseen("s.entry", f"GREATEST({MY_NOW}, s.slot_us)")}
            ORDER BY s.slot_us, s.entry
            LIMIT :limit
        ) v ON t.entry = v.entry AND t.slot_us = v.slot_us
        SET t.batch = :batch, t.state = 0, t.owner = :owner, t.fence = t.fence + 1,
            t.lease_until_us = {MY_NOW} + :lease_us, t.claimed_us = {MY_NOW}
        WHERE t.state = 1 AND t.claimed_us < {MY_NOW} - :lease_us""",
    confirm=f"""
        UPDATE {{s}} s JOIN {_MY_SLOTS}
            ON s.entry = c.entry COLLATE utf8mb4_bin AND s.slot_us = c.slot_us
               AND s.fence = c.fence
        SET s.state = 1, s.sent_us = COALESCE(s.sent_us, {MY_NOW})
        WHERE s.owner = :owner""",
    # ON DUPLICATE KEY UPDATE assigns left to right, each seeing the ones before:
    # the batch is set first, on the condition, and the rest follow it
    reassert=f"""
        INSERT INTO {{s}} (entry, slot_us, state, owner, fence, lease_until_us, claimed_us,
            sent_us, batch)
        SELECT c.entry, c.slot_us, 1, :owner, c.fence, 0, {MY_NOW}, {MY_NOW}, :batch
        FROM {_MY_SLOTS}
        ON DUPLICATE KEY UPDATE
            batch = IF({{s}}.state = 0 AND {{s}}.owner = VALUES(owner)
                       AND {{s}}.fence = VALUES(fence), VALUES(batch), {{s}}.batch),
            sent_us = IF({{s}}.batch <=> VALUES(batch),
                         COALESCE({{s}}.sent_us, VALUES(sent_us)), {{s}}.sent_us),
            state = IF({{s}}.batch <=> VALUES(batch), 1, {{s}}.state)""",
    select_batch=f"""
        SELECT {MY_NOW}, s.entry, s.slot_us, s.fence, s.state, {MY_CONTROLS}
        FROM (SELECT 1 AS one) d LEFT JOIN {{s}} s ON s.batch = :batch AND s.owner = :owner""",
    release=f"""
        UPDATE {{s}} s JOIN {_MY_SLOTS}
            ON s.entry = c.entry COLLATE utf8mb4_bin AND s.slot_us = c.slot_us
               AND s.fence = c.fence
        SET s.lease_until_us = IF(:retry_us = 0, 0, {MY_NOW} + :retry_us)
        WHERE s.owner = :owner AND s.state = 0""",
    prune_turn=f"""
        UPDATE {{m}} SET value_us = {MY_NOW} + :every_us
        WHERE `key` = 'prune' AND value_us <= {MY_NOW}""",
    prune_mark=f"""
        UPDATE {{e}} e JOIN (
            SELECT entry, max(slot_us) AS mx FROM {{s}}
            WHERE state = 1 AND slot_us < {MY_NOW} - :retention_us GROUP BY entry
        ) m ON e.name = m.entry
        SET e.last_slot_us = GREATEST(COALESCE(e.last_slot_us, -1), m.mx)""",
    prune_delete=f"""
        DELETE s FROM {{s}} s JOIN {{e}} e ON e.name = s.entry
        WHERE s.state = 1 AND s.slot_us < {MY_NOW} - :retention_us
          AND s.slot_us <= e.last_slot_us""",
    recent_owners=f"""
        SELECT {MY_NOW}, o.owner FROM (SELECT 1 AS one) d LEFT JOIN (
            SELECT DISTINCT owner FROM {{s}} WHERE slot_us > {MY_NOW} - :window_us
        ) o ON true""",
)

SQLITE = SlotDialect(
    returning=True,
    register_insert=f"""
        INSERT INTO {{e}} (name, anchor_us, registered_by)
        SELECT c.value, {LITE_NOW}, :owner FROM json_each(:names) c WHERE true
        ON CONFLICT (name) DO NOTHING""",
    register_select=f"""
        SELECT {LITE_NOW}, e.name, e.anchor_us,
               max(COALESCE(e.last_slot_us, -1),
                   COALESCE((SELECT max(s.slot_us) FROM {{s}} s WHERE s.entry = e.name), -1))
        FROM (SELECT 1 AS one) d LEFT JOIN (
            {{e}} e JOIN json_each(:names) c ON c.value = e.name
        ) ON true""",
    claim=f"""
        INSERT INTO {{s}} AS s (entry, slot_us, state, owner, fence, lease_until_us, claimed_us)
        SELECT DISTINCT json_extract(c.value, '$[0]') AS entry,
               json_extract(c.value, '$[1]') AS slot_us,
               0, :owner, 1, {LITE_NOW} + :lease_us, {LITE_NOW}
        FROM json_each(:slots) c
        JOIN {{e}} e ON e.name = json_extract(c.value, '$[0]')
        WHERE json_extract(c.value, '$[1]') > COALESCE(e.last_slot_us, -1)
          AND json_extract(c.value, '$[1]') <= {LITE_NOW} + :early_us
          AND NOT {_paused("json_extract(c.value, '$[0]')", LITE_NOW)}
          AND NOT {
        _stale(
            "json_extract(c.value, '$[0]')",
            "json_extract(c.value, '$[2]')",
            "json_extract(c.value, '$[3]')",
            f"max({LITE_NOW}, json_extract(c.value, '$[1]'))",
        )
    }
        ORDER BY 1, 2
        ON CONFLICT (entry, slot_us) DO UPDATE
            SET owner = excluded.owner, fence = s.fence + 1,
                lease_until_us = excluded.lease_until_us, claimed_us = excluded.claimed_us
            WHERE s.state = 0
              AND (s.lease_until_us < excluded.claimed_us OR s.owner = excluded.owner)
        RETURNING {LITE_NOW}, entry, slot_us, fence, {CONTROLS}""",
    take_over=f"""
        UPDATE {{s}} SET state = 0, owner = :owner, fence = fence + 1,
            lease_until_us = {LITE_NOW} + :lease_us, claimed_us = {LITE_NOW}
        WHERE rowid IN (
            SELECT rid FROM (
                SELECT rowid AS rid, slot_us, entry FROM {{s}}
                WHERE state = 0 AND lease_until_us < {LITE_NOW}
                  AND NOT {_paused("{s}.entry", LITE_NOW)}
                  AND (fence > 0 OR EXISTS (SELECT 1 FROM {{k}} k
                                            WHERE k.catalog = :catalog AND k.entry = {{s}}.entry)
                       OR {_stored("{s}.entry")})
                  AND NOT {_unseen("{s}.entry", f"max({LITE_NOW}, {{s}}.slot_us)")}
                UNION ALL
                SELECT s.rowid, s.slot_us, s.entry FROM {{u}} r, {{s}} s
                WHERE {_stalled(LITE_NOW)}
                  AND NOT {_unseen("s.entry", f"max({LITE_NOW}, s.slot_us)")}
            ) ORDER BY slot_us, entry LIMIT :limit)
        RETURNING {LITE_NOW}, entry, slot_us, fence""",
    take_over_stalled="",
    confirm=f"""
        UPDATE {{s}} SET state = 1, sent_us = COALESCE(sent_us, {LITE_NOW})
        WHERE owner = :owner AND (entry, slot_us, fence) IN (
            SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]'),
                   json_extract(value, '$[2]') FROM json_each(:slots))
        RETURNING {LITE_NOW}, entry, slot_us, fence""",
    reassert=f"""
        INSERT INTO {{s}} AS s (entry, slot_us, state, owner, fence, lease_until_us,
            claimed_us, sent_us)
        SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]'), 1, :owner,
            json_extract(value, '$[2]'), 0, {LITE_NOW}, {LITE_NOW}
        FROM json_each(:slots) WHERE true
        ON CONFLICT (entry, slot_us) DO UPDATE
            SET state = 1, sent_us = COALESCE(s.sent_us, excluded.sent_us)
            WHERE s.state = 0 AND s.owner = excluded.owner AND s.fence = excluded.fence
        RETURNING {LITE_NOW}, entry, slot_us, fence""",
    select_batch="",
    release=f"""
        UPDATE {{s}} SET lease_until_us = CASE WHEN :retry_us = 0 THEN 0
            ELSE {LITE_NOW} + :retry_us END
        WHERE owner = :owner AND state = 0 AND (entry, slot_us, fence) IN (
            SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]'),
                   json_extract(value, '$[2]') FROM json_each(:slots))""",
    prune_turn=f"""
        UPDATE {{m}} SET value_us = {LITE_NOW} + :every_us
        WHERE key = 'prune' AND value_us <= {LITE_NOW}""",
    prune_mark=f"""
        UPDATE {{e}} SET last_slot_us = (
            SELECT max(COALESCE({{e}}.last_slot_us, -1), max(s.slot_us)) FROM {{s}} s
            WHERE s.entry = {{e}}.name AND s.state = 1
              AND s.slot_us < {LITE_NOW} - :retention_us)
        WHERE EXISTS (SELECT 1 FROM {{s}} s WHERE s.entry = {{e}}.name AND s.state = 1
                      AND s.slot_us < {LITE_NOW} - :retention_us)""",
    prune_delete=f"""
        DELETE FROM {{s}} WHERE state = 1 AND slot_us < {LITE_NOW} - :retention_us
          AND slot_us <= (SELECT e.last_slot_us FROM {{e}} e WHERE e.name = {{s}}.entry)""",
    recent_owners=f"""
        SELECT {LITE_NOW}, o.owner FROM (SELECT 1 AS one) d LEFT JOIN (
            SELECT DISTINCT owner FROM {{s}} WHERE slot_us > {LITE_NOW} - :window_us
        ) o ON true""",
)


def slot_dialect_for(backend: str, prefix: str) -> SlotDialect:
    """The statements for an SQLAlchemy backend name, with table names filled in."""
    family = {"postgresql": POSTGRESQL, "mysql": MYSQL, "sqlite": SQLITE}[family_of(backend)]
    return render(family, prefix, TABLES)
