"""The admin over the stored schedules: list, add, change, preview, history,
delete, and the entry controls.

Every write goes through :class:`~celery_singlebeat.schedules.api.Schedules`
(``store.schedules(by=user)``), with Django's connection inside
``transaction.atomic()`` when the store lives in a Django database
(``singlebeat_url = "django://<alias>"``, the default), so that the entry's
row, its revision, its history and the admin's ``LogEntry`` commit together
or not at all. A change is written only at the revision the form was read at
(the hidden ``revision``): a form gone stale under another editor is refused
with the revisions named, never written over. The API's refusals land on the
form's fields (:mod:`.forms`).

The write runs during the form's validation (its ``_post_clean``), not in
``save_model``: there a refusal could no longer reach the form, and the page
would fail instead of showing which field is wrong. Django's change view runs
both inside one ``transaction.atomic()``.
"""

from __future__ import annotations

import json
from typing import Any

from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.contrib.admin.utils import unquote
from django.core.exceptions import PermissionDenied
from django.db import connections, transaction
from django.http import HttpRequest, HttpResponse

from ...exceptions import (
    InvalidEntry,
    ScheduleConflict,
    ScheduleExists,
    ScheduleNotFound,
    StoreUnavailable,
)
from ...schedules.columns import entry_from_fields
from ...schedules.entry import StoredEntry
from . import store
from .admin_actions import ENTRY_ACTIONS, ControlsMixin
from .admin_changelist import StoreListAdmin
from .admin_display import display, spec_text
from .conf import celery_conf
from .database import SCHEME
from .forms import StoredScheduleForm
from .models import StoredSchedule

#: how many next runs the change page and the preview show
PREVIEW_RUNS = 5
#: how many changes of an entry's history its page shows, newest first
HISTORY_SHOWN = 50


def store_alias() -> str | None:
    """The Django database alias the store lives in (``django://<alias>``), or
    None when ``CELERY_SINGLEBEAT_URL`` names a database of its own: then a
    write cannot share the request's transaction, and runs in its own."""
    from ...config import read_setting

    url = read_setting(celery_conf(), "singlebeat_url")
    if isinstance(url, str) and url.startswith(SCHEME):
        return url[len(SCHEME) :] or "default"
    return None


def entry_of(row: StoredSchedule) -> StoredEntry:
    """A listed row as the API's :class:`StoredEntry` (no query)."""
    return entry_from_fields(
        {f.attname: getattr(row, f.attname) for f in row._meta.concrete_fields}
    )


class EnabledFilter(admin.SimpleListFilter):
    """Enabled or disabled entries (the column is 0 or 1)."""

    title = "enabled"
    parameter_name = "enabled"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("1", "Yes"), ("0", "No")]

    def queryset(self, request: HttpRequest, queryset: Any) -> Any:
        if self.value() in ("0", "1"):
            return queryset.filter(enabled=int(self.value() or 0))
        return queryset


@admin.register(StoredSchedule)
class StoredScheduleAdmin(ControlsMixin, StoreListAdmin):
    """The stored schedules: the list, the form (with Preview), the history."""

    list_display = (
        "name",
        "task",
        "schedule",
        "is_enabled",
        "next_run",
        "revision",
        "updated_by",
        "updated",
    )
    search_fields = ("name", "task")
    list_filter = (EnabledFilter, "managed_by")
    ordering = ("name",)
    actions = ENTRY_ACTIONS
    fieldsets = (
        (None, {"fields": ("name", "task")}),
        ("Schedule (one of)", {"fields": ("every", "cron", "tz", "at")}),
        ("Arguments and options", {"fields": ("args", "kwargs", "queue")}),
        ("Bounds", {"fields": ("start", "end")}),
        (None, {"fields": ("description", "enabled", "why", "revision")}),
    )

    def get_fieldsets(self, request: HttpRequest, obj: Any = None) -> Any:
        if obj is not None:
            return self.fieldsets
        # a new entry has no revision to check
        return [
            (title, {"fields": tuple(f for f in opts["fields"] if f != "revision")})
            for title, opts in self.fieldsets
        ]

    # -- permissions: Django's own, unlike the other lists (writes go through the API)

    def has_add_permission(self, request: HttpRequest, *args: Any) -> bool:
        return admin.ModelAdmin.has_add_permission(self, request)

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return admin.ModelAdmin.has_change_permission(self, request, obj)

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return admin.ModelAdmin.has_delete_permission(self, request, obj)

    # -- the list ------------------------------------------------------------

    def get_queryset(self, request: HttpRequest) -> Any:
        # a deleted entry is a tombstone until the prune removes it
        return super().get_queryset(request).filter(deleted=0)

    def enrich(self, request: HttpRequest, rows: Any) -> list[Any]:
        api = store.schedules()
        for row in rows:
            row.sb_next = None
            if row.enabled:
                try:
                    runs = api.next_runs(entry_of(row), 1)
                except InvalidEntry:
                    runs = []  # a row written by hand that is no entry: shown, not run
                row.sb_next = runs[0] if runs else None
        return list(rows)

    @display(description="schedule")
    def schedule(self, obj: StoredSchedule) -> str:
        return spec_text(obj.spec)

    @display(description="enabled", boolean=True, ordering="enabled")
    def is_enabled(self, obj: StoredSchedule) -> bool:
        return bool(obj.enabled)

    @display(description="next run (UTC)")
    def next_run(self, obj: StoredSchedule) -> str:
        at = getattr(obj, "sb_next", None)
        return "-" if at is None else at.strftime("%Y-%m-%d %H:%M:%S")

    @display(description="updated (UTC)", ordering="updated_us")
    def updated(self, obj: StoredSchedule) -> str:
        at = obj.updated_at
        return "-" if at is None else at.strftime("%Y-%m-%d %H:%M:%S")

    # -- the form --------------------------------------------------------------

    def get_form(
        self, request: HttpRequest, obj: Any = None, change: bool = False, **kwargs: Any
    ) -> Any:
        entry = None
        if obj is not None:
            entry = store.schedules().get(obj.name)
        model_admin = self

        class Form(StoredScheduleForm):
            def __init__(self, *args: Any, **kw: Any) -> None:
                super().__init__(*args, entry=entry, **kw)
                self.saved: StoredSchedule | None = None

            def _post_clean(self) -> None:
                super()._post_clean()
                if self.is_bound and not self.errors and "_preview" not in request.POST:
                    model_admin.write(request, self)

            def save(self, commit: bool = False) -> StoredSchedule | None:
                return self.saved

            def save_m2m(self) -> None:
                """No relations: nothing to save."""

        return Form

    def write(self, request: HttpRequest, form: Any) -> None:
        """The form's entry written through the API, in the request's
        transaction; each refusal put on the form."""
        alias = store_alias()
        connection = None if alias is None else connections[alias]
        api = store.schedules(by=request.user.get_username())
        why = form.cleaned_data.get("why") or ""
        try:
            with transaction.atomic(using=alias or "default"):
                if form.current is None:
                    entry = api.upsert(
                        form.entry, if_exists="error", why=why, connection=connection
                    )
                else:
                    entry = api.update(
                        form.current.name,
                        if_revision=form.cleaned_data["revision"],
                        why=why,
                        connection=connection,
                        **form.changes,
                    )
        except InvalidEntry as exc:
            form.add_problems(exc)
        except ScheduleExists:
            form.add_error("name", "an entry of this name exists already: edit it instead")
        except ScheduleConflict as exc:
            form.add_error(
                None,
                f"Not saved: someone else changed this entry since you opened it (it is at "
                f"revision {exc.revision}, this form at {exc.expected}). Reload the page to "
                "see their change, then make yours again.",
            )
        except ScheduleNotFound:
            form.add_error(None, "Not saved: the entry was deleted since you opened it.")
        except StoreUnavailable as exc:
            form.add_error(None, f"Not saved: the database refused ({exc}).")
        else:
            form.saved = StoredSchedule.objects.using(alias or "default").get(name=entry.name)

    def save_model(self, request: HttpRequest, obj: Any, form: Any, change: bool) -> None:
        """Written already, through the API, when the form was validated."""

    def changeform_view(
        self,
        request: HttpRequest,
        object_id: str | None = None,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        if request.method == "POST" and "_preview" in request.POST:
            return self.preview_view(request, object_id, form_url, extra_context)
        context = dict(extra_context or {})
        if object_id is not None:
            context.update(self.entry_context(unquote(object_id)))
        return super().changeform_view(request, object_id, form_url, context)

    def entry_context(self, name: str) -> dict[str, Any]:
        """The next runs and the history of a stored entry, for its page."""
        api = store.schedules()
        try:
            entry = api.get(name)
        except ScheduleNotFound:
            return {}
        return {
            "next_runs": [_utc(r) for r in api.next_runs(entry, PREVIEW_RUNS)],
            "changes": history(api.log(name, HISTORY_SHOWN)),
        }

    def preview_view(
        self,
        request: HttpRequest,
        object_id: str | None,
        form_url: str,
        extra_context: dict[str, Any] | None,
    ) -> HttpResponse:
        """The form again, checked as a save checks it, with the next runs of
        what it holds; nothing written."""
        obj = None
        if object_id is not None:
            obj = self.get_object(request, unquote(object_id))
            if obj is None:
                return self._get_obj_does_not_exist_redirect(request, self.opts, object_id)
            if not self.has_change_permission(request, obj):
                raise PermissionDenied
        elif not self.has_add_permission(request):
            raise PermissionDenied
        form_class = self.get_form(request, obj, change=obj is not None)
        form = form_class(request.POST, request.FILES, instance=obj)
        runs = None
        if form.is_valid():
            runs = [_utc(r) for r in store.schedules().next_runs(form.entry, PREVIEW_RUNS)]
        admin_form = helpers.AdminForm(
            form,
            list(self.get_fieldsets(request, obj)),
            {},
            self.get_readonly_fields(request, obj),
            model_admin=self,
        )
        title = "Add %s" if obj is None else "Change %s"
        context = {
            **self.admin_site.each_context(request),
            "title": title % self.opts.verbose_name,
            "subtitle": str(obj) if obj else None,
            "adminform": admin_form,
            "object_id": object_id,
            "original": obj,
            "is_popup": False,
            "to_field": None,
            "media": self.media + admin_form.media,
            "inline_admin_formsets": [],
            "errors": helpers.AdminErrorList(form, []),
            "preserved_filters": self.get_preserved_filters(request),
            **(self.entry_context(obj.name) if obj is not None else {}),
            "preview": True,
            "next_runs": runs,
            **(extra_context or {}),
        }
        return self.render_change_form(
            request, context, add=obj is None, change=obj is not None, obj=obj, form_url=form_url
        )

    # -- delete ------------------------------------------------------------------

    def delete_model(self, request: HttpRequest, obj: Any) -> None:
        self._delete(request, [obj.name])

    def delete_queryset(self, request: HttpRequest, queryset: Any) -> None:
        self._delete(request, [str(n) for n in queryset.values_list("name", flat=True)])

    def _delete(self, request: HttpRequest, names: list[str]) -> None:
        """Delete through the API, in the request's transaction (with its
        LogEntry); an entry already gone is said, not an error."""
        alias = store_alias()
        connection = None if alias is None else connections[alias]
        api = store.schedules(by=request.user.get_username())
        for name in names:
            try:
                with transaction.atomic(using=alias or "default"):
                    api.delete(name, why="deleted in the admin", connection=connection)
            except ScheduleNotFound:
                self.message_user(request, f"{name!r} was deleted already.", messages.WARNING)


def _utc(at: Any) -> str:
    return str(at.strftime("%Y-%m-%d %H:%M:%S UTC (%a)"))


def history(rows: Any) -> list[dict[str, Any]]:
    """The store's history rows as the entry's page shows them: each change's
    fields with their old and new values (``args`` and ``kwargs`` as the
    digests the history keeps)."""
    shown = []
    for row in rows:
        try:
            changes = json.loads(row.changes or "{}")
        except ValueError:
            changes = {}
        fields = []
        if isinstance(changes, dict):
            for field, pair in sorted(changes.items()):
                old, new = pair if isinstance(pair, list) and len(pair) == 2 else (None, pair)
                fields.append((field, _value(old), _value(new)))
        shown.append(
            {
                "revision": row.revision,
                "action": row.action,
                "by": row.by,
                "why": row.why,
                "at": _at(row.at_us),
                "fields": fields,
            }
        )
    return shown


def _value(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, str):
        return value
    return json.dumps(value, sort_keys=True)


def _at(us: int) -> str:
    from .admin_display import instant_text

    return instant_text(us)


__all__ = ["EnabledFilter", "StoredScheduleAdmin", "entry_of", "history", "store_alias"]
