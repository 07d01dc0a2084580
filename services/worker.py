"""A service's start: `bootstrap`, the one wiring of a Context (the real adapters, or the
fakes a test gives), and `run_worker`, the Celery worker every service's __main__ runs."""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from typing import Any

import redis
from celery import Celery

from rsieve.adapters.metrics import JsonFormatter
from rsieve.adapters.model import Model
from rsieve.adapters.queues import enqueue, make_celery
from rsieve.adapters.storage import ObjectStore, S3Store
from rsieve.settings import Settings, get_settings
from services.context import Context, GeneratorModelOf, Send
from services.liveness import start_watcher
from services.progress import time_limit


def bootstrap(
    settings: Settings | None = None,
    *,
    app: Celery | None = None,
    store: ObjectStore | None = None,
    redis_client: redis.Redis | None = None,
    send: Send | None = None,
    judge_model: Callable[[str], Model] | None = None,
    generator_model: GeneratorModelOf | None = None,
) -> Context:
    """The one wiring of a service: real adapters by default (S3, Redis, the Celery app on
    Redis, Triton), or the fakes given, typed by what the services use (`ObjectStore`, a
    Redis client such as fakeredis's, `send` for the next task, `Model` for the judge)."""
    settings = settings or get_settings()
    app = app or make_celery(settings)

    def enqueued(task: str, kwargs: dict[str, Any]) -> None:
        # A generate or judge shard's limit follows its model's pace (services/progress.py).
        enqueue(app, task, time_limit=time_limit(ctx, task, kwargs), **kwargs)

    ctx = Context(
        settings=settings,
        app=app,
        send=send or enqueued,
        given_store=store,
        given_redis=redis_client,
        judge_model_of=judge_model,
        generator_model_of=generator_model,
    )
    return ctx


def run_worker(
    service: str,
    queue: str,
    register: Callable[[Context], None],
    concurrency_of: Callable[[Settings], int] | None = None,
    pool: str = "prefork",
) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter(service))  # one JSON object per line (run, shard, item)
    logging.basicConfig(level=logging.INFO, handlers=[handler])
    ctx = bootstrap()
    register(ctx)  # in the main process, before the prefork children exist
    # botocore parses its S3 model on a session's first client (about 0.3 s of CPU); done
    # here, every child inherits the parsed model. The client itself is dropped: each child
    # builds its own (clients are not fork-safe).
    S3Store(ctx.settings)
    concurrency = str((concurrency_of or (lambda s: s.worker_concurrency))(ctx.settings))
    start_watcher(ctx.app, ctx.settings)  # dead workers' shards requeued (services/liveness.py)
    ctx.app.worker_main(
        [
            "worker",
            "-Q",
            queue,
            "-c",
            concurrency,
            "-P",
            pool,
            "-n",
            f"{service}@%h",
            "--loglevel",
            "INFO",
            "--without-gossip",
            "--without-mingle",
        ]
    )
