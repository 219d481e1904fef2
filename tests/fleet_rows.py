"""Rows the replicas and workers write, written by hand for the tests of what
operators read (``store/sql/operator.py``, the CLI): the tests choose each replica's
liveness, each entry's catalog and each slot's state directly."""

from __future__ import annotations

import json
from typing import Any

from conftest import direct_engine
from sqlalchemy.engine import make_url

from celery_singlebeat.store.sql import SqlStore
from celery_singlebeat.store.sql.schema import Tables
from celery_singlebeat.timeline.clock import US


#: the spec a replica publishes for an interval entry (catalog.describe)
def every(seconds: float) -> str:
    return json.dumps({"kind": "interval", "every_us": int(seconds * US)}, sort_keys=True)


def cron(minute: str = "*", hour: str = "*", tz: str = "UTC") -> str:
    fields = {"minute": minute, "hour": hour, "day_of_month": "*", "month_of_year": "*"}
    return json.dumps({"kind": "crontab", **fields, "day_of_week": "*", "tz": tz}, sort_keys=True)


class FleetRows:
    """A schema of its own (a fresh prefix) and helpers that write its rows."""

    def __init__(self, url: str, prefix: str) -> None:
        self.url = url
        self.prefix = prefix
        self.tables = Tables(prefix)
        self.store = SqlStore(make_url(url), table_prefix=prefix)
        self.store.prepare(create=True)
        self.engine = direct_engine(url)

    def now_us(self) -> int:
        """The database's clock."""
        return self.store.ping()

    def _insert(self, table: Any, **values: Any) -> None:
        with self.engine.begin() as conn:
            conn.execute(table.insert().values(**values))

    def replica(
        self,
        rid: str,
        *,
        seen_us: int,
        heartbeat_us: int = 5 * US,
        stopped_us: int | None = None,
        tracked: int = 0,
        proposes_first: int = 0,
        offset_us: int = 0,
        lost_writes: int = 0,
    ) -> None:
        host, _, pid = rid.partition(":")
        self._insert(
            self.tables.replicas,
            id=rid,
            host=host,
            pid=int(pid.partition(":")[0] or 1),
            version="0.1.0",
            started_us=seen_us - 60 * US,
            seen_us=seen_us,
            loop_us=seen_us,
            offset_us=offset_us,
            tracked=tracked,
            proposes_first=proposes_first,
            heartbeat_us=heartbeat_us,
            stopped_us=stopped_us,
            # each replica's catalog here is its own, named after it (rows.catalog)
            catalog=rid,
            lost_writes=lost_writes,
        )

    def catalog(
        self,
        replica: str,
        entry: str,
        spec: str,
        *,
        task: str = "proj.report",
        schedule: str = "every 10s",
    ) -> None:
        """A row of ``replica``'s catalog. Catalogs are shared by content in the
        store (schema.py); here each replica's is its own, with the replica's id
        as the catalog's, published a day ago (as by a replica started then)."""
        headers = self.tables.catalogs
        with self.engine.begin() as conn:
            found = conn.execute(headers.select().where(headers.c.id == replica)).first()
            if found is None:
                conn.execute(
                    headers.insert().values(
                        id=replica, entries=1, published_us=self.now_us() - 86_400 * US
                    )
                )
            else:
                conn.execute(
                    headers.update()
                    .where(headers.c.id == replica)
                    .values(entries=headers.c.entries + 1)
                )
            conn.execute(
                self.tables.catalog.insert().values(
                    catalog=replica, entry=entry, task=task, schedule=schedule, spec=spec
                )
            )

    def entry(self, name: str, anchor_us: int, last_slot_us: int | None = None) -> None:
        self._insert(
            self.tables.entries,
            name=name,
            anchor_us=anchor_us,
            last_slot_us=last_slot_us,
            registered_by="test",
        )

    def slot(
        self,
        entry: str,
        slot_us: int,
        *,
        owner: str,
        sent_us: int | None = None,
        fence: int = 1,
        lease_until_us: int | None = None,
    ) -> None:
        """A sent row when ``sent_us`` is given, else a claimed one."""
        self._insert(
            self.tables.slots,
            entry=entry,
            slot_us=slot_us,
            state=0 if sent_us is None else 1,
            owner=owner,
            fence=fence,
            lease_until_us=slot_us + 15 * US if lease_until_us is None else lease_until_us,
            claimed_us=slot_us,
            sent_us=sent_us,
            batch=None,
        )

    def lock(self, key: str, *, owner: str, token: int, expires_us: int, acquired_us: int) -> None:
        self._insert(
            self.tables.locks,
            name=key,
            token=token,
            owner=owner,
            grant_id="g",
            expires_us=expires_us,
            acquired_us=acquired_us,
        )

    def select(self, table: Any) -> list[Any]:
        with self.engine.connect() as conn:
            return list(conn.execute(table.select()).all())

    def controls_version(self) -> int:
        meta = self.tables.meta
        with self.engine.connect() as conn:
            return int(conn.execute(meta.select().where(meta.c.key == "controls")).one().value_us)

    def close(self, drop: bool = True) -> None:
        self.store.close()
        if drop:
            self.tables.metadata.drop_all(self.engine)
        self.engine.dispose()
