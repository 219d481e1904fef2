"""The configuration reference, rendered from the list of settings itself.

``celery_singlebeat.config.SETTINGS`` is the list the parser reads; this
extension turns it into the tables of docs/configuration.md, so the reference
has no second, hand-kept list to drift. Usage in a MyST page::

    ```{singlebeat-settings}
    ```

    ```{singlebeat-settings}
    :entry-options:
    ```

The first renders every setting (name, type, default, meaning); the second the
keys a ``beat_schedule`` entry's ``options`` may carry. A setting's name links
to the section of the same page whose heading names it, where the prose says
more; a page that has none keeps the name as plain code.
"""

from __future__ import annotations

from typing import Any, ClassVar

from docutils import nodes
from docutils.parsers.rst import directives
from sphinx.application import Sphinx
from sphinx.util.docutils import SphinxDirective

from celery_singlebeat.config import SETTINGS, Setting

#: the class of the container the tables are rendered in (found again after parsing)
CLASS = "singlebeat-settings"


def _cell(text: str) -> str:
    # A pipe would end the Markdown table's cell.
    return text.replace("|", "\\|").replace("\n", " ")


def _settings_table(settings: list[Setting]) -> list[str]:
    lines = ["| Setting | Type | Default | Meaning |", "|---|---|---|---|"]
    for s in settings:
        meaning = s.meaning
        if s.scope == "celery":
            meaning = f"{meaning} (Celery's own setting.)"
        elif s.scope == "testing":
            meaning = f"{meaning} (Tests only.)"
        lines.append(
            f"| `{s.name}` | {_cell(s.type)} | {_cell(s.shown_default)} | {_cell(meaning)} |"
        )
    return lines


def _entry_options_table(settings: list[Setting]) -> list[str]:
    lines = ["| Option | Type | Meaning |", "|---|---|---|"]
    for s in settings:
        lines.append(f"| `{s.name}` | {_cell(s.type)} | {_cell(s.meaning)} |")
    return lines


class SettingsDirective(SphinxDirective):
    """``singlebeat-settings``: a table of the defined settings."""

    has_content = False
    option_spec: ClassVar[dict[str, Any]] = {"entry-options": directives.flag}

    def run(self) -> list[nodes.Node]:
        if "entry-options" in self.options:
            lines = _entry_options_table([s for s in SETTINGS if s.entry_option])
        else:
            lines = _settings_table(list(SETTINGS))
        container = nodes.container(classes=[CLASS])
        # Parsed as Markdown by MyST: the meanings carry backticks and links.
        self.state.nested_parse(lines, self.content_offset, container)
        return [container]


def _link_names(app: Sphinx, doctree: nodes.document) -> None:
    """Link each setting named in a table to the section whose heading names it."""
    names = {s.name for s in SETTINGS}
    section_of: dict[str, str] = {}
    for section in doctree.findall(nodes.section):
        title = section.next_node(nodes.title)
        if title is None or not section["ids"]:
            continue
        for literal in title.findall(nodes.literal):
            # the first heading that names a setting is its section
            section_of.setdefault(literal.astext(), section["ids"][0])
    for container in doctree.findall(nodes.container):
        if CLASS not in container["classes"]:
            continue
        for literal in list(container.findall(nodes.literal)):
            name = literal.astext()
            if name not in names or name not in section_of:
                continue
            if isinstance(literal.parent, nodes.reference):
                continue
            # only the first cell of a row names the row's setting
            entry = literal.parent.parent
            row = entry.parent if entry is not None else None
            if not isinstance(row, nodes.row) or row.children[0] is not entry:
                continue
            reference = nodes.reference("", "", refid=section_of[name], internal=True)
            literal.replace_self(reference)
            reference += literal


def setup(app: Sphinx) -> dict[str, Any]:
    app.add_directive("singlebeat-settings", SettingsDirective)
    app.connect("doctree-read", _link_names)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
