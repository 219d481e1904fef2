"""The storage contract split by audience cannot drift (no services needed).

``store/base.py``'s :class:`Store` is exactly its audiences' contracts
(:class:`SlotStore`, :class:`FleetStore`, :class:`SingletonStore`,
:class:`ScheduleStore`, over the :class:`StoreConnection` they share): it adds
nothing, each method belongs to one audience, CONTRIBUTING.md's table says
which, and both stores the package ships implement every contract.
"""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest
from sqlalchemy.engine import make_url

from celery_singlebeat.store.base import (
    ControlListener,
    FleetStore,
    ScheduleStore,
    ScheduleWrite,
    SingletonStore,
    SlotStore,
    Store,
    StoreConnection,
)
from celery_singlebeat.store.sql import SqlStore
from celery_singlebeat.testing import MemoryStore

AUDIENCES: tuple[type[StoreConnection], ...] = (
    SlotStore,
    FleetStore,
    SingletonStore,
    ScheduleStore,
)
CONTRACTS: tuple[type[StoreConnection], ...] = (StoreConnection, *AUDIENCES)

CONTRIBUTING = Path(__file__).resolve().parents[2] / "CONTRIBUTING.md"


def own_names(cls: type) -> set[str]:
    """The public methods and attributes a class itself defines or declares."""
    names = {n for n in vars(cls) if not n.startswith("_")}
    # vars(), not getattr: before Python 3.10 a class without annotations of its
    # own answers ``__annotations__`` with its first base's
    names |= {n for n in vars(cls).get("__annotations__", {}) if not n.startswith("_")}
    return names


def public_names(cls: type) -> set[str]:
    """Every public name of a class and its bases up to (not including) ABC."""
    names: set[str] = set()
    for base in cls.__mro__:
        if base in (object,) or base.__module__ == "abc":
            continue
        names |= own_names(base)
    return names


def test_store_is_its_contracts_and_adds_nothing() -> None:
    assert Store.__bases__ == AUDIENCES
    for audience in AUDIENCES:
        assert audience.__bases__ == (StoreConnection,), audience
    assert own_names(Store) == set(), "Store declares a name no audience's contract has"


def test_each_method_belongs_to_one_contract() -> None:
    owners: dict[str, list[str]] = {}
    for contract in CONTRACTS:
        for name in own_names(contract):
            owners.setdefault(name, []).append(contract.__name__)
    shared = {name: where for name, where in owners.items() if len(where) > 1}
    assert not shared, f"declared by more than one contract: {shared}"
    assert set(owners) == public_names(Store)


def test_the_abstract_methods_of_store_are_exactly_those_of_its_contracts() -> None:
    needed = set().union(*(c.__abstractmethods__ for c in AUDIENCES))
    assert Store.__abstractmethods__ == needed
    # and each audience's abstract methods are its own or the shared connection's
    for audience in AUDIENCES:
        assert audience.__abstractmethods__ <= own_names(audience) | own_names(StoreConnection)
        assert StoreConnection.__abstractmethods__ <= audience.__abstractmethods__


def test_every_method_of_every_contract_says_what_it_may_touch() -> None:
    for contract in (*CONTRACTS, ControlListener):
        for name, member in vars(contract).items():
            if name.startswith("_") or not callable(member):
                continue
            assert inspect.getdoc(member), f"{contract.__name__}.{name} has no docstring"


@pytest.mark.parametrize("cls", [SqlStore, MemoryStore])
def test_the_shipped_stores_implement_every_contract(cls: type[Store]) -> None:
    assert not inspect.isabstract(cls), cls.__abstractmethods__
    for contract in CONTRACTS:
        assert issubclass(cls, contract)


def shipped_stores() -> list[Store]:
    # SqlStore does not connect until its first statement
    return [
        MemoryStore(),
        SqlStore(make_url("sqlite://")),
        SqlStore(make_url("mysql+pymysql://root@127.0.0.1:1/none")),
    ]


def test_instances_are_every_contract_and_keep_its_defaults() -> None:
    for store in shipped_stores():
        try:
            for contract in CONTRACTS:
                assert isinstance(store, contract)
            assert store.stop_at_reconnect is False
            store.stop_at_reconnect = True
            assert store.stop_at_reconnect is True
            # no notification channel on these: listen() answers None, no round trip
            assert store.listen() is None
        finally:
            store.close()


def test_the_contract_defaults_of_a_store_that_overrides_nothing_optional() -> None:
    class Minimal(Store):
        """Only the abstract methods (a store written for an earlier release)."""

    for name in Store.__abstractmethods__:
        setattr(Minimal, name, lambda self, *a, **k: None)
    Minimal.__abstractmethods__ = frozenset()
    store = Minimal()
    assert store.listen() is None
    assert store.stop_at_reconnect is False
    assert store.interruptions == 0
    assert store.heartbeat.__func__ is FleetStore.heartbeat  # type: ignore[attr-defined]
    # stored schedules: reads answer nothing, writes say the store keeps none
    assert store.schedule_rows() == ([], 0)
    assert store.schedule_row("a") is None
    assert store.schedule_feed(7) == ([], 7, True)
    assert store.feed_versions() == 0
    assert store.schedule_log() == []
    assert store.prune_schedules(1, 1) == 0
    assert store.sent_count("a", 0) == 0
    with pytest.raises(NotImplementedError, match="keeps no stored schedules"):
        store.write_schedules([ScheduleWrite("delete", "a")], "me")


def contributing_table() -> dict[str, set[str]]:
    """CONTRIBUTING.md's "Which contract each store method belongs to":
    contract class name -> the methods and attributes its row lists (lower case)."""
    page = CONTRIBUTING.read_text(encoding="utf-8")
    start = page.index("### Which contract each store method belongs to")
    section = page[start : page.index("\n## ", start)]
    rows: dict[str, set[str]] = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        contract = re.match(r"`(\w+)`", cells[0]) if len(cells) >= 3 else None
        if contract is not None:
            rows[contract.group(1)] = set(re.findall(r"`([a-z_]+)`", cells[1]))
    return rows


@pytest.mark.skipif(not CONTRIBUTING.exists(), reason="CONTRIBUTING.md is not installed")
def test_contributing_names_each_contract_s_methods() -> None:
    table = contributing_table()
    assert set(table) == {c.__name__ for c in CONTRACTS}
    for contract in CONTRACTS:
        assert table[contract.__name__] == own_names(contract), contract.__name__
