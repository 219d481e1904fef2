"""The package stays readable from its tree (issue 31, CONTRIBUTING.md's map).

A root that lists the public face only, and no class a reader must hold in
mind at once beyond a few hundred lines: both grew back quietly before, one
module and one method at a time, so they are held here rather than by review.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "celery_singlebeat"

#: the public face: __init__, the adapter, configuration, exceptions, signals,
#: the entry-source interface, the entry points and the like
MAX_ROOT_MODULES = 12
MAX_CLASS_LINES = 450


def test_the_root_holds_at_most_twelve_modules() -> None:
    root = sorted(path.name for path in PACKAGE.glob("*.py"))
    assert len(root) <= MAX_ROOT_MODULES, f"{len(root)} modules at the root: {root}"


def test_no_class_is_longer_than_450_lines() -> None:
    long = []
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                assert node.end_lineno is not None
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_CLASS_LINES:
                    long.append(f"{path.relative_to(PACKAGE)}:{node.name} ({lines})")
    assert not long, f"classes over {MAX_CLASS_LINES} lines: {long}"


def test_every_folder_says_what_it_holds() -> None:
    bare = [
        str(init.parent.relative_to(PACKAGE))
        for init in sorted(PACKAGE.rglob("__init__.py"))
        if ast.get_docstring(ast.parse(init.read_text(encoding="utf-8"))) is None
    ]
    assert not bare, f"folders whose __init__.py has no docstring: {bare}"
