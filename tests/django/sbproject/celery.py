"""The project's Celery app, configured from Django's settings as Django projects do."""

from __future__ import annotations

import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "sbproject.settings")

import django

django.setup()

from celery import Celery  # noqa: E402

app = Celery("sbproject")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
