"""The app's migrations: the store's schema (its DDL is the core's) and the models' state."""
