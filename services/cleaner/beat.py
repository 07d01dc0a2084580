"""`python -m services.cleaner.beat [--schedule FILE]`: Celery beat sending `rsieve.watch`
to the clean queue every `watch_interval_s` (continuous ingestion, services/cleaner/watch.py;
only with a `watch_prefix`) and `rsieve.sweep` every `sweep_interval_s` (stalled runs
reconciled, services/cleaner/sweep.py). Exits at once when neither is on. Run exactly one beat per
deployment; a second would only double the looks (takes stay exactly-once)."""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Any

from rsieve.adapters.metrics import JsonFormatter
from rsieve.settings import Settings
from services.worker import bootstrap


def beat_schedule(settings: Settings) -> dict[str, Any]:
    """The beat schedule: a look at the watched prefix per `watch_interval_s` (when one is
    set) and a sweep per `sweep_interval_s` (unless 0); a message not started within its
    interval (the cleaners are busy) expires instead of piling up."""
    schedule: dict[str, Any] = {}
    if settings.watch_prefix.strip():
        schedule["rsieve-watch"] = {
            "task": "rsieve.watch",
            "schedule": settings.watch_interval_s,
            "options": {"queue": "clean", "expires": max(settings.watch_interval_s, 1.0)},
        }
    if settings.sweep_interval_s > 0:
        schedule["rsieve-sweep"] = {
            "task": "rsieve.sweep",
            "schedule": settings.sweep_interval_s,
            "options": {"queue": "clean", "expires": max(settings.sweep_interval_s, 1.0)},
        }
    return schedule


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="services.cleaner.beat")
    parser.add_argument(
        "--schedule", default="celerybeat-schedule", help="beat's state file (last run times)"
    )
    args = parser.parse_args(argv)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter("beat"))
    logging.basicConfig(level=logging.INFO, handlers=[handler])
    ctx = bootstrap()
    schedule = beat_schedule(ctx.settings)
    if not schedule:
        logging.getLogger("rsieve").info("no watch_prefix and no sweep: no beat")
        return 0
    ctx.app.conf.beat_schedule = schedule
    ctx.app.start(["beat", "--schedule", args.schedule, "--loglevel", "INFO"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
