"""``python -m celery_singlebeat create-schema --url URL``, ``... health --status-file F``."""

import sys


def main() -> None:
    if sys.argv[1:2] == ["health"]:
        # The exec probe's fast path: a kubelet runs it every few seconds in
        # every beat pod, so it imports neither click nor Celery nor SQLAlchemy
        # (health.py is stdlib only): 30-45 ms of CPU, about what starting the
        # interpreter costs, instead of 600+ with Celery imported.
        from .observe.health import main as health

        sys.exit(health(sys.argv[2:], prog="python -m celery_singlebeat health"))
    from .cli import singlebeat

    singlebeat(prog_name="python -m celery_singlebeat")


if __name__ == "__main__":
    main()
