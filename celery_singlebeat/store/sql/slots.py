"""The beat's slots in SQL: the implementation of :class:`.SlotStore`.

:class:`SqlSlots` is the part of :class:`~.store.SqlStore` its slot methods
delegate to, with its statements beside it (``slot_statements.py``). Every
method is one statement where the database returns the rows it wrote
(``RETURNING``: PostgreSQL, SQLite); MySQL/MariaDB's statement marks the rows
it wins with a batch id of its own and a second statement reads them back.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy.engine import Connection

from ..values import (
    EARLY_TOLERANCE_US,
    STALE_DEFINITION_US,
    Claim,
    EntryState,
    SlotKey,
    Written,
)
from .host import SqlHost, fetch, note_controls
from .slot_statements import SlotDialect, slot_dialect_for

#: the write a slot of no stored entry is proposed under: none to check
_NO_WRITE = Written(0, 0)


class SqlSlots:
    """The slot rows of every beat replica sharing the database: the methods
    of :class:`.SlotStore`, whose docstrings say what each may touch."""

    def __init__(self, host: SqlHost, catalogs: Mapping[str, str]) -> None:
        self.host = host
        #: the store's one executor
        self.executor = host.executor
        #: replica id -> the catalog it last published (the fleet's part keeps
        #: it): a run-now request is taken over only for an entry it lists
        self.catalogs = catalogs
        self.sql: SlotDialect = slot_dialect_for(host.backend, host.tables.prefix)

    def register(self, names: Sequence[str], owner: str = "") -> dict[str, EntryState]:
        payload = json.dumps(sorted(set(names)))

        def work(conn: Connection) -> dict[str, EntryState]:
            if names:
                conn.execute(
                    self.executor.text(self.sql.register_insert), {"names": payload, "owner": owner}
                )
            rows = fetch(self.host, conn, self.sql.register_select, names=payload)
            out = {}
            for _now, name, anchor, last in rows:
                if name is None:
                    continue
                last_slot = None if last is None or int(last) < 0 else int(last)
                out[name] = EntryState(name, int(anchor), last_slot)
            return out

        return self.executor.run("register entries", work)

    def claim(
        self,
        owner: str,
        slots: Sequence[SlotKey],
        lease_us: int,
        revisions: Mapping[str, Written] | None = None,
    ) -> list[Claim]:
        if not slots:
            return []
        # each slot with the write it is proposed under (0, 0: no stored entry)
        revs = revisions or {}
        payload = json.dumps(
            sorted({(s.entry, s.slot_us, *revs.get(s.entry, _NO_WRITE)) for s in slots})
        )
        if self.sql.returning:
            return self.executor.run(
                "claim",
                lambda conn: _claims(
                    note_controls(
                        self.host,
                        fetch(
                            self.host,
                            conn,
                            self.sql.claim,
                            owner=owner,
                            slots=payload,
                            lease_us=lease_us,
                            early_us=EARLY_TOLERANCE_US,
                            stale_us=STALE_DEFINITION_US,
                        ),
                    )
                ),
            )
        batch = uuid.uuid4().hex

        def work(conn: Connection) -> list[Claim]:
            conn.execute(
                self.executor.text(self.sql.claim),
                {
                    "owner": owner,
                    "slots": payload,
                    "lease_us": lease_us,
                    "batch": batch,
                    "early_us": EARLY_TOLERANCE_US,
                    "stale_us": STALE_DEFINITION_US,
                },
            )
            return _claims(
                note_controls(
                    self.host,
                    fetch(self.host, conn, self.sql.select_batch, batch=batch, owner=owner),
                )
            )

        return self.executor.run("claim", work)

    def confirm(self, owner: str, claims: Sequence[Claim]) -> list[Claim]:
        # once each: MySQL compares the matched row count with the number of claims
        claims = list(dict.fromkeys(claims))
        if not claims:
            return []
        payload = json.dumps([[c.entry, c.slot_us, c.fence] for c in claims])
        if self.sql.returning:
            return self.executor.run(
                "confirm",
                lambda conn: _claims(
                    fetch(self.host, conn, self.sql.confirm, owner=owner, slots=payload)
                ),
            )

        def work(conn: Connection) -> list[Claim]:
            result = conn.execute(
                self.executor.text(self.sql.confirm), {"owner": owner, "slots": payload}
            )
            if result.rowcount == len(claims):
                return list(claims)
            # Some were taken over: find out which are ours and sent.
            table = self.host.tables.slots
            mine = {
                (row[0], int(row[1]), int(row[2]))
                for row in conn.execute(
                    table.select()
                    .with_only_columns(
                        table.c.entry,
                        table.c.slot_us,
                        table.c.fence,
                    )
                    .where(
                        table.c.owner == owner,
                        table.c.state == 1,
                        table.c.entry.in_({c.entry for c in claims}),
                    )
                )
            }
            return [c for c in claims if (c.entry, c.slot_us, c.fence) in mine]

        return self.executor.run("confirm", work)

    def reassert(self, owner: str, sent: Sequence[Claim]) -> list[Claim]:
        sent = list(dict.fromkeys(sent))
        if not sent:
            return []
        payload = json.dumps([[c.entry, c.slot_us, c.fence] for c in sent])
        params = {"owner": owner, "slots": payload}
        return self._won("write sent slots again", self.sql.reassert, params, sent=True)

    def release(self, owner: str, claims: Sequence[Claim], retry_in_us: int = 0) -> None:
        if not claims:
            return
        payload = json.dumps([[c.entry, c.slot_us, c.fence] for c in claims])
        params = {"owner": owner, "slots": payload, "retry_us": max(0, retry_in_us)}
        self.executor.run(
            "release", lambda conn: conn.execute(self.executor.text(self.sql.release), params)
        )

    def take_over(
        self, owner: str, lease_us: int, limit: int, seen: int | None = None
    ) -> list[Claim]:
        stalled = self.host.stalled_runs
        # run-now rows only for the entries of the catalog this replica published
        params = {
            "owner": owner,
            "lease_us": lease_us,
            "limit": limit,
            "catalog": self.catalogs.get(owner),
            "resends": stalled.resends,
            "window_us": stalled.window_us,
            "seen": -1 if seen is None else seen,
            "stale_us": STALE_DEFINITION_US,
        }
        if self.sql.take_over_stalled and stalled.resends > 0:
            return self._won(
                "take over", self.sql.take_over, params, sent=False, then=self.sql.take_over_stalled
            )
        return self._won("take over", self.sql.take_over, params, sent=False)

    def _won(
        self, what: str, statement: str, params: dict[str, Any], sent: bool, then: str = ""
    ) -> list[Claim]:
        """The rows a statement won for ``params["owner"]``, oldest first.

        With RETURNING they come back with it; on MySQL the statement marks them
        with a batch id of its own and a second statement reads them back, only
        when the first changed a row. ``sent``: the rows it wins are sent ones
        (reassert) rather than claims (take_over). ``then`` (MySQL): a second
        statement marking more rows with the same batch, up to what is left of
        ``params["limit"]`` (the takeover's stalled slots).
        """
        if self.sql.returning:
            return _oldest_first(
                self.executor.run(
                    what, lambda conn: _claims(fetch(self.host, conn, statement, **params))
                )
            )
        batch = uuid.uuid4().hex
        owner = params["owner"]

        def work(conn: Connection) -> list[Claim]:
            won = conn.execute(self.executor.text(statement), {**params, "batch": batch}).rowcount
            left = int(params.get("limit", 0)) - won
            if then and left > 0:
                more = {**params, "batch": batch, "limit": left}
                won += conn.execute(self.executor.text(then), more).rowcount
            if won == 0:
                # nothing to read back; the heartbeat sent with every sweep
                # feeds the clock (a ping here cost MySQL one statement a sweep)
                return []
            rows = fetch(self.host, conn, self.sql.select_batch, batch=batch, owner=owner)
            return _claims([r for r in rows if sent or r[4] in (None, 0)])

        return _oldest_first(self.executor.run(what, work))

    def prune(self, retention_us: int, every_us: int) -> int | None:
        def work(conn: Connection) -> int | None:
            turn = conn.execute(self.executor.text(self.sql.prune_turn), {"every_us": every_us})
            if turn.rowcount != 1:
                return None
            return self.delete_sent(conn, retention_us)

        return self.executor.run("prune", work)

    def delete_sent(self, conn: Connection, retention_us: int) -> int:
        """What :meth:`prune` deletes once it has the turn, and the operator's
        prune at once: each entry's high-water mark raised to its newest sent
        slot older than ``retention_us`` (so that no deleted slot can be won
        again), then the sent rows at or below it deleted; how many went."""
        params = {"retention_us": retention_us}
        conn.execute(self.executor.text(self.sql.prune_mark), params)
        return int(conn.execute(self.executor.text(self.sql.prune_delete), params).rowcount)

    def recent_owners(self, window_us: int) -> list[str]:
        rows = self.executor.run(
            "recent owners",
            lambda conn: fetch(self.host, conn, self.sql.recent_owners, window_us=window_us),
        )
        return sorted(str(r[1]) for r in rows if r[1] is not None)


def _claims(rows: Sequence[Any]) -> list[Claim]:
    return [Claim(r[1], int(r[2]), int(r[3])) for r in rows if r[1] is not None]


def _oldest_first(claims: list[Claim]) -> list[Claim]:
    # RETURNING gives no order; taken-over slots are published oldest first
    return sorted(claims, key=lambda c: (c.slot_us, c.entry))
