"""The admin at ``/admin/`` (stored schedules, entries, slots, replicas, leases)
and a plain ``/healthz`` for the web container's probes."""

from __future__ import annotations

from django.conf import settings
from django.contrib import admin
from django.http import HttpRequest, HttpResponse
from django.urls import path, re_path
from django.views.static import serve


def healthz(request: HttpRequest) -> HttpResponse:
    """The web process answers: what the web container's probes ask (it
    touches no database, so a database outage restarts no web pod)."""
    return HttpResponse("ok\n", content_type="text/plain")


urlpatterns = [
    path("admin/", admin.site.urls),
    path("healthz", healthz),
    # The admin's CSS and scripts, collected into STATIC_ROOT by the image's
    # build (collectstatic): an admin-only site with a handful of users can let
    # Django serve them; a busy public site puts them behind a CDN or WhiteNoise.
    re_path(r"^static/(?P<path>.*)$", serve, {"document_root": settings.STATIC_ROOT}),
]
