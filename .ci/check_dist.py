"""Check what ``python -m build`` made in dist/, beyond what ``twine check`` reads.

twine checks that the metadata renders; this checks that it says what the source
says and that each archive holds what it should:

* one wheel and one sdist, of the version in ``celery_singlebeat/_version.py``
  (the only place it is written; pyproject.toml reads it);
* the wheel: only the package (with ``py.typed``) and its dist-info, the license,
  and the two entry points Celery looks up (``celery.commands`` for
  ``celery singlebeat``, ``celery.beat_schedulers`` for ``celery beat -S singlebeat``);
* the sdist: what a downstream packager rebuilds and tests from (README,
  CHANGELOG, LICENSE, docs, tests, the Makefile), and no local leftovers.

Prints the archives' sizes. Exits 1 naming each problem found.
"""

from __future__ import annotations

import ast
import configparser
import subprocess
import sys
import tarfile
import zipfile
from email.parser import Parser
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DIST = ROOT / "dist"

ENTRY_POINTS = {
    "celery.commands": {"singlebeat": "celery_singlebeat.cli:singlebeat"},
    "celery.beat_schedulers": {"singlebeat": "celery_singlebeat.scheduler:SingleBeatScheduler"},
}
SDIST_REQUIRED = [
    "PKG-INFO",
    "pyproject.toml",
    "setup.cfg",
    "MANIFEST.in",
    "README.md",
    "CHANGELOG.md",
    "CONTRIBUTING.md",
    "LICENSE",
    "Makefile",
    "docs/index.md",
    "tests/conftest.py",
    "celery_singlebeat/py.typed",
    "celery_singlebeat/_version.py",
]
# local state that must never ship: a test database, compiled files, a venv
SDIST_FORBIDDEN = (".sqlite", ".pyc", "__pycache__/", ".venv", "-quick.json", ".egg-info/")


def source_version() -> str:
    """``__version__`` as written in _version.py, read without importing the package."""
    tree = ast.parse((ROOT / "celery_singlebeat" / "_version.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__version__" for t in node.targets
        ):
            value = node.value
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                return value.value
    raise SystemExit("check-dist: no __version__ string in celery_singlebeat/_version.py")


def package_files() -> list[str]:
    """The package's files as git tracks them (none outside a checkout): any data
    file added beside the modules must reach the wheel too."""
    listed = subprocess.run(
        ["git", "ls-files", "celery_singlebeat"], cwd=ROOT, capture_output=True, text=True
    )
    return listed.stdout.split() if listed.returncode == 0 else []


def check_wheel(wheel: Path, version: str, problems: list[str]) -> None:
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        infos = {n.split("/")[0] + "/" for n in names if n.split("/")[0].endswith(".dist-info")}
        if len(infos) != 1:
            problems.append(f"wheel has {len(infos)} dist-info folders: {sorted(infos)}")
            return
        info = infos.pop()
        metadata = Parser().parsestr(archive.read(info + "METADATA").decode())
        entry_points = configparser.ConfigParser()
        entry_points.read_string(archive.read(info + "entry_points.txt").decode())
    if metadata["Version"] != version:
        problems.append(f"wheel METADATA Version {metadata['Version']!r}, source {version!r}")
    for name in names:
        if not (name.startswith("celery_singlebeat/") or name.startswith(info)):
            problems.append(f"wheel holds {name}, outside the package")
    for required in ("celery_singlebeat/py.typed", "celery_singlebeat/__init__.py"):
        if required not in names:
            problems.append(f"wheel lacks {required}")
    for tracked in package_files():
        if tracked not in names:
            problems.append(f"wheel lacks {tracked}, a file of the package in git")
    if not any(n.startswith(info) and n.endswith("LICENSE") for n in names):
        problems.append("wheel lacks the LICENSE file")
    for group, wanted in ENTRY_POINTS.items():
        have = dict(entry_points[group]) if entry_points.has_section(group) else {}
        for name, target in wanted.items():
            if have.get(name) != target:
                problems.append(f"wheel entry point {group} {name}: {have.get(name)!r}")


def check_sdist(sdist: Path, version: str, problems: list[str]) -> None:
    with tarfile.open(sdist) as archive:
        names = [m.name + ("/" if m.isdir() else "") for m in archive.getmembers()]
        top = names[0].split("/")[0] + "/"
        pkg_info = archive.extractfile(top + "PKG-INFO")
        assert pkg_info is not None
        metadata = Parser().parsestr(pkg_info.read().decode())
    if metadata["Version"] != version:
        problems.append(f"sdist PKG-INFO Version {metadata['Version']!r}, source {version!r}")
    relative = {n[len(top) :] for n in names if n.startswith(top)}
    for required in SDIST_REQUIRED:
        if required not in relative:
            problems.append(f"sdist lacks {required}")
    for name in sorted(relative):
        if any(bad in name for bad in SDIST_FORBIDDEN) and not name.startswith(
            "celery_singlebeat.egg-info/"
        ):
            problems.append(f"sdist holds {name}, a local leftover")


def main() -> int:
    version = source_version()
    wheels = sorted(DIST.glob("celery_singlebeat-*.whl"))
    sdists = sorted(DIST.glob("celery_singlebeat-*.tar.gz"))
    problems: list[str] = []
    if len(wheels) != 1 or len(sdists) != 1:
        problems.append(
            f"dist/ should hold one wheel and one sdist, has {[p.name for p in wheels + sdists]}"
            " (make dist empties it first)"
        )
    for wheel in wheels:
        if wheel.name != f"celery_singlebeat-{version}-py3-none-any.whl":
            problems.append(f"{wheel.name}: not version {version}, pure Python")
        check_wheel(wheel, version, problems)
        print(f"check-dist: {wheel.name}: {wheel.stat().st_size / 1024:.0f} KiB")
    for sdist in sdists:
        check_sdist(sdist, version, problems)
        print(f"check-dist: {sdist.name}: {sdist.stat().st_size / 1024:.0f} KiB")
    for problem in problems:
        print(f"check-dist: {problem}", file=sys.stderr)
    if not problems:
        print(f"check-dist: version {version} in both, contents as expected")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
