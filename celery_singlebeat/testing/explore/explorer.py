"""One explored seed: a fault plan drawn from it, run over the real engine, judged.

:func:`draw_plan` draws the faults of a seed (:class:`Fault`, each at an
instant of the run's fault phase); :func:`run_seed` runs three replicas of a
beat app (three static probe entries, the editor lane's stored entries), two
workers and the plan on one :class:`.world.World`, and judges the history
with the one judge (:mod:`.judge`). A seed and a plan (all of the seed's
faults, or the subset a shrink kept) give the same history on every run:
:attr:`Outcome.digest` says so.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from functools import lru_cache, partial
from typing import Any
from unittest import mock

from celery import Celery
from kombu.connection import Connection

from ...engine import Environment
from ...engine import agenda as agenda_module
from ...engine.sharing import bucket_owners
from ...exceptions import StoreUnavailable
from ...schedules.api import Schedules
from ...store.base import SlotKey
from ...timeline.clock import US
from .editor import EDITOR, Editor
from .judge import (
    TASK,
    EditsReport,
    StaticReport,
    db_windows,
    is_stored,
    judge,
    judge_static,
)
from .links import Link, transport_for
from .workers import Workers
from .world import Node, World

__all__ = ["FAULT_KINDS", "Fault", "Outcome", "draw_plan", "run_seed"]

#: the run's settings: a short lease so that stops longer than it, takeovers
#: and holds all happen within a few simulated seconds
LEASE_S = 3.0
TTL_S = 3.0
REPLICAS = 3
WORKERS = 2
#: the static entries: name -> period (s)
PROBES = {"probe-0": 1.0, "probe-1": 2.0, "probe-2": 3.0}
START_US = 1_800_000_000 * US
#: the fault phase, then the settling (every claim held by a fault expires, is
#: taken over and executed), then the judged window ends where the faults did
WARMUP_US = 3 * US
FAULTS_US = 30 * US
SETTLE_US = 25 * US
#: faults per seed
FAULTS = (4, 10)

#: each kind of fault and its weight in a plan
FAULT_KINDS: dict[str, float] = {
    "stop-after-claim": 2.0,
    "stop-after-publish": 1.5,
    "stop-after-feed": 1.0,
    "stop-anywhere": 1.0,
    "kill": 1.5,
    "db-outage": 1.0,
    "db-restart": 1.0,
    "failover": 1.5,
    "answer-lost": 2.0,
    "broker-down": 1.0,
    "broker-loses": 0.7,
    "clock-step": 1.0,
    "worker-dies": 1.5,
    "pause-entry": 1.0,
    "run-now": 1.0,
}

#: statements whose answer a fault may lose
ANSWERS = ("claim", "confirm", "take over", "release", "heartbeat", "read schedule feed",
           "register entries", "write sent slots again")  # fmt: skip


@dataclass(frozen=True)
class Fault:
    """One fault of a plan: its kind, when (µs after the run's start), whom
    (a replica's number, an entry), and how long or how much."""

    at_us: int
    kind: str
    target: int
    amount: float

    def describe(self) -> str:
        return f"t+{self.at_us / US:.2f}s {self.kind} r{self.target} {self.amount:g}"


def draw_plan(seed: int, without: Sequence[str] = ()) -> list[Fault]:
    """The faults of ``seed``, in time order; ``without``: kinds left out
    (their draws are replaced by nothing, the rest of the plan unchanged)."""
    rng = random.Random(f"{seed}-plan")
    kinds = list(FAULT_KINDS)
    weights = list(FAULT_KINDS.values())
    plan = []
    for _ in range(rng.randint(*FAULTS)):
        kind = rng.choices(kinds, weights)[0]
        at = WARMUP_US + rng.randrange(FAULTS_US)
        target = rng.randrange(1, REPLICAS + 1)
        if kind.startswith("stop"):
            # shorter or longer than the lease
            amount = LEASE_S * rng.choice((rng.uniform(0.2, 0.9), rng.uniform(1.1, 3.0)))
        elif kind == "kill":
            amount = rng.uniform(0.3, 4.0)
        elif kind == "db-outage":
            amount = rng.uniform(0.5, 8.0)
        elif kind == "failover":
            amount = rng.uniform(0.2, 2.5)  # how far the standby lagged (s)
        elif kind == "answer-lost":
            amount = float(rng.randrange(len(ANSWERS)))
        elif kind == "broker-down":
            amount = rng.uniform(0.3, 4.0)
        elif kind == "clock-step":
            amount = rng.choice((-1, 1)) * rng.choice((rng.uniform(0.05, 2.0), 90.0))
        elif kind == "pause-entry":
            amount = rng.uniform(1.0, 6.0)
        else:
            amount = 0.0
        if kind not in without:
            plan.append(Fault(at, kind, target, round(amount, 3)))
    plan.sort(key=lambda f: (f.at_us, f.kind, f.target))
    return plan


@dataclass
class Outcome:
    """What one seed gave: its violations (empty: none), and the history's digest."""

    seed: int
    plan: list[Fault]
    violations: list[str] = field(default_factory=list)
    digest: str = ""
    static: StaticReport | None = None
    edits: EditsReport | None = None
    stats: dict[str, int] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.violations


_APP: Celery | None = None


def explorer_app() -> Celery:
    """The beat app every explored replica runs (one per process)."""
    global _APP
    if _APP is None:
        app = Celery("explore", set_as_current=False)
        app.conf.update(
            broker_url="memory://",
            timezone="UTC",
            enable_utc=True,
            task_publish_retry=False,
            beat_max_loop_interval=1.0,
            singlebeat_lease=LEASE_S,
            beat_schedule={
                name: {"task": TASK, "schedule": timedelta(seconds=period), "args": [i]}
                for i, (name, period) in enumerate(PROBES.items())
            },
        )
        _APP = app
    return _APP


class _Run:
    """The machinery of one seed (run_seed builds and drives it)."""

    def __init__(self, seed: int, plan: Sequence[Fault]) -> None:
        self.seed = seed
        self.plan = list(plan)
        self.app = explorer_app()
        self.world = world = World(seed, START_US)
        self.rng = random.Random(f"{seed}-run")
        self.transport = transport_for(world)
        self.skews: dict[int, int] = {}
        self.restarts: dict[int, int] = {}
        #: (name, start, restored) of every time the database was away
        self.outages: list[tuple[str, int, int]] = []
        #: outages in force now: a process started meanwhile cannot reach it
        self.db_down = 0
        self.down_pending: list[tuple[str, int]] = []
        #: since when every replica is stopped or dead (None: one runs)
        self.fleet_down_since: int | None = None
        #: executions whose finish a failover lost with their worker
        self.run_again = 0
        self.failovers: list[tuple[int, int]] = []
        #: (lost after, cut) of each failover: the writes it lost
        self.lost_spans: list[tuple[int, int]] = []
        self.pauses: list[tuple[str, int, int]] = []
        self.run_now: list[tuple[SlotKey, int]] = []
        self.infra: list[tuple[int, int]] = []
        self.ops = Link(world, "operator", world.state)
        self.ops.prepare(True)
        self.editor_link = Link(world, EDITOR, world.state)
        self.editor = Editor(
            None,
            None,
            seed,
            world.clock,
            monotonic=lambda: world.now_us / US,
            sleep=lambda s: None,
            schedules=Schedules(store=self.editor_link, by=EDITOR),
        )
        self.workers = Workers(world, world.state, WORKERS, int(TTL_S * US), self.rng)
        for number in range(1, REPLICAS + 1):
            self.spawn(number)

    # -- replicas -----------------------------------------------------------------

    def spawn(self, number: int) -> None:
        world = self.world
        self.restarts[number] = self.restarts.get(number, 0) + 1
        name = f"r{number}" + (f"#{self.restarts[number]}" if self.restarts[number] > 1 else "")
        link = Link(world, name, world.state, self.skews.get(number, 0))
        link.available = not self.db_down
        node = Node(number, name, link, monotonic_offset=1000.0 * number)
        offset = node.monotonic_offset
        env = Environment(
            monotonic=lambda: world.now_us / US + offset,
            time=lambda: (world.now_us + link.skewed.skew_us) / US,
            random=random.Random(f"{self.seed}-{name}"),
        )
        connection = Connection(transport=self.transport)  # type: ignore[no-untyped-call]
        world.nodes[number] = node
        world.spawn(node, self.app, connection, env)

    def node(self, number: int) -> Node:
        return self.world.nodes[number]

    # -- faults -------------------------------------------------------------------

    def schedule(self) -> None:
        world = self.world
        for fault in self.plan:
            world.at(START_US + fault.at_us, partial(self.strike, fault))
        self.editor.open()
        self.edit_at(START_US + WARMUP_US)

    def edit_at(self, at_us: int) -> None:
        def edit() -> None:
            end = (START_US + WARMUP_US + FAULTS_US) / US
            if self.world.now_us / US < end:
                self.editor.step(self.editor.next_kind(), end)
                self.edit_at(self.world.now_us + int(self.editor.gap() * US))

        self.world.at(at_us, edit)

    def down(self, name: str, seconds: float, broken: bool) -> None:
        world = self.world
        start = world.now_us
        links = self.links()
        with world.state.lock:
            for link in links:
                link.available = False
                if broken:
                    link.interruptions += 1
                    link._broken = True
        end = start + int(seconds * US)
        self.db_down += 1

        def up() -> None:
            # back once no other outage holds it down (they may overlap):
            # each of them restored then
            self.db_down -= 1
            self.down_pending.append((name, start))
            if not self.db_down:
                for link in self.links():
                    link.available = True
                self.outages += [(n, s, world.now_us) for n, s in self.down_pending]
                self.down_pending.clear()

        self.infra.append((start, end))
        world.at(end, up)

    def links(self) -> list[Link]:
        out = [n.link for n in self.world.nodes.values()]
        out += [w.link for w in self.workers.workers]
        return [*out, self.ops, self.editor_link]

    def strike(self, fault: Fault) -> None:
        world = self.world
        kind = fault.kind
        node = self.node(fault.target)
        amount_us = int(fault.amount * US)
        alive = node.state != "dead"
        if kind.startswith("stop") and alive:
            where = {
                "stop-after-claim": "after claim",
                "stop-after-publish": "publish",
                "stop-after-feed": "after read schedule feed",
                "stop-anywhere": "",
            }[kind]
            if where == "" and node.state == "idle":
                node.state = "stopped"
                node.until_us = world.now_us + amount_us
            else:
                node.arm = (where, amount_us)
        elif kind == "kill" and alive:
            world.kill(node)
            world.at(world.now_us + amount_us, partial(self.spawn, fault.target))
        elif kind == "db-outage":
            self.down(f"outage at {self.t(world.now_us)}", fault.amount, True)
        elif kind == "db-restart":
            self.down(f"restart at {self.t(world.now_us)}", 0.3, True)
        elif kind == "failover":
            self.failover(fault.amount)
        elif kind == "answer-lost" and alive:
            world.lose_answer = (node.name, ANSWERS[int(fault.amount)])
        elif kind == "broker-down":
            world.broker_down = True
            end = world.now_us + amount_us
            self.infra.append((world.now_us, end))

            def broker_up() -> None:
                world.broker_down = False

            world.at(end, broker_up)
        elif kind == "broker-loses":
            world.lose_next_publish += 1
        elif kind == "clock-step" and alive:
            skew = node.link.skewed.skew_us + amount_us
            node.link.skewed.skew_us = skew
            self.skews[fault.target] = skew
        elif kind == "worker-dies":
            self.workers.arm_death()
        elif kind == "pause-entry":
            self.pause(f"probe-{fault.target - 1}", amount_us)
        elif kind == "run-now":
            try:
                key = self.ops.request_run(f"probe-{fault.target - 1}")
            except StoreUnavailable:
                return
            self.run_now.append((key, world.now_us))

    def pause(self, entry: str, amount_us: int) -> None:
        world = self.world
        start = world.now_us
        try:
            self.ops.pause(entry, start + amount_us)
        except StoreUnavailable:
            return
        # a pause of an entry paused already replaces it (one row per entry)
        self.pauses = [(e, p0, min(p1, start) if e == entry else p1) for e, p0, p1 in self.pauses]
        self.pauses.append((entry, start, start + amount_us))

    def failover(self, lag_s: float) -> None:
        """An edit the replicas read, then the cut 1.5 s later to a standby
        that lagged ``lag_s`` behind: writes after ``cut - lag`` are gone."""
        world = self.world
        self.editor.edit_now("right before a failover's cut")
        cut = world.now_us + int(1.5 * US)

        def cut_over() -> None:
            lost_after = world.now_us - int(lag_s * US)
            self.ops.lose_writes(lost_after, break_connection=False)
            self.down(f"failover at {self.t(world.now_us)}", 0.3, True)
            self.failovers.append((world.now_us, world.now_us + int(0.3 * US)))
            self.lost_spans.append((lost_after, world.now_us))
            self.editor.after_failover()

        world.at(cut, cut_over)

    def t(self, us: int) -> str:
        return f"t+{(us - START_US) / US:.1f}s"

    # -- the loop -----------------------------------------------------------------

    def loop(self, end_us: int) -> None:
        world = self.world
        while True:
            world.fire_due()
            self.workers.service()
            self.watch_fleet()
            for node in world.nodes.values():
                if node.state == "stopped" and node.until_us <= world.now_us:
                    if node.mid_tick:
                        node.state = "suspended"
                    else:
                        node.state = "idle"
                        node.wake_us = world.now_us
            runnable = sorted(
                (
                    n
                    for n in world.nodes.values()
                    if n.state == "suspended" or (n.state == "idle" and n.wake_us <= world.now_us)
                ),
                key=lambda n: n.number,
            )
            if runnable:
                world.run(world.rng.choice(runnable))
                continue
            if world.now_us >= end_us:
                return
            wakes = [end_us]
            for n in world.nodes.values():
                if n.state == "idle":
                    wakes.append(n.wake_us)
                elif n.state == "stopped":
                    wakes.append(n.until_us)
            upcoming = world.next_event_us()
            if upcoming is not None:
                wakes.append(upcoming)
            world.now_us = max(world.now_us + 1, min(wakes))

    def watch_fleet(self) -> None:
        """Record the spans in which no replica runs (each stopped or dead):
        for the missed-run policy, as an outage of the whole fleet is."""
        now = self.world.now_us
        down = all(n.state in ("stopped", "dead") for n in self.world.nodes.values())
        if down and self.fleet_down_since is None:
            self.fleet_down_since = now
        elif not down and self.fleet_down_since is not None:
            self.outages.append(("fleet stopped", self.fleet_down_since, now))
            self.fleet_down_since = None

    # -- the verdict ----------------------------------------------------------------

    def judge(self, outcome: Outcome) -> None:
        world = self.world
        state = world.state
        upto = START_US + WARMUP_US + FAULTS_US
        rows = {(k.entry, k.slot_us): r for k, r in state.slots.items()}
        records = self.unrecorded_finishes_dropped()
        done: dict[tuple[str, int], list[float]] = {}
        for rec in records:
            slot = (rec["slot"][0], int(rec["slot"][1]))
            if not is_stored(slot[0]):
                done.setdefault(slot, []).append(rec["at"])
        required: set[tuple[str, int]] = set()
        optional: set[tuple[str, int]] = set()

        def held(lo: int, hi: int) -> bool:
            for start, end in self.infra:
                if start <= hi and end + 10 * US >= lo:
                    return True
            if any(
                START_US + f.at_us <= hi and START_US + f.at_us + int(LEASE_S * 3 * US) >= lo
                for f in self.plan
                if f.kind.startswith(("stop", "kill", "answer"))
            ):
                return True
            # a worker that died mid-run holds its slot until the run's ttl, a
            # lease's grace and a sweep have passed (the stalled run's re-send)
            hold = int((TTL_S + 2 * LEASE_S) * US) + 2 * US
            return any(when <= hi and when + hold >= lo for _, _, when, _ in self.workers.died_in)

        claimed_at: dict[tuple[str, int], int] = {}
        for at_us, entry_name, slot_us, _, _ in world.claims:
            key = (entry_name, slot_us)
            claimed_at[key] = min(claimed_at.get(key, at_us), at_us)

        def unclaimed_at_pause(name: str, at: int, p0: int) -> bool:
            """Due before a pause, held back by a fault, and not yet claimed
            when the pause came: not sent ("from its commit on, no replica
            sends a slot of the entry that was not already claimed")."""
            return at < p0 and claimed_at.get((name, at), 2**62) > p0 and held(at - US, p0)

        for name, period in PROBES.items():
            entry = state.entries.get(name)
            if entry is None:
                continue
            step = int(period * US)
            at = entry.anchor_us + step
            while at <= upto:
                # a failover keeps the pauses here: the memory store's
                # lose_writes rolls back slots, run rows and stored schedules,
                # not the operators' controls (docs/testing.md says so)
                paused = any(
                    e == name and (p0 - US <= at <= p1 + US or unclaimed_at_pause(name, at, p0))
                    for e, p0, p1 in self.pauses
                )
                (optional if paused else required).add((name, at))
                at += step
        for key, at in self.run_now:
            slot = (key.entry, key.slot_us)
            if self.lost(at) or any(
                e == key.entry and p0 <= at <= p1 + US for e, p0, p1 in self.pauses
            ):
                optional.add(slot)
            elif slot[1] <= upto:
                required.add(slot)
        # A worker died in the middle of a run whose row a failover then lost
        # (the run started after the standby's lag): no trace of the run is
        # left for the fleet's stalled-run re-send, and the message died with
        # its worker (no acks_late). Not executed: allowed, and named
        # (docs/guarantees.md, "A worker that dies mid-run").
        untraced = {
            slot
            for slot, _, _, started in self.workers.died_in
            if any(after < started <= cut for after, cut in self.lost_spans)
        }
        optional |= required & untraced
        required -= untraced
        first_claims = [(c[0], c[1], c[3]) for c in world.claims]
        windows = db_windows(self.outages, first_claims)
        early = {(c[1], c[2]) for c in world.claims if c[3] == 1 and c[0] < c[2] - 250_000}
        lost_ids = world.broker_lost

        def broker_lost(slots: list[tuple[str, int]]) -> set[tuple[str, int]]:
            from ...timeline.slots import slot_task_id

            return {s for s in slots if slot_task_id(*s) in lost_ids}

        def sent(slot: tuple[str, int]) -> bool:
            row = rows.get(slot)
            return row is not None and row.state == 1

        static = judge_static(
            required, optional, done, windows, upto, START_US, sent, broker_lost, early
        )
        outcome.static = static
        outcome.violations += static.problems
        for s in static.lost_slots[:20]:
            outcome.violations.append(f"lost: {s[0]}@{s[1]} ({self.t(s[1])}) row {rows.get(s)}")
        # no claim of a paused entry while its pause was in force
        for at, claimed, slot_us, _, by in world.claims:
            for e, p0, p1 in self.pauses:
                if e == claimed and p0 < at < p1:
                    outcome.violations.append(
                        f"claimed while paused: {claimed}@{slot_us} by {by} at {self.t(at)}"
                    )
        history = list(state.schedule_log)

        edits = judge(
            self.editor.attempts,
            history,
            records,
            list(windows),
            self.failovers,
            upto,
            START_US,
            sent,
            broker_lost,
            held,
            int(LEASE_S * US) // 3 + 3 * US,
            untraced.__contains__,
        )
        outcome.edits = edits
        outcome.violations += edits.problems
        outcome.violations += world.errors
        outcome.stats = {
            "claims": len(world.claims),
            "executed": len(self.workers.records),
            "repeats": self.workers.repeats,
            "worker_deaths": len(self.workers.died_in),
            "run_again": self.run_again,
            "edits": len(self.editor.attempts),
        }
        digest = hashlib.sha256()
        for rec in self.workers.records:
            digest.update(repr(sorted(rec.items())).encode())
        for claim in world.claims:
            digest.update(repr(claim).encode())
        outcome.digest = digest.hexdigest()[:16]

    def unrecorded_finishes_dropped(self) -> list[dict[str, Any]]:
        """The executions, but for a finished one whose finish a failover lost
        while its worker process died before writing it back, when the slot
        ran again after (the fleet saw a stalled run and sent it again: no
        trace of the finish was left; an allowance, docs/guarantees.md "A
        worker dies mid-run"), counted in ``self.run_again``."""
        records = self.workers.records
        later: dict[tuple[str, int], float] = {}
        for rec in records:
            slot = (rec["slot"][0], int(rec["slot"][1]))
            later[slot] = max(later.get(slot, 0.0), rec["at"])
        kept = []
        for rec in records:
            slot = (rec["slot"][0], int(rec["slot"][1]))
            finished = int(rec["finished"] * US)
            died = self.workers.deaths.get(rec["pid"])
            if (
                died is not None
                and later[slot] > rec["at"]
                and any(
                    after < finished <= cut and finished < died <= cut + 2 * US
                    for after, cut in self.lost_spans
                )
            ):
                self.run_again += 1
                continue
            kept.append(rec)
        return kept

    def lost(self, at_us: int) -> bool:
        """A control written ``at_us`` that a failover's lagging standby lost."""
        return any(after < at_us <= cut for after, cut in self.lost_spans)


@lru_cache(maxsize=32)
def _bucket_owners(live: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(bucket_owners(live))


def run_seed(
    seed: int, plan: Sequence[Fault] | None = None, without: Sequence[str] = ()
) -> Outcome:
    """Explore ``seed`` with ``plan`` (default: all of the seed's faults but
    the kinds ``without``)."""
    faults = draw_plan(seed, without) if plan is None else list(plan)
    outcome = Outcome(seed, faults)
    # Each replica deals the 65,536 buckets among the live set it sees (13 ms
    # a deal, half of a seed's time): the replicas of one process share the
    # deals here. A pure function of the live set, so nothing changes but
    # the time (a beat process has one replica, and caches its own).
    with mock.patch.object(agenda_module, "bucket_owners", _bucket_owners):
        run = _Run(seed, faults)
        try:
            run.schedule()
            run.loop(START_US + WARMUP_US + FAULTS_US + SETTLE_US)
            run.judge(outcome)
        finally:
            run.world.close()
    return outcome


def shrink(seed: int, plan: Sequence[Fault]) -> list[Fault]:
    """The shortest sub-plan found that still fails (one fault removed at a
    time, while the seed still fails without it)."""
    kept = list(plan)
    changed = True
    while changed:
        changed = False
        for i in range(len(kept)):
            trial = kept[:i] + kept[i + 1 :]
            if not run_seed(seed, trial).ok:
                kept = trial
                changed = True
                break
    return kept
