"""From the command line to the fleet's tables: the settings (the app's, or
the group's ``--url``), the store, and every error as one line.

A command's failure is ``Error: <one line>`` on stderr and exit status 1
(click's ClickException); a usage error is click's usage text and status 2.
No traceback, and no secret: URLs are shown through ``safe_url``, and the
secrets the store connects with are scrubbed from every message.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import click

from ..exceptions import SingleBeatError
from .group import _app_of, target_of

if TYPE_CHECKING:
    from ..config import Settings
    from ..store.sql import SqlStore
    from ..store.sql.operator import Operator


def settings_of(ctx: click.Context, **overrides: Any) -> Settings:
    """The validated settings: the app's (``celery -A``), the group's --url and
    --table-prefix over them, and ``overrides`` (``singlebeat_*`` names) last."""
    from ..config import Overrides, Settings
    from ..exceptions import ConfigurationError

    app = _app_of(ctx)
    target = target_of(ctx)
    if app is None and target.url is None:
        raise click.UsageError(
            "pass --url URL (python -m celery_singlebeat --url URL COMMAND), "
            "or run as `celery -A proj singlebeat COMMAND`"
        )
    given: dict[str, Any] = {}
    if target.url is not None:
        given["singlebeat_url"] = target.url
    if target.table_prefix is not None:
        given["singlebeat_table_prefix"] = target.table_prefix
    given.update(overrides)
    try:
        return Settings.from_conf(Overrides(given, {} if app is None else app.conf))
    except ConfigurationError as exc:
        raise click.ClickException(_one_line(str(exc))) from None


@contextmanager
def operator_of(ctx: click.Context, **overrides: Any) -> Iterator[Operator]:
    """The operator's reads and controls over the command's database, its
    store closed afterwards. Every error in the block becomes one line naming
    the database (its secrets masked)."""
    from ..store.sql.operator import Operator

    with store_of(ctx, **overrides) as (store, _settings):
        yield Operator(store)


class Refused(click.ClickException):
    """The command's input does not fit (an invalid entry, an unknown name, a
    stale revision, a bad file): ``Error: ...`` and exit status 2, as click's
    usage errors, so a script tells it from a database that is down (1)."""

    exit_code = 2


@contextmanager
def store_of(ctx: click.Context, **overrides: Any) -> Iterator[tuple[SqlStore, Settings]]:
    """The store of the command's database and the settings it was opened
    with, closed afterwards. Every error in the block becomes one line naming
    the database (its secrets masked); an error about the input
    (:class:`~..exceptions.ControlError`, :class:`~..exceptions.InvalidEntry`
    and the stored schedules' refusals) names only the input, with status 2
    for the stored schedules' (:class:`Refused`)."""
    from sqlalchemy.exc import SQLAlchemyError

    from ..exceptions import ControlError, InvalidEntry, ScheduleError, ScheduleStoreError
    from ..redact import Secrets
    from ..store.sql import SqlStore

    settings = settings_of(ctx, **overrides)
    shown = settings.safe_url
    secrets = Secrets.of(settings.url, settings.engine_options)

    def fail(message: str) -> click.ClickException:
        # the URL is already masked: scrubbing it again would mask a short
        # password's letters inside the words around it
        return click.ClickException(_one_line(f"database {shown}: {secrets.scrub(message)}"))

    database = settings.url.database
    if settings.backend == "sqlite" and database and not os.path.exists(database):
        # connecting would create an empty file: a typo must not leave one behind
        raise fail("no such SQLite file; check the path (`create-schema` creates it)")
    try:
        store = SqlStore.from_settings(settings)
    except (SQLAlchemyError, ImportError) as exc:
        raise fail(f"cannot open it: {type(exc).__name__}: {exc}") from None
    try:
        yield store, settings
    except (click.ClickException, click.exceptions.Exit, click.Abort):
        raise
    except ControlError as exc:  # about the input, not the database
        raise click.ClickException(_one_line(secrets.scrub(str(exc)))) from None
    except (InvalidEntry, ScheduleStoreError, ScheduleError) as exc:
        # about the input too; a file's problems keep one line each
        raise Refused(secrets.scrub(str(exc))) from None
    except SingleBeatError as exc:
        raise fail(str(exc)) from None
    except Exception as exc:  # a bug: still one line, still no secret
        raise fail(f"unexpected {type(exc).__name__}: {exc}") from None
    finally:
        store.close()


def _one_line(text: str) -> str:
    return " ".join(text.split())
