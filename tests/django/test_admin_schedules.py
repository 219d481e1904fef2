"""The admin's stored schedules over real rows: the list, add, change,
preview, the stale form refused by its revision, delete, the history, and bad
input refused on its field with nothing stored. Every write goes through the
API (``Schedules``), in the request's transaction with its LogEntry."""

from __future__ import annotations

import pytest
from admin_support import close_stores, staff_client, unique
from django.contrib.admin.models import ADDITION, CHANGE, DELETION, LogEntry

from celery_singlebeat.contrib.django import store
from celery_singlebeat.exceptions import ScheduleNotFound

pytestmark = pytest.mark.django_db(transaction=True)

__all__ = ["close_stores"]  # the fixture, used by every test here (autouse)

ADD = "/admin/celery_singlebeat/storedschedule/add/"
LIST = "/admin/celery_singlebeat/storedschedule/"


def change_url(name: str) -> str:
    return f"{LIST}{name}/change/"


def form(name: str, **fields: object) -> dict[str, object]:
    data: dict[str, object] = {
        "name": name,
        "task": "proj.report",
        "every": "",
        "cron": "",
        "tz": "",
        "at": "",
        "args": "[1, 2]",
        "kwargs": '{"to": "ops"}',
        "queue": "",
        "start": "",
        "end": "",
        "description": "",
        "enabled": "on",
        "why": "",
    }
    data.update(fields)
    return data


def test_add_writes_through_the_api_with_its_log_entry() -> None:
    client, user = staff_client(superuser=True)
    name = unique("nightly")
    response = client.post(ADD, form(name, cron="0 3 * * *", tz="Europe/Paris", why="new report"))
    assert response.status_code == 302, response.content.decode()[-3000:]
    api = store.schedules()
    entry = api.get(name)
    assert entry.task == "proj.report" and entry.args == (1, 2) and entry.kwargs == {"to": "ops"}
    assert entry.updated_by == user.username and entry.revision is not None
    (change,) = api.log(name)
    assert change.why == "new report" and change.by == user.username
    log = LogEntry.objects.get(object_id=name)
    assert log.action_flag == ADDITION and log.user == user
    listing = client.get(LIST, {"q": name}).content.decode()
    assert name in listing and "0 3 * * * (Europe/Paris)" in listing


def test_bad_input_is_refused_on_its_field_and_nothing_is_stored() -> None:
    client, _ = staff_client(superuser=True)
    name = unique("bad")
    response = client.post(
        ADD, form(name, task="has space", cron="0 25 * * *", kwargs="[]", queue="")
    )
    assert response.status_code == 200
    errors = response.context["adminform"].form.errors
    assert "whitespace" in errors["task"][0]
    assert "hour" in " ".join(errors["cron"]) or "25" in " ".join(errors["cron"])
    assert "kwargs" in errors
    with pytest.raises(ScheduleNotFound):
        store.schedules().get(name)
    assert not LogEntry.objects.filter(object_id=name).exists()
    # a schedule needs exactly one kind; a zone goes with a crontab
    both = client.post(ADD, form(name, every="30", at="2030-01-01T00:00:00+00:00", tz="UTC"))
    errors = both.context["adminform"].form.errors
    assert {"every", "at", "tz"} <= set(errors)
    # a preview of a bad form shows the same errors, and no runs
    preview = client.post(ADD, form(name, task="has space", every="60", _preview="1"))
    assert "whitespace" in preview.context["adminform"].form.errors["task"][0]
    assert preview.context["next_runs"] is None
    bad_tz = client.post(ADD, form(name, cron="0 3 * * *", tz="Mars/Olympus"))
    assert "Mars/Olympus" in bad_tz.context["adminform"].form.errors["tz"][0]
    with pytest.raises(ScheduleNotFound):
        store.schedules().get(name)


def test_preview_shows_the_next_runs_and_writes_nothing() -> None:
    client, _ = staff_client(superuser=True)
    name = unique("preview")
    response = client.post(ADD, form(name, every="3600", _preview="1"))
    assert response.status_code == 200
    runs = response.context["next_runs"]
    assert len(runs) == 5
    assert "Preview: the next runs" in response.content.decode()
    with pytest.raises(ScheduleNotFound):
        store.schedules().get(name)


def test_change_stale_revision_history_and_delete() -> None:
    client, user = staff_client(superuser=True)
    name = unique("edit")
    api = store.schedules(by="someone")
    first = api.upsert(name, "proj.report", {"every": 60}, why="seed")
    page = client.get(change_url(name))
    assert page.status_code == 200
    initial = page.context["adminform"].form.initial
    assert initial["revision"] == first.revision and initial["every"] == 60
    assert len(page.context["next_runs"]) == 5

    # edit at the revision read: written, with the history's field diff
    response = client.post(
        change_url(name),
        form(name, every="120", revision=first.revision, why="slower", args="[]", kwargs="{}"),
    )
    assert response.status_code == 302, response.context["adminform"].form.errors
    second = api.get(name)
    assert second.revision != first.revision and second.updated_by == user.username
    assert LogEntry.objects.get(object_id=name, action_flag=CHANGE).user == user
    page = client.get(change_url(name)).content.decode()
    assert "slower" in page and "schedule" in page

    # a form read at the first revision is stale now: refused, not written over
    stale = client.post(
        change_url(name),
        form(name, every="5", revision=first.revision, args="[]", kwargs="{}"),
    )
    assert stale.status_code == 200
    assert "someone else changed this entry" in stale.content.decode()
    assert api.get(name).revision == second.revision

    # preview on the change page writes nothing either
    preview = client.post(
        change_url(name),
        form(name, every="7", revision=second.revision, args="[]", kwargs="{}", _preview="1"),
    )
    assert len(preview.context["next_runs"]) == 5
    assert api.get(name).revision == second.revision

    # delete asks first, then deletes through the API (history kept)
    delete_url = f"{LIST}{name}/delete/"
    assert "Are you sure" in client.get(delete_url).content.decode()
    assert client.post(delete_url, {"post": "yes"}).status_code == 302
    with pytest.raises(ScheduleNotFound):
        api.get(name)
    assert api.log(name)[0].action == "deleted"
    assert LogEntry.objects.filter(object_id=name, action_flag=DELETION).exists()


def test_a_user_without_the_add_permission_gets_403() -> None:
    client, _ = staff_client(["view_storedschedule"])
    assert client.get(LIST).status_code == 200
    assert client.get(ADD).status_code == 403
    name = unique("nope")
    assert client.post(ADD, form(name, every="60")).status_code == 403
    with pytest.raises(ScheduleNotFound):
        store.schedules().get(name)
