"""The one judge: what became of each slot, from a run's history.

Used by the chaos run of real processes (``benchmarks/chaos.py``) and by the
explorer (:mod:`.explorer`) alike: one implementation of every check, so that
an allowance is made once, in one place, and named in docs/guarantees.md.

The static entries (:func:`judge_static`): each slot executed once to
completion, none lost (a slot that fell due while the database was away is
the missed-run policy's, :class:`DbWindow`; one the broker lost after taking
it is counted apart), none executed for an instant its entry does not have,
none claimed, sent or run early.

The stored entries, edited by the editor lane (:mod:`.editor`): every write
carries the editor's version number in the entry's kwargs, so each execution
says which definition it was sent under; the history of the database the run
ended on is the truth of which writes committed (a write that returned but is
missing there was lost with the failover that followed it).

The verdict (:func:`judge`), per execution of a stored entry, on the
database's clock:

* **outdated**: sent under a version replaced more than 1 s (the promise of
  docs/schedules.md) before the slot's instant, or under one never committed;
* **premature**: a slot at or before its version's commit that was no slot
  of the version in force at its instant (no slot before an edit is sent
  under it); one that was, claimed before the edit and sent after it (a
  publish retried after a broker restart, a takeover), goes out with the
  definition its sender has then, as docs/schedules.md says, and is counted
  apart (*sent late under a newer definition*);
* **no slot of its version**: an instant the definition it carries does not
  have (disabled, past its runs, another grid);
* **executed twice**: one entry and instant executed more than once;
* **lost**: an instant of the version in force, more than 1 s after its
  commit and before the next, never executed, unless it fell due while the
  database was away (the missed-run policy's, as for the static entries) or
  the broker lost it after taking it; one due less than a reconnect's hold
  (a sweep and 2 s) and a second before its version was replaced, whose
  claim a fault held back past the replacement, is counted apart (*dropped
  with its version*: the new definition sends nothing at or before its
  commit, and the old one is gone), unless a failover had put that version
  back (the replicas that had read the lost write may never have known);
* **limited runs**: each ``once-K`` and ``max-K`` executed exactly as many
  times as asked, or, when some of its instants fell due in a database
  outage, no more and no fewer than the missed-run policy leaves (coalesce:
  the latest missed instant of the outage is sent, the others are not).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from typing import Any, Protocol

from ...schedules.entry import StoredEntry, with_changes
from ...schedules.runs import sequence_of_entry

US = 1_000_000
#: the task every probe slot runs (the worker records each execution)
TASK = "singletonapp.slot_probe"
#: who the history says wrote, and how its ``why`` starts (then the version)
EDITOR = "chaos-editor"
WHY = "chaos v"
#: a commit is in effect on every replica within this (docs/schedules.md)
EFFECT_US = US


class Window(Protocol):
    """A database outage's slots (:class:`DbWindow`): the missed-run policy's."""

    #: from just before the database went away, to when it was back
    start_us: int
    restored_us: int

    def contains(self, slot: tuple[str, int]) -> bool: ...


@dataclass
class Attempt:
    """One write the editor tried, and what the store answered."""

    v: int
    name: str
    #: create, recreate, schedule, kwargs, disable, enable, delete, once, limited
    action: str
    asked_us: int
    #: the definition it writes, as the editor believes it (None for a delete)
    intended: StoredEntry | None
    note: str = ""
    #: an update's fields: what it changes on the row as stored
    fields: dict[str, Any] | None = None
    done_us: int = 0
    #: the returned row's revision, created and updated (the database's
    #: clock); None when it raised (or for a delete, which returns nothing)
    revision: int | None = None
    created_us: int | None = None
    updated_us: int | None = None
    error: str = ""


def _us(when: datetime | None) -> int | None:
    return None if when is None else int(when.timestamp() * US)


def _at(us: int) -> datetime:
    return datetime.fromtimestamp(us / US, timezone.utc)


# -- the static entries -------------------------------------------------------------

#: the missed-run grace of the runs judged (``singlebeat_missed_grace``'s default)
GRACE_US = 5 * US
#: a slot due this long before an outage began is the outage's too: its claim
#: may have been cut (a statement sent, no answer)
OUTAGE_BEFORE_US = US
#: the edge of an outage's window (when exactly a replica planned what was
#: missed) is known to within this
OUTAGE_EDGE_US = US // 2
#: an outage that begins this soon after another ended may find replicas not
#: back yet (their backoff is up to 1.5 s, the others' share FALLBACK_DELAY_US
#: later): the entries they had not planned wait for the end of the second
OUTAGE_CHAIN_US = 3 * US
#: a claim may win a slot this much before its instant (EARLY_TOLERANCE_US)
EARLY_US = 250_000

Slot = tuple[str, int]


@dataclass
class DbWindow:
    """Slots that fell due while the database was away: the missed-run policy's."""

    fault: str
    start_us: int
    restored_us: int
    #: the first claim after the database was back, of any entry and per entry:
    #: when the replica that made it planned what was missed
    recovered_us: int | None
    recovered: dict[str, int]
    #: the slots due inside it
    slots: list[Slot] = field(default_factory=list)
    grace_us: int = GRACE_US
    #: the next outage, when it began before every replica could be back
    #: (OUTAGE_CHAIN_US after this one's end): an entry not claimed between
    #: the two was planned again only after it
    chained: DbWindow | None = None

    def recovery(self, entry: str) -> int | None:
        if entry in self.recovered:
            return self.recovered[entry]
        if self.chained is not None:
            return self.chained.recovery(entry)
        return self.recovered_us

    def contains(self, slot: Slot) -> bool:
        """Due after the outage began, and more than the grace before its
        entry's first claim after it (give or take OUTAGE_EDGE_US)."""
        recovered = self.recovery(slot[0])
        end = 2**62 if recovered is None else recovered - self.grace_us + OUTAGE_EDGE_US
        return self.start_us <= slot[1] <= end


def db_windows(
    outages: Iterable[tuple[str, int, int]],
    claims: Iterable[tuple[int, str, int]],
    grace_us: int = GRACE_US,
) -> list[DbWindow]:
    """The window of each outage ``(name, start, restored)`` (the database's
    clock), from the claims ``(claimed at, entry, fence)`` made after it. The
    first replica back plans every entry at once (the others' share
    FALLBACK_DELAY_US later): an entry's own first claim then, if it had slots
    due, says when exactly. A taken-over row keeps only the taker's claim
    time, so only first claims (fence 1) are read; leave out rows a
    write-back stamped (they say nothing of when claiming resumed)."""
    ordered = sorted(claims)
    windows = []
    for name, start_us, restored_us in outages:
        after = [c for c in ordered if c[0] >= restored_us]
        first = after[0][0] if after else None
        recovered: dict[str, int] = {}
        for claimed_us, entry, fence in after:
            # each replica plans its share as it comes back (its backoff up to
            # 1.5 s), the others' a fallback delay later
            if first is not None and claimed_us > first + OUTAGE_CHAIN_US:
                break
            if fence == 1:
                recovered.setdefault(entry, claimed_us)
        windows.append(
            DbWindow(name, start_us - OUTAGE_BEFORE_US, restored_us, first, recovered, [], grace_us)
        )
    ordered_windows = sorted(windows, key=lambda w: w.start_us)
    for window, after_it in zip(ordered_windows, ordered_windows[1:]):
        if after_it.start_us + OUTAGE_BEFORE_US - window.restored_us < OUTAGE_CHAIN_US:
            window.chained = after_it
    return windows


@dataclass
class StaticReport:
    """What became of the static entries' slots (:func:`judge_static`)."""

    #: required slots outside every outage's window
    due_required: int = 0
    executed: int = 0
    executed_twice: int = 0
    unexpected: int = 0
    lost: int = 0
    #: of the lost, those whose slot row says sent (confirmed) all the same
    lost_never_sent: int = 0
    #: sent and confirmed, and the broker lost them after taking them
    lost_in_broker: list[Slot] = field(default_factory=list)
    early: int = 0
    lost_slots: list[Slot] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (self.executed_twice or self.unexpected or self.lost or self.early)


def judge_static(
    required: set[Slot],
    optional: set[Slot],
    done: dict[Slot, list[float]],
    windows: list[DbWindow],
    upto_us: int,
    started_us: int,
    sent: Callable[[Slot], bool],
    broker_lost: Callable[[list[Slot]], set[Slot]],
    early: Iterable[Slot] = (),
) -> StaticReport:
    """The verdict on the static entries' slots up to ``upto_us``.

    ``required``: the slots that must be executed once (outside the outages'
    windows, which take the slots due in them, per :class:`DbWindow`);
    ``optional``: slots that may be executed once or not at all; ``done``:
    each slot's executions to completion (their start, seconds since the
    epoch); ``sent``: the slot's row says it was sent; ``broker_lost``: of the
    missing slots that were sent, those the broker lost after taking them;
    ``early``: slots claimed or sent before their instant, beyond the
    tolerance, as the caller saw them (an execution that started early is
    found here)."""
    report = StaticReport()

    def t(us: int) -> str:
        return f"t+{(us - started_us) / US:.1f}s"

    def in_window(slot: Slot) -> DbWindow | None:
        return next((w for w in windows if w.contains(slot)), None)

    due = required | {s for s in optional if s in done}
    executed = {s for s in done if s[1] <= upto_us}
    report.executed = len(executed)
    twice = sorted(s for s in executed if len(done[s]) > 1)
    report.executed_twice = len(twice)
    for s in twice[:20]:
        report.problems.append(f"executed {len(done[s])}x: {s[0]}@{s[1]} ({t(s[1])})")
    unexpected = sorted(executed - due - optional)
    report.unexpected = len(unexpected)
    for s in unexpected[:20]:
        report.problems.append(f"executed, but no slot of its entry: {s[0]}@{s[1]} ({t(s[1])})")
    lost = []
    for slot in sorted(required):
        window = in_window(slot)
        if window is not None:
            window.slots.append(slot)
            continue
        report.due_required += 1
        if slot not in done:
            lost.append(slot)
    in_broker = broker_lost([s for s in lost if sent(s)])
    report.lost_in_broker = sorted(in_broker)
    lost = [s for s in lost if s not in in_broker]
    report.lost = len(lost)
    report.lost_slots = lost
    report.lost_never_sent = sum(1 for s in lost if not sent(s))
    tolerance = EARLY_US / US
    early_slots = set(early) | {
        s for s, starts in done.items() if starts and min(starts) < s[1] / US - tolerance
    }
    report.early = len(early_slots)
    for s in sorted(early_slots)[:20]:
        report.problems.append(f"claimed, sent or run early: {s[0]}@{s[1]} ({t(s[1])})")
    return report


# -- the verdict -------------------------------------------------------------------


@dataclass
class Version:
    """One committed state of an entry from its commit (the database's
    clock): its definition as stored, disabled too (None: deleted)."""

    v: int
    stored: StoredEntry | None
    since_us: int
    #: a write that returned, then was lost with a failover
    lost: bool = False

    @property
    def entry(self) -> StoredEntry | None:
        """The definition the replicas run (None: disabled or deleted)."""
        return self.stored if self.stored is not None and self.stored.enabled else None


@dataclass
class Segment:
    start_us: int
    end_us: int
    version: Version


@dataclass
class EditsReport:
    """What became of the stored entries' edits and slots (module docstring)."""

    attempted: int = 0
    #: in the history of the database the run ended on
    committed: int = 0
    #: raised, and not in that history: not committed
    failed: int = 0
    #: raised, yet in that history: committed, the answer lost
    uncertain_committed: int = 0
    #: returned, then lost with a failover (not in that history)
    lost_in_failover: int = 0
    by_action: dict[str, int] = field(default_factory=dict)
    #: the edits made right before a failover's cut, and their fate
    at_failover: list[str] = field(default_factory=list)
    #: every edit tried: what, when (UTC, the database's clock) and its fate
    log: list[dict[str, Any]] = field(default_factory=list)
    due: int = 0
    in_outage: int = 0
    executed: int = 0
    executed_twice: int = 0
    lost: int = 0
    lost_in_broker: int = 0
    outdated: int = 0
    premature: int = 0
    #: slots of the version in force at their instant, sent after a later
    #: edit under the newer definition (a retried publish, a takeover): allowed
    late_newer: int = 0
    #: slots due while a write a failover lost was in force, sent after the
    #: failover under the version it put back: allowed
    late_surviving: int = 0
    #: missing slots whose worker died mid-run and whose run row a failover
    #: lost: allowed (no trace of the run is left to send it again by)
    untraced: int = 0
    #: slots of a version a failover put back, due before the replicas could
    #: read it again (the database away again after the cut): not owed
    found_again_late: int = 0
    #: missing slots due less than a reconnect's hold before their version was
    #: replaced, whose claim a fault held back past the replacement
    dropped_with_version: int = 0
    dropped: list[str] = field(default_factory=list)
    not_a_slot: int = 0
    limited: list[dict[str, Any]] = field(default_factory=list)
    limited_wrong: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (
            self.outdated
            or self.premature
            or self.not_a_slot
            or self.executed_twice
            or self.lost
            or self.limited_wrong
        )


def stored_executions(
    records: Iterable[dict[str, Any]],
) -> dict[tuple[str, int], list[tuple[float, int | None]]]:
    """(entry, slot) -> [(start, version)] of every stored entry's execution
    (a slot's start records, one per execution: task id, process, token)."""
    out: dict[tuple[str, int], list[tuple[float, int | None]]] = defaultdict(list)
    seen: set[tuple[Any, ...]] = set()
    for rec in records:
        if rec["event"] != "start" or rec["task"] != TASK or not rec.get("slot"):
            continue
        entry, slot_us = rec["slot"][0], int(rec["slot"][1])
        ident = (rec["task_id"], rec["pid"], rec["token"])
        if not is_stored(entry) or ident in seen:
            continue
        seen.add(ident)
        out[(entry, slot_us)].append((rec["at"], rec.get("v")))
    return out


def is_stored(entry: str) -> bool:
    return entry.startswith(("ed-", "once-", "max-"))


def is_limited(entry: str) -> bool:
    return entry.startswith(("once-", "max-"))


def instants(entry: StoredEntry, after_us: int, upto_us: int) -> list[int]:
    """The definition's slots in (after, upto], as the engine computes them."""
    assert entry.created is not None
    sequence = sequence_of_entry(entry, _us(entry.created) or 0, timezone.utc)
    out: list[int] = []
    at: int | None = after_us
    while True:
        assert at is not None
        at = sequence.next_after(at)
        if at is None or at > upto_us:
            return out
        out.append(at)


def timelines(
    attempts: list[Attempt],
    history: list[Any],
    failovers: list[tuple[int, int]],
    report: EditsReport,
) -> tuple[dict[str, list[Segment]], set[int]]:
    """Each entry's versions in force, from the history that survived and the
    writes a failover lost (``failovers``: (cut, moved) on the database's
    clock), and the versions that history has; counts each attempt's fate
    into ``report``."""
    by_v = {a.v: a for a in attempts}
    kept: dict[int, Any] = {}
    for row in history:
        if row.by == EDITOR and row.why.startswith(WHY):
            kept[int(row.why[len(WHY) :].split()[0])] = row
    # (at, order, v, action, survived): a revert (order 0) before a write at the same instant
    events: dict[str, list[tuple[int, int, int, str, bool]]] = defaultdict(list)
    for v, row in kept.items():
        events[row.name].append((row.at_us, 1, v, row.action, True))
    report.attempted = len(attempts)
    report.by_action = dict(Counter(a.action for a in attempts))
    for a in attempts:
        if a.v in kept:
            report.committed += 1
            report.uncertain_committed += bool(a.error)
            fate = f"committed (revision {kept[a.v].revision})"
        elif a.error:
            report.failed += 1
            fate = "not committed (" + a.error[:80] + ")"
        else:
            report.lost_in_failover += 1
            # a delete returns no row: the moment it returned, after its commit
            at = a.updated_us or a.done_us
            # in force until the old primary's last answer, the cut (or its
            # own commit, when that came after the cut was stamped): from
            # then on no database has it, and the one that answers next has
            # the surviving version (issue 30: seed 7's ed-0@t+341.1, due in
            # the 0.25 s between the cut and the move, was judged outdated
            # for going out under the surviving version)
            moved = next((max(cut, at) for cut, m in failovers if m >= at), None)
            if moved is None:
                report.problems.append(
                    f"edit v{a.v} ({a.action} {a.name}) returned, yet the history of the "
                    "database has no trace of it and no failover followed"
                )
                moved = 2**62
            reverted = "never" if moved == 2**62 else _at(moved).isoformat()
            fate = (
                f"lost with the failover (returned at {_at(at).isoformat()}, reverted {reverted})"
            )
            created = a.created_us is not None and a.created_us == a.updated_us
            action = "deleted" if a.action == "delete" else "created" if created else "changed"
            events[a.name].append((at, 1, a.v, action, False))
            events[a.name].append((moved, 0, 0, "revert", False))
        if a.note:
            report.at_failover.append(f"v{a.v} {a.action} {a.name} ({a.note}): {fate}")
        report.log.append(
            {
                "v": a.v,
                "entry": a.name,
                "action": a.action,
                "asked": _at(a.asked_us).isoformat(timespec="milliseconds"),
                "returned": _at(a.done_us).isoformat(timespec="milliseconds"),
                "revision": kept[a.v].revision if a.v in kept else a.revision,
                "committed": (
                    _at(kept[a.v].at_us).isoformat(timespec="milliseconds") if a.v in kept else None
                ),
                "schedule": None if a.intended is None else str(a.intended.schedule),
                "enabled": None if a.intended is None else a.intended.enabled,
                "fate": fate,
                "note": a.note,
            }
        )
    out: dict[str, list[Segment]] = {}
    for name, items in events.items():
        segments: list[Segment] = []
        # the state each write applied to: a surviving write to the last
        # surviving state (the new primary's), a lost one to the last of all
        # (the old primary's); an update is a delta on it, not the editor's
        # belief, which a lost write had led astray
        last: Version | None = None
        surviving: Version | None = None
        for at, _, v, action, survived in sorted(items):
            if action == "revert":
                new = surviving
            elif action == "deleted":
                new = Version(v, None, at, not survived)
            else:
                attempt = by_v[v]
                base = (surviving if survived else last) if action == "changed" else None
                if attempt.fields is not None and base is not None and base.stored is not None:
                    stored = with_changes(base.stored, **attempt.fields)
                else:
                    assert attempt.intended is not None
                    stored = attempt.intended
                    if base is not None and base.stored is not None:
                        stored = replace(stored, created=base.stored.created)
                if action == "created" or stored.created is None:
                    stored = replace(stored, created=_at(at))
                new = Version(v, replace(stored, updated=_at(at)), at, not survived)
            last = new
            if survived:
                surviving = new
            if segments:
                segments[-1].end_us = at
            if new is not None:
                segments.append(Segment(at, 2**62, new))
        out[name] = segments
    return out, set(kept)


def judge(
    attempts: list[Attempt],
    history: list[Any],
    records: Iterable[dict[str, Any]],
    windows: list[Window],
    failovers: list[tuple[int, int]],
    upto_us: int,
    started_us: int,
    sent: Callable[[tuple[str, int]], bool],
    broker_lost: Callable[[list[tuple[str, int]]], set[tuple[str, int]]],
    held: Callable[[int, int], bool],
    hold_us: int,
    untraced: Callable[[tuple[str, int]], bool] = lambda slot: False,
) -> EditsReport:
    """The verdict on the stored entries (module docstring). ``sent``: the
    slot's row says it was sent; ``broker_lost``: of those, the ones the
    broker lost after taking them (chaos.Chaos.lost_in_broker); ``held``: a
    fault was in force between two instants that can hold a claim back, for
    up to ``hold_us`` (a reconnect's hold of fallback proposals, and a
    second); ``untraced``: a slot whose worker died mid-run and whose run row
    a failover then lost (nothing is left to send it again by: allowed)."""
    report = EditsReport()
    segments, kept = timelines(attempts, history, failovers, report)
    done = stored_executions(records)

    def t(us: int) -> str:
        return f"t+{(us - started_us) / US:.1f}s"

    def in_window(slot: tuple[str, int]) -> bool:
        return any(w.contains(slot) for w in windows)

    # each execution against the versions of its entry
    for slot, runs in sorted(done.items()):
        name, at = slot
        if len(runs) > 1:
            report.executed_twice += 1
            report.problems.append(f"stored slot executed {len(runs)}x: {name}@{at} ({t(at)})")
        for started, v in runs:
            mine = [s for s in segments.get(name, []) if s.version.v == v]
            if not mine:
                report.outdated += 1
                report.problems.append(
                    f"outdated: {name}@{at} ({t(at)}) sent under v{v}, never committed"
                )
                continue
            if any(s.start_us < at <= s.end_us + EFFECT_US for s in mine):
                entry = next(s.version.entry for s in mine)
                if entry is None or at not in instants(entry, at - 1, at):
                    report.not_a_slot += 1
                    report.problems.append(
                        f"no slot of its version: {name}@{at} ({t(at)}) under v{v}"
                    )
            elif at <= min(s.start_us for s in mine):
                # the version in force at its instant, or one replaced less
                # than a second before it (a claim may still go under it)
                then = [s for s in segments[name] if s.start_us < at <= s.end_us + EFFECT_US]
                if any(
                    s.version.entry is not None and at in instants(s.version.entry, at - 1, at)
                    for s in then
                ):
                    # a slot of the version in force at its instant, claimed
                    # then and sent after a later edit (a publish retried, a
                    # takeover): out with the definition its sender had then,
                    # as docs/schedules.md says; once, which is what counts
                    report.late_newer += 1
                    continue
                report.premature += 1
                report.problems.append(
                    f"premature: {name}@{at} ({t(at)}) sent under v{v}, committed at "
                    f"{t(min(s.start_us for s in mine))}"
                )
            else:
                replaced = max(s.end_us for s in mine if s.end_us < at)
                back = min((s.start_us for s in mine if s.start_us >= at), default=None)
                between = [s for s in segments[name] if replaced <= s.start_us < (back or 2**62)]
                if (
                    back is not None
                    and started * US >= back
                    and all(s.version.lost for s in between)
                ):
                    # Replaced only by writes a failover then lost, and put
                    # back (at the cut) before it ran: the database the
                    # replicas claim against has no trace of them, and the
                    # slot went out under the definition it has (a claim held
                    # across the failover; docs/guarantees.md, "Stored
                    # schedules"). The explorer's seed 201.
                    report.late_surviving += 1
                    continue
                report.outdated += 1
                report.problems.append(
                    f"outdated: {name}@{at} ({t(at)}) sent under v{v}, replaced at "
                    f"{t(replaced)} ({(at - replaced) / US:.2f}s before the slot)"
                )
    report.executed = sum(1 for slot in done if slot[1] <= upto_us)

    # every instant of the version in force, past the second after its commit
    required: list[tuple[str, int]] = []
    for name, segs in segments.items():
        if is_limited(name):
            continue
        for index, seg in enumerate(segs):
            entry = seg.version.entry
            if entry is None:
                continue
            # A version a failover put back (the one before it lost): each
            # replica follows it from the tick that reads it again after its
            # reconnect (Change.found_again), never from further back. When
            # the database was away again between the cut and that read, the
            # slots before the entry's first run after the cut are not owed.
            found_again_until = 0
            if index > 0 and segs[index - 1].version.lost:
                runs_after = [at for (e, at) in done if e == name and at > seg.start_us]
                first = min(runs_after, default=seg.end_us)
                if any(w.start_us <= first and w.restored_us >= seg.start_us for w in windows):
                    found_again_until = first
            for at in instants(entry, seg.start_us + EFFECT_US, min(seg.end_us - 1, upto_us)):
                if in_window((name, at)):
                    report.in_outage += 1
                elif at < found_again_until:
                    report.found_again_late += 1
                else:
                    required.append((name, at))
    report.due = len(required)
    missing = [s for s in required if s not in done]
    in_broker = broker_lost([s for s in missing if sent(s)])
    report.lost_in_broker = len(in_broker)
    ends = {
        (name, at): seg
        for name, segs in segments.items()
        for seg in segs
        if seg.version.entry is not None
        for at in instants(seg.version.entry, seg.start_us, min(seg.end_us - 1, upto_us))
    }
    # the instants at which an entry was disabled or deleted
    removed_at = {
        (name, seg.start_us)
        for name, segs in segments.items()
        for seg in segs
        if seg.version.entry is None
    }
    lost = []
    for slot in missing:
        if slot in in_broker:
            continue
        if untraced(slot):
            report.untraced += 1
            continue
        # A slot due shortly before its version was replaced, whose claim a
        # fault held back past the replacement: the replica that proposes it
        # then has the new definition, which sends nothing at or before its
        # commit; counted apart, not as lost (docs/guarantees.md, "Stored
        # schedules")
        # A version a failover put back too: every replica reads it again at
        # its reconnect (Change.found_again) and holds its fallbacks as for
        # any version, so the same hold drops its slots with it (seed 8 at
        # ee04e59: three such slots, the first replica of each entry paused
        # or killed across the failover).
        # And a slot whose claim a fault held (a paused claimer, an outage)
        # until its entry was disabled or deleted, however long before: a
        # claim not yet published is not sent once its entry is gone (its
        # taker no longer has the entry; docs/guarantees.md, "Stored
        # schedules"). Seed 6 at 729e7ba: two such slots, each claimed by a
        # replica paused right after its claim, the entry disabled or deleted
        # 13 and 44 s later, before a takeover.
        seg = ends[slot]
        end = seg.end_us
        if end < 2**62 and (
            (end - slot[1] < hold_us and held(slot[1] - US, end + EFFECT_US))
            # the fault in force at the slot's claim itself, not any later one;
            # the entry's first removal after the slot, also past edits that
            # came between (a worker that died mid-run held its slot until the
            # stalled run's re-send, by when the entry was gone: seed 27)
            or (
                any(n == slot[0] and r >= end for n, r in removed_at)
                and held(slot[1] - US, slot[1] + US)
            )
        ):
            report.dropped_with_version += 1
            report.dropped.append(f"{slot[0]}@{slot[1]} ({t(slot[1])}), replaced at {t(end)}")
            continue
        lost.append(slot)
    report.lost = len(lost)
    for name, at in lost[:20]:
        report.problems.append(f"stored slot lost: {name}@{at} ({t(at)})")

    # limited entries: exactly as many ran as asked
    for a in attempts:
        if a.action not in ("once", "limited"):
            continue
        name = a.name
        ran = sum(len(r) for (e, _), r in done.items() if e == name)
        segs = segments.get(name, [])
        line: dict[str, Any] = {"entry": name, "asked": 1, "executed": ran, "in_outage": 0}
        if a.intended is not None and a.intended.max_runs is not None:
            line["asked"] = a.intended.max_runs
        if not segs:
            line["verdict"] = "not created (its write failed): must not run"
            wrong = ran > 0
        elif a.v not in kept and not a.error:
            # the replicas may have followed it before the failover: what
            # they did with it then is in the outdated count, not here
            line["verdict"] = "created, then lost with a failover: not judged"
            wrong = False
        elif all(not s.version.entry or s.version.v != a.v for s in segs):
            line["verdict"] = "replaced before it ran: not judged"
            wrong = False
        else:
            entry = next(s.version.entry for s in segs if s.version.entry is not None)
            assert entry is not None
            asked = instants(entry, 0, 2**62)
            line["asked"] = len(asked)
            line["first_at_s"] = round((asked[0] - started_us) / US, 1)
            missed = sum(1 for at in asked if in_window((name, at)))
            line["in_outage"] = missed
            # sent and confirmed, then lost by the broker (the allowance
            # "lost by the broker"): the scheduler's part was done
            unrun = [(name, at) for at in asked if (name, at) not in done and sent((name, at))]
            by_broker = len(broker_lost(unrun)) if unrun else 0
            line["lost_by_broker"] = by_broker
            # and those whose worker died as a failover lost the run's row
            # (the allowance "lost with its worker's run row")
            line["untraced"] = sum(
                1 for at in asked if (name, at) not in done and untraced((name, at))
            )
            by_broker += line["untraced"]
            if asked[-1] > upto_us:
                line["verdict"] = "ran after the judged window: not judged"
                wrong = False
            elif missed:
                # coalesce: of an outage's missed instants, the latest is sent
                wrong = not (len(asked) - missed - by_broker <= ran <= len(asked))
                line["verdict"] = (
                    f"{missed} instant(s) in a database outage (missed-run policy): "
                    + ("within what it allows" if not wrong else "WRONG")
                )
            else:
                wrong = ran != len(asked) - by_broker
                line["verdict"] = (
                    ("exact" if not by_broker else f"exact but {by_broker} lost by the broker")
                    if not wrong
                    else "WRONG"
                )
        report.limited.append(line)
        if wrong:
            report.limited_wrong += 1
            report.problems.append(
                f"limited entry {name}: asked {line['asked']}, executed {ran} ({line['verdict']})"
            )
    return report


__all__ = [
    "EDITOR",
    "TASK",
    "Attempt",
    "DbWindow",
    "EditsReport",
    "StaticReport",
    "db_windows",
    "is_limited",
    "is_stored",
    "judge",
    "judge_static",
    "stored_executions",
]
