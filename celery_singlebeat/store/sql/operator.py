"""The operator's side of the SQL store: what an operator reads and steers.

The replicas write their own rows (``replicas``, ``catalog``, ``slots``); this
module reads them for the CLI (and any other reader without the Celery app) and
writes the controls: pauses, run-now requests, a lease released by hand.

Each read is a constant number of statements, whatever the number of entries
(no statement per entry). Each control is **one transaction**, not the store's
autocommit: it checks what it refers to, writes, and raises the control
version (the ``controls`` meta row, :data:`~.base.CONTROLS_KEY`), all or
nothing; on PostgreSQL it also notifies :func:`~.base.controls_channel`, which
the database delivers at commit. A replica that reads the version (every
heartbeat) sees that something changed and reads the pauses again.

Times are integer microseconds since the Unix epoch, UTC, on the **database's**
clock: every operation reads that clock once and judges liveness, expiry and
"now" by that instant (callers may pass their own ``now_us`` instead, to ask as
of another instant).
"""

from __future__ import annotations

import difflib
import gc
import json
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from sqlalchemy import text
from sqlalchemy.engine import Connection
from sqlalchemy.sql.elements import TextClause

from ...exceptions import ControlError
from ...timeline.membership import replica_live
from ...widths import MAX_AUTHOR, MAX_ENTRY_NAME, MAX_REASON
from ..base import LIVE_HEARTBEATS, LIVE_SLACK_US, PAUSE_ALL, Pause, controls_channel
from .fleet import FleetPruned
from .operator_results import (
    ABANDONED,
    CLAIMED,
    EXPIRED,
    HELD,
    LIVE,
    LOST,
    RELEASED,
    REQUESTED,
    SENT,
    STOPPED,
    HistoryRow,
    LeaseStatus,
    PauseResult,
    PruneReport,
    ReplicaStatus,
    ResumeResult,
    RunNowResult,
    Status,
)
from .operator_statements import OperatorDialect, operator_dialect_for, status_entries
from .operator_status import entry_statuses
from .store import SqlStore

T = TypeVar("T")

#: a run-now's slot is the database's now, or the first free microsecond after
#: it among this many: a row of that very instant is a coincidence (a slot, or
#: another run-now in the same microsecond), and should a concurrent writer
#: insert the one chosen, the unique key refuses it and the transaction runs again
NEAR_SPAN_US = 1_000

#: how many close matches an unknown name's error offers
CLOSE_MATCHES = 3


class Operator:
    """An operator's reads and controls over a :class:`~.store.SqlStore`'s tables.

    Sends every statement through the store's :class:`~.executor.SqlExecutor`
    (its connections, retries and secrets), as the store itself does: every
    driver error becomes :class:`~celery_singlebeat.exceptions.StoreUnavailable` with the
    store's secrets scrubbed, and a missing table
    :class:`~celery_singlebeat.exceptions.SchemaError` saying to create the
    schema. Controls raise :class:`~celery_singlebeat.exceptions.ControlError`
    when refused, having changed nothing.
    """

    def __init__(self, store: SqlStore) -> None:
        self.store = store
        self.prefix = store.tables.prefix
        self.sql: OperatorDialect = operator_dialect_for(store.backend, self.prefix)

    # -- plumbing -----------------------------------------------------------

    def _text(self, statement: str) -> TextClause:
        return self.store.executor.text(statement)

    def _rows(self, conn: Connection, statement: str, **params: Any) -> list[Any]:
        return list(conn.execute(self._text(statement), params).all())

    def _now(self, conn: Connection) -> int:
        return int(conn.execute(self._text(self.sql.now)).scalar_one())

    def _read(self, what: str, work: Callable[[Connection], T]) -> T:
        """``work`` on an autocommit connection, through the store's executor
        (retries of deadlocks and dead pooled connections, ``StoreUnavailable``;
        a missing table is a SchemaError naming the fix)."""
        return self.store.executor.run(what, work, schema_errors=True)

    def _transaction(
        self, what: str, work: Callable[[Connection, int], T], *, retry_conflict: bool = False
    ) -> T:
        """``work(conn, now_us)`` inside one transaction; commit, or change nothing.

        Through the store's executor, with its retries: run again whole (a new
        transaction) after a deadlock or serialization failure, a dead
        connection, and, with ``retry_conflict``, a unique violation (a
        concurrent writer took the key this one chose). Never run again once
        the COMMIT was sent: its answer lost, the change may or may not have
        been made, and the error says so.
        """
        return self.store.executor.run(
            what,
            lambda conn: work(conn, self._now(conn)),
            begin=self.sql.begin,
            retry_conflict=retry_conflict,
            schema_errors=True,
        )

    def _bump_controls(self, conn: Connection) -> int:
        """Raise the control version (creating its row) and, on PostgreSQL,
        notify the replicas; both take effect at commit."""
        conn.execute(self._text(self.sql.controls_bump))
        version = int(conn.execute(self._text(self.sql.controls_read)).scalar_one())
        if self.sql.notify:
            conn.execute(self._text(self.sql.notify), {"channel": controls_channel(self.prefix)})
        return version

    def _live_params(self, now_us: int) -> dict[str, int]:
        return {"now_us": now_us, "beats": LIVE_HEARTBEATS, "slack_us": LIVE_SLACK_US}

    def _check_known(self, conn: Connection, now_us: int, names: Sequence[str]) -> None:
        """Refuse names no live replica's catalog lists and no stored entry has,
        with close matches."""
        wanted = sorted(set(names))
        found = {
            str(row[0])
            for row in self._rows(
                conn, self.sql.live_known, names=json.dumps(wanted), **self._live_params(now_us)
            )
        }
        unknown = [name for name in wanted if name not in found]
        if not unknown:
            return
        live = self._rows(conn, self.sql.live_names, **self._live_params(now_us))
        known = [str(row[0]) for row in live]
        raise ControlError(
            _unknown(
                "no live replica has the",
                "entry",
                "entries",
                unknown,
                known,
                "no live replica lists any entry",
            )
        )

    def _pause_rows(self, conn: Connection, names: Sequence[str]) -> dict[str, Pause]:
        rows = self._rows(conn, self.sql.pause_rows, names=json.dumps(sorted(set(names))))
        return {str(row[0]): _pause(row) for row in rows}

    # -- reads ----------------------------------------------------------------

    def now_us(self) -> int:
        """The database's clock: what the reads below judge "now" by, and what
        a reader shows their instants relative to."""
        return self._read("reading the database's clock", self._now)

    def status(self, now_us: int | None = None) -> Status:
        """Every registered entry, every replica row and the pauses in force.

        Per entry: its task and schedule from the catalog (rows of live replicas
        first), how many live replicas have it, the next slot the fleet will
        send (rebuilt from the catalog's spec and the entry's anchor:
        :func:`celery_singlebeat.timeline.catalog_form.sequence_of`), the first slot it should
        have sent and did not when there is one (``overdue_slot_us``), the
        latest slot claimed and the state of its row, the latest sent slot with
        its sender and delay, and the pause in force (its own or ``*``).

        Three statements (the replicas, the entries, the pauses) plus the clock
        read, whatever the number of entries. Reads only.
        """

        def work(conn: Connection) -> tuple[int, list[ReplicaStatus], list[Any], list[Any]]:
            now = self._now(conn) if now_us is None else now_us
            replicas = [_replica(row, now) for row in self._rows(conn, self.sql.replicas)]
            statement, params = status_entries(self.sql, _live_catalogs(replicas))
            result = conn.execute(text(statement), {**params, "now_us": now})
            # the driver's own tuples: a text statement's columns need no
            # processing, and a Row per entry cost a fifth of status() at 100,000
            entries = list(result.cursor.fetchall()) if result.cursor is not None else []
            result.close()
            pauses = self._rows(conn, self.sql.pauses, now_us=now)
            return now, replicas, entries, pauses

        # Some 100,000 tuples and entries, none in a reference cycle: the cyclic
        # collector's passes over them while they are built are pure cost (a
        # quarter of status() at 100,000 entries, and most of its variance).
        collecting = gc.isenabled()
        gc.disable()
        try:
            now, replicas, entry_rows, pause_rows = self._read("status", work)
            pauses = [_pause(row) for row in pause_rows]
            entries = entry_statuses(entry_rows, now, pauses)
        finally:
            if collecting:
                gc.enable()
        return Status(now, entries, _by_state(replicas), pauses)

    def history(
        self,
        entry: str | None = None,
        since_us: int | None = None,
        limit: int = 50,
        now_us: int | None = None,
    ) -> list[HistoryRow]:
        """Up to ``limit`` slot rows, newest slot first; only ``entry``'s when
        given, only slots at or after ``since_us`` when given.

        The rows are what the store keeps: sent rows live for the retention
        (``singlebeat_retention``), claimed ones until sent. A row keeps only its
        last owner; a fence above 1 says it changed hands before. Reads only.
        """
        from ...timeline.slots import slot_task_id

        if limit < 1:
            raise ValueError(f"limit {limit}: expected at least 1")
        params: dict[str, Any] = {"since_us": -(2**62) if since_us is None else since_us}
        params["limit"] = limit
        statement = self.sql.history
        if entry is not None:
            statement = self.sql.history_entry
            params["entry"] = entry

        def work(conn: Connection) -> tuple[int, list[Any]]:
            now = self._now(conn) if now_us is None else now_us
            return now, self._rows(conn, statement, **params)

        now, rows = self._read("history", work)
        out = []
        for row in rows:
            name, slot, state, owner, fence, lease, claimed, sent, by, reason, at = row
            word = _slot_state(int(state), int(fence), int(lease), now)
            out.append(
                HistoryRow(
                    entry=str(name),
                    slot_us=int(slot),
                    state=word,
                    holder=str(owner) if word in (CLAIMED, ABANDONED) else None,
                    sender=str(owner) if word == SENT else None,
                    fence=int(fence),
                    lease_until_us=int(lease),
                    claimed_us=int(claimed),
                    sent_us=None if sent is None else int(sent),
                    delay_us=None if sent is None else int(sent) - int(slot),
                    task_id=slot_task_id(str(name), int(slot)),
                    requested_by=None if by is None else str(by),
                    request_reason=None if reason is None else str(reason),
                    requested_us=None if at is None else int(at),
                )
            )
        return out

    def replicas(self, now_us: int | None = None) -> list[ReplicaStatus]:
        """Every replica row (until pruned, see :meth:`prune_fleet`) with its
        state: live, stopped (graceful), or lost (not seen for
        ``LIVE_HEARTBEATS`` of its heartbeats plus ``LIVE_SLACK_US``). Reads only."""

        def work(conn: Connection) -> tuple[int, list[Any]]:
            now = self._now(conn) if now_us is None else now_us
            return now, self._rows(conn, self.sql.replicas)

        now, rows = self._read("replicas", work)
        return _by_state([_replica(row, now) for row in rows])

    def leases(self, now_us: int | None = None) -> list[LeaseStatus]:
        """Every SingletonTask key's lease row (until pruned), by key: held
        (``expires_us`` not passed), expired, or released. Reads only."""

        def work(conn: Connection) -> tuple[int, list[Any]]:
            now = self._now(conn) if now_us is None else now_us
            return now, self._rows(conn, self.sql.leases)

        now, rows = self._read("leases", work)
        return [_lease(row, now) for row in rows]

    def lease(self, key: str, now_us: int | None = None) -> LeaseStatus | None:
        """The lease row of one key (None: the key has no row). Reads only."""

        def work(conn: Connection) -> tuple[int, list[Any]]:
            now = self._now(conn) if now_us is None else now_us
            return now, self._rows(conn, self.sql.lease_row, key=key)

        now, rows = self._read("lease", work)
        return _lease(rows[0], now) if rows else None

    # -- controls -------------------------------------------------------------

    def pause(
        self,
        entries: Sequence[str],
        until_us: int | None,
        by: str,
        reason: str = "",
        *,
        for_us: int | None = None,
    ) -> PauseResult:
        """Pause ``entries`` (``[PAUSE_ALL]``: every entry) until ``until_us``,
        or for ``for_us`` from the database's now (neither: until resumed); one
        transaction.

        Every name but ``*`` must be in the catalog of at least one live replica
        (an entry only some have is fine); otherwise :class:`ControlError`
        names the unknown ones and close matches among the known entries, and
        nothing changes. Also refused: an empty list, an end at or before the
        database's now, ``by`` or ``reason`` too long. Upserts one pauses row
        per name (``at_us`` = now; pausing a paused entry replaces its row),
        raises the control version, notifies (PostgreSQL). A replica claims no
        slot of a paused entry and takes none over; slots in flight are not
        recalled.
        """
        names = _names(entries)
        _check_texts(by, reason)
        if until_us is not None and for_us is not None:
            raise ValueError("pass until_us or for_us, not both")

        def work(conn: Connection, now: int) -> PauseResult:
            end = until_us if for_us is None else now + for_us
            if end is not None and end <= now:
                raise ControlError(
                    "the pause would end in the past (the database's clock is later); "
                    "give a later instant or a duration"
                )
            named = [n for n in names if n != PAUSE_ALL]
            if named:
                self._check_known(conn, now, named)
            for name in names:
                conn.execute(
                    self._text(self.sql.pause_upsert),
                    {"entry": name, "until_us": end, "by": by, "reason": reason, "now_us": now},
                )
            version = self._bump_controls(conn)
            return PauseResult([Pause(n, end, by, reason, now) for n in names], version)

        return self._transaction("pause", work)

    def resume(self, entries: Sequence[str] | None) -> ResumeResult:
        """Delete the pause rows of ``entries`` (None: every pause row, ``*``
        included); one transaction.

        A name must have a pause row or be in a live replica's catalog (a pause
        of an entry no replica has any more can still be lifted); otherwise
        :class:`ControlError`, and nothing changes. Raises the control version
        and notifies (PostgreSQL), even when nothing was paused. When the pause
        of all entries stays in force, the result says so: the resumed entries
        are still paused by it.
        """
        names = None if entries is None else _names(entries)

        def work(conn: Connection, now: int) -> ResumeResult:
            if names is None:
                every = [_pause(row) for row in self._rows(conn, self.sql.all_pauses)]
                conn.execute(self._text(self.sql.resume_all))
                resumed = [p.entry for p in every if _in_force(p, now)]
                return ResumeResult(resumed, [], None, self._bump_controls(conn), now)
            rows = self._pause_rows(conn, names)
            # a pause row that merely expired is no pause; its row goes too
            held = {n for n, p in rows.items() if _in_force(p, now)}
            unpaused = [n for n in names if n not in rows and n != PAUSE_ALL]
            if unpaused:
                self._check_known(conn, now, unpaused)
            conn.execute(self._text(self.sql.resume), {"names": json.dumps(sorted(set(names)))})
            remaining = None if PAUSE_ALL in names else rows.get(PAUSE_ALL)
            return ResumeResult(
                [n for n in names if n in held],
                [n for n in names if n not in held],
                remaining if remaining is not None and _in_force(remaining, now) else None,
                self._bump_controls(conn),
                now,
            )

        return self._transaction("resume", work)

    def run_now(self, entry: str, by: str, reason: str = "") -> RunNowResult:
        """Ask the fleet to send ``entry`` once, now; one transaction.

        Refused (:class:`ControlError`, nothing changes) when no live replica's
        catalog lists the entry (with close matches), or the entry is paused
        (its own pause or ``*``: the error says by whom and why). Otherwise
        inserts a slot row at ``slot_us`` = the database's now (now + 1, + 2 …
        when a row of that instant exists): claimed by nobody, fence 0, lease
        over, which a replica's sweep takes over and sends with the entry's
        task, args, kwargs and options, under the task id
        ``slot_task_id(entry, slot_us)``; and a requests row saying who asked
        and why. Raises the control version and notifies (PostgreSQL).
        """
        (name,) = _names([entry])
        if name == PAUSE_ALL:
            raise ControlError("run takes one entry name, not '*'")
        _check_texts(by, reason)

        def work(conn: Connection, now: int) -> RunNowResult:
            from ...timeline.slots import slot_task_id

            self._check_known(conn, now, [name])
            rows = self._pause_rows(conn, [name])
            in_force = [p for p in (rows.get(name), rows.get(PAUSE_ALL)) if p and _in_force(p, now)]
            if in_force:
                pause = in_force[0]
                lift = "--all" if pause.entry == PAUSE_ALL else name
                raise ControlError(
                    f"entry {name!r} is paused{_pause_words(pause)}: "
                    f"resume it first (singlebeat resume {lift})"
                )
            taken = {
                int(row[0])
                for row in self._rows(
                    conn, self.sql.near_slots, entry=name, now_us=now, span=NEAR_SPAN_US
                )
            }
            slot_us = now
            while slot_us in taken:
                slot_us += 1
            params = {"entry": name, "slot_us": slot_us, "now_us": now}
            conn.execute(self._text(self.sql.insert_request_slot), params)
            conn.execute(
                self._text(self.sql.insert_request), {**params, "by": by, "reason": reason}
            )
            version = self._bump_controls(conn)
            return RunNowResult(
                name, slot_us, slot_task_id(name, slot_us), by, reason, now, version
            )

        return self._transaction("run now", work, retry_conflict=True)

    def release_lease(self, key: str) -> bool:
        """Free a SingletonTask key at once, whatever its token: the operator's
        override of a holder that is stuck or gone. True when a held lease was
        released; False when the key's lease had already expired or been
        released. A key with no row: :class:`ControlError` naming it (with close
        matches among the keys). One transaction.

        The holder is not stopped: its heartbeat's next renewal finds the lease
        lost (``LeaseLost`` from ``check()``/``guard()``), and another
        execution may take the key at once.
        """

        def work(conn: Connection, now: int) -> bool:
            done = conn.execute(self._text(self.sql.lease_release), {"key": key, "now_us": now})
            if done.rowcount == 1:
                return True
            if self._rows(conn, self.sql.lease_row, key=key):
                return False
            keys = [str(row[0]) for row in self._rows(conn, self.sql.lease_names)]
            raise ControlError(
                _unknown(
                    "no lease row for the",
                    "singleton key",
                    "singleton keys",
                    [key],
                    keys,
                    "no singleton key has a row",
                )
            )

        return self._transaction("release lease", work)

    # -- pruning --------------------------------------------------------------

    def prune(self, retention_us: int, run_retention_us: int) -> PruneReport:
        """Delete what the replicas' and workers' periodic prunes delete, at once:
        sent slot rows older than ``retention_us`` (each entry's high-water mark
        raised first, so that no deleted slot can be won again), SingletonTask
        run and idle key rows older than ``run_retention_us``, and
        :meth:`prune_fleet`'s rows.

        Runs the store's own prune statements without waiting for the fleet's
        turn (the turn only spreads the work: two prunes at once are safe, each
        raises the high-water mark before it deletes), and leaves the turn as
        it is.
        """
        slots, leases = self.store.slots, self.store.leases
        deleted = self._read("prune", lambda conn: slots.delete_sent(conn, retention_us))
        singleton_rows = self._read(
            "prune singletons", lambda conn: leases.delete_old(conn, run_retention_us)
        )
        return PruneReport(deleted, singleton_rows, self.prune_fleet(retention_us))

    def prune_fleet(self, retention_us: int) -> FleetPruned:
        """Delete the replica rows stopped, or not seen, for longer than
        ``retention_us``, the catalogs no replica row names (published longer
        than ``retention_us`` ago; ``catalog`` counts their rows), and the
        request rows whose slot row is gone (pruned once sent). Idempotent; safe
        while replicas run (a live replica's row is always younger than the
        retention, which is at least four leases)."""

        return self.store.prune_fleet_rows(retention_us)


# -- helpers ------------------------------------------------------------------


def _names(entries: Sequence[str]) -> list[str]:
    """The names in order given, once each; refuses an empty list or an
    empty or over-long name."""
    names = list(dict.fromkeys(entries))
    if not names:
        raise ControlError("no entry named")
    for name in names:
        if not name or len(name) > MAX_ENTRY_NAME:
            raise ControlError(
                f"entry name {name[:40]!r}: expected 1 to {MAX_ENTRY_NAME} characters"
            )
    return names


def _check_texts(by: str, reason: str) -> None:
    if not by or len(by) > MAX_AUTHOR:
        raise ControlError(f"who ({by[:40]!r}): expected 1 to {MAX_AUTHOR} characters")
    if len(reason) > MAX_REASON:
        raise ControlError(f"reason: {len(reason)} characters, at most {MAX_REASON}")


def _unknown(
    prefix: str,
    singular: str,
    plural: str,
    unknown: Sequence[str],
    known: Sequence[str],
    none_known: str,
) -> str:
    """One line naming the unknown names, and the known ones closest to each."""
    quoted = ", ".join(repr(n) for n in unknown)
    hints = []
    for name in unknown:
        close = difflib.get_close_matches(name, known, n=CLOSE_MATCHES, cutoff=0.6)
        if close:
            near = " or ".join(repr(c) for c in close)
            hints.append(f"did you mean {near}?" if len(unknown) == 1 else f"{name!r}: {near}?")
    if not known:
        hints.append(none_known)
    noun = singular if len(unknown) == 1 else plural
    detail = f" ({'; '.join(hints)})" if hints else ""
    return f"{prefix} {noun} {quoted}{detail}; nothing changed"


def _pause(row: Sequence[Any]) -> Pause:
    return Pause(
        str(row[0]), None if row[1] is None else int(row[1]), str(row[2]), str(row[3]), int(row[4])
    )


def _in_force(pause: Pause, now_us: int) -> bool:
    return pause.until_us is None or pause.until_us > now_us


def _pause_words(pause: Pause) -> str:
    whole = " (with every entry: '*')" if pause.entry == PAUSE_ALL else ""
    why = f": {pause.reason}" if pause.reason else ""
    return f"{whole} by {pause.by}{why}"


def _slot_state(state: int, fence: int, lease_until_us: int, now_us: int) -> str:
    if state == 1:
        return SENT
    if fence == 0:
        return REQUESTED
    return ABANDONED if lease_until_us < now_us else CLAIMED


def _replica(row: Sequence[Any], now_us: int) -> ReplicaStatus:
    rid, host, pid, version, started, seen, loop, offset, tracked, first, beat, stopped = row[:12]
    cat, lost_writes = row[12], int(row[13] or 0)
    if stopped is not None:
        state = STOPPED
    elif replica_live(int(seen), int(beat), None, now_us):
        state = LIVE
    else:
        state = LOST
    return ReplicaStatus(
        id=str(rid),
        host=str(host),
        pid=int(pid),
        version=str(version),
        started_us=int(started),
        seen_us=int(seen),
        loop_us=int(loop),
        offset_us=int(offset),
        tracked=int(tracked),
        proposes_first=int(first),
        heartbeat_us=int(beat),
        stopped_us=None if stopped is None else int(stopped),
        state=state,
        catalog=None if cat is None else str(cat),
        lost_writes=lost_writes,
    )


def _live_catalogs(replicas: Sequence[ReplicaStatus]) -> dict[str, int]:
    """Each catalog a live replica names, and how many do."""
    weights: dict[str, int] = {}
    for replica in replicas:
        if replica.state == LIVE and replica.catalog is not None:
            weights[replica.catalog] = weights.get(replica.catalog, 0) + 1
    return weights


def _by_state(replicas: list[ReplicaStatus]) -> list[ReplicaStatus]:
    order = {LIVE: 0, LOST: 1, STOPPED: 2}
    return sorted(replicas, key=lambda r: (order[r.state], r.id))


def _lease(row: Sequence[Any], now_us: int) -> LeaseStatus:
    key, owner, token, expires, acquired = row
    expires = int(expires)
    state = RELEASED if expires == 0 else HELD if expires >= now_us else EXPIRED
    return LeaseStatus(str(key), str(owner), int(token), expires, int(acquired), state)
