"""The project's Celery app, configured from Django's settings (``CELERY_*``).

``celery -A mysite beat`` (three replicas, every one of them sending; each slot
is sent once), ``celery -A mysite worker``; the scheduler is named by
``CELERY_BEAT_SCHEDULER`` in settings.py, so ``beat`` needs no ``-S``.
"""

from __future__ import annotations

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "mysite.settings")

app = Celery("mysite")
# every CELERY_* setting of settings.py, CELERY_SINGLEBEAT_* included, is read
# here as the lower-case Celery setting (CELERY_BEAT_SCHEDULER -> beat_scheduler)
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
