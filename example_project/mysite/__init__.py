"""The example's Django project: a shop whose periodic tasks run under celery-singlebeat.

The Celery app is imported here, as Celery's Django guide does, so that
``@shared_task`` in the apps binds to it whenever Django starts (the web
process, ``manage.py``), not only in ``celery -A mysite`` processes.
"""

from .celery import app as celery_app

__all__ = ["celery_app"]
