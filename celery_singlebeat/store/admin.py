"""Creating the schema explicitly, for deployments whose beat user may not run DDL.

With ``singlebeat_create_schema = False`` the scheduler only checks the schema;
run :func:`create_schema` (or ``celery -A proj singlebeat create-schema``) once
with a privileged user, e.g. in a migration job.
"""

from __future__ import annotations

from collections.abc import MutableMapping
from typing import Any

from sqlalchemy.engine import URL

from ..config import Overrides, Settings


def create_schema(
    app_or_url: Any, *, url: str | URL | None = None, table_prefix: str | None = None
) -> str:
    """Create (or check) the tables for a Celery app's settings, or a database URL.

    ``url`` and ``table_prefix`` override the app's ``singlebeat_url`` and
    ``singlebeat_table_prefix``: the usual case is the app's settings with a
    privileged user's URL. Idempotent and safe to run while replicas are
    starting. Returns the database URL with its password masked.
    """
    from .sql import SqlStore

    overrides: dict[str, Any] = {}
    if isinstance(app_or_url, (str, URL)):
        base: MutableMapping[str, Any] = {}
        overrides["singlebeat_url"] = app_or_url
    else:
        base = app_or_url.conf
    if url is not None:
        overrides["singlebeat_url"] = url
    if table_prefix is not None:
        overrides["singlebeat_table_prefix"] = table_prefix
    settings = Settings.from_conf(Overrides(overrides, base))
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
