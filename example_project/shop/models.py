"""One row per task execution, written by the worker: what ``make example``
counts (each slot of each entry must have exactly one) and what the admin lists."""

from __future__ import annotations

from django.db import models


class TaskRun(models.Model):
    """One execution of a shop task on a worker."""

    task = models.CharField(max_length=200)
    #: the beat entry and the slot (its scheduled instant, microseconds since
    #: the epoch) from the message's ``singlebeat_slot`` header; empty for a
    #: call that no beat sent (``delay()``)
    entry = models.CharField(max_length=255, blank=True)
    slot_us = models.BigIntegerField(null=True)
    task_id = models.CharField(max_length=255)
    worker = models.CharField(max_length=255)
    #: when the worker started it (this host's clock, microseconds)
    started_us = models.BigIntegerField()

    class Meta:
        ordering = ("-started_us",)

    def __str__(self) -> str:
        return f"{self.entry or self.task} {self.slot_us}"
