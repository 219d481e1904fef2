"""docs/cli.md names every command and every option the click group has, in
the command's own section: the commands are the source, the page must follow."""

from __future__ import annotations

import re
from pathlib import Path

import click

from celery_singlebeat.cli import singlebeat

DOC = (Path(__file__).resolve().parents[2] / "docs" / "cli.md").read_text()
#: documented on pages of their own
ELSEWHERE = {"create-schema": "operations.md", "health": None}


def sections() -> dict[str, str]:
    parts = re.split(r"^## `([a-z-]+)`\n", DOC, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2]))


def test_every_command_and_option_is_documented() -> None:
    documented = sections()
    for name, command in singlebeat.commands.items():
        if name in ELSEWHERE:
            continue
        assert name in documented, f"docs/cli.md has no section for `{name}`"
        subcommands = getattr(command, "commands", {})
        for sub_name, sub in subcommands.items():
            assert f"{name} {sub_name}" in documented[name] or sub_name in documented[name], (
                f"`{name} {sub_name}` is not in docs/cli.md"
            )
            for param in sub.params:
                if isinstance(param, click.Option) and "--help" not in param.opts:
                    for opt in param.opts:
                        assert opt in documented[name], (
                            f"`{name} {sub_name} {opt}` is not in docs/cli.md"
                        )
        for param in command.params:
            if isinstance(param, click.Option) and "--help" not in param.opts:
                for opt in param.opts:
                    assert opt in documented[name], f"`{name} {opt}` is not in docs/cli.md"
    for param in singlebeat.params:
        for opt in param.opts:
            assert f"`{opt}`" in DOC, f"group option {opt} is not in docs/cli.md"
    assert "create-schema" in DOC
