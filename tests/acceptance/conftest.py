"""The acceptance tests' own fixtures: the ``rig`` of real processes, and
RabbitMQ (only these tests start brokers' consumers against it).

The shared ones (the databases, Redis, PgBouncer, ``table_prefix``) stay in
tests/conftest.py, which the integration and unit tests use too.

This module also hands on tests/conftest.py's helpers (its ``__all__``).
Every conftest.py outside a package is the module ``conftest``, and pytest
replaces that module with each one it loads: from the moment this one is
loaded, ``from conftest import IN_CI`` reaches this module, in the acceptance
tests and harness.py, and in the integration and unit tests collected after
them. Outside pytest too: the benchmarks put tests/acceptance on ``sys.path``
ahead of tests/, and harness.py imports ``conftest``.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from harness import Rig


def _tests_conftest() -> None:
    """Make tests/conftest.py importable as ``tests_conftest``: under pytest
    it is already (pytest loads a directory's parents' conftest first, and that
    one registers itself so), the very module pytest uses; outside pytest it is
    imported from its file here."""
    if "tests_conftest" in sys.modules:
        return
    spec = importlib.util.spec_from_file_location(
        "tests_conftest", Path(__file__).resolve().parents[1] / "conftest.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["tests_conftest"] = module
    spec.loader.exec_module(module)


_tests_conftest()

from tests_conftest import *  # noqa: E402, F403  (its __all__: the helpers, no fixture)
from tests_conftest import AMQP_URL, require  # noqa: E402


@pytest.fixture
def amqp_url() -> str:
    require("rabbitmq")
    return AMQP_URL


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    """The acceptance tests' ``harness.Rig`` in the test's directory: every
    process of it stopped, every queue and table of it dropped at the end."""
    from harness import Rig  # here, not above: harness.py imports this module

    rig = Rig(tmp_path)
    try:
        yield rig
    finally:
        rig.close()
