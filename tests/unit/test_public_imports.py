"""What users write keeps working whatever the tree inside the package looks like.

The package was laid out in folders (issue 31); these are the imports and the
entry points users' settings, command lines and test suites name. Each is
loaded the way its user loads it: an attribute of the package, a dotted path
Celery resolves, an entry point found by its group and name.
"""

from __future__ import annotations

import importlib
from importlib.metadata import entry_points

import pytest


def _entry_point(group: str, name: str) -> object:
    every = entry_points()
    # Python 3.9's entry_points() is a dict of groups; select() came in 3.10
    in_group = every.select(group=group) if hasattr(every, "select") else every.get(group, [])
    found = [ep for ep in in_group if ep.name == name]
    # Python 3.9's lists a distribution once per path entry that holds its
    # metadata (an editable install and the checkout's own): one target is
    # what counts
    targets = {ep.value for ep in found}
    assert len(targets) == 1, f"no single {group!r} entry point named {name!r}: {found}"
    return found[0].load()


def test_the_package_names_users_import() -> None:
    import celery_singlebeat
    from celery_singlebeat.scheduler import SingleBeatScheduler
    from celery_singlebeat.schedules.api import Schedules
    from celery_singlebeat.singleton import SingletonTask

    assert celery_singlebeat.SingleBeatScheduler is SingleBeatScheduler
    assert celery_singlebeat.SingletonTask is SingletonTask
    assert celery_singlebeat.Schedules is Schedules
    assert hasattr(SingletonTask, "singleton_ttl")
    for name in celery_singlebeat.__all__:
        assert getattr(celery_singlebeat, name) is not None, name


def test_beat_scheduler_by_its_dotted_path_and_by_its_short_name() -> None:
    from celery.utils.imports import symbol_by_name

    from celery_singlebeat import SingleBeatScheduler

    # beat_scheduler = "celery_singlebeat.SingleBeatScheduler" and the module path
    assert symbol_by_name("celery_singlebeat.SingleBeatScheduler") is SingleBeatScheduler
    assert symbol_by_name("celery_singlebeat.scheduler:SingleBeatScheduler") is SingleBeatScheduler
    # celery beat -S singlebeat
    assert _entry_point("celery.beat_schedulers", "singlebeat") is SingleBeatScheduler


def test_the_cli_and_the_pytest_plugin_entry_points() -> None:
    import celery_singlebeat.pytest_plugin as plugin
    from celery_singlebeat.cli import singlebeat

    assert _entry_point("celery.commands", "singlebeat") is singlebeat
    assert _entry_point("pytest11", "singlebeat") is plugin


@pytest.mark.parametrize(
    ("module", "names"),
    [
        (
            "celery_singlebeat.testing",
            ["MemoryStore", "MemoryScheduler", "MemorySource", "FakeClock", "SlotRow", "send_slot"],
        ),
        (
            "celery_singlebeat.simulation",
            ["Simulation", "Fleet", "ReplicaKilled", "assert_runs"],
        ),
        ("celery_singlebeat.signals", ["slot_published", "slots_skipped"]),
        ("celery_singlebeat.exceptions", ["ConfigurationError", "StoreUnavailable"]),
        ("celery_singlebeat.config", ["Settings"]),
        ("celery_singlebeat.sources", ["EntrySource", "EntryDefinition", "Change"]),
    ],
)
def test_the_modules_users_import_from(module: str, names: list[str]) -> None:
    loaded = importlib.import_module(module)
    missing = [name for name in names if not hasattr(loaded, name)]
    assert not missing, f"{module} lacks {missing}"


def test_the_simulation_alias_is_the_simulation() -> None:
    from celery_singlebeat import simulation
    from celery_singlebeat.testing import simulation as moved

    assert simulation.Simulation is moved.Simulation
    assert set(simulation.__all__) == set(moved.__all__)
