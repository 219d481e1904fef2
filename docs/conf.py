"""Sphinx configuration for the celery-singlebeat documentation.

Built by ``make docs`` with warnings as errors and nitpicky cross references, so
a broken link, a missing anchor or an autodoc name that no longer exists stops
the build. Nothing here reaches the network: the sequence diagram and the plots
are committed images, and intersphinx is not used.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
# docs/_ext holds the settings-reference extension; the package itself is imported
# from the checkout so that autodoc reads the docstrings being edited.
sys.path.insert(0, str(HERE / "_ext"))
sys.path.insert(0, str(HERE.parent))

from celery_singlebeat import __version__  # noqa: E402

project = "celery-singlebeat"
author = "celery-singlebeat contributors"
copyright = "celery-singlebeat contributors"
release = __version__
version = ".".join(__version__.split(".")[:2])

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx_click",
    "singlebeat_settings",
]

source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "Thumbs.db", ".DS_Store"]

# The pages link to each other's headings (configuration.md#singlebeat_lease):
# give every heading down to ### an anchor, and let Sphinx check them.
myst_heading_anchors = 4
myst_enable_extensions = ["colon_fence", "deflist"]

nitpicky = True
# Names autodoc meets in signatures that no page of this site documents: the
# libraries' own types (no intersphinx: the build must not need the network) and
# private helpers of the package.
_LIBRARIES = (
    r"(celery|kombu|sqlalchemy|click|prometheus_client|datetime|typing|collections|enum|abc|random)"
)
# Internal modules the public signatures and docstrings mention (the clock the
# stores keep, the telemetry base classes, the missed-run policy tuple): their
# names are shown, but they are not part of the API these pages promise.
_INTERNAL = (
    r"celery_singlebeat\.(timeline\.clock|observe\.telemetry|timeline\.slots|engine\.catalog"
    r"|testing\.memory\.connection|testing\.memory\.state|redact)"
)
nitpick_ignore_regex = [
    (r"py:.*", _LIBRARIES + r"\..*"),
    ("py:class", r"(Any|Callable|Iterable|Iterator|Mapping|Sequence|NamedTuple|Enum|ABC)"),
    ("py:class", r"(datetime|timedelta|CollectorRegistry|URL|MissedPolicy|MemoryState)"),
    (r"py:.*", _INTERNAL + r"(\..*)?"),
    ("py:class", r"celery_singlebeat\..*\._.*"),
]

autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_default_options = {"show-inheritance": True}

html_theme = "furo"
html_title = f"celery-singlebeat {release}"
html_static_path = ["_static"]


# sphinx-click hands the commands' help to reStructuredText, where a word ending
# in an underscore ("singlebeat_", the default table prefix) is a link to a
# target of that name. The help is written for a terminal: escape it here
# rather than clutter ``--help`` with markup.
_TRAILING_UNDERSCORE = re.compile(r"(?<=\w)_(?=[\s).,;:]|$)")


def _escape_help(app: object, ctx: object, lines: list[str]) -> None:
    lines[:] = [_TRAILING_UNDERSCORE.sub(r"\\_", line) for line in lines]


def setup(app: Any) -> None:
    for event in ("description", "usage", "options", "arguments", "envvars", "epilog"):
        app.connect(f"sphinx-click-process-{event}", _escape_help)
