"""Each extra, installed alone from the built wheel, gives what it promises.

For each extra, a clean venv outside the checkout gets
``pip install 'dist/celery_singlebeat-X-py3-none-any.whl[EXTRA]'`` and nothing
else, then uses what the extra is for, against the real services:

* (none): the package, its scheduler and a SQLite engine; and kombu's Redis
  transport refuses to connect, which is what the ``redis`` extra is for (so the
  redis check below would catch an extra that installed nothing);
* ``redis``: kombu's Redis transport loads and a connection to Redis answers;
* ``postgres``: a psycopg 3 engine connects to PostgreSQL;
* ``mysql``: a PyMySQL engine connects to MariaDB/MySQL;
* ``metrics``: ``celery_singlebeat.observe.metrics`` imports and renders its series;
* ``django``: ``django://default`` resolves once Django's settings are set up,
  and the app (``celery_singlebeat.contrib.django``) migrates and reads;
  also on Python 3.9 where this machine has it (Django 4.2, the oldest listed).

Two venvs at a time; pip's cache is reused. Service URLs as the test suite's
(``SB_TEST_PG``, ``SB_TEST_MYSQL``, ``SB_TEST_REDIS``). Exits 1 naming each
extra whose check failed.
"""

from __future__ import annotations

import glob
import os
import sys
import tempfile
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from cleanvenv import Venv, built_wheel

PG_URL = os.environ.get("SB_TEST_PG", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
MYSQL_URL = os.environ.get("SB_TEST_MYSQL", "mysql+pymysql://root@127.0.0.1:3306/test")
REDIS_URL = os.environ.get("SB_TEST_REDIS", "redis://127.0.0.1:6379") + "/7"

SELECT_ONE = """
from sqlalchemy import create_engine, text
engine = create_engine({url!r})
with engine.connect() as conn:
    assert conn.execute(text("SELECT 1")).scalar() == 1
print("connected:", engine.dialect.name, engine.dialect.driver)
"""

CHECKS = {
    "": """
from celery_singlebeat import SingleBeatScheduler, __version__
from sqlalchemy import create_engine, text
with create_engine("sqlite://").connect() as conn:
    assert conn.execute(text("SELECT 1")).scalar() == 1
from kombu import Connection
try:
    Connection({redis!r}).connect()
except ImportError as exc:
    print("without the redis extra kombu's Redis transport refuses:", exc)
else:
    raise SystemExit("kombu's Redis transport works without the redis extra: check it")
print("imports", SingleBeatScheduler.__name__, __version__)
""",
    "redis": """
from kombu import Connection
from kombu.transport import resolve_transport
transport = resolve_transport("redis")
with Connection({redis!r}) as conn:
    conn.connect()
    assert conn.default_channel.client.ping()
print("connected through", transport)
""",
    "postgres": SELECT_ONE.replace("{url!r}", "{pg!r}"),
    "mysql": SELECT_ONE.replace("{url!r}", "{mysql!r}"),
    "metrics": """
from prometheus_client import CollectorRegistry
from celery_singlebeat.observe.metrics import Metrics, metric_names
registry = CollectorRegistry()
Metrics(registry)
names = metric_names(registry)
assert "singlebeat_slots_sent_total" in names, sorted(names)
print(len(names), "series")
""",
    "django": """
import os, tempfile
import django
from django.conf import settings
name = os.path.join(tempfile.mkdtemp(), "extras.sqlite")
settings.configure(
    INSTALLED_APPS=["django.contrib.contenttypes", "django.contrib.auth",
                    "celery_singlebeat.contrib.django"],
    DATABASES={{"default": {{"ENGINE": "django.db.backends.sqlite3", "NAME": name}}}},
)
django.setup()
from celery_singlebeat.contrib.django import database_url
url = database_url("default")
assert url.drivername == "sqlite" and url.database == name, url
# the app from the wheel: its migration creates the store's tables, its models read them
from django.core.management import call_command
call_command("migrate", verbosity=0)
from celery_singlebeat.contrib.django.models import StoredSchedule, Slot
assert StoredSchedule.objects.count() == 0 and not Slot.objects.exists()
print("Django", django.get_version(), "->", url, "migrated")
""",
}


@dataclass
class Result:
    label: str
    ok: bool
    seconds: float
    output: str


def oldest_python() -> str | None:
    """A Python 3.9 on this machine (pyenv's), or None."""
    found = sorted(glob.glob("/root/.pyenv/versions/3.9.*/bin/python"))
    return found[-1] if found else None


def check(extra: str, python: str, base: Path) -> Result:
    started = time.monotonic()
    version = ".".join(map(str, sys.version_info[:2])) if python == sys.executable else "3.9"
    label = f"{extra or '(none)'} on Python {version}"
    folder = Path(tempfile.mkdtemp(prefix=f"extra-{extra or 'none'}-", dir=base))
    try:
        venv = Venv(folder / "venv", python)
        wheel = built_wheel()
        venv.pip_install(f"{wheel}[{extra}]" if extra else str(wheel))
        code = textwrap.dedent(CHECKS[extra]).format(pg=PG_URL, mysql=MYSQL_URL, redis=REDIS_URL)
        done = venv.python(code, cwd=folder)
        output = (done.stdout + done.stderr).strip()
        return Result(label, done.returncode == 0, time.monotonic() - started, output)
    except SystemExit as exc:  # pip failed: report it with the others
        return Result(label, False, time.monotonic() - started, str(exc))


def main() -> int:
    started = time.monotonic()
    jobs = [(extra, sys.executable) for extra in CHECKS]
    py39 = oldest_python()
    if py39:
        jobs.append(("django", py39))
    else:
        print("check-extras: no Python 3.9 here; Django 4.2 not checked")
    scratch = tempfile.TemporaryDirectory(prefix="singlebeat-extras-")
    with scratch as tmp, ThreadPoolExecutor(2) as pool:
        results = list(pool.map(lambda job: check(job[0], job[1], Path(tmp)), jobs))
    for result in results:
        mark = "ok" if result.ok else "FAILED"
        print(f"check-extras: {mark}: {result.label} ({result.seconds:.1f}s)")
        print(textwrap.indent(result.output, "    "))
    failed = [r.label for r in results if not r.ok]
    print(f"check-extras: took {time.monotonic() - started:.1f}s")
    print(f"check-extras: {len(results) - len(failed)} passed, {len(failed)} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
