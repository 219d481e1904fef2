"""What a process tells its operators: telemetry hooks, decisions, metrics and probes.

:mod:`.telemetry` is the hooks the engine and SingletonTask call (no-ops by
default); :mod:`.decisions` names each decision about a slot and its log
fields; :mod:`.metrics` turns the hooks into Prometheus series; :mod:`.health`
and :mod:`.listener` are the liveness and readiness probes and their HTTP
server; :mod:`.observers` assembles what a process's settings ask for. The
exec probe (:mod:`.health`) loads none of Celery, SQLAlchemy or the store.
"""
