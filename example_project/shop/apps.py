"""The shop app's configuration."""

from __future__ import annotations

from django.apps import AppConfig


class ShopConfig(AppConfig):
    """``"shop"`` in ``INSTALLED_APPS``."""

    name = "shop"
    default_auto_field = "django.db.models.BigAutoField"
