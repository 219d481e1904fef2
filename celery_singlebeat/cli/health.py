"""``singlebeat health``: the exec probe as a Celery sub-command.

``python -m celery_singlebeat health`` does not come here: it takes
``health.main``'s fast path, without click or Celery (a kubelet runs it every
few seconds). Both read the same options (``health.OPTIONS``) and print the
same verdict; this one also finds the status file in the app's settings.
"""

from __future__ import annotations

import click

from ..exceptions import SingleBeatError
from ..observe import health
from .group import _app_of, singlebeat

_STATUS_FILE, _LIVE, _READY = (text for _flag, _meta, text in health.OPTIONS)


@singlebeat.command(name="health")
@click.option(
    "--status-file",
    default=None,
    metavar="PATH",
    help=f"{_STATUS_FILE} Default: the app's singlebeat_status_file.",
)
@click.option("--live", is_flag=True, help=_LIVE)
@click.option("--ready", is_flag=True, help=_READY)
@click.pass_context
def health_command(ctx: click.Context, status_file: str | None, live: bool, ready: bool) -> None:
    """Probe a running beat through its status file (exit 0 ok, 1 failing, 2 usage)."""
    if live and ready:
        raise click.UsageError("--live and --ready exclude each other")
    if status_file is None:
        app = _app_of(ctx)
        if app is None:
            raise click.UsageError(
                "pass --status-file, or run as `celery -A proj singlebeat health`"
            )
        from ..config import Settings

        try:
            status_file = Settings.from_conf(app.conf).status_file
        except SingleBeatError as exc:
            raise click.ClickException(str(exc)) from None
        if status_file is None:
            raise click.UsageError(
                "the app has no singlebeat_status_file: set it (beat writes the file), "
                "or pass --status-file"
            )
    code, line = health.probe(status_file, "live" if live else "ready")
    click.echo(line)
    ctx.exit(code)
