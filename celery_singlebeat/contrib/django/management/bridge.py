"""A Django management command that runs one of the CLI's click commands.

``manage.py singlebeat_schedules add ...`` is ``celery -A proj singlebeat
schedules add ...``: the same click command (``celery_singlebeat/cli/``), the
same options, output and checks, run with the project's settings. The
command hands its arguments to click untouched; click's Celery app is one
configured from Django's settings as the project's own is
(:func:`..conf.celery_app`), so the database, the table prefix, the time zone
and ``CELERY_BEAT_SCHEDULE`` are the replicas'.

Click's failures become one-line :class:`~django.core.management.CommandError`
with click's exit status (1 for a database that cannot be used, 2 for input
that does not fit: nothing was written), which ``manage.py`` prints as
``CommandError: ...`` and ``call_command`` raises. ``--help`` is click's help
for the command; Django's own options (``--settings``, ``--pythonpath``,
``--traceback``, ``--no-color``, ``-v``) keep their meaning.
"""

from __future__ import annotations

import argparse
import contextlib
import os
from typing import Any

import click
from django.core.management.base import BaseCommand, CommandError

#: what ``celery -A`` would have named: the commands' app is Django's settings
APP_NAME = "django.conf:settings"


class ClickCommand(BaseCommand):
    """A management command running the click command at :attr:`click_path`
    under the CLI's ``singlebeat`` group; a subclass sets the path and its
    ``help``."""

    #: the command's path under ``singlebeat``: ``("schedules",)``, ``("status",)``
    click_path: tuple[str, ...] = ()
    #: the program name click's usage lines start with
    prog_name = "manage.py"

    def click_command(self) -> click.Command:
        """The click command this runs."""
        from ....cli import singlebeat

        command: click.Command = singlebeat
        for name in self.click_path:
            assert isinstance(command, click.Group)
            found = command.get_command(click.Context(command), name)
            if found is None:  # pragma: no cover - a subclass's typo
                raise LookupError(f"no command {name!r} under {command.name!r}")
            command = found
        return command

    def create_parser(self, prog_name: str, subcommand: str, **kwargs: Any) -> Any:
        """Django's parser for its own options only; every other argument,
        ``--help`` included, is left for click (``args``)."""
        self._program(prog_name)
        parser = super().create_parser(
            prog_name, subcommand, add_help=False, allow_abbrev=False, **kwargs
        )

        def parse_args(
            args: list[str] | None = None, namespace: argparse.Namespace | None = None
        ) -> argparse.Namespace:
            # parse_known_args leaves the rest in its order: click parses it
            options, rest = parser.parse_known_args(args, namespace)
            options.args = rest
            return options

        parser.parse_args = parse_args
        return parser

    def print_help(self, prog_name: str, subcommand: str) -> None:
        """``manage.py help singlebeat_...``: click's help of the command."""
        self._program(prog_name)
        self.handle("--help")

    def handle(self, *args: str, **options: Any) -> None:
        """Run the click command on ``args``; its output goes to this
        command's stdout and stderr (``call_command(stdout=...)`` too)."""
        from ..conf import celery_app, in_django_terms

        command = self.click_command()
        # the root of the context: what `celery -A proj` gives the group (an
        # app in obj, its name in params), so the CLI reads the app's settings
        root = click.Context(click.Group(self.prog_name), info_name=self.prog_name)
        root.obj = _Host(celery_app())
        root.params["app"] = APP_NAME
        out = getattr(self.stdout, "_out", self.stdout)
        err = getattr(self.stderr, "_out", self.stderr)
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                code = command.main(
                    list(args),
                    prog_name=self._name(),
                    standalone_mode=False,
                    parent=root,
                )
        except click.UsageError as exc:
            path = exc.ctx.command_path if exc.ctx is not None else self._name()
            raise CommandError(
                _one_line(f"{exc.format_message()} (see {path} --help)"),
                returncode=exc.exit_code,
            ) from None
        except click.ClickException as exc:
            # a setting is named as the project wrote it (CELERY_SINGLEBEAT_LEASE)
            message = in_django_terms(_one_line(exc.format_message()))
            raise CommandError(message, returncode=exc.exit_code) from None
        except click.Abort:
            raise CommandError("aborted", returncode=1) from None
        # standalone_mode=False: an exit (--help's) is returned, not raised
        if isinstance(code, int) and code != 0:
            raise CommandError(f"exit status {code}", returncode=code)

    def _program(self, argv0: str) -> None:
        # as Django's own usage lines say it
        name = os.path.basename(argv0)
        self.prog_name = "python -m django" if name == "__main__.py" else name or self.prog_name

    def _name(self) -> str:
        return self.__class__.__module__.rsplit(".", 1)[-1]


class _Host:
    """What click's ``ctx.obj`` is under ``celery``: it carries the app."""

    def __init__(self, app: Any) -> None:
        self.app = app


def _one_line(text: str) -> str:
    return " ".join(text.split())
