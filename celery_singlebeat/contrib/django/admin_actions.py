"""The operator's controls as admin actions: pause, resume, run now, release a
lease.

Each action first shows a confirmation page (as Django's own "delete
selected" does): the items chosen, the action's inputs (a pause's end and
reason, a run's reason) and a Confirm button; only the confirmed POST acts.
Each needs its own permission (``celery_singlebeat.pause_entry``,
``celery_singlebeat.run_entry_now``, ``celery_singlebeat.release_lease``):
without it the action is not offered, and a POST naming it anyway is refused
(403). Each goes through the operator
(:class:`~celery_singlebeat.store.sql.operator.Operator`, one transaction in
the store), and each item it changed gets an admin ``LogEntry`` (CHANGE)
saying what was done. A refusal (:class:`~celery_singlebeat.exceptions.ControlError`,
nothing changed) is shown as an error message.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.contrib.admin.models import CHANGE, LogEntry
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse

from ...exceptions import ControlError, StoreUnavailable
from ...timeline.clock import datetime_to_us
from . import store
from .admin_display import instant_text
from .forms import PauseForm, RunNowForm

#: the permissions each control needs, as ``user.has_perm`` names them
PAUSE_PERMISSION = "celery_singlebeat.pause_entry"
RUN_NOW_PERMISSION = "celery_singlebeat.run_entry_now"
RELEASE_PERMISSION = "celery_singlebeat.release_lease"

#: how many of the chosen items the confirmation page lists by name
LISTED = 100

TEMPLATE = "celery_singlebeat/action_confirmation.html"


class ControlsMixin:
    """What an admin offering the controls provides: the permission checks
    Django's ``allowed_permissions`` asks for, and the entry name (or lease
    key) of each row (``control_key``, the model field holding it)."""

    control_key = "name"

    def has_pause_permission(self, request: HttpRequest) -> bool:
        return bool(request.user.has_perm(PAUSE_PERMISSION))

    def has_run_now_permission(self, request: HttpRequest) -> bool:
        return bool(request.user.has_perm(RUN_NOW_PERMISSION))

    def has_release_permission(self, request: HttpRequest) -> bool:
        return bool(request.user.has_perm(RELEASE_PERMISSION))


def _who(request: HttpRequest) -> str:
    return f"{request.user.get_username()} (admin)"


def _log(request: HttpRequest, objects: Sequence[Any], message: str) -> None:
    """One admin LogEntry (CHANGE) per item acted on."""
    if not objects:
        return
    user_id = request.user.pk
    log_actions = getattr(LogEntry.objects, "log_actions", None)
    if log_actions is not None:  # Django 5.1+: one INSERT for them all
        log_actions(user_id, list(objects), CHANGE, change_message=message)
        return
    from django.contrib.contenttypes.models import ContentType

    for obj in objects:  # pragma: no cover - Django < 5.1
        LogEntry.objects.log_action(
            user_id,
            ContentType.objects.get_for_model(obj).pk,
            str(obj.pk),
            str(obj)[:200],
            CHANGE,
            message,
        )


def _confirm(
    modeladmin: Any,
    request: HttpRequest,
    queryset: Any,
    *,
    action: str,
    verb: str,
    warning: str,
    form: forms.Form | None,
    keys: list[str],
) -> HttpResponse:
    """The confirmation page: the items, the inputs, Confirm or go back."""
    opts = modeladmin.model._meta
    context = {
        **modeladmin.admin_site.each_context(request),
        "title": f"{verb}: are you sure?",
        "subtitle": None,
        "verb": verb,
        "warning": warning,
        "action": action,
        "form": form,
        "keys": keys[:LISTED],
        "more": max(0, len(keys) - LISTED),
        "selected": request.POST.getlist(helpers.ACTION_CHECKBOX_NAME),
        "select_across": request.POST.get("select_across", "0"),
        "opts": opts,
        "app_label": opts.app_label,
        "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
        "media": modeladmin.media,
    }
    request.current_app = modeladmin.admin_site.name
    return TemplateResponse(request, TEMPLATE, context)


def _keys(modeladmin: Any, queryset: Any) -> list[str]:
    return [str(k) for k in queryset.values_list(modeladmin.control_key, flat=True).distinct()]


def _control(
    *,
    name: str,
    description: str,
    permission: str,
    verb: str,
    warning: str,
    form_class: type[forms.Form] | None,
    act: Callable[[HttpRequest, list[str], dict[str, Any]], tuple[list[str], str]],
) -> Callable[[Any, HttpRequest, Any], HttpResponse | None]:
    """An admin action that asks first, then ``act(request, keys, inputs)``,
    which returns the keys it changed and a message; LogEntry per changed row."""

    def action(modeladmin: Any, request: HttpRequest, queryset: Any) -> HttpResponse | None:
        if not request.user.has_perm(permission):
            raise PermissionDenied
        keys = _keys(modeladmin, queryset)
        confirmed = request.POST.get("post") == "yes"
        form = None
        if form_class is not None:
            form = form_class(request.POST) if confirmed else form_class()
        if not confirmed or (form is not None and not form.is_valid()):
            return _confirm(
                modeladmin,
                request,
                queryset,
                action=name,
                verb=verb,
                warning=warning,
                form=form,
                keys=keys,
            )
        try:
            done, message = act(request, keys, form.cleaned_data if form is not None else {})
        except (ControlError, StoreUnavailable) as exc:
            modeladmin.message_user(request, f"{verb} refused: {exc}", messages.ERROR)
            return None
        changed = [o for o in queryset if str(getattr(o, modeladmin.control_key)) in set(done)]
        _log(request, changed, message)
        modeladmin.message_user(request, message, messages.SUCCESS if done else messages.WARNING)
        return None

    action.__name__ = name
    return admin.action(description=description, permissions=[_perm_name(permission)])(action)


def _perm_name(permission: str) -> str:
    """The name ``allowed_permissions`` takes for a permission: the admin's
    ``has_<name>_permission``."""
    return {
        PAUSE_PERMISSION: "pause",
        RUN_NOW_PERMISSION: "run_now",
        RELEASE_PERMISSION: "release",
    }[permission]


def _quoted(keys: Sequence[str]) -> str:
    shown = ", ".join(repr(k) for k in keys[:10])
    return shown + (f" and {len(keys) - 10} more" if len(keys) > 10 else "")


def _pause(request: HttpRequest, keys: list[str], inputs: dict[str, Any]) -> tuple[list[str], str]:
    until = inputs.get("until")
    until_us = None if until is None else datetime_to_us(until)
    reason = inputs.get("reason") or ""
    result = store.operator().pause(keys, until_us, _who(request), reason)
    names = [p.entry for p in result.pauses]
    end = "until resumed" if until_us is None else f"until {instant_text(until_us)}"
    why = f" ({reason})" if reason else ""
    return names, f"Paused {_quoted(names)} {end}{why}."


def _resume(request: HttpRequest, keys: list[str], inputs: dict[str, Any]) -> tuple[list[str], str]:
    result = store.operator().resume(keys)
    parts = []
    if result.resumed:
        parts.append(f"Resumed {_quoted(result.resumed)}.")
    if result.not_paused:
        parts.append(f"Not paused: {_quoted(result.not_paused)}.")
    held = result.still_paused_by
    if held is not None:
        parts.append(f"Every entry is still paused by {held.by} ('*'): resume '*' to lift it.")
    return list(result.resumed), " ".join(parts)


def _run_now(
    request: HttpRequest, keys: list[str], inputs: dict[str, Any]
) -> tuple[list[str], str]:
    operator = store.operator()
    reason = inputs.get("reason") or ""
    done: list[str] = []
    lines: list[str] = []
    for key in keys:
        # one transaction per entry (the operator's run_now): a refusal of one
        # (paused, unknown) leaves the others requested, and says which
        try:
            result = operator.run_now(key, _who(request), reason)
        except ControlError as exc:
            if len(keys) == 1:
                raise
            lines.append(f"{key!r} refused: {exc}.")
            continue
        done.append(key)
        lines.append(
            f"Requested a run of {key!r}: slot {instant_text(result.slot_us)}, "
            f"task id {result.task_id}."
        )
    return done, " ".join(lines)


def _release(
    request: HttpRequest, keys: list[str], inputs: dict[str, Any]
) -> tuple[list[str], str]:
    operator = store.operator()
    released: list[str] = []
    idle: list[str] = []
    for key in keys:
        (released if operator.release_lease(key) else idle).append(key)
    parts = []
    if released:
        parts.append(f"Released {_quoted(released)}.")
    if idle:
        parts.append(f"Not held (expired or released already): {_quoted(idle)}.")
    return released, " ".join(parts)


pause_entries = _control(
    name="pause_entries",
    description="Pause the selected entries",
    permission=PAUSE_PERMISSION,
    verb="Pause",
    warning="No replica claims a slot of a paused entry; a slot already sent is not recalled.",
    form_class=PauseForm,
    act=_pause,
)
resume_entries = _control(
    name="resume_entries",
    description="Resume the selected entries",
    permission=PAUSE_PERMISSION,
    verb="Resume",
    warning="The entries run again from their next slot; the paused span is not caught up.",
    form_class=None,
    act=_resume,
)
run_entries_now = _control(
    name="run_entries_now",
    description="Run the selected entries now",
    permission=RUN_NOW_PERMISSION,
    verb="Run now",
    warning="A replica that has each entry sends it once at its next sweep, besides its schedule.",
    form_class=RunNowForm,
    act=_run_now,
)
release_leases = _control(
    name="release_leases",
    description="Release the selected SingletonTask leases",
    permission=RELEASE_PERMISSION,
    verb="Release",
    warning="The running task is not stopped: its next renewal finds the lease lost, and "
    "another execution may take the key at once.",
    form_class=None,
    act=_release,
)

#: the entry controls, in the order the action menu lists them
ENTRY_ACTIONS = (pause_entries, resume_entries, run_entries_now)

__all__ = [
    "ENTRY_ACTIONS",
    "PAUSE_PERMISSION",
    "RELEASE_PERMISSION",
    "RUN_NOW_PERMISSION",
    "ControlsMixin",
    "pause_entries",
    "release_leases",
    "resume_entries",
    "run_entries_now",
]
