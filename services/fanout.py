"""Fan-out bookkeeping in Redis: which member of a step is done (`last_done`, so the last
one sends what follows) and who sends a step's tasks (`send_once`, so a coordinator called
again does not multiply them)."""

from __future__ import annotations

from celery import current_task

from rsieve import redis_keys
from services.stage_context import StageContext


def delivery_id() -> str | None:
    """The id of the message the running task came in (kept when it is redelivered); None
    outside a worker's task."""
    request = getattr(current_task, "request", None)
    task_id = getattr(request, "id", None)
    return str(task_id) if task_id else None


def last_done(ctx: StageContext, key: str, member: str | int, total: int) -> bool:
    """Marks `member` of a fan-out done (a Redis set); True once all `total` are, to
    whoever sees it first and to any redelivery after (what it sends next must be
    idempotent). A set lost with Redis leaves the run to the sweeper."""
    pipe = ctx.redis.pipeline()
    pipe.sadd(key, member)
    pipe.scard(key)
    pipe.expire(key, redis_keys.KEPT_S)
    _, done, _ = pipe.execute()
    return int(done) >= total


def send_once(ctx: StageContext, key: str) -> bool:
    """Whether this call sends a fan-out's tasks: once per `sweep_after_s` (a Redis key
    per fan-out). A coordinator is called more than once for one step (each last task
    of the step before, a redelivery, the sweeper), and each call that re-sent the
    step's unfinished tasks multiplied them. The key holds the id of the message that
    took it, so that message redelivered (its worker died while sending) sends again;
    any other call waits for the key to expire, and the sweeper's call after that sends
    what is still missing."""
    owner = delivery_id()
    ttl = max(1, int(ctx.settings.sweep_after_s))
    if ctx.redis.set(key, owner or "-", nx=True, ex=ttl):
        return True
    return owner is not None and ctx.redis.get(key) == owner.encode()
