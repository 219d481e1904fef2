"""The admin of the app, on Django's default admin site (``admin.site``).

Django imports this module at start-up (its admin's autodiscovery); each
page lives in a module of its own, which registers its model admins:

* :mod:`.admin_schedules`: the stored schedules (list, add, change with a
  preview of the next runs and the store's history, delete), every write
  through :class:`~celery_singlebeat.schedules.api.Schedules`;
* :mod:`.admin_fleet`: the registered entries, the ``beat_schedule``
  catalog, the slot history, SingletonTask's runs and leases, the replicas;
* :mod:`.admin_actions`: the controls (pause, resume, run now, release a
  lease) as actions, each asking first, each under its own permission, each
  logged;
* :mod:`.admin_changelist`: what keeps the lists fast over a million rows.
"""

from __future__ import annotations

from . import admin_fleet, admin_schedules

__all__ = ["admin_fleet", "admin_schedules"]
