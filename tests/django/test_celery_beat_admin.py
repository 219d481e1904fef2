"""django-celery-beat's own admin beside the app: its "Run selected tasks"
action sends through the project's Celery app, as it does under
django-celery-beat's scheduler, and leaves the task's row as it was (the
drop-in's write-back is the sender's alone, never the admin's)."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django_celery_beat.models import IntervalSchedule, PeriodicTask

pytestmark = pytest.mark.django_db


@pytest.fixture
def celery_app() -> Any:
    from sbproject.celery import app

    app.set_current()
    previous = app.conf.task_always_eager
    app.conf.task_always_eager = True  # the action's apply_async runs the task here
    yield app
    app.conf.task_always_eager = previous


def test_run_selected_tasks_sends_each_once_and_changes_no_row(celery_app: Any) -> None:
    ran: list[tuple[Any, ...]] = []

    @celery_app.task(name="sbtest.record", shared=False)
    def record(*args: Any, **kwargs: Any) -> None:
        ran.append((args, kwargs))

    every, _ = IntervalSchedule.objects.get_or_create(every=30, period="seconds")
    task = PeriodicTask.objects.create(
        name="admin-run", task="sbtest.record", interval=every, args="[1, 2]", kwargs='{"k": 3}'
    )
    before = PeriodicTask.objects.values().get(pk=task.pk)
    User.objects.create_superuser("root", "root@example.com", "pw")
    client = Client()
    client.force_login(User.objects.get(username="root"))

    answer = client.post(
        "/admin/django_celery_beat/periodictask/",
        {"action": "run_tasks", "_selected_action": [task.pk]},
        follow=True,
    )

    assert answer.status_code == 200
    assert "1 task was successfully run" in answer.content.decode()
    assert ran == [((1, 2), {"k": 3})]
    # no run count, no last run, no save: the row is as it was
    assert PeriodicTask.objects.values().get(pk=task.pk) == before
