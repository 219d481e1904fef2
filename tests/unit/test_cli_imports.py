"""``python -m celery_singlebeat health`` must start without Celery: nothing in
``celery_singlebeat/cli`` may import it (or kombu) at import time, since every
command module is imported to register its command."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def test_the_cli_modules_import_without_celery(tmp_path: Path) -> None:
    """``python -m celery_singlebeat health`` must start without Celery: nothing
    in cli/ may import it at import time. The package's own __init__ still
    does (it is made lazy elsewhere), so this loads cli/ without it."""
    script = tmp_path / "no_celery.py"
    script.write_text(
        "import importlib.abc, importlib.util, sys, types\n"
        "spec = importlib.util.find_spec('celery_singlebeat')\n"
        "class Block(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path, target=None):\n"
        "        if name.split('.')[0] in ('celery', 'kombu'):\n"
        "            raise ImportError('blocked: ' + name)\n"
        "sys.meta_path.insert(0, Block())\n"
        "package = types.ModuleType('celery_singlebeat')\n"
        "package.__path__ = list(spec.submodule_search_locations)\n"
        "sys.modules['celery_singlebeat'] = package\n"
        "from click.testing import CliRunner\n"
        "from celery_singlebeat.cli import singlebeat\n"
        "for command in [[]] + [[name] for name in singlebeat.commands]:\n"
        "    result = CliRunner().invoke(singlebeat, command + ['--help'])\n"
        "    assert result.exit_code == 0, (command, result.output, result.exception)\n"
        "print(len(singlebeat.commands))\n"
    )
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert int(done.stdout) >= 10
