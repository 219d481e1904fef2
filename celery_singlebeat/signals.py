"""Signals for metrics, tracing and tests.

The scheduler's fire in the beat process; each receives ``sender`` (the
scheduler) and keyword arguments:

* :data:`slot_claimed` — ``entry``, ``slot`` (aware UTC datetime), ``task_id``,
  ``fence``, ``taken_over``: this replica won the slot and is about to publish.
  ``taken_over`` is True when another replica held the slot before, False for
  a new claim and for this replica's own claim won back (a retry after a lost
  answer, or a slot it had released).
* :data:`slot_published` — same arguments: the message left for the broker and
  the confirm has not been written yet.
* :data:`slots_skipped` — ``entry``, ``count``, ``first``, ``last``: the missed-run
  policy dropped slots (after an outage, or when every replica was down).

SingletonTask's fire in the worker (see the names below and
``docs/singleton.md``).

A receiver that raises is logged and ignored (Celery's ``Signal.send``), so it
can never stop the scheduler from sending.
"""

from __future__ import annotations

from celery.utils.dispatch import Signal

slot_claimed = Signal(
    name="singlebeat_slot_claimed",
    providing_args={"entry", "slot", "task_id", "fence", "taken_over"},
)
slot_published = Signal(
    name="singlebeat_slot_published",
    providing_args={"entry", "slot", "task_id", "fence", "taken_over"},
)
slots_skipped = Signal(
    name="singlebeat_slots_skipped",
    providing_args={"entry", "count", "first", "last"},
)

# -- SingletonTask: these fire in the worker; ``sender`` is the task ----------

#: ``key``, ``holder``, ``task_id``: the key was busy and the busy policy is "skip".
singleton_skipped = Signal(
    name="singlebeat_singleton_skipped", providing_args={"key", "holder", "task_id"}
)
#: ``entry``, ``slot``, ``task_id``, ``status`` ("finished"/"running"): a repeat
#: delivery of a slot that already ran (or is running) was dropped.
singleton_duplicate = Signal(
    name="singlebeat_singleton_duplicate",
    providing_args={"entry", "slot", "task_id", "status"},
)
#: ``key``, ``token``, ``task_id``, ``reason``: a running task lost its lease
#: (fired from the heartbeat thread).
singleton_lease_lost = Signal(
    name="singlebeat_singleton_lease_lost", providing_args={"key", "token", "task_id", "reason"}
)
