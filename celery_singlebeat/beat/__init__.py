"""What the Celery adapter (:mod:`celery_singlebeat.scheduler`) runs beside the engine.

Celery's ``beat_schedule`` as an entry source (:mod:`.source`), how a
configuration error ends ``celery beat`` as one line (:mod:`.fatal`), the
embedded worker of ``celery worker -B`` (:mod:`.embedded`) and the stop that
waits for the tick in progress (:mod:`.stopping`). Only the adapter imports
these; the engine knows none of them.
"""
