"""Every SQL statement of the store, per dialect, in one place.

Sets of slots travel as one JSON parameter (``[[entry, slot_us, fence], ...]``)
expanded by the database (``jsonb_to_recordset``, ``JSON_TABLE``,
``json_each``): the statement text stays constant whatever the batch size, so
one tick is one statement, and no driver parameter limit applies.

``{now}`` is the database's clock in microseconds; each dialect reads it once
per statement, so every comparison inside a statement uses the same instant.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Dialect:
    """Statement texts for one database family; ``{e}``/``{s}``/``{m}`` are the
    entries, slots and meta table names."""

    name: str
    now: str
    #: True when claim/take_over return rows directly (RETURNING); False when a
    #: second statement reads the rows marked with the batch id (MySQL).
    returning: bool
    ping: str
    register_insert: str
    register_select: str
    claim: str
    take_over: str
    confirm: str
    select_batch: str
    release: str
    prune_turn: str
    prune_mark: str
    prune_delete: str
    meta_insert: str
    recent_owners: str

    def render(self, prefix: str) -> Dialect:
        names = {"e": f"{prefix}entries", "s": f"{prefix}slots", "m": f"{prefix}meta"}
        values = {
            field: (
                getattr(self, field).replace("{now}", self.now).format(**names)
                if isinstance(getattr(self, field), str) and field not in ("name", "now")
                else getattr(self, field)
            )
            for field in self.__dataclass_fields__
        }
        return Dialect(**values)


_PG_NOW = "(CAST(EXTRACT(EPOCH FROM clock_timestamp()) * 1000000 AS BIGINT))"
_PG_SLOTS = """(SELECT v ->> 0 AS entry, CAST(v ->> 1 AS BIGINT) AS slot_us,
                       CAST(v ->> 2 AS BIGINT) AS fence
                FROM jsonb_array_elements(CAST(:slots AS jsonb)) AS j(v)) c"""

POSTGRESQL = Dialect(
    name="postgresql",
    now="n.us",
    returning=True,
    ping=f"SELECT {_PG_NOW}",
    register_insert=f"""
        WITH n AS MATERIALIZED (SELECT {_PG_NOW} AS us)
        INSERT INTO {{e}} (name, anchor_us, registered_by)
        SELECT c.name, n.us, :owner
        FROM jsonb_array_elements_text(CAST(:names AS jsonb)) AS c(name) CROSS JOIN n
        ORDER BY c.name
        ON CONFLICT (name) DO NOTHING""",
    register_select=f"""
        WITH n AS MATERIALIZED (SELECT {_PG_NOW} AS us)
        SELECT n.us, e.name, e.anchor_us,
               GREATEST(e.last_slot_us,
                        (SELECT max(s.slot_us) FROM {{s}} s WHERE s.entry = e.name))
        FROM n LEFT JOIN (
            {{e}} e JOIN jsonb_array_elements_text(CAST(:names AS jsonb)) AS c(name)
            ON c.name = e.name
        ) ON true""",
    claim=f"""
        WITH n AS MATERIALIZED (SELECT {_PG_NOW} AS us),
        won AS (
            INSERT INTO {{s}} AS s (entry, slot_us, state, owner, fence, lease_until_us, claimed_us)
            SELECT DISTINCT c.entry, c.slot_us, 0, :owner, 1, n.us + :lease_us, n.us
            FROM {_PG_SLOTS}
            JOIN {{e}} e ON e.name = c.entry
            CROSS JOIN n
            WHERE c.slot_us > COALESCE(e.last_slot_us, -1) AND c.slot_us <= n.us + :early_us
            ORDER BY c.entry, c.slot_us
            ON CONFLICT (entry, slot_us) DO UPDATE
                SET owner = EXCLUDED.owner, fence = s.fence + 1,
                    lease_until_us = EXCLUDED.lease_until_us, claimed_us = EXCLUDED.claimed_us
                WHERE s.state = 0
                  AND (s.lease_until_us < EXCLUDED.claimed_us OR s.owner = EXCLUDED.owner)
            RETURNING s.entry, s.slot_us, s.fence
        )
        SELECT n.us, won.entry, won.slot_us, won.fence FROM n LEFT JOIN won ON true""",
    take_over=f"""
        WITH n AS MATERIALIZED (SELECT {_PG_NOW} AS us),
        victims AS (
            SELECT s.entry, s.slot_us FROM {{s}} s
            WHERE s.state = 0 AND s.lease_until_us < (SELECT us FROM n)
            ORDER BY s.slot_us, s.entry
            LIMIT :limit
            FOR UPDATE OF s SKIP LOCKED
        ),
        taken AS (
            UPDATE {{s}} s SET owner = :owner, fence = s.fence + 1,
                lease_until_us = n.us + :lease_us, claimed_us = n.us
            FROM victims, n
            WHERE s.entry = victims.entry AND s.slot_us = victims.slot_us
            RETURNING s.entry, s.slot_us, s.fence
        )
        SELECT n.us, taken.entry, taken.slot_us, taken.fence FROM n LEFT JOIN taken ON true""",
    confirm=f"""
        WITH n AS MATERIALIZED (SELECT {_PG_NOW} AS us),
        done AS (
            UPDATE {{s}} s SET state = 1, sent_us = COALESCE(s.sent_us, n.us)
            FROM {_PG_SLOTS}, n
            WHERE s.entry = c.entry AND s.slot_us = c.slot_us AND s.fence = c.fence
              AND s.owner = :owner
            RETURNING s.entry, s.slot_us, s.fence
        )
        SELECT n.us, done.entry, done.slot_us, done.fence FROM n LEFT JOIN done ON true""",
    select_batch="",
    release=f"""
        UPDATE {{s}} s SET lease_until_us = CASE WHEN :retry_us = 0 THEN 0
            ELSE {_PG_NOW} + :retry_us END
        FROM {_PG_SLOTS}
        WHERE s.entry = c.entry AND s.slot_us = c.slot_us AND s.fence = c.fence
          AND s.owner = :owner AND s.state = 0""",
    prune_turn=f"""
        UPDATE {{m}} SET value_us = {_PG_NOW} + :every_us
        WHERE key = 'prune' AND value_us <= {_PG_NOW}""",
    prune_mark=f"""
        UPDATE {{e}} e SET last_slot_us = GREATEST(e.last_slot_us, m.mx)
        FROM (SELECT entry, max(slot_us) AS mx FROM {{s}}
              WHERE state = 1 AND slot_us < {_PG_NOW} - :retention_us
              GROUP BY entry) m
        WHERE e.name = m.entry AND (e.last_slot_us IS NULL OR e.last_slot_us < m.mx)""",
    prune_delete=f"""
        DELETE FROM {{s}} s USING {{e}} e
        WHERE e.name = s.entry AND s.state = 1
          AND s.slot_us < {_PG_NOW} - :retention_us AND s.slot_us <= e.last_slot_us""",
    meta_insert="""
        INSERT INTO {m} (key, value_us) VALUES (:key, :value_us)
        ON CONFLICT (key) DO NOTHING""",
    recent_owners=f"""
        WITH n AS MATERIALIZED (SELECT {_PG_NOW} AS us)
        SELECT n.us, o.owner FROM n LEFT JOIN (
            SELECT DISTINCT s.owner FROM {{s}} s, n WHERE s.slot_us > n.us - :window_us
        ) o ON true""",
)

_MY_NOW = "(TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)))"
_MY_SLOTS = """JSON_TABLE(:slots, '$[*]' COLUMNS (
                entry VARCHAR(255) CHARACTER SET utf8mb4 PATH '$[0]',
                slot_us BIGINT PATH '$[1]',
                fence BIGINT PATH '$[2]')) c"""

MYSQL = Dialect(
    name="mysql",
    now=_MY_NOW,
    returning=False,
    ping=f"SELECT {_MY_NOW}",
    register_insert=f"""
        INSERT INTO {{e}} (name, anchor_us, registered_by)
        SELECT c.name, {_MY_NOW}, :owner
        FROM JSON_TABLE(:names, '$[*]' COLUMNS (
            name VARCHAR(255) CHARACTER SET utf8mb4 PATH '$')) c
        ORDER BY c.name
        ON DUPLICATE KEY UPDATE name = {{e}}.name""",
    register_select=f"""
        SELECT {_MY_NOW}, e.name, e.anchor_us,
               GREATEST(COALESCE(e.last_slot_us, -1),
                        COALESCE((SELECT max(s.slot_us) FROM {{s}} s WHERE s.entry = e.name), -1))
        FROM (SELECT 1 AS one) d LEFT JOIN (
            {{e}} e JOIN JSON_TABLE(:names, '$[*]' COLUMNS (
                name VARCHAR(255) CHARACTER SET utf8mb4 PATH '$')) c
            ON c.name COLLATE utf8mb4_bin = e.name
        ) ON true""",
    claim=f"""
        INSERT INTO {{s}} (entry, slot_us, state, owner, fence, lease_until_us, claimed_us, batch)
        SELECT DISTINCT c.entry, c.slot_us, 0, :owner, 1, {_MY_NOW} + :lease_us, {_MY_NOW}, :batch
        FROM JSON_TABLE(:slots, '$[*]' COLUMNS (
                entry VARCHAR(255) CHARACTER SET utf8mb4 PATH '$[0]',
                slot_us BIGINT PATH '$[1]')) c
        JOIN {{e}} e ON e.name = c.entry COLLATE utf8mb4_bin
        WHERE c.slot_us > COALESCE(e.last_slot_us, -1)
          AND c.slot_us <= {_MY_NOW} + :early_us
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
            lease_until_us = {_MY_NOW} + :lease_us, claimed_us = {_MY_NOW}
        WHERE state = 0 AND lease_until_us < {_MY_NOW}
        ORDER BY slot_us, entry
        LIMIT :limit""",
    confirm=f"""
        UPDATE {{s}} s JOIN {_MY_SLOTS}
            ON s.entry = c.entry COLLATE utf8mb4_bin AND s.slot_us = c.slot_us
               AND s.fence = c.fence
        SET s.state = 1, s.sent_us = COALESCE(s.sent_us, {_MY_NOW})
        WHERE s.owner = :owner""",
    select_batch=f"""
        SELECT {_MY_NOW}, s.entry, s.slot_us, s.fence, s.state
        FROM (SELECT 1 AS one) d LEFT JOIN {{s}} s ON s.batch = :batch AND s.owner = :owner""",
    release=f"""
        UPDATE {{s}} s JOIN {_MY_SLOTS}
            ON s.entry = c.entry COLLATE utf8mb4_bin AND s.slot_us = c.slot_us
               AND s.fence = c.fence
        SET s.lease_until_us = IF(:retry_us = 0, 0, {_MY_NOW} + :retry_us)
        WHERE s.owner = :owner AND s.state = 0""",
    prune_turn=f"""
        UPDATE {{m}} SET value_us = {_MY_NOW} + :every_us
        WHERE `key` = 'prune' AND value_us <= {_MY_NOW}""",
    prune_mark=f"""
        UPDATE {{e}} e JOIN (
            SELECT entry, max(slot_us) AS mx FROM {{s}}
            WHERE state = 1 AND slot_us < {_MY_NOW} - :retention_us GROUP BY entry
        ) m ON e.name = m.entry
        SET e.last_slot_us = GREATEST(COALESCE(e.last_slot_us, -1), m.mx)""",
    prune_delete=f"""
        DELETE s FROM {{s}} s JOIN {{e}} e ON e.name = s.entry
        WHERE s.state = 1 AND s.slot_us < {_MY_NOW} - :retention_us
          AND s.slot_us <= e.last_slot_us""",
    meta_insert="""
        INSERT INTO {m} (`key`, value_us) VALUES (:key, :value_us)
        ON DUPLICATE KEY UPDATE value_us = value_us""",
    recent_owners=f"""
        SELECT {_MY_NOW}, o.owner FROM (SELECT 1 AS one) d LEFT JOIN (
            SELECT DISTINCT owner FROM {{s}} WHERE slot_us > {_MY_NOW} - :window_us
        ) o ON true""",
)

_LITE_NOW = "(CAST((julianday('now') - 2440587.5) * 86400000000 AS INTEGER))"

SQLITE = Dialect(
    name="sqlite",
    now=_LITE_NOW,
    returning=True,
    ping=f"SELECT {_LITE_NOW}",
    register_insert=f"""
        INSERT INTO {{e}} (name, anchor_us, registered_by)
        SELECT c.value, {_LITE_NOW}, :owner FROM json_each(:names) c WHERE true
        ON CONFLICT (name) DO NOTHING""",
    register_select=f"""
        SELECT {_LITE_NOW}, e.name, e.anchor_us,
               max(COALESCE(e.last_slot_us, -1),
                   COALESCE((SELECT max(s.slot_us) FROM {{s}} s WHERE s.entry = e.name), -1))
        FROM (SELECT 1 AS one) d LEFT JOIN (
            {{e}} e JOIN json_each(:names) c ON c.value = e.name
        ) ON true""",
    claim=f"""
        INSERT INTO {{s}} AS s (entry, slot_us, state, owner, fence, lease_until_us, claimed_us)
        SELECT DISTINCT json_extract(c.value, '$[0]') AS entry,
               json_extract(c.value, '$[1]') AS slot_us,
               0, :owner, 1, {_LITE_NOW} + :lease_us, {_LITE_NOW}
        FROM json_each(:slots) c
        JOIN {{e}} e ON e.name = json_extract(c.value, '$[0]')
        WHERE json_extract(c.value, '$[1]') > COALESCE(e.last_slot_us, -1)
          AND json_extract(c.value, '$[1]') <= {_LITE_NOW} + :early_us
        ORDER BY 1, 2
        ON CONFLICT (entry, slot_us) DO UPDATE
            SET owner = excluded.owner, fence = s.fence + 1,
                lease_until_us = excluded.lease_until_us, claimed_us = excluded.claimed_us
            WHERE s.state = 0
              AND (s.lease_until_us < excluded.claimed_us OR s.owner = excluded.owner)
        RETURNING {_LITE_NOW}, entry, slot_us, fence""",
    take_over=f"""
        UPDATE {{s}} SET owner = :owner, fence = fence + 1,
            lease_until_us = {_LITE_NOW} + :lease_us, claimed_us = {_LITE_NOW}
        WHERE rowid IN (
            SELECT rowid FROM {{s}} WHERE state = 0 AND lease_until_us < {_LITE_NOW}
            ORDER BY slot_us, entry LIMIT :limit)
        RETURNING {_LITE_NOW}, entry, slot_us, fence""",
    confirm=f"""
        UPDATE {{s}} SET state = 1, sent_us = COALESCE(sent_us, {_LITE_NOW})
        WHERE owner = :owner AND (entry, slot_us, fence) IN (
            SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]'),
                   json_extract(value, '$[2]') FROM json_each(:slots))
        RETURNING {_LITE_NOW}, entry, slot_us, fence""",
    select_batch="",
    release=f"""
        UPDATE {{s}} SET lease_until_us = CASE WHEN :retry_us = 0 THEN 0
            ELSE {_LITE_NOW} + :retry_us END
        WHERE owner = :owner AND state = 0 AND (entry, slot_us, fence) IN (
            SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]'),
                   json_extract(value, '$[2]') FROM json_each(:slots))""",
    prune_turn=f"""
        UPDATE {{m}} SET value_us = {_LITE_NOW} + :every_us
        WHERE key = 'prune' AND value_us <= {_LITE_NOW}""",
    prune_mark=f"""
        UPDATE {{e}} SET last_slot_us = (
            SELECT max(COALESCE({{e}}.last_slot_us, -1), max(s.slot_us)) FROM {{s}} s
            WHERE s.entry = {{e}}.name AND s.state = 1
              AND s.slot_us < {_LITE_NOW} - :retention_us)
        WHERE EXISTS (SELECT 1 FROM {{s}} s WHERE s.entry = {{e}}.name AND s.state = 1
                      AND s.slot_us < {_LITE_NOW} - :retention_us)""",
    prune_delete=f"""
        DELETE FROM {{s}} WHERE state = 1 AND slot_us < {_LITE_NOW} - :retention_us
          AND slot_us <= (SELECT e.last_slot_us FROM {{e}} e WHERE e.name = {{s}}.entry)""",
    meta_insert="""
        INSERT INTO {m} (key, value_us) VALUES (:key, :value_us)
        ON CONFLICT (key) DO NOTHING""",
    recent_owners=f"""
        SELECT {_LITE_NOW}, o.owner FROM (SELECT 1 AS one) d LEFT JOIN (
            SELECT DISTINCT owner FROM {{s}} WHERE slot_us > {_LITE_NOW} - :window_us
        ) o ON true""",
)


def dialect_for(backend: str, prefix: str) -> Dialect:
    """The statements for an SQLAlchemy backend name, with table names filled in."""
    family = {"postgresql": POSTGRESQL, "mysql": MYSQL, "mariadb": MYSQL, "sqlite": SQLITE}
    return family[backend].render(prefix)
