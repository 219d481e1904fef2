"""``make example``: the Django project's deployment, run on this machine as processes.

The topology of ``docker-compose.yml`` and ``k8s/``, with the same settings
(``mysite/settings.py``, read from the environment), on the local services:

1. a fresh PostgreSQL database (``sb_example_<random>`` on 127.0.0.1:5432,
   dropped at the end) and Redis on 127.0.0.1:6379 with a queue of the run's
   own (without Redis: kombu's SQLAlchemy transport on the same database, said
   so at the start);
2. ``manage.py migrate`` (the one-shot job), ``createsuperuser``;
3. Django's server (``runserver`` on a free port), one worker, three beat
   replicas (``beat-1``..``beat-3``), each serving ``/livez`` and ``/readyz``
   on a port of its own and writing the status file the exec probe reads; the
   script waits until each replica answers both probes and the exec probe;
4. the ``refresh-prices`` entry of ``CELERY_BEAT_SCHEDULE`` runs every 2 s
   (a SingletonTask);
5. the script logs in to the admin over HTTP (with the CSRF token, as a
   browser does) and adds the stored schedule ``digest`` (every 3 s) through
   the admin's add form, ``/admin/celery_singlebeat/storedschedule/add/``.
   If the form is not there, the run goes on with the static entry and fails at
   the end, saying so: the stored schedule is never added another way.

The exit code is 0 only when

* each slot of the window ran exactly once, counted from the worker's rows
  (``shop.TaskRun``), nothing else in the window ran, and the slots table
  agrees: ``refresh-prices``'s slots are ``anchor + k * 2 s`` with the anchor
  read from the entries table, ``digest``'s ``created + k * 3 s`` with
  ``created`` the instant the form's save committed (the schedules table,
  database clock), k >= 1, up to the window's end (it falls between slots);
* the admin's entry was **sent** within 1 s of its first slot: the slots
  table's ``sent_us`` (the database's clock when the winning replica recorded
  the message as published) minus the slot, for the slot ``created + 3 s``.
  The worker's start of that run is shown too (this host's clock, which is
  the database's here).
"""

from __future__ import annotations

import argparse
import html.parser
import http.cookiejar
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

HERE = Path(__file__).resolve().parent
REPLICAS = ("beat-1", "beat-2", "beat-3")
STATIC_ENTRY = "refresh-prices"
#: seconds between refresh-prices' runs (SHOP_REFRESH_EVERY)
STATIC_EVERY = 2
ADMIN_ENTRY = "digest"
ADMIN_TASK = "shop.tasks.send_digest"
#: the admin entry's interval, in seconds (the form's ``every``)
ADMIN_EVERY = 3
#: how many of the admin entry's slots the window holds
ADMIN_SLOTS = 4
#: the longest the admin entry's first slot may wait to be sent
SEND_BOUND_US = 1_000_000
#: the static entry's window, from its anchor, when the admin step failed
WINDOW = 17.0
STARTUP = 40.0
SETTLE = 10.0
ADD_FORM = "/admin/celery_singlebeat/storedschedule/add/"
US = 1_000_000
PG_ADMIN_URL = os.environ.get("EXAMPLE_PG", "postgresql://postgres@127.0.0.1:5432/test")
REDIS_URL = os.environ.get("EXAMPLE_REDIS", "redis://127.0.0.1:6379/0")


def log(message: str = "") -> None:
    print(message, flush=True)


class ExampleError(Exception):
    """The run could not go on; ``log_name`` names the process log to show."""

    def __init__(self, message: str, log_name: str | None = None) -> None:
        super().__init__(message)
        self.log_name = log_name


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def reachable(url: str, port: int) -> bool:
    parts = urllib.parse.urlsplit(url)
    try:
        with socket.create_connection((parts.hostname or "127.0.0.1", parts.port or port), 1):
            return True
    except OSError:
        return False


def with_database(url: str, name: str) -> str:
    return urllib.parse.urlunsplit(urllib.parse.urlsplit(url)._replace(path="/" + name))


def pg_execute(statement: str) -> None:
    import psycopg

    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
        conn.execute(statement)


# -- the admin, over HTTP ------------------------------------------------------


class FormFields(html.parser.HTMLParser):
    """The fields of a page's forms with the values a browser would submit."""

    def __init__(self) -> None:
        super().__init__()
        self.values: dict[str, str] = {}
        self._select: str | None = None
        self._textarea: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        name = a.get("name")
        if tag == "input" and name:
            kind = a.get("type", "text").lower()
            if kind in ("submit", "button", "image", "file"):
                return
            if kind in ("checkbox", "radio") and "checked" not in a:
                return
            self.values[name] = a.get("value", "on" if kind == "checkbox" else "")
        elif tag == "select" and name:
            self._select = name
        elif tag == "option" and self._select is not None:
            if self._select not in self.values or "selected" in a:
                self.values[self._select] = a.get("value", "")
        elif tag == "textarea" and name:
            self._textarea = name
            self.values[name] = ""

    def handle_endtag(self, tag: str) -> None:
        if tag == "select":
            self._select = None
        elif tag == "textarea":
            self._textarea = None

    def handle_data(self, data: str) -> None:
        if self._textarea is not None:
            self.values[self._textarea] += data


class AdminClient:
    """A browser's part: cookies, the CSRF token, form posts."""

    def __init__(self, base: str) -> None:
        self.base = base
        self.jar = http.cookiejar.CookieJar()
        self.opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(self.jar))

    def get(self, path: str) -> tuple[int, str, str]:
        try:
            with self.opener.open(self.base + path, timeout=10) as response:
                return response.status, response.geturl(), response.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.geturl(), exc.read().decode(errors="replace")

    def post(self, path: str, data: dict[str, str]) -> tuple[int, str, str]:
        body = urllib.parse.urlencode(data).encode()
        request = urllib.request.Request(
            self.base + path, data=body, headers={"Referer": self.base + path}
        )
        try:
            with self.opener.open(request, timeout=10) as response:
                return response.status, response.geturl(), response.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.geturl(), exc.read().decode(errors="replace")

    @staticmethod
    def fields(page: str) -> dict[str, str]:
        parser = FormFields()
        parser.feed(page)
        return parser.values

    def login(self, username: str, password: str) -> None:
        status, _url, page = self.get("/admin/login/?next=/admin/")
        if status != 200:
            raise ExampleError(f"GET /admin/login/ answered {status}", "web")
        form = self.fields(page)
        form.update(username=username, password=password, next="/admin/")
        status, url, page = self.post("/admin/login/?next=/admin/", form)
        if status != 200 or urllib.parse.urlsplit(url).path != "/admin/":
            raise ExampleError(f"logging in to the admin failed (HTTP {status}, at {url})", "web")

    def add_stored_schedule(self, values: dict[str, str]) -> None:
        """Fill and save the add form; raises with the form's own errors."""
        status, _url, page = self.get(ADD_FORM)
        if status == 404:
            raise ExampleError(
                f"the admin has no add form for stored schedules: GET {ADD_FORM} answered 404. "
                "The admin of celery_singlebeat.contrib.django (admin.py, StoredSchedule) is not "
                "in this checkout yet; the schedule was not added (and not by any other way)"
            )
        if status != 200:
            raise ExampleError(f"GET {ADD_FORM} answered {status}", "web")
        form = self.fields(page)
        missing = sorted(set(values) - set(form))
        if missing:
            raise ExampleError(
                f"the add form at {ADD_FORM} has no field {', '.join(missing)} "
                f"(it has: {', '.join(sorted(form))})"
            )
        if "enabled" not in values:
            form.pop("enabled", None)
        form.update(values)
        form["_save"] = "Save"
        status, url, page = self.post(ADD_FORM, form)
        if status == 200 and urllib.parse.urlsplit(url).path == ADD_FORM:
            errors = re.findall(r'<ul class="errorlist[^"]*"[^>]*>(.*?)</ul>', page, re.S)
            text = "; ".join(re.sub(r"<[^>]+>", " ", e).strip() for e in errors) or "no message"
            raise ExampleError(f"the admin refused the stored schedule: {text}")
        if status != 200:
            raise ExampleError(f"saving the add form answered HTTP {status}", "web")


# -- the processes -------------------------------------------------------------


@dataclass
class Report:
    """What the summary needs."""

    anchor_us: int = 0
    end_us: int = 0
    expected: dict[str, set[int]] = field(default_factory=dict)
    admin_error: str | None = None
    saved_us: int | None = None
    created_us: int | None = None
    probes: list[str] = field(default_factory=list)


class Example:
    """The processes of one run, their environment and their logs."""

    def __init__(self, folder: Path, database_url: str, broker_url: str, queue: str) -> None:
        self.folder = folder
        self.web_port = free_port()
        self.http_ports = {name: free_port() for name in REPLICAS}
        self.password = secrets.token_urlsafe(16)
        self.env = {
            **os.environ,
            "PYTHONUNBUFFERED": "1",
            "DJANGO_SETTINGS_MODULE": "mysite.settings",
            "DATABASE_URL": database_url,
            "DJANGO_SECRET_KEY": secrets.token_urlsafe(40),
            "DJANGO_ALLOWED_HOSTS": "127.0.0.1,localhost",
            "CELERY_BROKER_URL": broker_url,
            "CELERY_TASK_DEFAULT_QUEUE": queue,
            "SHOP_REFRESH_EVERY": str(STATIC_EVERY),
            # short loop and lease, as the demo's: a run of seconds shows everything
            "SINGLEBEAT_LEASE": "4",
            "BEAT_MAX_LOOP_INTERVAL": "1",
        }
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self._logs: list[BinaryIO] = []

    def spawn(self, name: str, argv: list[str], **extra: str) -> subprocess.Popen[bytes]:
        out = (self.folder / f"{name}.log").open("wb")
        self._logs.append(out)
        proc = subprocess.Popen(
            argv,
            cwd=HERE,
            env={**self.env, **extra},
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.procs[name] = proc
        return proc

    def manage(self, *args: str, **extra: str) -> None:
        name = "manage-" + args[0]
        proc = self.spawn(name, [sys.executable, "manage.py", *args], **extra)
        if proc.wait(timeout=120) != 0:
            raise ExampleError(f"manage.py {args[0]} failed (code {proc.returncode})", name)

    def celery(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "celery", "-A", "mysite", *args]

    def start(self) -> None:
        self.spawn(
            "web", [sys.executable, "manage.py", "runserver", f"127.0.0.1:{self.web_port}",
                    "--noreload"]
        )  # fmt: skip
        self.spawn(
            "worker",
            self.celery(
                "worker", "--pool=solo", "--without-gossip", "--without-mingle",
                "--without-heartbeat", "--loglevel=warning",
            ),
        )  # fmt: skip
        for name in REPLICAS:
            self.spawn(
                name,
                self.celery("beat", "--loglevel=info"),
                SINGLEBEAT_REPLICA_ID=name,
                SINGLEBEAT_HTTP_PORT=str(self.http_ports[name]),
                SINGLEBEAT_STATUS_FILE=str(self.folder / f"{name}.status"),
            )

    def check_alive(self) -> None:
        for name, proc in self.procs.items():
            if not name.startswith("manage-") and proc.poll() is not None:
                raise ExampleError(f"{name} exited by itself (code {proc.returncode})", name)

    def stop(self, name: str) -> None:
        proc = self.procs.get(name)
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)

    def stop_all(self) -> None:
        for name in list(self.procs):
            self.stop(name)
        for out in self._logs:
            out.close()

    def tail(self, name: str, lines: int = 25) -> str:
        path = self.folder / f"{name}.log"
        if not path.exists():
            return ""
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def http_status(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status, response.read().decode().strip()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace").strip()
    except OSError as exc:
        return 0, str(exc)


def wait_for(what: str, check: Any, example: Example, log_name: str) -> Any:
    deadline = time.monotonic() + STARTUP
    while True:
        example.check_alive()
        found = check()
        if found:
            return found
        if time.monotonic() > deadline:
            raise ExampleError(f"{what}: not within {STARTUP:.0f} s", log_name)
        time.sleep(0.1)


def probe_replicas(example: Example, report: Report) -> None:
    """Every replica answers the probes the deploy files use: HTTP /livez and
    /readyz (200) and the exec probe on its status file (exit 0)."""
    for name in REPLICAS:
        port = example.http_ports[name]

        def ready(name: str = name, port: int = port) -> bool:
            return http_status(f"http://127.0.0.1:{port}/readyz")[0] == 200

        wait_for(f"{name} ready on /readyz", ready, example, name)
        live = http_status(f"http://127.0.0.1:{port}/livez")
        if live[0] != 200:
            raise ExampleError(f"{name}: /livez answered {live[0]}: {live[1]}", name)
        status_file = str(example.folder / f"{name}.status")
        for flag in ("--live", "--ready"):
            probe = subprocess.run(
                [sys.executable, "-m", "celery_singlebeat", "health", flag,
                 "--status-file", status_file],
                capture_output=True, text=True, timeout=20, check=False,
            )  # fmt: skip
            if probe.returncode != 0:
                raise ExampleError(f"{name}: exec probe {flag}: {probe.stdout.strip()}", name)
        report.probes.append(f"{name}: /livez 200, /readyz 200, exec probe ok")


def expected_slots(first_us: int, every_us: int, end_us: int) -> set[int]:
    """``first + k * every`` (k >= 1) up to ``end``."""
    return set(range(first_us + every_us, end_us + 1, every_us))


def run(example: Example) -> Report:
    from shop.models import TaskRun

    from celery_singlebeat.contrib.django.models import Entry, Slot, StoredSchedule

    report = Report()
    log("migrate (the one-shot job of compose and k8s)...")
    example.manage("migrate", "--noinput")
    example.manage(
        "createsuperuser", "--noinput", "--username", "admin", "--email", "admin@example.invalid",
        DJANGO_SUPERUSER_PASSWORD=example.password,
    )  # fmt: skip
    log(
        f"starting the web admin (runserver on 127.0.0.1:{example.web_port}), 1 worker, "
        "3 beat replicas (beat-1, beat-2, beat-3)..."
    )
    example.start()
    base = f"http://127.0.0.1:{example.web_port}"
    wait_for("the web admin", lambda: http_status(base + "/healthz")[0] == 200, example, "web")

    def anchor() -> int | None:
        row = Entry.objects.filter(name=STATIC_ENTRY).first()
        return row.anchor_us if row else None

    report.anchor_us = wait_for(f"{STATIC_ENTRY} registered", anchor, example, "beat-1")
    probe_replicas(example, report)
    for line in report.probes:
        log(f"  {line}")

    log(f"admin: logging in at {base}/admin/ and adding '{ADMIN_ENTRY}' through {ADD_FORM}")
    try:
        client = AdminClient(base)
        client.login("admin", example.password)
        client.add_stored_schedule(
            {
                "name": ADMIN_ENTRY, "task": ADMIN_TASK, "every": str(ADMIN_EVERY),
                "cron": "", "tz": "", "at": "", "args": "[]",
                "kwargs": '{"to": "team@example.invalid"}', "queue": "", "start": "",
                "end": "", "description": "added through the admin by make example",
                "enabled": "on", "why": "make example: the admin's add form",
            }
        )  # fmt: skip
        report.saved_us = time.time_ns() // 1000
        stored = StoredSchedule.objects.filter(name=ADMIN_ENTRY, deleted=0).first()
        if stored is None:
            raise ExampleError("the form was saved but no stored schedule 'digest' is in the table")
        report.created_us = stored.created_us
        log(f"admin: saved; stored by {stored.updated_by!r} at revision {stored.revision}")
    except ExampleError as exc:
        if exc.log_name:
            raise
        report.admin_error = str(exc)
        log(f"admin step FAILED (the run goes on with {STATIC_ENTRY}, then exits 1): {exc}")

    static_end = report.anchor_us + int(WINDOW * US)
    if report.created_us is not None:
        admin_end = report.created_us + ADMIN_SLOTS * ADMIN_EVERY * US
        report.end_us = max(static_end, admin_end) + US // 2
        report.expected[ADMIN_ENTRY] = expected_slots(
            report.created_us, ADMIN_EVERY * US, report.end_us
        )
    else:
        report.end_us = static_end + US // 2
    # the end falls half a second after a slot of each grid: never on one
    report.expected[STATIC_ENTRY] = expected_slots(
        report.anchor_us, STATIC_EVERY * US, report.end_us
    )
    total = sum(len(v) for v in report.expected.values())
    log(f"counting the slots up to +{(report.end_us - report.anchor_us) / US:.1f}s ({total})")

    def seen() -> set[tuple[str, int]]:
        return set(
            TaskRun.objects.filter(entry__in=list(report.expected)).values_list("entry", "slot_us")
        )

    wanted = {(e, s) for e, slots in report.expected.items() for s in slots}
    hard_deadline_us = report.end_us + int(SETTLE * US)
    while True:
        example.check_alive()
        now_us = time.time_ns() // 1000
        if (now_us > report.end_us and wanted <= seen()) or now_us > hard_deadline_us:
            break
        time.sleep(0.2)

    log("window over: stopping the beat replicas, then letting the worker finish the queue")
    for name in REPLICAS:
        example.stop(name)
    # everything recorded as sent must reach the worker before it stops, or a
    # message still queued would be missed by the count
    sent = set(
        Slot.objects.filter(state=1, entry__in=list(report.expected)).values_list(
            "entry", "slot_us"
        )
    )
    drain_deadline = time.monotonic() + 8
    while time.monotonic() < drain_deadline and not sent <= seen():
        time.sleep(0.1)
    example.stop("worker")
    example.stop("web")
    return report


def summarise(report: Report) -> bool:
    from shop.models import TaskRun

    from celery_singlebeat.contrib.django.models import Run, Slot

    log()
    log("summary")
    ok = True
    runs = list(TaskRun.objects.all())
    slots = {(s.entry, s.slot_us): s for s in Slot.objects.all()}
    per_replica: Counter[str] = Counter()
    for entry, expected in sorted(report.expected.items()):
        mine = [r for r in runs if r.entry == entry and r.slot_us is not None]
        counted = Counter(r.slot_us for r in mine if r.slot_us <= report.end_us)
        duplicates = sum(n - 1 for n in counted.values())
        missing = expected - set(counted)
        unknown = set(counted) - expected
        late = sum(1 for r in mine if r.slot_us > report.end_us)
        in_db = [slots[(entry, s)] for s in expected if (entry, s) in slots]
        per_replica.update(s.owner for s in in_db)
        taken_over = sum(1 for s in in_db if s.fence > 1)
        log(
            f"  {entry}: ran {sum(counted.values())}, expected {len(expected)}, duplicates "
            f"{duplicates}; database: {sum(1 for s in in_db if s.state == 1)} recorded sent, "
            f"{taken_over} taken over"
            + (f" ({late} after the window, not counted)" if late else "")
        )
        if missing:
            ok = False
            log(f"  FAIL: {entry}: {len(missing)} slots never ran")
        if duplicates:
            ok = False
            log(f"  FAIL: {entry}: {duplicates} slots ran more than once")
        if unknown:
            ok = False
            log(f"  FAIL: {entry}: {len(unknown)} runs at instants that are no slot of it")
    log("  per replica (slots won): " + ", ".join(f"{n} {per_replica[n]}" for n in REPLICAS))
    singleton = list(Run.objects.filter(entry=STATIC_ENTRY))
    log(
        f"  SingletonTask {STATIC_ENTRY}: {sum(1 for r in singleton if r.state == 1)} runs "
        f"finished, {sum(r.repeats for r in singleton)} repeated deliveries dropped"
    )
    if report.admin_error is not None:
        ok = False
        log(f"  FAIL: the admin step: {report.admin_error}")
    elif report.created_us is not None:
        first = report.created_us + ADMIN_EVERY * US
        slot = slots.get((ADMIN_ENTRY, first))
        ran = [r.started_us for r in runs if r.entry == ADMIN_ENTRY and r.slot_us == first]
        assert report.saved_us is not None
        log(
            f"  admin entry '{ADMIN_ENTRY}': committed at C (database clock), the form's answer "
            f"{(report.saved_us - report.created_us) / 1000:.0f} ms after C; first slot C + "
            f"{ADMIN_EVERY} s"
        )
        if slot is None or slot.sent_us is None:
            ok = False
            log("  FAIL: its first slot was never sent")
        else:
            delay = slot.sent_us - first
            log(
                f"  its first slot: sent {delay / 1000:.0f} ms after the slot (sent_us - slot, "
                f"database clock, by {slot.owner})"
                + (f"; the worker started it {(ran[0] - first) / 1000:.0f} ms after" if ran else "")
            )
            if not 0 <= delay <= SEND_BOUND_US:
                ok = False
                log(f"  FAIL: sent {delay / 1000:.0f} ms after its slot (bound 1000 ms)")
    delays = sorted(
        (s.sent_us - s.slot_us) / 1000
        for (e, at), s in slots.items()
        if e in report.expected and at in report.expected[e] and s.sent_us is not None
    )
    if delays:
        log(
            f"  sent after the slot: median {delays[len(delays) // 2]:.0f} ms, "
            f"worst {delays[-1]:.0f} ms"
        )
    if ok:
        log(
            "OK: every slot of the window ran exactly once across 3 beat replicas, and the "
            "schedule added in the admin was sent within 1 s of its first slot."
        )
    return ok


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep", action="store_true", help="keep the database and the logs")
    args = parser.parse_args(argv)
    started = time.monotonic()

    if not reachable(PG_ADMIN_URL, 5432):
        log(
            "make example needs PostgreSQL: nothing answers on "
            f"{urllib.parse.urlsplit(PG_ADMIN_URL).hostname}:"
            f"{urllib.parse.urlsplit(PG_ADMIN_URL).port or 5432} (set EXAMPLE_PG to a server "
            "URL whose user may create databases)"
        )
        return 2
    tag = secrets.token_hex(4)
    dbname = f"sb_example_{tag}"
    database_url = with_database(PG_ADMIN_URL, dbname)
    if reachable(REDIS_URL, 6379):
        broker, broker_note = REDIS_URL, f"Redis {urllib.parse.urlsplit(REDIS_URL).netloc}"
    else:
        broker = "sqla+" + with_database(PG_ADMIN_URL, dbname).replace(
            "postgresql://", "postgresql+psycopg://", 1
        )
        broker_note = "kombu's SQLAlchemy transport on the same database (Redis is not running)"
    folder = Path(tempfile.mkdtemp(prefix="singlebeat-example-"))
    log(f"celery-singlebeat example (Django): database {dbname}, broker {broker_note}")
    log(f"logs in {folder}")
    pg_execute(f'CREATE DATABASE "{dbname}"')
    example = Example(folder, database_url, broker, queue=f"example-{tag}")
    # this process reads the tables through the project's models: same settings
    os.environ.update(example.env)
    sys.path.insert(0, str(HERE))
    import django

    django.setup()
    ok = False
    try:
        ok = summarise(run(example))
    except ExampleError as exc:
        log(f"example failed: {exc}")
        if exc.log_name:
            log(f"--- last lines of {exc.log_name}.log ---\n{example.tail(exc.log_name)}")
    except KeyboardInterrupt:
        log("interrupted")
    finally:
        example.stop_all()
        from django.db import connections

        connections.close_all()
        if not args.keep:
            pg_execute(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)')
    if ok and not args.keep:
        shutil.rmtree(folder, ignore_errors=True)
    else:
        log(f"logs kept in {folder}" + (f"; database {dbname} kept" if args.keep else ""))
    log(f"took {time.monotonic() - started:.1f} s")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
