"""``python -m celery_singlebeat create-schema --url URL``."""

from .cli import singlebeat

if __name__ == "__main__":
    singlebeat(prog_name="python -m celery_singlebeat")
