"""The executions, listed in the admin beside celery-singlebeat's pages."""

from __future__ import annotations

from django.contrib import admin

from .models import TaskRun


@admin.register(TaskRun)
class TaskRunAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """Read-only: the worker writes these rows."""

    list_display = ("entry", "slot_us", "task", "task_id", "worker", "started_us")
    list_filter = ("entry",)

    def has_add_permission(self, request: object) -> bool:
        return False

    def has_change_permission(self, request: object, obj: object = None) -> bool:
        return False
