"""List pages that stay fast over the store's largest tables.

A changelist of 1,000,000 slot rows or 100,000 entries must not count them:
Django's paginator runs ``COUNT(*)`` over the filtered table on every page,
which takes seconds at that size. :class:`LookaheadPaginator` counts only as
far as the page asked for and a few pages past it (one index-ordered read of
primary keys, ``LIMIT`` bounded), so a list shows "1 2 3 … 7" and "700+
slots" instead of the exact total. :class:`EnrichedChangeList` lets an admin
add what a row needs from other tables or from the operator's reads in one
query per page (never one per row).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.contrib import admin
from django.contrib.admin.views.main import PAGE_VAR, ChangeList
from django.core.paginator import Paginator
from django.db.models import Q
from django.http import HttpRequest
from django.utils.functional import cached_property

#: how many pages past the one shown a list counts (and offers links to)
LOOKAHEAD_PAGES = 5


class LookaheadPaginator(Paginator):
    """A paginator that counts rows up to ``pages_ahead`` pages past
    ``page``: ``count`` is a lower bound, exact (``exact``) only when the
    table ends within that reach.

    The page asked for is read in two steps: the keys (``key_fields``, the
    table's primary key) of this page and of the reach past it, in the
    list's order, in one query (an index-only read where an index gives that
    order); then the page's rows by their keys. A deep page skips its offset
    over the index alone: MariaDB reads a whole row for every row an
    ``OFFSET`` skips, seconds at 500,000.
    """

    def __init__(
        self,
        object_list: Any,
        per_page: int,
        *args: Any,
        page: int = 1,
        pages_ahead: int = LOOKAHEAD_PAGES,
        key_fields: Sequence[str] = ("pk",),
        **kwargs: Any,
    ) -> None:
        super().__init__(object_list, per_page, *args, **kwargs)
        self.page_asked = max(1, page)
        self.pages_ahead = pages_ahead
        self.key_fields = tuple(key_fields)
        self.exact = True

    def _offset(self) -> int:
        return (self.page_asked - 1) * int(self.per_page)

    def _keys(self) -> list[Any]:
        """The keys from the page asked for to the end of the reach, plus one."""
        reach = int(self.per_page) * (self.pages_ahead + 1)
        offset = self._offset()
        if len(self.key_fields) == 1:
            listed = self.object_list.values_list(self.key_fields[0], flat=True)
        else:
            listed = self.object_list.values_list(*self.key_fields)
        return list(listed[offset : offset + reach + 1])

    keys = cached_property(_keys)

    def _count(self) -> int:
        """The rows up to the reach: before the page asked, and at most
        ``pages_ahead`` pages after it."""
        reach = int(self.per_page) * (self.pages_ahead + 1)
        found = len(self.keys)
        offset = self._offset()
        if found == 0 and offset:
            # a page past the end: Django answers it with the list's first page
            self.exact = True
            return 0
        self.exact = found <= reach
        return offset + min(found, reach)

    # read once per page (Django's own count is a cached_property too)
    count = cached_property(_count)

    def page(self, number: Any) -> Any:
        number = self.validate_number(number)
        if number != self.page_asked:
            return super().page(number)
        wanted = self.keys[: int(self.per_page)]
        return self._get_page(self._rows(wanted), number, self)

    def _rows(self, wanted: list[Any]) -> list[Any]:
        """The rows of these keys, in their order: one query by primary key."""
        if not wanted:
            return []
        rows = self.object_list.model._default_manager.using(self.object_list.db)
        if len(self.key_fields) == 1:
            field = self.key_fields[0]
            found = {getattr(r, field): r for r in rows.filter(**{f"{field}__in": wanted})}
            return [found[k] for k in wanted if k in found]
        where = Q()
        for key in wanted:
            where |= Q(**dict(zip(self.key_fields, key)))
        found = {tuple(getattr(r, f) for f in self.key_fields): r for r in rows.filter(where)}
        return [found[tuple(k)] for k in wanted if tuple(k) in found]


class EnrichedChangeList(ChangeList):
    """A changelist whose page of rows passes through the admin's ``enrich``
    (when it has one) once, after the page is read: the admin attaches
    what each row shows from other tables in one query per page."""

    def get_results(self, request: HttpRequest) -> None:
        super().get_results(request)
        enrich = getattr(self.model_admin, "enrich", None)
        if enrich is not None:
            # set by Django's get_results, which mypy cannot see (no types)
            rows: Any = getattr(self, "result_list")  # noqa: B009
            setattr(self, "result_list", enrich(request, list(rows)))  # noqa: B010


class StoreListAdmin(admin.ModelAdmin):
    """The list settings every admin over a store's table shares: no full
    count, no facet counts, the lookahead paginator, the enriched changelist;
    nothing added, changed or deleted through the ORM (the tables are the
    store's, written through its API)."""

    #: the fields of the table's primary key (Django's ``pk`` is one column
    #: of a key that spans two, for the slot and run tables)
    list_key_fields: tuple[str, ...] = ("pk",)
    show_full_result_count = False
    show_facets = admin.ShowFacets.NEVER
    list_per_page = 100
    list_max_show_all = 200

    def get_paginator(
        self,
        request: HttpRequest,
        queryset: Any,
        per_page: int,
        orphans: int = 0,
        allow_empty_first_page: bool = True,
    ) -> LookaheadPaginator:
        try:
            page = int(request.GET.get(PAGE_VAR, 1))
        except ValueError:
            page = 1
        return LookaheadPaginator(
            queryset,
            per_page,
            orphans,
            allow_empty_first_page,
            page=page,
            key_fields=self.list_key_fields,
        )

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return EnrichedChangeList

    def enrich(self, request: HttpRequest, rows: Sequence[Any]) -> list[Any]:
        """The page's rows with what they show from elsewhere (none here)."""
        return list(rows)

    def has_add_permission(self, request: HttpRequest, *args: Any) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


__all__ = ["LOOKAHEAD_PAGES", "EnrichedChangeList", "LookaheadPaginator", "StoreListAdmin"]
