"""The admin's fleet pages over rows a simulated replica wrote through the
store (heartbeat, catalog, claims, a takeover, SingletonTask's runs and
leases), and the controls: each asks first, each needs its permission, each
writes a LogEntry, and a refusal changes nothing."""

from __future__ import annotations

import pytest
from admin_support import CONTROLS, SimulatedReplica, close_stores, staff_client, unique
from django.contrib.admin.models import CHANGE, LogEntry
from django.db import connection
from django.test.utils import CaptureQueriesContext

from celery_singlebeat.contrib.django import store
from celery_singlebeat.contrib.django.models import Pause, Slot
from celery_singlebeat.timeline.slots import slot_task_id

pytestmark = pytest.mark.django_db(transaction=True)

__all__ = ["close_stores"]  # the fixture, used by every test here (autouse)

ADMIN = "/admin/celery_singlebeat/"


@pytest.fixture
def replica() -> SimulatedReplica:
    return SimulatedReplica()


def test_entries_catalog_slots_replicas_and_leases_render(replica: SimulatedReplica) -> None:
    client, _ = staff_client(superuser=True)
    name = unique("report")
    replica.publish([name])
    sent = replica.send(name)
    other = SimulatedReplica()
    other.publish([name])
    taken = replica.taken_over(name, other)
    task_id = replica.run(name, sent[-1])
    key = unique("singleton")
    replica.lease(key)

    entries = client.get(f"{ADMIN}entry/", {"q": name}).content.decode()
    assert name in entries and "proj.report" in entries and "every 10s" in entries
    assert other.id in entries  # the last sender: the replica that took the slot over

    catalog = client.get(f"{ADMIN}catalogentry/", {"q": name}).content.decode()
    assert name in catalog and "every 10s" in catalog

    slots = client.get(f"{ADMIN}slot/", {"entry": name})
    rows = list(slots.context["cl"].result_list)
    assert [r.slot_us for r in rows] == sorted([*sent, taken], reverse=True)
    assert slot_task_id(name, sent[0]) in slots.content.decode()
    over = client.get(f"{ADMIN}slot/", {"entry": name, "taken_over": "yes"}).context["cl"]
    assert [(r.slot_us, r.fence, r.owner) for r in over.result_list] == [(taken, 2, other.id)]
    mine = client.get(f"{ADMIN}slot/", {"entry": name, "owner": replica.id}).context["cl"]
    assert sorted(r.slot_us for r in mine.result_list) == sorted(sent)
    recent = client.get(f"{ADMIN}slot/", {"entry": name, "since": "1h", "state": "1"})
    assert len(recent.context["cl"].result_list) == 4
    # a task id is found through SingletonTask's runs, which keep it
    found = client.get(f"{ADMIN}slot/", {"q": task_id}).context["cl"]
    assert [(r.entry, r.slot_us) for r in found.result_list] == [(name, sent[-1])]
    runs = client.get(f"{ADMIN}run/", {"q": task_id}).content.decode()
    assert f"entry={name}&amp;slot_us={sent[-1]}" in runs

    replicas = client.get(f"{ADMIN}replica/", {"q": replica.id}).content.decode()
    assert replica.id in replicas and ">live<" in replicas

    leases = client.get(f"{ADMIN}lease/", {"q": key}).content.decode()
    assert key in leases and replica.id in leases and ">held<" in leases


def test_list_pages_cost_a_constant_number_of_queries(replica: SimulatedReplica) -> None:
    client, _ = staff_client(superuser=True)
    few_tag, many_tag = unique("few"), unique("many")
    few = [f"{few_tag}-{i}" for i in range(2)]
    many = [f"{many_tag}-{i}" for i in range(30)]
    replica.publish(few + many)
    for name in few + many:
        replica.send(name, slots=1)

    def queries(tag: str, listed: int) -> int:
        with CaptureQueriesContext(connection) as seen:
            page = client.get(f"{ADMIN}entry/", {"q": tag})
        assert len(page.context["cl"].result_list) == listed
        assert all(row.sb_last is not None for row in page.context["cl"].result_list)
        # no COUNT(*) of a store's table: the paginator reads keys up to a LIMIT
        counts = [q["sql"] for q in seen.captured_queries if "COUNT(" in q["sql"].upper()]
        assert not [q for q in counts if "singlebeat_" in q], counts
        return len(seen.captured_queries)

    # the same number of statements for a page of 2 entries as for one of 32
    assert queries(few_tag, 2) == queries(many_tag, 30)


def _action(client, model: str, action: str, keys: list[str], **extra: str):  # type: ignore[no-untyped-def]
    data = {"action": action, "_selected_action": keys, "index": "0", **extra}
    return client.post(f"{ADMIN}{model}/", data, follow=True)


def test_pause_asks_first_then_pauses_and_logs(replica: SimulatedReplica) -> None:
    client, user = staff_client(["view_entry", "pause_entry"])
    name = unique("pausable")
    replica.publish([name])
    page = _action(client, "entry", "pause_entries", [name])
    assert 'id="confirm"' in page.content.decode() and name in page.content.decode()
    assert not Pause.objects.filter(entry=name).exists()  # asked, not done

    done = _action(
        client, "entry", "pause_entries", [name], post="yes", reason="db upgrade", until=""
    )
    assert "Paused" in done.content.decode()
    pause = Pause.objects.get(entry=name)
    assert pause.reason == "db upgrade" and pause.paused_by.startswith(user.username)
    log = LogEntry.objects.get(object_id=name, action_flag=CHANGE)
    assert log.user == user and "Paused" in log.get_change_message()
    listing = client.get(f"{ADMIN}entry/", {"q": name}).content.decode()
    assert "paused by" in listing

    resumed = _action(client, "entry", "resume_entries", [name], post="yes")
    assert "Resumed" in resumed.content.decode()
    assert not Pause.objects.filter(entry=name).exists()


def test_a_pause_in_the_past_is_refused_and_changes_nothing(replica: SimulatedReplica) -> None:
    client, _ = staff_client(["view_entry", "pause_entry"])
    name = unique("past")
    replica.publish([name])
    page = _action(client, "entry", "pause_entries", [name], post="yes", until="2001-01-01 00:00")
    assert "Pause refused" in page.content.decode() and "past" in page.content.decode()
    assert not Pause.objects.filter(entry=name).exists()
    assert not LogEntry.objects.filter(object_id=name).exists()


def test_run_now_requests_a_slot_and_is_refused_while_paused(replica: SimulatedReplica) -> None:
    client, user = staff_client(["view_entry", "run_entry_now", "pause_entry"])
    name = unique("runnable")
    replica.publish([name])
    assert 'id="confirm"' in _action(client, "entry", "run_entries_now", [name]).content.decode()
    done = _action(client, "entry", "run_entries_now", [name], post="yes", reason="backfill")
    assert "Requested a run" in done.content.decode()
    (request,) = Slot.objects.filter(entry=name, fence=0)
    assert request.state == 0
    assert LogEntry.objects.filter(object_id=name, user=user).count() == 1

    store.operator().pause([name], None, "ops", "freeze")
    refused = _action(client, "entry", "run_entries_now", [name], post="yes")
    assert "Run now refused" in refused.content.decode() and "paused" in refused.content.decode()
    assert Slot.objects.filter(entry=name, fence=0).count() == 1
    assert LogEntry.objects.filter(object_id=name, user=user).count() == 1


def test_release_a_lease(replica: SimulatedReplica) -> None:
    client, user = staff_client(["view_lease", "release_lease"])
    key = unique("singleton")
    replica.lease(key)
    assert 'id="confirm"' in _action(client, "lease", "release_leases", [key]).content.decode()
    done = _action(client, "lease", "release_leases", [key], post="yes")
    assert "Released" in done.content.decode()
    assert store.operator().lease(key).state == "released"
    assert LogEntry.objects.get(object_id=key).user == user


@pytest.mark.parametrize(
    ("model", "action", "missing"),
    [
        ("entry", "pause_entries", "pause_entry"),
        ("entry", "run_entries_now", "run_entry_now"),
        ("lease", "release_leases", "release_lease"),
        ("storedschedule", "pause_entries", "pause_entry"),
    ],
)
def test_each_control_needs_its_permission(
    replica: SimulatedReplica, model: str, action: str, missing: str
) -> None:
    others = [c for c in CONTROLS if c != missing]
    client, _ = staff_client([f"view_{model}", *others])
    name = unique("guarded")
    replica.publish([name])
    replica.lease(name)
    store.schedules().upsert(name + "-s", "proj.report", {"every": 60})
    listing = client.get(f"{ADMIN}{model}/").content.decode()
    assert f'value="{action}"' not in listing  # not offered
    key = name + "-s" if model == "storedschedule" else name
    _action(client, model, action, [key], post="yes")
    assert not Pause.objects.filter(entry=key).exists()
    assert not Slot.objects.filter(entry=key, fence=0).exists()
    assert store.operator().lease(name).state == "held"
    assert not LogEntry.objects.filter(object_id=key).exists()
