"""``DatabaseScheduler``: the drop-in for django-celery-beat's scheduler.

``CELERY_BEAT_SCHEDULER = "celery_singlebeat.contrib.django.DatabaseScheduler"``
(or ``celery beat -S django_singlebeat``) runs beat over django-celery-beat's
tables in every pod: a :class:`~celery_singlebeat.SingleBeatScheduler` given
one more entry source, :class:`.periodic_tasks.PeriodicTaskSource`, through
the adapter's constructor (``sources=``), the seam it has for sources besides
``beat_schedule`` and the stored schedules. Nothing of the adapter or the
engine changes: the replicas coordinate each slot in the database as for any
other entry, and write ``last_run_at``/``total_run_count`` back to the task's
row once per slot.

The coordination tables default to Django's ``default`` database
(``singlebeat_url = "django://default"``) when the setting is unset, also
in a project that lists only ``django_celery_beat`` in ``INSTALLED_APPS``
(without ``celery_singlebeat.contrib.django``, whose migration would create
them; the scheduler then creates them itself, as ``singlebeat_create_schema``
says).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ...config import read_setting
from ...scheduler import SingleBeatScheduler
from ...sources import EntrySource
from .database import SCHEME
from .periodic_tasks import PeriodicTaskSource


class DatabaseScheduler(SingleBeatScheduler):
    """A :class:`~celery_singlebeat.SingleBeatScheduler` whose entries include
    django-celery-beat's periodic tasks (:class:`.periodic_tasks.PeriodicTaskSource`).

    ``beat_schedule``'s entries and the stored schedules stay sources as
    well; django-celery-beat's own ``DatabaseScheduler`` copied
    ``beat_schedule`` into its table, this one does not (an entry of both
    names stops beat, naming both sources). ``celery.backend_cleanup``, which
    Celery adds to ``beat_schedule``, is sent from there (django-celery-beat
    wrote it as a row; a row of that name left from it is refused as a
    duplicate name: delete it, or rename it).

    ``rescan_period`` (seconds): within how long a ``QuerySet.update()`` that
    did not bump ``PeriodicTasks`` is in force when the chunk digests see it;
    ``backstop_period``: within how long every row is read whole again, for
    the bare updates they cannot see (a text of the same length). Subclass to
    change them.
    """

    #: the bound, in seconds, on a bare ``QuerySet.update()`` edit's pickup
    rescan_period: float = PeriodicTaskSource.rescan_period
    #: the bound, in seconds, on one the digests cannot see
    backstop_period: float = PeriodicTaskSource.backstop_period

    def __init__(
        self,
        app: Any,
        *args: Any,
        sources: Sequence[EntrySource] = (),
        **kwargs: Any,
    ) -> None:
        if read_setting(app.conf, "singlebeat_url", unset=None) is None:
            # the project's own database, whether or not the app is installed
            app.conf.singlebeat_url = SCHEME + "default"
        tasks = PeriodicTaskSource(
            app.timezone,
            rescan_period=self.rescan_period,
            backstop_period=self.backstop_period,
        )
        #: the source over django-celery-beat's tables
        self.periodic_tasks = tasks
        super().__init__(app, *args, sources=[tasks, *sources], **kwargs)


__all__ = ["DatabaseScheduler"]
