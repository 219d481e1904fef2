"""The app's management commands (``commands/``) and what they share (``bridge.py``)."""
