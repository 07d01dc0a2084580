"""What a stage's machinery needs of the process it runs in (`StageContext`): the settings,
the bucket, Redis, the metrics and a way to send the next task. services/stage.py,
services/progress.py and the run bookkeeping type against it rather than against
services.context.Context, so each reads, and type-checks, alone. A leaf: it imports
nothing from services."""

from __future__ import annotations

from typing import Any, Protocol

import redis

from rsieve.adapters.metrics import RedisMetrics
from rsieve.adapters.storage import ObjectStore
from rsieve.settings import Settings


class Cache(Protocol):
    """A bounded map a context keeps of objects written once (services.cache.BoundedCache)."""

    def get(self, key: Any) -> Any: ...

    def put(self, key: Any, value: Any) -> Any: ...


class StageContext(Protocol):
    """The adapters of one process (services.context.Context is the one that wires them)."""

    settings: Settings

    @property
    def store(self) -> ObjectStore: ...

    @property
    def redis(self) -> redis.Redis: ...

    @property
    def metrics(self) -> RedisMetrics: ...

    def next(self, task: str, **kwargs: Any) -> None:
        """Send `task` with `kwargs` (the queue, or a test's record of what was sent)."""

    def cache(self, name: str, size: int) -> Cache:
        """This context's cache `name`, made on first use; never shared with another."""
