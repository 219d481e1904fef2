"""Creating the schema explicitly, for deployments whose beat user may not run DDL.

With ``singlebeat_create_schema = False`` the scheduler only checks the schema;
run :func:`create_schema` (or ``celery -A proj singlebeat create-schema``) once
with a privileged user, e.g. in a migration job.
"""

from __future__ import annotations

from typing import Any

from .config import Settings


def create_schema(app_or_url: Any, *, table_prefix: str | None = None) -> str:
    """Create (or check) the tables for a Celery app's settings, or a database URL.

    Idempotent and safe to run while replicas are starting. Returns the
    database URL with its password masked.
    """
    from .store.sql import SqlStore

    if isinstance(app_or_url, str):
        conf: dict[str, Any] = {"singlebeat_url": app_or_url}
        if table_prefix is not None:
            conf["singlebeat_table_prefix"] = table_prefix
        settings = Settings.from_conf(conf)
    else:
        settings = Settings.from_conf(app_or_url.conf)
    store = SqlStore(
        settings.url,
        table_prefix=settings.table_prefix,
        engine_options=dict(settings.engine_options),
    )
    try:
        store.prepare(create=True)
    finally:
        store.close()
    return settings.safe_url
