"""What every service shares: bootstrap (settings, storage, queue app, models), the base
task class (retries of transient failures, logging context), shard I/O and the worker
entry point. Services stay one screen each."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from celery import Celery, Task

from rsieve.adapters.model import TritonModel
from rsieve.adapters.queues import enqueue, make_celery
from rsieve.adapters.storage import S3Store
from rsieve.errors import RetryableError
from rsieve.schemas import RunSpec, ShardOutput
from rsieve.settings import Settings, get_settings

log = logging.getLogger("rsieve")


@dataclass
class Context:
    """The adapters a service uses, built once per process (never at import)."""

    settings: Settings
    app: Celery
    _pid: int = field(default_factory=os.getpid)

    @cached_property
    def store(self) -> S3Store:
        # boto3 clients are not fork-safe: each worker child builds its own on first use.
        return S3Store(self.settings)

    def model(self, name: str) -> TritonModel:
        s = self.settings
        return TritonModel(s.triton_grpc_url, name, max_inflight=s.max_inflight,
                           timeout_s=s.model_timeout_s, retries=s.model_retries)

    def spec(self, run: str) -> RunSpec:
        return RunSpec.model_validate_json(self.store.get(f"runs/{run}/run.json"))

    def output_key(self, run: str, stage: str, shard: str) -> str:
        return f"runs/{run}/{stage}/{shard}.json"

    def load(self, run: str, stage: str, shard: str) -> ShardOutput:
        return ShardOutput.model_validate_json(self.store.get(self.output_key(run, stage, shard)))

    def save(self, out: ShardOutput) -> None:
        self.store.put(self.output_key(out.run, out.stage, out.shard),
                       out.model_dump_json().encode(), content_type="application/json")

    def done(self, run: str, stage: str, shard: str) -> bool:
        return self.store.exists(self.output_key(run, stage, shard))

    def next(self, task: str, **kwargs: Any) -> None:
        enqueue(self.app, task, **kwargs)


class StageTask(Task):  # type: ignore[misc]
    """Base of every stage task: late acks (from the app), transient failures retried with
    backoff, every other failure logged with its run and shard."""

    autoretry_for = (RetryableError,)
    retry_backoff = 2
    retry_backoff_max = 60
    retry_jitter = True
    max_retries = 20

    def before_start(self, task_id: str, args: Any, kwargs: Any) -> None:
        log.info("start %s run=%s shard=%s", self.name, kwargs.get("run"), kwargs.get("shard"))


def bootstrap(settings: Settings | None = None) -> Context:
    settings = settings or get_settings()
    return Context(settings=settings, app=make_celery(settings))


def run_worker(service: str, queue: str, register: Callable[[Context], None]) -> None:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format=f"%(asctime)s {service} %(levelname)s %(message)s")
    ctx = bootstrap()
    register(ctx)
    concurrency = str(ctx.settings.worker_concurrency)
    ctx.app.worker_main(["worker", "-Q", queue, "-c", concurrency, "-n", f"{service}@%h",
                         "--loglevel", "INFO", "--without-gossip", "--without-mingle"])
