"""A deterministic fault explorer over the real engine.

Every interleaving, not a draw: N real replicas (the Celery adapter, the
engine, its steps and sources) over one in-memory database, on simulated
time, driven by a seeded scheduler that decides at every step boundary which
replica runs next and which fault strikes; a worker model with
SingletonTask's per-slot dedupe; the editor lane of the chaos run; and the
chaos run's own judge over the history. ``make explore`` runs it
(docs/testing.md, "The explorer").
"""

from .explorer import Fault, Outcome, draw_plan, run_seed, shrink

__all__ = ["Fault", "Outcome", "draw_plan", "run_seed", "shrink"]
