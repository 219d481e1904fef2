"""The chaos run's editor lane and its verdict: stored entries edited while the
faults run, and what the replicas sent of them.

Both live in the package, so that the chaos run of real processes and the
deterministic explorer make the same edits and are judged by one
implementation: the editor in ``celery_singlebeat.testing.explore.editor``,
the verdict (every check and every allowance, each named in
docs/guarantees.md) in ``celery_singlebeat.testing.explore.judge``. This
module keeps the names ``chaos.py`` imports.
"""

from __future__ import annotations

from celery_singlebeat.testing.explore.editor import REGULAR, Editor
from celery_singlebeat.testing.explore.judge import (
    EDITOR,
    EFFECT_US,
    TASK,
    WHY,
    Attempt,
    EditsReport,
    Segment,
    Version,
    instants,
    is_limited,
    is_stored,
    judge,
    stored_executions,
    timelines,
)

__all__ = [
    "EDITOR",
    "EFFECT_US",
    "REGULAR",
    "TASK",
    "WHY",
    "Attempt",
    "Editor",
    "EditsReport",
    "Segment",
    "Version",
    "instants",
    "is_limited",
    "is_stored",
    "judge",
    "stored_executions",
    "timelines",
]
