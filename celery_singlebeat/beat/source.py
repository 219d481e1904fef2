"""Celery's ``beat_schedule`` as an entry source (:mod:`.sources`).

The entries of ``beat_schedule`` and the ones Celery adds itself
(``celery.backend_cleanup``), as Celery's ``Scheduler.setup_schedule`` merged
them into ``scheduler.schedule``. They never change while beat runs: a new
schedule comes with a new process, and during a rolling deploy each replica
sends the entries of its own version (docs/guarantees.md's union rule).

Each entry's ``options`` may carry ``singlebeat_missed_policy``,
``_missed_grace`` and ``_missed_max`` (the entry's own missed-run policy);
they configure us and are never sent on. A misspelt ``singlebeat_`` key is an
error rather than a silent fall-back to the default policy.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any

from ..config import ENTRY_OPTIONS, MissedPolicyError, parse_missed_policy
from ..exceptions import ConfigurationError
from ..sources import EntryDefinition, EntrySource, check_definition
from ..timeline.slots import MissedPolicy

#: ``options`` keys of a beat_schedule entry that configure us (never sent on).
ENTRY_OPTION_PREFIX = "singlebeat_"

LABEL = "beat_schedule"

#: the options of an entry that has none: one shared mapping, not an empty
#: dict per entry (a replica keeps every entry's definition)
_NO_OPTIONS: Mapping[str, Any] = MappingProxyType({})


def entry_policy(name: str, options: Mapping[str, Any], default: MissedPolicy) -> MissedPolicy:
    """The missed-run policy of ``beat_schedule[name]`` (``default`` unless its
    options say otherwise); a ConfigurationError naming the entry if they are
    wrong."""
    unknown = sorted(
        k for k in options if k.startswith(ENTRY_OPTION_PREFIX) and k not in ENTRY_OPTIONS
    )
    if unknown:
        raise ConfigurationError(
            f"{LABEL}[{name!r}].options: unknown option(s) {', '.join(unknown)}; "
            f"expected {', '.join(sorted(ENTRY_OPTIONS))}"
        )
    try:
        return parse_missed_policy(ENTRY_OPTION_PREFIX, options, default)
    except MissedPolicyError as exc:
        raise ConfigurationError(f"{LABEL}[{name!r}].options: {exc}") from None


def sent_options(options: Mapping[str, Any]) -> Mapping[str, Any]:
    """``options`` without our keys; the same object when it has none (a
    replica tracks every entry, 100,000 copies of an empty dict add up)."""
    if not any(k.startswith(ENTRY_OPTION_PREFIX) for k in options):
        return options
    return {k: v for k, v in options.items() if not k.startswith(ENTRY_OPTION_PREFIX)}


class BeatScheduleSource(EntrySource):
    """The entries of Celery's ``scheduler.schedule`` (``beat_schedule`` and
    Celery's defaults), validated, each with its own missed-run policy."""

    label = LABEL

    def __init__(
        self,
        schedule: Mapping[str, Any],
        default_policy: MissedPolicy,
        default_tz: Any,
        now_us: int,
    ) -> None:
        self._definitions = [
            self.definition(name, entry, default_policy, default_tz, now_us)
            for name, entry in schedule.items()
        ]

    @staticmethod
    def definition(
        name: str, entry: Any, default_policy: MissedPolicy, default_tz: Any, now_us: int
    ) -> EntryDefinition:
        """One Celery ``ScheduleEntry`` as a checked definition."""
        options = entry.options or _NO_OPTIONS
        policy = entry_policy(name, options, default_policy)
        tz = getattr(entry.schedule, "tz", None) or default_tz
        definition = EntryDefinition(
            name=name,
            task=entry.task,
            schedule=entry.schedule,
            args=entry.args,
            kwargs=entry.kwargs,
            options=sent_options(options),
            # the shared default, not a copy per entry (memory at 100,000 entries)
            policy=default_policy if policy == default_policy else policy,
            tz=tz,
            # never changes while the process runs: no revision to tell versions apart
            revision="",
            source=LABEL,
        )
        check_definition(definition, tz, now_us)
        return definition

    def load(self) -> tuple[Sequence[EntryDefinition], object]:
        return self._definitions, None


__all__ = ["ENTRY_OPTION_PREFIX", "BeatScheduleSource", "entry_policy", "sent_options"]
