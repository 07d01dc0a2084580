"""The Context a service's tasks run on: the adapters of one process, built on first use
(never at import), and the calls the tasks make on them under one name. Each concern's
code lives in its own module, which these methods call: stored outputs and their redo
(services/outputs.py), fan-out (services/fanout.py), a run's bookkeeping
(services/runs.py), the cache (services/cache.py). services/worker.py wires a Context
(`bootstrap`) and starts a worker on it."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, cast

import redis
from celery import Celery
from pydantic import BaseModel

from rsieve.adapters.gate import EngineGate
from rsieve.adapters.metrics import RedisMetrics
from rsieve.adapters.model import Model, open_model
from rsieve.adapters.storage import ObjectStore, S3Store, read_images
from rsieve.clean.profiles import FamilyProfile
from rsieve.generate.generation import AsyncModel, ModelInfo
from rsieve.judge.calibration import CalibrationShard
from rsieve.schemas import Item, Quarantined, RunSpec, ShardOutput
from rsieve.settings import Settings
from services import fanout, outputs, runs
from services.cache import BoundedCache
from services.stage import ItemGuard, StageTask

Send = Callable[[str, dict[str, Any]], None]  # (task name, its kwargs): enqueue it
GeneratorModelOf = Callable[[EngineGate, Callable[[ModelInfo], None]], AsyncModel]


@dataclass
class Context:
    """The adapters a service uses, built once per process on first use (never at import).
    `bootstrap` wires the real ones, or the fakes it is given (unit tests)."""

    settings: Settings
    app: Celery
    send: Send
    given_store: ObjectStore | None = None
    given_redis: redis.Redis | None = None
    judge_model_of: Callable[[str], Model] | None = None
    generator_model_of: GeneratorModelOf | None = None
    _pid: int = field(default_factory=os.getpid)
    _caches: dict[str, BoundedCache] = field(default_factory=dict)

    # --- the adapters ------------------------------------------------------------------

    @cached_property
    def store(self) -> ObjectStore:
        # boto3 clients are not fork-safe: each worker child builds its own on first use.
        return self.given_store or S3Store(self.settings)

    @cached_property
    def redis(self) -> redis.Redis:
        return self.given_redis or redis.Redis.from_url(
            self.settings.redis_url, socket_timeout=30, health_check_interval=30
        )

    @cached_property
    def metrics(self) -> RedisMetrics:
        return RedisMetrics(self.redis)

    def task(self, name: str) -> Callable[[Callable[..., None]], Any]:
        """A stage task of this service's app, on the base class every stage shares
        (StageTask); not shared with other apps (each bootstrap is its own)."""
        return cast(
            Callable[[Callable[..., None]], Any],
            self.app.task(name=name, base=StageTask, shared=False, rsieve_ctx=self),
        )

    def guard(self, task: str, run: str, shard: str) -> ItemGuard:
        return ItemGuard(self, task, run, shard)

    def judge_model(self, name: str) -> Model:
        """The judge's model, on the judge's engine (one engine per role): Triton, or an
        OpenAI-compatible server (settings.judge_interface)."""
        if self.judge_model_of is not None:
            return self.judge_model_of(name)
        return open_model(self.settings, "judge")

    def generator_model(
        self, gate: EngineGate, on_ready: Callable[[ModelInfo], None], settings: Settings
    ) -> AsyncModel:
        """The generator's model on its engine (Triton or an OpenAI-compatible server),
        sampling as `settings` (the run's) say, feeding through `gate`; `on_ready` sees
        what the model is before any request."""
        if self.generator_model_of is not None:
            return self.generator_model_of(gate, on_ready)
        return open_model(settings, "generator", gate, on_ready=on_ready)

    def images(self, items: Iterable[Item]) -> dict[str, bytes]:
        """sha256 -> bytes of the items' images: ranged reads of the pool's packs."""
        return read_images(self.store, [i.image_at for i in items if i.image_at])

    def cache(self, name: str, size: int) -> BoundedCache:
        """This context's cache `name` (made on first use), never a module global: two
        contexts in one process (tests, or two stores) never share entries."""
        if name not in self._caches:
            self._caches.setdefault(name, BoundedCache(size))
        return self._caches[name]

    def next(self, task: str, **kwargs: Any) -> None:
        self.send(task, kwargs)

    # --- stored outputs (services/outputs.py) ---------------------------------------------

    def load_json(self, key: str) -> dict[str, Any] | None:
        return outputs.load_json(self, key)

    def load(self, run: str, stage: str, shard: str) -> ShardOutput:
        return outputs.load(self, run, stage, shard)

    def quarantined(self, run: str, stage: str, shard: str) -> list[Quarantined]:
        return outputs.quarantined(self, run, stage, shard)

    def load_raw(self, run: str, stage: str, shard: str) -> dict[str, Any]:
        return outputs.load_raw(self, run, stage, shard)

    def calibration_shard(self, run: str, shard: str) -> CalibrationShard | None:
        return outputs.calibration_shard(self, run, shard)

    def save(self, out: ShardOutput) -> None:
        outputs.save(self, out)

    def put_sealed(self, key: str, model: BaseModel) -> None:
        outputs.put_sealed(self, key, model)

    def done(self, run: str, stage: str, shard: str) -> bool:
        return outputs.done(self, run, stage, shard)

    def shard_index(self, run: str) -> dict[str, Any] | None:
        return outputs.shard_index(self, run)

    def stored_shards(self, run: str, stage: str) -> set[str]:
        return outputs.stored_shards(self, run, stage)

    # --- fan-out (services/fanout.py) -----------------------------------------------------

    def last_done(self, key: str, member: str | int, total: int) -> bool:
        return fanout.last_done(self, key, member, total)

    def send_once(self, key: str) -> bool:
        return fanout.send_once(self, key)

    # --- a run's bookkeeping (services/runs.py) -------------------------------------------

    def fingerprint(self, settings: Settings | None = None) -> dict[str, object]:
        return runs.fingerprint(self, settings)

    def create_run(
        self,
        *,
        pool_uri: str,
        pool_sha256: str,
        dataset: str,
        settings: Settings | None = None,
        index_extra: dict[str, Any] | None = None,
    ) -> str:
        return runs.create_run(
            self,
            pool_uri=pool_uri,
            pool_sha256=pool_sha256,
            dataset=dataset,
            settings=settings,
            index_extra=index_extra,
        )

    def spec(self, run: str) -> RunSpec:
        return runs.spec(self, run)

    def run_settings(self, run: str) -> Settings:
        return runs.run_settings(self, run)

    def dataset_profiles(self, dataset: str) -> dict[str, FamilyProfile]:
        return runs.dataset_profiles(self, dataset)

    def load_run(self, run: str) -> tuple[dict[str, Any] | None, dict[str, dict[str, ShardOutput]]]:
        return runs.load_run(self, run)

    def compacted(self, run: str) -> bool:
        return runs.compacted(self, run)

    def reconcile(self, run: str) -> list[tuple[str, dict[str, Any]]]:
        return runs.reconcile(self, run)
