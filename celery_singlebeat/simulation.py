"""The import path of the simulation before it moved into :mod:`celery_singlebeat.testing`.

``from celery_singlebeat.simulation import Simulation`` keeps working for tests
written against it; new code imports :mod:`celery_singlebeat.testing.simulation`.
"""

from __future__ import annotations

from .testing.simulation import *  # noqa: F403
from .testing.simulation import __all__ as __all__
