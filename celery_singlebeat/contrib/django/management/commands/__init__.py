"""``manage.py singlebeat_*``: the ``singlebeat`` CLI's commands over the project's settings."""
