"""The stage task machinery every service's tasks run on: the base task class (late acks,
transient failures retried with backoff, Redis unreachable requeues the shard, metrics of
every task) and per-item poison isolation (ItemGuard). services/common.py wires them."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar

import redis
from celery import Celery
from celery.exceptions import Reject
from kombu.exceptions import OperationalError

from rsieve.adapters.metrics import RedisMetrics, log_context
from rsieve.errors import RetryableError
from rsieve.schemas import ShardOutput
from services.liveness import Held

if TYPE_CHECKING:
    from services.common import Context

log = logging.getLogger("rsieve")


# Redis (the broker, ItemGuard's counters, progress) unreachable inside a task: the
# shard's message must go back to its queue. OperationalError is a publish that failed
# after kombu's retries.
BROKER_DOWN = (redis.ConnectionError, redis.TimeoutError, OperationalError)


class StageTask(Held):
    """Base of every stage task: late acks (from the app), transient failures retried with
    backoff, every other failure logged with its run and shard.

    Redis unreachable inside the task (ItemGuard's counters, the next stage's message, a
    retry's message) requeues the shard, never fails it: a failed shard is acked, and
    nothing would run it again."""

    autoretry_for = (RetryableError,)
    retry_backoff = 2
    retry_backoff_max = 60
    retry_jitter = True
    max_retries = 20

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().__call__(*args, **kwargs)
        except BROKER_DOWN as exc:
            raise Reject(exc, requeue=True) from exc
        except Reject as exc:
            if exc.requeue or not isinstance(exc.reason, BROKER_DOWN):
                raise
            raise Reject(exc.reason, requeue=True) from exc

    _started: ClassVar[dict[str, float]] = {}

    def before_start(self, task_id: str, args: Any, kwargs: Any) -> None:
        log_context(run=kwargs.get("run"), shard=kwargs.get("shard"), task=self.name)
        self._started[task_id] = time.monotonic()
        log.info("start %s run=%s shard=%s", self.name, kwargs.get("run"), kwargs.get("shard"))

    # Metrics (rsieve.adapters.metrics): latency, retries, failures to Redis; never fail a task.
    def after_return(
        self, status: str, retval: Any, task_id: str, args: Any, kwargs: Any, einfo: Any
    ) -> None:
        started = self._started.pop(task_id, None)
        if started is not None:
            _safely(
                lambda: _task_metrics(self.app).observe(
                    "rsieve_stage_seconds", time.monotonic() - started, self.name, status.lower()
                )
            )
        log_context()

    def on_retry(
        self, exc: BaseException, task_id: str, args: Any, kwargs: Any, einfo: Any
    ) -> None:
        _safely(
            lambda: _task_metrics(self.app).inc(
                "rsieve_task_retries", self.name, type(exc).__name__
            )
        )

    def on_failure(
        self, exc: BaseException, task_id: str, args: Any, kwargs: Any, einfo: Any
    ) -> None:
        _safely(
            lambda: _task_metrics(self.app).inc(
                "rsieve_task_failures", self.name, type(exc).__name__
            )
        )


_METRICS: dict[tuple[int, str], RedisMetrics] = {}


def _task_metrics(app: Celery) -> RedisMetrics:
    """One Redis client per process (prefork children build their own)."""
    key = (os.getpid(), str(app.conf.broker_url))
    if key not in _METRICS:
        _METRICS[key] = RedisMetrics(redis.Redis.from_url(key[1], socket_timeout=5))
    return _METRICS[key]


def _safely(fn: Callable[[], Any]) -> None:
    try:
        fn()
    except redis.RedisError as exc:
        log.warning("metrics not recorded: %s", exc)


def observe_shard(ctx: Context, out: ShardOutput) -> None:
    """Counters and run progress for a stored stage output; quarantines logged by item."""
    _safely(lambda: ctx.metrics.record_shard(out))
    for q in out.quarantined:
        log.info(
            "quarantined",
            extra={"item": q.id, "line": q.line, "reason": q.reason, "stage": q.stage},
        )


class ItemGuard:
    """Per-item poison isolation for one delivery of a shard.

    Each delivery of a (task, run, shard) is counted in Redis. Up to `max_deliveries` the
    shard runs normally. Past it, the stage runs item by item and marks the item in flight
    before touching it; an item still marked from an earlier delivery is the one that
    killed the worker, and is quarantined with reason `max_deliveries` instead of run."""

    def __init__(self, ctx: Context, task: str, run: str, shard: str) -> None:
        self._redis = ctx.redis
        base = f"rsieve:{task}:{run}:{shard}"
        self._inflight = f"{base}:inflight"
        self.deliveries = int(self._redis.incr(f"{base}:deliveries"))
        self._redis.expire(f"{base}:deliveries", 7 * 24 * 3600)
        self.isolating = self.deliveries > ctx.settings.max_deliveries

    def run(
        self,
        items: list[Any],
        fn: Callable[[Any], Any],
        *,
        poisoned: Callable[[Any], Any],
        key: Callable[[Any], int],
    ) -> list[Any]:
        """fn(item) for every item; in isolation, poisoned(item) for the item that kept
        killing its worker."""
        results = []
        for item in items:
            if self.isolating:
                if self._redis.hexists(self._inflight, key(item)):
                    log.error("quarantining poison item at line %s", key(item))
                    results.append(poisoned(item))
                    continue
                self._redis.hset(self._inflight, key(item), 1)
            try:
                results.append(fn(item))
            finally:
                # Reached on success and on ordinary exceptions (a retry); a worker that
                # dies leaves the mark, which is what identifies the poison item.
                if self.isolating:
                    self._redis.hdel(self._inflight, key(item))
        return results

    def batch(
        self,
        items: list[Any],
        fn: Callable[[list[Any]], list[Any]],
        *,
        poisoned: Callable[[Any], Any],
        key: Callable[[Any], int],
    ) -> list[Any]:
        """fn(items) in one call (one Triton batch); item by item when isolating."""
        if not self.isolating:
            return fn(items)
        return self.run(items, lambda item: fn([item])[0], poisoned=poisoned, key=key)
