"""CONTRIBUTING.md stays true to the tree: its map names every module, and
every file and make target it names exists.

A map of the house that misses the newest module, or sends a reader to a test
file that was renamed, is worse than none: this fails first.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CONTRIBUTING = ROOT / "CONTRIBUTING.md"
PACKAGE = ROOT / "celery_singlebeat"

pytestmark = pytest.mark.skipif(
    not CONTRIBUTING.exists(), reason="CONTRIBUTING.md is not installed with the package"
)


def text() -> str:
    return CONTRIBUTING.read_text(encoding="utf-8")


def quoted(source: str) -> set[str]:
    """Everything between backticks, each word of it too (a command's arguments)."""
    spans = set(re.findall(r"`([^`\n]+)`", source))
    return spans | {word for span in spans for word in span.split()}


def test_the_map_names_every_module() -> None:
    names = quoted(text())
    missing = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE)
        if path.name == "__init__.py":
            # a package is named by its folder (``store/``, ``contrib/django/``)
            folder = f"{relative.parent.as_posix()}/"
            if folder != "./" and not any(name.startswith(folder) for name in names):
                missing.append(folder)
            continue
        if path.name not in names and relative.as_posix() not in names:
            missing.append(relative.as_posix())
    assert not missing, f"CONTRIBUTING.md's map lacks {missing}"


def test_every_file_it_names_exists() -> None:
    named = {
        word.rstrip(",.;:)")
        for word in quoted(text())
        if re.match(r"(tests|benchmarks|docs|celery_singlebeat|\.ci)/", word)
    }
    assert named, "no path found: the pattern no longer matches the text"
    missing = [path for path in sorted(named) if not list(ROOT.glob(path))]
    assert not missing, f"CONTRIBUTING.md names files that do not exist: {missing}"


def test_every_test_file_it_names_by_name_exists() -> None:
    # the tables name a suite's further files by name after the first by path
    named = {word.rstrip(",.;:)") for word in quoted(text()) if re.match(r"test_[\w*]+\.py", word)}
    assert named, "no test file found: the pattern no longer matches the text"
    missing = [name for name in sorted(named) if not list((ROOT / "tests").rglob(name))]
    assert not missing, f"CONTRIBUTING.md names test files that do not exist: {missing}"


def test_the_algorithm_pages_map_names_modules_that_exist() -> None:
    # docs/algorithm.md's last section maps its sections to modules
    page = (ROOT / "docs" / "algorithm.md").read_text(encoding="utf-8")
    heading = re.search(r"^## \d+\. Where each part lives$", page, flags=re.M)
    assert heading, "docs/algorithm.md has no map section"
    section = page[heading.start() :]
    named = {w for w in quoted(section) if w.endswith(".py")}
    assert named, "no module found: the pattern no longer matches the page"
    missing = [name for name in sorted(named) if not (PACKAGE / name).exists()]
    assert not missing, f"docs/algorithm.md's map names modules that do not exist: {missing}"
    # and every step of the engine has its place on the map
    steps = {
        f"engine/{path.name}"
        for path in (PACKAGE / "engine").glob("*.py")
        if path.stem != "__init__"
    }
    unmapped = sorted(steps - named)
    assert not unmapped, f"docs/algorithm.md's map lacks the engine's {unmapped}"


def test_every_make_target_it_names_exists() -> None:
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    targets = set(re.findall(r"^([a-z][a-z0-9-]*):", makefile, flags=re.M))
    named = set()
    for span in re.findall(r"`(make [^`\n]+)`", text()) + re.findall(
        r"^make ([^#\n]+)", text(), flags=re.M
    ):
        for word in span.removeprefix("make ").split():
            if "=" in word:  # a variable (PY=...), not a target
                continue
            named.add(word)
    assert named, "no make command found: the pattern no longer matches the text"
    assert named <= targets, (
        f"CONTRIBUTING.md names make targets that do not exist: {named - targets}"
    )
