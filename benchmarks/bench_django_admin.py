"""The Django admin's list pages at scale: 100,000 stored entries (and as many
registered beat entries) and 1,000,000 slot rows.

Per database (PostgreSQL, MariaDB, SQLite; each a database of this run's own,
dropped at the end), the tables are filled fast: the replicas' rows through
the store as a replica writes them (heartbeats, one catalog of 100,000
entries, their registration), the stored schedules and the slot rows by one
``INSERT ... SELECT`` over a sequence of numbers each (a benchmark may write
SQL directly; the admin never does). Then each list page is fetched through
Django's test client as a logged-in superuser (one warm-up, then the median
of :data:`REPEAT` fetches): page 1 and a deep page, with and without filters
and searches. The target is under 1 s each; the table says which pass.

Usage: ``python benchmarks/bench_django_admin.py [--dbs postgres,mysql,sqlite]
[--entries 100000] [--slots 1000000] [--json PATH]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PG = os.environ.get("SB_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test")
MYSQL = os.environ.get("SB_TEST_MYSQL", "mysql://root@127.0.0.1:3306/test")
PREFIX = "singlebeat_"
REPEAT = 3
TARGET_S = 1.0
US = 1_000_000

#: the admin's URLs (this module is the project's URLconf)
urlpatterns: list[Any] = []


def _numbers(dialect: str, n: int) -> str:
    """A FROM clause yielding ``n`` rows numbered 0..n-1 as column ``n``."""
    if dialect == "postgresql":
        return f"generate_series(0, {n - 1}) AS g(n)"
    if dialect == "mysql":  # MariaDB's sequence engine
        return f"(SELECT seq AS n FROM seq_0_to_{n - 1}) AS g"
    return (
        f"(WITH RECURSIVE c(n) AS (SELECT 0 UNION ALL SELECT n + 1 FROM c WHERE n < {n - 1}) "
        "SELECT n FROM c) AS g"
    )


def _sql(dialect: str) -> dict[str, str]:
    """The few expressions that differ between the three dialects."""
    if dialect == "postgresql":
        return {
            "name": "'bench-' || lpad((n % {m})::text, 6, '0')",
            "div": "(n / {d})",
            "text": "(n % {m})::text",
        }
    if dialect == "mysql":
        return {
            "name": "CONCAT('bench-', LPAD(n % {m}, 6, '0'))",
            "div": "(n DIV {d})",
            "text": "CAST(n % {m} AS CHAR)",
        }
    return {
        "name": "'bench-' || printf('%06d', n % {m})",
        "div": "(n / {d})",
        "text": "CAST(n % {m} AS TEXT)",
    }


def configure(db: str, name: str) -> None:
    """Django's settings for a project with the app, on a database ``name``."""
    from urllib.parse import urlsplit

    import django
    from django.conf import settings

    if db == "sqlite":
        database: dict[str, Any] = {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": str(Path(os.environ.get("TMPDIR", "/tmp")) / f"{name}.sqlite"),
        }
    else:
        url = urlsplit(PG if db == "postgres" else MYSQL)
        if db == "mysql":
            import pymysql

            pymysql.version_info = (2, 2, 1, "final", 0)
            pymysql.install_as_MySQLdb()
        database = {
            "ENGINE": f"django.db.backends.{'postgresql' if db == 'postgres' else 'mysql'}",
            "NAME": name,
            "USER": url.username or "",
            "PASSWORD": url.password or "",
            "HOST": url.hostname or "127.0.0.1",
            "PORT": str(url.port or ""),
        }
    settings.configure(
        DEBUG=False,
        SECRET_KEY="bench-only",
        ALLOWED_HOSTS=["*"],
        USE_TZ=True,
        TIME_ZONE="UTC",
        INSTALLED_APPS=[
            "django.contrib.admin",
            "django.contrib.auth",
            "django.contrib.contenttypes",
            "django.contrib.sessions",
            "django.contrib.messages",
            "celery_singlebeat.contrib.django",
        ],
        MIDDLEWARE=[
            "django.contrib.sessions.middleware.SessionMiddleware",
            "django.contrib.auth.middleware.AuthenticationMiddleware",
            "django.contrib.messages.middleware.MessageMiddleware",
        ],
        ROOT_URLCONF=__name__,
        TEMPLATES=[
            {
                "BACKEND": "django.template.backends.django.DjangoTemplates",
                "APP_DIRS": True,
                "OPTIONS": {
                    "context_processors": [
                        "django.template.context_processors.request",
                        "django.contrib.auth.context_processors.auth",
                        "django.contrib.messages.context_processors.messages",
                    ]
                },
            }
        ],
        DATABASES={"default": database},
        DEFAULT_AUTO_FIELD="django.db.models.BigAutoField",
        PASSWORD_HASHERS=["django.contrib.auth.hashers.MD5PasswordHasher"],
        CELERY_SINGLEBEAT_TABLE_PREFIX=PREFIX,
    )
    django.setup()
    from django.contrib import admin
    from django.urls import path

    urlpatterns.append(path("admin/", admin.site.urls))


def create_database(db: str, name: str) -> None:
    if db == "postgres":
        import psycopg

        url = PG.replace("postgresql://", "postgresql://", 1)
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
    elif db == "mysql":
        import pymysql

        conn = pymysql.connect(host="127.0.0.1", port=3306, user="root")
        with conn.cursor() as cur:
            cur.execute(f"CREATE DATABASE `{name}`")
        conn.close()


def drop_database(db: str, name: str) -> None:
    from django.db import connections

    from celery_singlebeat.contrib.django import store

    store.close_all()
    connections.close_all()
    if db == "postgres":
        import psycopg

        with psycopg.connect(PG, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    elif db == "mysql":
        import pymysql

        conn = pymysql.connect(host="127.0.0.1", port=3306, user="root")
        with conn.cursor() as cur:
            cur.execute(f"DROP DATABASE IF EXISTS `{name}`")
        conn.close()
    else:
        Path(str(Path(os.environ.get("TMPDIR", "/tmp")) / f"{name}.sqlite")).unlink(missing_ok=True)


def fill(entries: int, slots: int) -> dict[str, Any]:
    """The rows: three replicas (one catalog of every entry, registered), the
    stored schedules, the slot rows, a few SingletonTask runs and leases."""
    from datetime import timedelta, timezone

    from sqlalchemy import text

    from celery_singlebeat.contrib.django import store
    from celery_singlebeat.engine.catalog import describe
    from celery_singlebeat.store.values import ReplicaInfo

    sql_store = store.store()
    now = sql_store.ping()
    names = [f"bench-{i:06d}" for i in range(entries)]
    took: dict[str, float] = {}
    t0 = time.perf_counter()
    replicas = [f"replica-{i}" for i in range(3)]
    for rid in replicas:
        sql_store.heartbeat(
            ReplicaInfo(rid, "bench", 1, "bench", now, now, 0, entries, entries // 3, 5 * US)
        )
    catalog = [
        describe(n, "proj.report", timedelta(seconds=60 + i % 3600), timezone.utc)
        for i, n in enumerate(names)
    ]
    for rid in replicas:
        sql_store.publish_catalog(rid, catalog)
    for i in range(0, entries, 10_000):
        sql_store.register(names[i : i + 10_000], replicas[0])
    took["replicas, catalog, entries"] = time.perf_counter() - t0

    from sqlalchemy import create_engine

    from celery_singlebeat.contrib.django.database import database_url

    engine = create_engine(database_url("default"))
    dialect = engine.dialect.name
    x = _sql(dialect)
    t0 = time.perf_counter()
    with engine.begin() as conn:
        name = x["name"].format(m=entries)
        every = x["text"].format(m=3600)
        spec = _concat(dialect, "'{\"every\": '", every, "'}'")
        conn.execute(
            text(
                f"INSERT INTO {PREFIX}schedules (name, task, spec, args, kwargs, options, enabled, "
                "start_us, end_us, max_runs, policy, jitter_us, description, managed_by, revision, "
                "created_us, updated_us, created_by, updated_by, deleted) "
                f"SELECT {name.replace('bench-', 'stored-')}, "
                f"CASE WHEN n % 7 = 0 THEN 'proj.cleanup' ELSE 'proj.report' END, "
                f"{spec}, "
                "'[]', '{}', '{}', CASE WHEN n % 10 = 0 THEN 0 ELSE 1 END, NULL, NULL, NULL, NULL, "
                "0, '', CASE WHEN n % 2 = 0 THEN 'deploy/schedules.yaml' ELSE NULL END, n + 1, "
                f":now, :now, 'bench', 'bench', 0 FROM {_numbers(dialect, entries)}"
            ),
            {"now": now},
        )
    took["stored schedules (INSERT SELECT)"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    per_entry = max(1, slots // entries)
    with engine.begin() as conn:
        name = x["name"].format(m=entries)
        div = x["div"].format(d=entries)
        slot = f"(:base - {div} * 60000000 - (n % {entries}) * 100)"
        owner = _concat(dialect, "'replica-'", x["text"].format(m=3))
        conn.execute(
            text(
                f"INSERT INTO {PREFIX}slots (entry, slot_us, state, owner, fence, lease_until_us, "
                "claimed_us, sent_us, batch) "
                f"SELECT {name}, {slot}, CASE WHEN n % 1000 = 0 THEN 0 ELSE 1 END, "
                f"{owner}, "
                "CASE WHEN n % 500 = 0 THEN 2 ELSE 1 END, "
                f"{slot} + 30000000, {slot}, "
                f"CASE WHEN n % 1000 = 0 THEN NULL ELSE {slot} + 5000 END, NULL "
                f"FROM {_numbers(dialect, entries * per_entry)}"
            ),
            {"base": now},
        )
    took["slot rows (INSERT SELECT)"] = time.perf_counter() - t0

    # a few SingletonTask runs (for the task-id search) and leases
    from celery_singlebeat.store.values import Run

    task_id = str(uuid.uuid4())
    sql_store.begin_run(Run("bench-000042", now - 42 * 100, "run-1"), "worker-1", task_id, 60 * US)
    for i in range(20):
        sql_store.acquire_lease(f"singleton-{i}", "worker-1", 60 * US)
    if dialect == "postgresql":
        with engine.begin() as conn:
            conn.execute(text("ANALYZE"))
    engine.dispose()
    return {"took": took, "task_id": task_id}


def _concat(dialect: str, *parts: str) -> str:
    if dialect == "mysql":
        return f"CONCAT({', '.join(parts)})"
    return " || ".join(parts)


def pages(entries: int, slots: int, task_id: str) -> list[tuple[str, str]]:
    """The list pages timed: (what, URL)."""
    a = "/admin/celery_singlebeat/"
    deep_s = max(2, entries // 100 - 10)
    deep_slots = max(2, slots // 100 // 2)
    return [
        ("stored schedules, page 1", f"{a}storedschedule/"),
        (f"stored schedules, page {deep_s}", f"{a}storedschedule/?p={deep_s}"),
        ("stored schedules, enabled=no", f"{a}storedschedule/?enabled=0"),
        ("stored schedules, managed_by", f"{a}storedschedule/?managed_by=deploy%2Fschedules.yaml"),
        ("stored schedules, search task", f"{a}storedschedule/?q=proj.cleanup"),
        ("stored schedules, search name", f"{a}storedschedule/?q=stored-04242"),
        ("entries, page 1", f"{a}entry/"),
        (f"entries, page {deep_s}", f"{a}entry/?p={deep_s}"),
        ("entries, search", f"{a}entry/?q=bench-0424"),
        ("beat_schedule entries, page 1", f"{a}catalogentry/"),
        ("slots, page 1", f"{a}slot/"),
        (f"slots, page {deep_slots}", f"{a}slot/?p={deep_slots}"),
        ("slots, entry", f"{a}slot/?entry=bench-004242"),
        ("slots, replica", f"{a}slot/?owner=replica-1"),
        ("slots, state claimed", f"{a}slot/?state__exact=0"),
        ("slots, taken over", f"{a}slot/?taken_over=yes"),
        ("slots, last hour", f"{a}slot/?since=1h"),
        ("slots, taken over + replica", f"{a}slot/?taken_over=yes&owner=replica-2"),
        ("slots, search entry", f"{a}slot/?q=bench-00424"),
        ("slots, search task id", f"{a}slot/?q={task_id}"),
        ("runs", f"{a}run/"),
        ("replicas", f"{a}replica/"),
        ("leases", f"{a}lease/"),
    ]


def measure(urls: list[tuple[str, str]]) -> list[dict[str, Any]]:
    from django.contrib.auth.models import User
    from django.db import connection, reset_queries
    from django.test import Client
    from django.test.utils import CaptureQueriesContext

    user = User.objects.create_superuser("bench", "bench@example.com", "pw")
    client = Client()
    client.force_login(user)
    out = []
    for what, url in urls:
        first = client.get(url)
        assert first.status_code == 200, (url, first.status_code, first.content[:2000])
        times = []
        for _ in range(REPEAT):
            reset_queries()
            with CaptureQueriesContext(connection) as seen:
                t0 = time.perf_counter()
                response = client.get(url)
                times.append(time.perf_counter() - t0)
            assert response.status_code == 200, url
        out.append(
            {
                "page": what,
                "url": url,
                "median_s": statistics.median(times),
                "max_s": max(times),
                "queries": len(seen.captured_queries),
            }
        )
    return out


def run_one(db: str, entries: int, slots: int, only: str = "") -> dict[str, Any]:
    from django.core.management import call_command

    name = f"sb_bench_admin_{os.getpid()}"
    create_database(db, name)
    configure(db, name)
    try:
        call_command("migrate", verbosity=0)
        filled = fill(entries, slots)
        results = measure([p for p in pages(entries, slots, filled["task_id"]) if only in p[0]])
    finally:
        drop_database(db, name)
    return {
        "db": db,
        "entries": entries,
        "slots": slots,
        "fill_s": filled["took"],
        "pages": results,
    }


def table(result: dict[str, Any]) -> str:
    lines = [
        f"{result['db']}: {result['entries']:,} stored entries, {result['entries']:,} registered, "
        f"{result['slots']:,} slot rows",
        *(f"  fill: {k}: {v:.1f} s" for k, v in result["fill_s"].items()),
        f"  {'PAGE':<34} {'MEDIAN':>8} {'MAX':>8} {'QUERIES':>8}  TARGET < {TARGET_S:g} s",
    ]
    for row in result["pages"]:
        ok = "ok" if row["max_s"] < TARGET_S else "SLOW"
        lines.append(
            f"  {row['page']:<34} {row['median_s'] * 1000:>6.0f}ms {row['max_s'] * 1000:>6.0f}ms "
            f"{row['queries']:>8}  {ok}"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--db", default="postgres", choices=["postgres", "mysql", "sqlite"])
    parser.add_argument("--dbs", default=None, help="several, each in a process of its own")
    parser.add_argument("--entries", type=int, default=100_000)
    parser.add_argument("--slots", type=int, default=1_000_000)
    parser.add_argument("--json", default=None, help="write the results here")
    parser.add_argument("--only", default="", help="time only the pages whose name has this")
    args = parser.parse_args()
    if args.dbs:
        # Django's settings are one per process: one process per database
        import subprocess

        status = 0
        for db in args.dbs.split(","):
            cmd = [
                sys.executable,
                __file__,
                "--db",
                db,
                "--entries",
                str(args.entries),
                "--slots",
                str(args.slots),
            ]
            if args.json:
                cmd += ["--json", args.json.replace(".json", f"-{db}.json")]
            status |= subprocess.call(cmd)
        return status
    result = run_one(args.db, args.entries, args.slots, args.only)
    print(table(result), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0 if all(r["max_s"] < TARGET_S for r in result["pages"]) else 1


if __name__ == "__main__":
    sys.exit(main())
