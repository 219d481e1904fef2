"""The app's one migration: the store's tables, made by the core's schema code."""
