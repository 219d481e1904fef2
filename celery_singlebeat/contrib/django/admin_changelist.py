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
from django.http import HttpRequest
from django.utils.functional import cached_property

#: how many pages past the one shown a list counts (and offers links to)
LOOKAHEAD_PAGES = 5


class LookaheadPaginator(Paginator):
    """A paginator that counts rows up to ``pages_ahead`` pages past
    ``page``: ``count`` is a lower bound, exact (``exact``) only when the
    table ends within that reach."""

    def __init__(
        self,
        object_list: Any,
        per_page: int,
        *args: Any,
        page: int = 1,
        pages_ahead: int = LOOKAHEAD_PAGES,
        **kwargs: Any,
    ) -> None:
        super().__init__(object_list, per_page, *args, **kwargs)
        self.page_asked = max(1, page)
        self.pages_ahead = pages_ahead
        self.exact = True

    def _count(self) -> int:
        """The rows up to the reach: before the page asked, and at most
        ``pages_ahead`` pages after it (plus one row, to know whether more
        follow)."""
        per_page = int(self.per_page)
        offset = (self.page_asked - 1) * per_page
        reach = per_page * (self.pages_ahead + 1)
        # primary keys only, in the list's order: an index-only read where the
        # order is the index's, bounded by LIMIT whatever the table's size
        found = len(self.object_list.values_list("pk", flat=True)[offset : offset + reach + 1])
        if found == 0 and offset:
            # a page past the end: Django answers it with the list's first page
            self.exact = True
            return 0
        self.exact = found <= reach
        return offset + min(found, reach)

    # read once per page (Django's own count is a cached_property too)
    count = cached_property(_count)


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
        return LookaheadPaginator(queryset, per_page, orphans, allow_empty_first_page, page=page)

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
