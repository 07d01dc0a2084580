"""The stage task machinery every service's tasks run on: the base task class (late acks,
transient failures retried with backoff, Redis unreachable requeues the shard, metrics of
every task) and per-item poison isolation (ItemGuard). Typed against StageContext
(services/stage_context.py); services/context.py wires them."""

from __future__ import annotations

import logging
import os
import random
import time
from collections.abc import Callable
from typing import Any, ClassVar

import redis
from celery import Celery
from celery.exceptions import Reject, Retry, TimeLimitExceeded
from kombu.exceptions import OperationalError

from rsieve import __version__, keys, redis_keys
from rsieve.adapters.metrics import RedisMetrics, log_context
from rsieve.backoff import backoff_s
from rsieve.errors import CorruptOutputError, RetryableError
from rsieve.run.failures import (
    DETAIL_MAX_CHARS,
    EveryItemFailed,
    RunFailure,
    bisect,
    stage_error_detail,
)
from rsieve.schemas import STAGE_TASKS, Quarantined, ShardOutput
from services.liveness import Held
from services.progress import PACED
from services.stage_context import StageContext

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
    max_retries = 20
    # A RetryableError's retry (autoretry_for) waits rsieve.backoff's wait from this base
    # (2, 4, 8 ... s, at most a minute), drawn at random up to it so that the shards an
    # outage failed together do not all come back together (`retry`).
    retry_base_s = 2.0

    def retry(self, *args: Any, countdown: float | None = None, **kwargs: Any) -> Retry:
        """Celery's retry, waiting rsieve's one backoff where no delay is given (autoretry
        gives none: Celery's own retry_backoff is off)."""
        if countdown is None and kwargs.get("eta") is None:
            countdown = backoff_s(
                self.request.retries + 1, self.retry_base_s, jitter=random.uniform
            )
        return super().retry(*args, countdown=countdown, **kwargs)

    # The Context that registered the task (Context.task passes it); None on a task made
    # without one, which then fails as Celery's tasks do.
    rsieve_ctx: StageContext | None = None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        ctx, run = self.rsieve_ctx, kwargs.get("run")
        try:
            if ctx is not None and isinstance(run, str) and stopped(ctx, run):
                log.warning("run %s is stopped: %s skipped until it is resumed", run, self.name)
                return None
            return super().__call__(*args, **kwargs)
        except CorruptOutputError as exc:
            # What it read was moved aside and its stage sent again (services.outputs.redo), which
            # sends this stage again after it: this delivery ends here, acked, not failed.
            log.warning("%s: %s; its stage is redone", self.name, exc)
            return None
        except BROKER_DOWN as exc:
            raise Reject(exc, requeue=True) from exc
        except Reject as exc:
            if exc.requeue or not isinstance(exc.reason, BROKER_DOWN):
                raise
            raise Reject(exc.reason, requeue=True) from exc
        except Retry:
            raise
        except Exception as exc:
            if ctx is None or not isinstance(run, str):
                raise
            return self._failed(ctx, run, kwargs, exc)

    def _failed(self, ctx: StageContext, run: str, kwargs: dict[str, Any], exc: Exception) -> None:
        """A try that raised (a transient error past its own retries included): tried again
        with backoff up to `stage_error_retries` times, then once more with its items
        isolated (ItemGuard); past that, or when every item failed, the run stops."""
        if isinstance(exc, EveryItemFailed):
            stop_run(ctx, exc.failure)
            return None
        shard = kwargs.get("shard")
        try:
            tries = record_error(ctx, run, error_field(self.name, kwargs))
        except BROKER_DOWN as down:  # cannot count it: back to its queue, as for an outage
            raise Reject(down, requeue=True) from exc
        if tries <= ctx.settings.stage_error_retries + 1:
            delay = backoff_s(tries, ctx.settings.stage_error_backoff_s)
            log.warning(
                "%s run=%s shard=%s raised %s (try %d): again in %.0f s",
                self.name,
                run,
                shard,
                type(exc).__name__,
                tries,
                delay,
            )
            raise self.retry(exc=exc, countdown=delay, max_retries=self.request.retries + 1)
        failure = RunFailure(
            run=run,
            task=self.name,
            shard=shard if isinstance(shard, str) else None,
            error=type(exc).__name__,
            message=" ".join(str(exc).split())[:DETAIL_MAX_CHARS],
            version=__version__,
            items=0,
        )
        stop_run(ctx, failure)
        return None

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
        if isinstance(exc, TimeLimitExceeded):
            self._past_its_limit(kwargs)

    def _past_its_limit(self, kwargs: dict[str, Any]) -> None:
        """A generate or judge shard killed at its hard time limit (called in the worker's
        main process) is acked like any failure, so nothing would run it again before the
        sweeper (`sweep_after_s`). What it finished is kept (the generator's progress, the
        judge's verdict cache), so it is sent again at once, with a limit from the pace
        its killed delivery recorded: it resumes where it stopped. Every delivery counts
        towards `max_deliveries` (ItemGuard), so a shard that never fits is isolated."""
        ctx, run = self.rsieve_ctx, kwargs.get("run")
        if ctx is None or self.name not in PACED or not isinstance(run, str):
            return
        log.warning(
            "%s run=%s shard=%s past its time limit: sent again",
            self.name,
            run,
            kwargs.get("shard"),
        )
        try:
            ctx.next(self.name, **kwargs)
        except BROKER_DOWN as exc:  # the sweeper sends it once the broker is back
            log.warning("%s not sent again: %s", self.name, exc)


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


def observe_shard(ctx: StageContext, out: ShardOutput) -> None:
    """Counters and run progress for a stored stage output; quarantines logged by item."""
    _safely(lambda: ctx.metrics.record_shard(out))
    for q in out.quarantined:
        log.info(
            "quarantined",
            extra={"item": q.id, "line": q.line, "reason": q.reason, "stage": q.stage},
        )


# --- failures: errors counted per run, a stopped run ------------------------------------
# Redis, per run: tries that raised by task and shard; why the run stopped (its flag, read
# by every task); which task and shard stopped it (for status). runs/<run>/failed.json is
# the record that outlives Redis. `services.runs.reconcile` (`rsieve reconcile`) clears them all.


def error_field(task: str, kwargs: dict[str, Any]) -> str:
    """Which try is counted: the task and its shard, else its other arguments (a partition,
    an ingest step)."""
    if "shard" in kwargs:
        return f"{task}:{kwargs['shard']}"
    rest = ",".join(f"{k}={kwargs[k]}" for k in sorted(kwargs) if k not in ("run", "lines"))
    return f"{task}:{rest}"


def record_error(ctx: StageContext, run: str, field: str) -> int:
    """Count one more try of `field` that raised; how many have."""
    pipe = ctx.redis.pipeline(transaction=False)
    pipe.hincrby(redis_keys.run_errors(run), field, 1)
    pipe.expire(redis_keys.run_errors(run), redis_keys.KEPT_S)
    return int(pipe.execute()[0])


def errors_of(ctx: StageContext, run: str, field: str) -> int:
    return int(ctx.redis.hget(redis_keys.run_errors(run), field) or 0)


def stopped(ctx: StageContext, run: str) -> bool:
    """Whether the run is stopped; False while Redis cannot say (the task then meets the
    outage where it needs Redis, and its shard is requeued as for any outage)."""
    try:
        return bool(ctx.redis.exists(redis_keys.run_stopped(run)))
    except BROKER_DOWN:
        return False


def stop_run(ctx: StageContext, failure: RunFailure) -> None:
    """The run stops: its record stored, its flag set (every task of it is skipped until it
    is resumed), counted and logged."""
    ctx.store.put(
        keys.run_failed(failure.run),
        failure.model_dump_json().encode(),
        content_type="application/json",
    )
    pipe = ctx.redis.pipeline(transaction=False)
    pipe.set(redis_keys.run_stopped(failure.run), failure.reason())
    pipe.hset(
        redis_keys.run_failed(failure.run),
        f"{failure.task}:{failure.shard}",
        failure.model_dump_json(),
    )
    pipe.execute()
    _safely(lambda: ctx.metrics.inc("rsieve_runs_stopped", failure.task, failure.error))
    log.error("run %s stopped: %s", failure.run, failure.reason())


def clear_stop(ctx: StageContext, run: str) -> None:
    """What a resume clears: the run's stop, its failed record and its counted errors."""
    ctx.redis.delete(
        redis_keys.run_stopped(run), redis_keys.run_failed(run), redis_keys.run_errors(run)
    )
    ctx.store.delete(keys.run_failed(run))


class ItemGuard:
    """Per-item isolation for one delivery of a shard: of the item that kills its worker,
    and of the items that raise.

    Each delivery of a (task, run, shard) is counted in Redis. Up to `max_deliveries` the
    shard runs normally. Past it, the stage runs item by item and marks the item in flight
    before touching it; an item still marked from an earlier delivery is the one that
    killed the worker, and is quarantined with reason `max_deliveries` instead of run.

    A shard whose tries raised more than `stage_error_retries` times (StageTask counts
    them) is run with its items isolated: a batch is bisected (rsieve.run.failures.bisect),
    items one by one are each tried alone, and an item that still raises is quarantined
    `stage_error` with the stage, the exception and the rsieve version. When every item
    raises, the shard's failure is not the items': EveryItemFailed stops the run."""

    def __init__(self, ctx: StageContext, task: str, run: str, shard: str) -> None:
        self._ctx = ctx
        self._redis = ctx.redis
        self.task, self.run_id, self.shard = task, run, shard
        self._inflight = redis_keys.inflight(task, run, shard)
        delivered = redis_keys.deliveries(task, run, shard)
        self.deliveries = int(self._redis.incr(delivered))
        self._redis.expire(delivered, redis_keys.KEPT_S)
        raised = errors_of(ctx, run, error_field(STAGE_TASKS[task], {"shard": shard}))
        # A delivery that raised came back by a retry, not by a dead worker: only the rest
        # count towards max_deliveries.
        self.crashing = self.deliveries - raised > ctx.settings.max_deliveries
        self.erroring = raised > ctx.settings.stage_error_retries
        self.isolating = self.crashing or self.erroring

    def _errored(self, item: Any, exc: Exception, poisoned: Callable[[Any], Any]) -> Any:
        log.error("quarantining an item that raises: %s: %s", type(exc).__name__, exc)
        quarantine: Quarantined = poisoned(item)
        detail = stage_error_detail(self.task, exc, __version__)
        return quarantine.model_copy(update={"reason": "stage_error", "detail": detail})

    def _every_item_failed(self, items: int, exc: Exception) -> EveryItemFailed:
        return EveryItemFailed(
            RunFailure(
                run=self.run_id,
                task=STAGE_TASKS[self.task],
                shard=self.shard,
                error=type(exc).__name__,
                message=" ".join(str(exc).split())[:DETAIL_MAX_CHARS],
                version=__version__,
                items=items,
            )
        )

    def run(
        self,
        items: list[Any],
        fn: Callable[[Any], Any],
        *,
        poisoned: Callable[[Any], Any],
        key: Callable[[Any], int],
    ) -> list[Any]:
        """fn(item) for every item; in isolation, poisoned(item) for the item that kept
        killing its worker, and a `stage_error` quarantine for an item that raises."""
        results = []
        last: Exception | None = None
        raised = 0
        for item in items:
            if self.isolating:
                if self._redis.hexists(self._inflight, key(item)):
                    log.error("quarantining poison item at line %s", key(item))
                    results.append(poisoned(item))
                    continue
                self._redis.hset(self._inflight, key(item), 1)
            try:
                results.append(fn(item))
            except BROKER_DOWN:
                raise
            except Exception as exc:
                if not self.erroring:
                    raise
                last, raised = exc, raised + 1
                results.append(self._errored(item, exc, poisoned))
            finally:
                # Reached on success and on ordinary exceptions (a retry); a worker that
                # dies leaves the mark, which is what identifies the poison item.
                if self.isolating:
                    self._redis.hdel(self._inflight, key(item))
        if last is not None and raised == len(items):
            raise self._every_item_failed(len(items), last)
        return results

    def batch(
        self,
        items: list[Any],
        fn: Callable[[list[Any]], list[Any]],
        *,
        poisoned: Callable[[Any], Any],
        key: Callable[[Any], int],
    ) -> list[Any]:
        """fn(items) in one call (one Triton batch); item by item when isolating a crash;
        bisected when isolating items that raise."""
        if not self.isolating:
            return fn(items)
        if self.crashing:
            return self.run(items, lambda item: fn([item])[0], poisoned=poisoned, key=key)
        results, failed = bisect(items, lambda part: fn(list(part)))
        if failed and len(failed) == len(items):
            raise self._every_item_failed(len(items), next(iter(failed.values())))
        return [
            self._errored(items[i], failed[i], poisoned) if i in failed else r
            for i, r in enumerate(results)
        ]
