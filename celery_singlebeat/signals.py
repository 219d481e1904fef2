"""Signals for metrics, tracing and tests; they fire in the beat process.

Each receives ``sender`` (the scheduler) and keyword arguments:

* :data:`slot_claimed` — ``entry``, ``slot`` (aware UTC datetime), ``task_id``,
  ``fence``, ``taken_over``: this replica won the slot and is about to publish.
  ``taken_over`` is True when another replica held the slot before, False for
  a new claim and for this replica's own claim won back (a retry after a lost
  answer, or a slot it had released).
* :data:`slot_published` — same arguments: the message left for the broker and
  the confirm has not been written yet.
* :data:`slots_skipped` — ``entry``, ``count``, ``first``, ``last``: the missed-run
  policy dropped slots (after an outage, or when every replica was down).

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
