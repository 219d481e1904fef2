"""What the admin's tests share: staff users with chosen permissions, and a
small simulated replica that writes the fleet's rows through the store's
public methods (heartbeat, catalog, register, claim, confirm, take over,
SingletonTask's runs and leases), as a beat replica and a worker would."""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Sequence
from datetime import timedelta, timezone

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client

from celery_singlebeat.contrib.django import store
from celery_singlebeat.engine.catalog import describe
from celery_singlebeat.store.values import ReplicaInfo, Run, SlotKey
from celery_singlebeat.timeline.clock import US

#: the permission codenames of the controls (celery_singlebeat.<codename>)
CONTROLS = ("pause_entry", "run_entry_now", "release_lease")


def unique(prefix: str) -> str:
    """A name no other test (nor another run on the same database) uses: the
    store's tables outlive Django's flush between tests."""
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def staff_client(codenames: Sequence[str] = (), *, superuser: bool = False) -> tuple[Client, User]:
    """A logged-in staff user with exactly these permissions of the app."""
    name = unique("staff")
    if superuser:
        user = User.objects.create_superuser(name, f"{name}@example.com", "pw")
    else:
        user = User.objects.create_user(name, password="pw", is_staff=True)
        perms = Permission.objects.filter(
            content_type__app_label="celery_singlebeat", codename__in=list(codenames)
        )
        assert perms.count() == len(set(codenames)), f"missing permissions among {codenames}"
        user.user_permissions.set(perms)
    client = Client()
    client.force_login(user)
    return client, user


class SimulatedReplica:
    """One beat replica's rows, written through the store as the engine
    writes them: a live heartbeat, its catalog of interval entries, the
    entries registered, and sent slots."""

    def __init__(self, every_s: int = 10) -> None:
        self.store = store.store()
        self.id = unique("host") + ":4242"
        self.every_s = every_s
        self.heartbeat()

    def now_us(self) -> int:
        return self.store.ping()

    def heartbeat(self) -> None:
        now = self.now_us()
        self.store.heartbeat(
            ReplicaInfo(
                id=self.id,
                host=self.id.split(":")[0],
                pid=4242,
                version="0.0-test",
                started_us=now,
                loop_us=now,
                offset_us=0,
                tracked=0,
                proposes_first=0,
                heartbeat_us=5 * US,
            )
        )

    def publish(self, names: Sequence[str], task: str = "proj.report") -> None:
        """Catalog and register ``names`` (interval entries of ``every_s``)."""
        rows = [describe(n, task, timedelta(seconds=self.every_s), timezone.utc) for n in names]
        self.store.publish_catalog(self.id, rows)
        self.store.register(list(names), self.id)
        self.heartbeat()

    def send(self, name: str, slots: int = 3) -> list[int]:
        """Claim and confirm the last ``slots`` slots of ``name`` (sent rows)."""
        now = self.now_us()
        keys = [SlotKey(name, now - (slots - i) * self.every_s * US) for i in range(slots)]
        claims = self.store.claim(self.id, keys, 30 * US)
        assert len(claims) == slots, claims
        self.store.confirm(self.id, claims)
        return [k.slot_us for k in keys]

    def taken_over(self, name: str, by: SimulatedReplica) -> int:
        """A slot of ``name`` claimed here, released, taken over by ``by`` and
        sent by it: its fence is 2."""
        slot_us = self.now_us() - US // 2
        claims = self.store.claim(self.id, [SlotKey(name, slot_us)], 30 * US)
        assert claims, "claim refused"
        self.store.release(self.id, claims)
        taken = [c for c in by.store.take_over(by.id, 30 * US, 1000) if c.entry == name]
        assert taken and taken[0].fence == 2, taken
        by.store.confirm(by.id, taken)
        return slot_us

    def run(self, name: str, slot_us: int) -> str:
        """SingletonTask's run of a slot, as a worker records it: its task id."""
        task_id = str(uuid.uuid4())
        self.store.begin_run(Run(name, slot_us, unique("run")), self.id, task_id, 60 * US)
        return task_id

    def lease(self, key: str) -> None:
        """A SingletonTask key held by this replica's worker for a minute."""
        self.store.acquire_lease(key, self.id, 60 * US)


@pytest.fixture(scope="module", autouse=True)
def close_stores() -> Iterator[None]:
    """The store's pooled connections closed after the module: pytest-django
    drops the test database at the end, which PostgreSQL refuses while a
    connection to it is open."""
    yield
    store.close_all()
