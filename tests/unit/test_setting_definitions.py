"""The settings' definitions (celery_singlebeat.config.SETTINGS) are the one list the
parser reads and the docs render: every key the package reads is defined there,
every definition is read, and each definition's default is the one the parser
applies."""

from __future__ import annotations

import ast
from collections.abc import Iterator, Mapping
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from celery import Celery

import celery_singlebeat
from celery_singlebeat.config import (
    ENTRY_OPTIONS,
    SETTINGS,
    SETTINGS_BY_NAME,
    Settings,
    read_setting,
    setting_default,
)
from celery_singlebeat.testing import MemoryScheduler, MemoryStore

PACKAGE = Path(celery_singlebeat.__file__).resolve().parent


class Recording(Mapping[str, Any]):
    """A configuration that remembers which keys were looked up."""

    def __init__(self, data: dict[str, Any]) -> None:
        self.data = data
        self.asked: set[str] = set()

    def __getitem__(self, key: str) -> Any:
        self.asked.add(key)
        return self.data[key]

    def get(self, key: str, default: Any = None) -> Any:
        self.asked.add(key)
        return self.data.get(key, default)

    def __contains__(self, key: object) -> bool:
        if isinstance(key, str):
            self.asked.add(key)
        return key in self.data

    def __iter__(self) -> Iterator[str]:
        return iter(self.data)

    def __len__(self) -> int:
        return len(self.data)


def test_names_are_unique_and_documented() -> None:
    assert len(SETTINGS_BY_NAME) == len(SETTINGS)
    for setting in SETTINGS:
        assert setting.name.startswith(("singlebeat_", "beat_")), setting.name
        assert setting.type and setting.meaning.strip(), setting.name
        assert setting.scope in ("beat", "celery", "testing"), setting.name


def test_from_conf_reads_exactly_the_defined_settings() -> None:
    # Set the optional ones too, so that no branch that reads a key is skipped.
    conf = Recording(
        {
            "singlebeat_liveness_timeout": 90,
            "singlebeat_readiness_timeout": 30,
            "singlebeat_status_file": "/tmp/singlebeat-status",
            "singlebeat_http_port": 9808,
            "singlebeat_metrics": False,
        }
    )
    Settings.from_conf(conf)
    defined = {s.name for s in SETTINGS if s.scope in ("beat", "celery")}
    assert conf.asked - set(SETTINGS_BY_NAME) == set(), "read but not defined"
    assert defined - conf.asked == set(), "defined but never read"


def test_the_memory_store_setting_is_read_through_its_definition() -> None:
    store = MemoryStore()
    app = Celery("defs", set_as_current=False)
    app.conf.singlebeat_memory_store = store
    scheduler = MemoryScheduler(app, lazy=True)
    assert scheduler.memory_store is store


def test_an_undefined_name_cannot_be_read() -> None:
    with pytest.raises(KeyError):
        read_setting({}, "singlebeat_not_a_setting")


def _literal_keys_read_outside_definitions() -> list[str]:
    """``something.get("singlebeat_...")`` or ``conf["singlebeat_..."]`` anywhere in
    the package: a read that bypasses read_setting (and so the definitions)."""
    found = []
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            key: ast.expr | None = None
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("get", "setdefault", "pop")
                and node.args
            ):
                key = node.args[0]
            elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load):
                # a Store context is the CLI overriding a setting before from_conf reads it
                key = node.slice
            if (
                isinstance(key, ast.Constant)
                and isinstance(key.value, str)
                and key.value.startswith(("singlebeat_", "beat_"))
            ):
                found.append(f"{path.relative_to(PACKAGE)}:{node.lineno}: {key.value}")
    return found


def test_no_setting_is_read_around_the_definitions() -> None:
    assert _literal_keys_read_outside_definitions() == []


def test_the_defaults_are_the_ones_applied() -> None:
    settings = Settings.from_conf({})
    assert str(settings.url) == setting_default("singlebeat_url")
    assert settings.lease == timedelta(seconds=setting_default("singlebeat_lease"))
    assert settings.retention == timedelta(seconds=setting_default("singlebeat_retention"))
    assert settings.run_retention == timedelta(seconds=setting_default("singlebeat_run_retention"))
    assert settings.missed.mode == setting_default("singlebeat_missed_policy")
    assert settings.missed.grace_us == setting_default("singlebeat_missed_grace") * 1_000_000
    assert settings.missed.max_missed == setting_default("singlebeat_missed_max")
    assert settings.table_prefix == setting_default("singlebeat_table_prefix")
    assert settings.takeover_batch == setting_default("singlebeat_takeover_batch")
    assert settings.create_schema is setting_default("singlebeat_create_schema")
    assert settings.listen is setting_default("singlebeat_listen")
    assert settings.http_bind == setting_default("singlebeat_http_bind")
    assert settings.metrics_entry_label is setting_default("singlebeat_metrics_entry_label")
    for unset in ("singlebeat_http_port", "singlebeat_status_file", "singlebeat_metrics"):
        assert getattr(settings, unset.removeprefix("singlebeat_")) is None
        assert setting_default(unset) is None


def test_entry_options_are_the_missed_policy_settings() -> None:
    assert set(ENTRY_OPTIONS) == {
        "singlebeat_missed_policy",
        "singlebeat_missed_grace",
        "singlebeat_missed_max",
    }
