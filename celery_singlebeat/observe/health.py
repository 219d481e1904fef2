"""Liveness and readiness of a beat replica: one verdict for the HTTP and the exec probe.

**Liveness**: this process's loop ran within ``singlebeat_liveness_timeout``.
The scheduler reports the end of every tick (``Telemetry.loop``), also of
a tick that met a database outage, so liveness never depends on the database,
the broker or on winning slots: in an outage a replica waits and resumes by
itself, and restarting every beat pod for it would only add a stampede of
reconnects. It fails when the loop itself is stuck (a hung publish, a deadlock
in a ``slot_claimed`` receiver, a stopped process), which only a restart cures.

**Readiness**: the schema was checked, the database is not in an outage, and
the last successful round trip is at most ``singlebeat_readiness_timeout`` old
(and the replica is live). A replica that cannot reach the database sends
nothing, which is what "not ready" says; a beat pod serves no traffic, so this
only holds back a rolling update and shows on dashboards.

Both probes judge the same :class:`Status` with the same functions
(:func:`liveness`, :func:`readiness`): the HTTP listener (``/livez``,
``/readyz``) the live one, the exec probe (``python -m celery_singlebeat health``)
the copy the loop writes to ``singlebeat_status_file``. Instants are this
host's monotonic clock (``time.monotonic()``, CLOCK_MONOTONIC: one clock for
every process of the host, so the probe process reads the beat's instants as
they were meant; a wall-clock step changes nothing).

This module imports the standard library's ``os`` and ``time`` only (plus the
package's stdlib-only ``telemetry``, ``timing`` and ``exceptions``): a kubelet runs the exec
probe every few seconds in every pod, and its budget is a few tens of ms of CPU.
"""

from __future__ import annotations

import os
import time

from ..exceptions import ConfigurationError

# The default bounds derive from the loop's worst honest case; they live in
# timing.py, the leaf the configuration, the scheduler and the store share,
# and stay importable from here, where docs/reference/api.md documents them.
from ..timeline.timing import (
    ANSWER_TIMEOUT_S,
    CONNECT_TIMEOUT_S,
    LIVE_HEARTBEATS,
    LIVE_SLACK_S,
    OUTAGE_BACKOFF_MAX_S,
    PUBLISH_SHARE,
    default_liveness_timeout_s,
    default_readiness_timeout_s,
    sweep_period_s,
)
from .telemetry import Telemetry

#: the status file is rewritten at most this often (and at once on a change of
#: outage or schema state), so it costs nothing at 10,000 slots a second
WRITE_EVERY_S = 1.0
#: what a status file starts with: its format and version
MAGIC = "celery-singlebeat-status 1"


class Status:
    """What the probes judge: instants on the monotonic clock, None when never.

    The HTTP listener reads the scheduler's own object; the exec probe a copy
    parsed from the status file (:func:`read_status`)."""

    __slots__ = (
        "live_bound",
        "loop",
        "outage_since",
        "pid",
        "ready_bound",
        "round_trip",
        "schema_ready",
        "started",
        "stopped",
        "written",
    )

    def __init__(self, started: float, live_bound: float, ready_bound: float) -> None:
        self.pid = os.getpid()
        #: when the scheduler was built (liveness before the first tick ends)
        self.started = started
        #: the end of the last tick
        self.loop: float | None = None
        #: the end of the last successful statement
        self.round_trip: float | None = None
        self.schema_ready = False
        #: when the current outage began (None: no outage)
        self.outage_since: float | None = None
        #: the scheduler closed (a graceful stop)
        self.stopped = False
        self.live_bound = live_bound
        self.ready_bound = ready_bound
        #: when this copy was written to the status file
        self.written: float | None = None


def liveness(status: Status, now: float) -> tuple[bool, str]:
    """(live?, one line saying why) at monotonic instant ``now``."""
    bound = status.live_bound
    if status.stopped:
        return False, "not live: the scheduler stopped"
    if status.loop is None:
        age = now - status.started
        if age <= bound:
            return (
                True,
                f"live: starting, no tick ended yet ({age:.1f}s since start, bound {bound:g}s)",
            )
        return False, f"not live: no tick ended in {age:.1f}s since start (bound {bound:g}s)"
    age = now - status.loop
    if age <= bound:
        return True, f"live: last loop {age:.1f}s ago (bound {bound:g}s)"
    return False, f"not live: last loop {age:.1f}s ago (bound {bound:g}s)"


def readiness(status: Status, now: float) -> tuple[bool, str]:
    """(ready?, one line saying why) at monotonic instant ``now``; a replica
    that is not live is not ready either."""
    live, why = liveness(status, now)
    if not live:
        return False, f"not ready: {why}"
    if status.outage_since is not None:
        return False, (
            f"not ready: database unreachable for {now - status.outage_since:.1f}s "
            "(the replica sends nothing until it is back)"
        )
    if not status.schema_ready:
        return False, "not ready: not connected yet (schema check and entry registration pending)"
    if status.round_trip is None:  # pragma: no cover - the schema check is a round trip
        return False, "not ready: no database round trip yet"
    age = now - status.round_trip
    bound = status.ready_bound
    if age <= bound:
        return True, f"ready: last database round trip {age:.1f}s ago (bound {bound:g}s)"
    return False, f"not ready: last database round trip {age:.1f}s ago (bound {bound:g}s)"


def verdict(status: Status, now: float, check: str) -> tuple[bool, str]:
    """``check`` is ``"live"`` or ``"ready"``; the line starts ``ok:`` or ``failing:``."""
    ok, why = (liveness if check == "live" else readiness)(status, now)
    return ok, f"{'ok' if ok else 'failing'}: {why}"


# -- the status file ------------------------------------------------------------

_FLOATS = ("started", "loop", "round_trip", "outage_since", "live_bound", "ready_bound", "written")


def _number(value: float | None) -> str:
    return "-" if value is None else repr(value)


def format_status(status: Status) -> str:
    """The status file's text: ``key value`` lines after :data:`MAGIC` (no
    JSON: the probe would pay for importing it)."""
    lines = [MAGIC, f"pid {status.pid}"]
    lines += [f"{name} {_number(getattr(status, name))}" for name in _FLOATS]
    lines += [f"schema_ready {int(status.schema_ready)}", f"stopped {int(status.stopped)}"]
    return "\n".join(lines) + "\n"


def parse_status(text: str) -> Status:
    """The :class:`Status` a status file holds; ValueError when it is not one."""
    lines = text.splitlines()
    if not lines or lines[0] != MAGIC:
        raise ValueError("not a celery-singlebeat status file (or of another version)")
    fields = dict(line.partition(" ")[::2] for line in lines[1:])

    def number(name: str) -> float | None:
        value = fields[name]
        return None if value == "-" else float(value)

    try:
        started, live_bound, ready_bound = (
            number(n) for n in ("started", "live_bound", "ready_bound")
        )
        if started is None or live_bound is None or ready_bound is None:
            raise ValueError("started and the bounds must be numbers")
        status = Status(started, live_bound, ready_bound)
        status.pid = int(fields["pid"])
        status.loop = number("loop")
        status.round_trip = number("round_trip")
        status.outage_since = number("outage_since")
        status.written = number("written")
        status.schema_ready = fields["schema_ready"] == "1"
        status.stopped = fields["stopped"] == "1"
    except KeyError as exc:
        raise ValueError(f"status file lacks {exc.args[0]!r}") from None
    return status


def read_status(path: str) -> Status:
    """The status in ``path``; OSError when unreadable, ValueError when malformed."""
    with open(path, encoding="utf-8") as file:
        return parse_status(file.read(4096))


def write_status(path: str, status: Status) -> None:
    """Replace ``path`` atomically (a temporary file in the same directory,
    renamed over it): a probe reads the old status or the new, never half."""
    status.written = time.monotonic()
    temporary = f"{path}.{status.pid}.tmp"
    with open(temporary, "w", encoding="utf-8") as file:
        file.write(format_status(status))
    os.replace(temporary, path)


# -- the scheduler's side -------------------------------------------------------


class Health(Telemetry):
    """Keeps a replica's :class:`Status` from the scheduler's hooks and, with a
    ``status_file``, a copy of it on disk for the exec probe.

    Every hook is a few attribute writes; the file is rewritten at the end of
    a tick at most once a second (:data:`WRITE_EVERY_S`), and at once when the
    outage or schema state changes, so that both probes turn together.
    """

    def __init__(self, live_bound: float, ready_bound: float, status_file: str | None) -> None:
        self.status = Status(time.monotonic(), live_bound, ready_bound)
        self.status_file = status_file
        self._next_write = 0.0
        self._write_failed = False
        if status_file is not None:
            try:
                write_status(status_file, self.status)
            except OSError as exc:
                raise ConfigurationError(
                    f"singlebeat_status_file={status_file!r}: cannot write it ({exc.strerror}); "
                    "its directory must exist and be writable by beat (an emptyDir volume "
                    "shared with the probe's container, or a path in this one)"
                ) from None

    def live(self) -> tuple[bool, str]:
        return verdict(self.status, time.monotonic(), "live")

    def ready(self) -> tuple[bool, str]:
        return verdict(self.status, time.monotonic(), "ready")

    # -- Telemetry ----------------------------------------------------------

    def loop(self, monotonic: float) -> None:
        self.status.loop = monotonic
        if self.status_file is not None and monotonic >= self._next_write:
            self._next_write = monotonic + WRITE_EVERY_S
            self._write()

    # A change of state is written at once (a few times per outage, outside
    # the once-a-second rhythm of the loop's writes), so that the exec probe
    # turns when the HTTP one does, not a second or a tick later.

    def schema_ready(self) -> None:
        self.status.schema_ready = True
        if self.status_file is not None:
            self._write()

    def round_trip(self, seconds: float, ok: bool) -> None:
        if ok:
            self.status.round_trip = time.monotonic()

    def outage(self, active: bool) -> None:
        now = time.monotonic()
        self.status.outage_since = now if active else None
        if self.status_file is not None:
            self._write()

    def close(self) -> None:
        self.status.stopped = True
        if self.status_file is not None:
            self._write()

    def _write(self) -> None:
        assert self.status_file is not None
        try:
            write_status(self.status_file, self.status)
        except OSError as exc:
            # Not fatal to scheduling: the exec probe then sees a stale file and
            # fails liveness, which is the honest answer to "is it observable".
            if not self._write_failed:
                import logging

                logging.getLogger("celery_singlebeat.health").warning(
                    "singlebeat: cannot write the status file %s (%s); the exec probe "
                    "will report this replica as not live until it can",
                    self.status_file,
                    exc.strerror,
                )
            self._write_failed = True
        else:
            self._write_failed = False


# -- the exec probe ---------------------------------------------------------------

#: the probe's options, shared with the click command (cli/health.py): flag,
#: metavar (None: a switch), help
OPTIONS = (
    (
        "--status-file",
        "PATH",
        "The status file beat writes (singlebeat_status_file).",
    ),
    ("--live", None, "Check liveness only: the loop ran within its bound."),
    (
        "--ready",
        None,
        "Check readiness (the default): live, connected, and a recent database round trip.",
    ),
)

USAGE = "usage: {prog} --status-file PATH [--live | --ready]"


def probe(path: str, check: str) -> tuple[int, str]:
    """Exit status (0 ok, 1 failing) and the one line to print."""
    try:
        status = read_status(path)
    except OSError as exc:
        return 1, (
            f"failing: cannot read the status file {path}: {exc.strerror} (is beat running "
            "with singlebeat_status_file set to this path?)"
        )
    except ValueError as exc:
        return 1, f"failing: {path}: {exc}"
    ok, line = verdict(status, time.monotonic(), check)
    return (0 if ok else 1), line


def main(argv: list[str], prog: str = "celery_singlebeat health") -> int:
    """The exec probe, argv without the command name; returns the exit status
    (0 ok, 1 failing, 2 usage). Parsed by hand: argparse would cost the probe
    as much as the rest of it."""
    path: str | None = None
    checks: set[str] = set()
    args = list(argv)
    usage = USAGE.format(prog=prog)
    while args:
        arg = args.pop(0)
        if arg in ("-h", "--help"):
            lines = [usage, "", "Exit status 0 ok, 1 failing (the reason on stdout), 2 usage.", ""]
            lines += [
                f"  {flag + (' ' + meta if meta else ''):<22}{text}" for flag, meta, text in OPTIONS
            ]
            print("\n".join(lines))
            return 0
        if arg == "--status-file" or arg.startswith("--status-file="):
            if "=" in arg:
                path = arg.partition("=")[2]
            elif args:
                path = args.pop(0)
            else:
                return _usage(usage, "--status-file needs a PATH")
        elif arg in ("--live", "--ready"):
            checks.add(arg[2:])
        else:
            return _usage(usage, f"unexpected argument {arg!r}")
    if not path:
        return _usage(usage, "--status-file PATH is required")
    if len(checks) > 1:
        return _usage(usage, "--live and --ready exclude each other")
    code, line = probe(path, checks.pop() if checks else "ready")
    print(line)
    return code


def _usage(usage: str, problem: str) -> int:
    import sys

    print(f"{usage}\nerror: {problem}", file=sys.stderr)
    return 2


__all__ = [
    "ANSWER_TIMEOUT_S",
    "CONNECT_TIMEOUT_S",
    "LIVE_HEARTBEATS",
    "LIVE_SLACK_S",
    "OUTAGE_BACKOFF_MAX_S",
    "PUBLISH_SHARE",
    "Health",
    "Status",
    "default_liveness_timeout_s",
    "default_readiness_timeout_s",
    "liveness",
    "main",
    "read_status",
    "readiness",
    "sweep_period_s",
    "verdict",
    "write_status",
]
