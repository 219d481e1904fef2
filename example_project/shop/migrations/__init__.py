"""The shop app's migrations."""
