"""Singleton keys and TTLs: what a SingletonTask's options mean, checked early.

Options are checked when the task class is made (``@app.task(...)`` or a
subclass), keys when a call is made (``apply_async`` in the caller) and again
in the worker, since beat and other producers may send by name without the
task class.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from datetime import timedelta
from typing import Any, Union

from ..exceptions import ConfigurationError, SingletonKeyError
from ..widths import MAX_ENTRY_NAME

#: ``singleton_key`` values: the task name alone, or the name and the arguments.
KEY_BY_NAME = None
KEY_BY_ARGS = "args"

KeyFunction = Callable[[Sequence[Any], Mapping[str, Any]], str]
KeyOption = Union[None, str, KeyFunction]

#: ``singleton_busy`` values.
BUSY_POLICIES = ("skip", "retry", "raise")

#: The shortest TTL: a lease is renewed every third of it, and a renewal is a
#: database round trip that a loaded database may take a good part of a second for.
MIN_TTL = timedelta(seconds=1)

#: Longest key stored as is (the key column, ``locks.name``, is as wide as every
#: name column); longer keys keep their start for operators and end in a digest
#: of the whole.
MAX_KEY_LENGTH = MAX_ENTRY_NAME
_KEPT = MAX_KEY_LENGTH - 1 - 64


def parse_ttl(task_name: str, value: Any) -> timedelta:
    """``singleton_ttl`` as a timedelta, or a ConfigurationError naming the task."""
    where = f"{task_name}: singleton_ttl={value!r}"
    if value is None:
        raise ConfigurationError(
            f"{where}: a SingletonTask needs a TTL, e.g. @app.task(base=SingletonTask, "
            "singleton_ttl=60): how long its lease outlives a worker that died"
        )
    if isinstance(value, timedelta):
        ttl = value
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        try:
            ttl = timedelta(seconds=value)
        except (ValueError, OverflowError):
            raise ConfigurationError(f"{where}: not a usable number of seconds") from None
    else:
        raise ConfigurationError(f"{where}: expected a number of seconds or a timedelta")
    if ttl <= timedelta(0):
        raise ConfigurationError(f"{where}: must be positive")
    if ttl < MIN_TTL:
        raise ConfigurationError(
            f"{where}: must be at least {MIN_TTL.total_seconds():g} second (the lease is "
            "renewed every third of it, one database round trip each time)"
        )
    return ttl


def check_key_option(task_name: str, option: Any) -> None:
    """Reject a ``singleton_key`` that is neither None, ``"args"`` nor callable."""
    if option is KEY_BY_NAME or option == KEY_BY_ARGS or callable(option):
        return
    raise ConfigurationError(
        f"{task_name}: singleton_key={option!r}: expected None (the task name), "
        f"{KEY_BY_ARGS!r} (the name and the arguments) or a function "
        "(args, kwargs) -> str"
    )


def check_busy_option(task_name: str, option: Any) -> None:
    if option not in BUSY_POLICIES:
        raise ConfigurationError(
            f"{task_name}: singleton_busy={option!r}: expected one of {', '.join(BUSY_POLICIES)}"
        )


def compute_key(
    task_name: str, option: KeyOption, args: Sequence[Any] | None, kwargs: Mapping[str, Any] | None
) -> str:
    """The singleton key of one call; SingletonKeyError when it cannot be made."""
    args = tuple(args or ())
    kwargs = dict(kwargs or {})
    if option is KEY_BY_NAME:
        key = task_name
    elif option == KEY_BY_ARGS:
        # sort_keys: the same call spelled with kwargs in another order is the
        # same key; repr for what JSON cannot encode (documented: give such
        # arguments a stable repr, or a key function)
        encoded = json.dumps(
            [list(args), kwargs], sort_keys=True, default=repr, separators=(",", ":")
        )
        key = f"{task_name}:{encoded}"
    else:
        assert callable(option)
        try:
            key = option(args, kwargs)
        except Exception as exc:
            raise SingletonKeyError(
                f"{task_name}: singleton_key function {_name_of(option)} raised "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        if not isinstance(key, str) or not key:
            raise SingletonKeyError(
                f"{task_name}: singleton_key function {_name_of(option)} returned {key!r}; "
                "it must return a non-empty string"
            )
    if len(key) > MAX_KEY_LENGTH:
        digest = hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()
        key = f"{key[:_KEPT]}#{digest}"
    return key


def _name_of(function: Any) -> str:
    return str(getattr(function, "__qualname__", None) or repr(function))
