"""``python -m celery_singlebeat create-schema --url URL``."""

from .cli import singlebeat

singlebeat(prog_name="python -m celery_singlebeat")
