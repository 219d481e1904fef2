"""The editor lane: stored entries edited while the faults run.

Used by the chaos run (``benchmarks/chaos.py``, over a real database) and by
the explorer (over the in-memory one), so that both make the same edits and
record them the same way for the one judge (:mod:`.judge`).

The editor (:class:`Editor`, drawn from its seed) goes through ``Schedules``,
so outages, restarts and failovers hit its writes as they hit the replicas'
claims. It keeps four entries (``ed-0``..``ed-3``) and edits them all through
the run: a new interval or crontab, new arguments, disable and enable, delete
and (a few seconds later) add again; it also adds limited entries: single runs
at an instant (``once-K``) and interval entries limited to N runs (``max-K``).
Every write carries a version number ``v`` of the editor's own, in the
entry's kwargs (the worker records it with each execution) and in the
write's ``why`` (the history keeps it), so that each execution tells which
definition it was sent under and the history tells which writes committed.

An edit that raised may still have committed (the commit went out, the
answer did not come back); an edit that returned may be undone by a failover
(its commit had not reached the standby). So the editor reads an entry back
before editing it again after an error.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from ...exceptions import ScheduleNotFound
from ...schedules.api import Schedules
from ...schedules.entry import StoredEntry, stored_entry, with_changes
from .judge import EDITOR, TASK, US, WHY, Attempt, _at, _us

#: the entries the editor keeps all through the run, and the argument (the
#: worker's singleton key) of each; limited entries take 4100+K and 4200+K
REGULAR = ("ed-0", "ed-1", "ed-2", "ed-3")
ARG = 4000
#: the schedules an edit draws from: intervals of 1 to 3 s, and for ``ed-2``
#: also whole-minute crontabs (UTC), so an edit moves between the two kinds
INTERVALS = (1, 2, 3)
CRONTABS = ("* * * * *", "*/2 * * * *")
#: every kind once (shuffled), then drawn by weight
KINDS = {"schedule": 3.0, "kwargs": 2.0, "toggle": 2.0, "delete": 1.2, "once": 1.0, "limited": 1.0}
#: seconds between two edits
GAP = (1.0, 3.0)
#: a limited entry is added only while its runs (at most 8 s after its
#: commit) end this long before the faults do: judged whole
LIMITED_MARGIN = 12.0


class Editor:
    """The editor lane: one ``Schedules`` through the run's database proxy."""

    def __init__(
        self,
        url: str | None,
        prefix: str | None,
        seed: int,
        now_us: Callable[[], int],
        *,
        monotonic: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        schedules: Schedules | None = None,
    ) -> None:
        """``url`` and ``prefix``: the database the chaos run edits; or
        ``schedules``, one over a store already open (the explorer's). The
        lane's clocks are passed in: the explorer's are simulated."""
        self.url = url
        self.prefix = prefix
        self.rng = random.Random(f"{seed}-editor")
        self.now_us = now_us
        self.monotonic = monotonic
        self.sleep = sleep
        #: the lane's thread and the failover fault's edit take turns
        self.lock = threading.Lock()
        self.attempts: list[Attempt] = []
        #: what the editor believes stored (None: deleted); a name in
        #: ``unknown`` is read back before its next edit
        self.current: dict[str, StoredEntry | None] = {}
        self.unknown: set[str] = set()
        #: deleted entries and when (monotonic) to add them again
        self.recreate_at: dict[str, float] = {}
        self.limited = 0
        self.schedules: Schedules | None = schedules
        #: every kind once (shuffled), then drawn by weight (next_kind)
        self._first = list(KINDS)
        self.rng.shuffle(self._first)

    # -- writing ------------------------------------------------------------

    def open(self) -> None:
        """The regular entries, before the faults start (these must commit)."""
        if self.schedules is None:
            self.schedules = Schedules(self.url, table_prefix=self.prefix, by=EDITOR)
        for name in REGULAR:
            attempt = self._create(name, "create")
            if attempt.error:
                raise RuntimeError(f"editor: creating {name} failed: {attempt.error}")

    def _write(
        self,
        action: str,
        name: str,
        intended: StoredEntry | None,
        call: Callable[[str], StoredEntry | None],
        note: str = "",
        fields: dict[str, Any] | None = None,
    ) -> Attempt:
        attempt = Attempt(
            len(self.attempts) + 1, name, action, self.now_us(), intended, note, fields=fields
        )
        self.attempts.append(attempt)
        try:
            result = call(f"{WHY}{attempt.v} {action}")
        except Exception as exc:  # an outage, a failover: committed or not, read later
            attempt.error = f"{type(exc).__name__}: {exc}"[:300]
            self.unknown.add(name)
        else:
            if result is not None:
                attempt.revision = result.revision
                attempt.created_us = _us(result.created)
                attempt.updated_us = _us(result.updated)
            self.current[name] = result
        attempt.done_us = self.now_us()
        return attempt

    def _kwargs(self) -> dict[str, int]:
        return {"v": len(self.attempts) + 1}

    def _draw_schedule(self, name: str, current: object = None) -> Any:
        choices: list[Any] = [timedelta(seconds=s) for s in INTERVALS]
        if name == "ed-2":
            choices = [{"crontab": c, "tz": "UTC"} for c in CRONTABS] + [timedelta(seconds=2)]
        while True:
            drawn = self.rng.choice(choices)
            candidate = stored_entry(name, TASK, drawn, args=[0])
            if current is None or candidate.schedule != current:
                return drawn

    def _create(self, name: str, action: str) -> Attempt:
        assert self.schedules is not None
        schedules = self.schedules
        entry = stored_entry(
            name,
            TASK,
            self._draw_schedule(name),
            args=[ARG + REGULAR.index(name)],
            kwargs=self._kwargs(),
        )
        return self._write(action, name, entry, lambda why: schedules.upsert(entry, why=why))

    def _update(self, action: str, name: str, note: str = "", **fields: Any) -> Attempt:
        assert self.schedules is not None
        schedules = self.schedules
        current = self.current[name]
        assert current is not None
        fields["kwargs"] = self._kwargs()
        intended = with_changes(current, **fields)
        return self._write(
            action,
            name,
            intended,
            lambda why: schedules.update(name, why=why, **fields),
            note,
            dict(fields),
        )

    def _sync(self) -> None:
        """Read back what an error left unknown: which write won, if any."""
        assert self.schedules is not None
        for name in sorted(self.unknown):
            try:
                self.current[name] = self.schedules.get(name)
            except ScheduleNotFound:
                self.current[name] = None
            except Exception:
                continue  # still away: read again before the next edit
            self.unknown.discard(name)

    def _editable(self) -> list[str]:
        return [
            n
            for n in REGULAR
            if n not in self.unknown and self.current.get(n) is not None
            and n not in self.recreate_at
        ]  # fmt: skip

    def step(self, kind: str, end: float) -> None:
        """One edit of ``kind`` (or, when it cannot apply now, a kwargs edit)."""
        assert self.schedules is not None
        schedules = self.schedules
        self._sync()
        due = [n for n, at in sorted(self.recreate_at.items()) if at <= self.monotonic()]
        if due and due[0] not in self.unknown:
            del self.recreate_at[due[0]]
            self._create(due[0], "recreate")
            return
        if kind in ("once", "limited") and self.monotonic() + LIMITED_MARGIN > end:
            kind = "kwargs"
        if kind in ("once", "limited"):
            k = self.limited
            self.limited += 1
            if kind == "once":
                at = _at(self.now_us() + int(self.rng.uniform(2.0, 6.0) * US))
                entry = stored_entry(
                    f"once-{k}", TASK, at, args=[ARG + 100 + k], kwargs=self._kwargs()
                )
            else:
                entry = stored_entry(
                    f"max-{k}",
                    TASK,
                    timedelta(seconds=1),
                    args=[ARG + 200 + k],
                    kwargs=self._kwargs(),
                    max_runs=self.rng.randint(2, 4),
                )
            self._write(kind, entry.name, entry, lambda why: schedules.upsert(entry, why=why))
            return
        names = self._editable()
        if not names:
            return
        name = self.rng.choice(names)
        current = self.current[name]
        assert current is not None
        if kind == "schedule":
            self._update("schedule", name, schedule=self._draw_schedule(name, current.schedule))
        elif kind == "toggle":
            action = "disable" if current.enabled else "enable"
            self._update(action, name, enabled=not current.enabled)
        elif kind == "delete":
            self.recreate_at[name] = self.monotonic() + self.rng.uniform(2.0, 5.0)
            self._write("delete", name, None, lambda why: schedules.delete(name, why=why))
        else:
            self._update("kwargs", name)

    def edit_now(self, note: str) -> Attempt | None:
        """A kwargs edit at once (the failover fault's, right before its cut)."""
        with self.lock:
            self._sync()
            names = self._editable()
            if not names:
                return None
            return self._update("kwargs", self.rng.choice(names), note=note)

    def after_failover(self) -> None:
        """A failover may have undone what the editor believes stored: every
        entry is read back before its next edit."""
        with self.lock:
            self.unknown.update(REGULAR)

    def next_kind(self) -> str:
        """The kind of the next edit: every kind once, then drawn by weight."""
        if self._first:
            return self._first.pop(0)
        return self.rng.choices(list(KINDS), list(KINDS.values()))[0]

    def gap(self) -> float:
        """Seconds to the next edit."""
        return self.rng.uniform(*GAP)

    def run(self, end: float, abort: threading.Event) -> None:
        """Edits at random gaps until ``end`` (monotonic): every kind once, then by weight."""
        while not abort.wait(self.gap()) and self.monotonic() < end:
            kind = self.next_kind()
            with self.lock:
                self.step(kind, end)

    def history(self) -> list[Any]:
        """The history of the database the run ended on (retried while it is away)."""
        assert self.schedules is not None
        for _ in range(30):
            try:
                return self.schedules.log(limit=100_000)
            except Exception:
                self.sleep(1.0)
        return self.schedules.log(limit=100_000)

    def close(self) -> None:
        if self.schedules is not None:
            self.schedules.close()


__all__ = ["EDITOR", "REGULAR", "Attempt", "Editor"]
