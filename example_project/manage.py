#!/usr/bin/env python
"""Django's command line for the example project (``mysite``)."""

from __future__ import annotations

import os
import sys


def main() -> None:
    """Run a ``manage.py`` command with the project's settings."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "mysite.settings")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
