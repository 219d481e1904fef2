"""The app's configuration: its label, and the checks it runs at start-up."""

from __future__ import annotations

from django.apps import AppConfig


class SingleBeatConfig(AppConfig):
    """``"celery_singlebeat.contrib.django"`` in ``INSTALLED_APPS``.

    The label is ``celery_singlebeat``: the admin's URLs
    (``/admin/celery_singlebeat/...``), the permissions
    (``celery_singlebeat.pause_entry``) and ``manage.py migrate
    celery_singlebeat`` all say it.
    """

    name = "celery_singlebeat.contrib.django"
    label = "celery_singlebeat"
    verbose_name = "Celery beat (celery-singlebeat)"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        """Register the system checks of the app's settings (checks.py)."""
        from django.core import checks

        from .checks import TAG, check_settings

        checks.register(check_settings, TAG)
