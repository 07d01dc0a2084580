"""A long shard's progress that survives its worker, and its time limit (issue 37, "Nothing
stalls"; docs/decisions.md, "Long shards resume").

`Progress`: the replies a generate shard has had, stored at rsieve.keys.progress as each
batch returns (rsieve.generate.progress), read by a redelivery, which asks only the rest;
deleted once the shard's output is stored. The judge needs none of its own: each verdict is
stored in the verdict cache as its batch returns (services/judge/ask.py), and a redelivery
finds it there.

`observe_pace` / `time_limit`: the seconds per item a stage's shards observe, an EWMA in
Redis recorded per batch (so a shard that never finishes is measured too), and from it the
hard time limit of the next shard sent (rsieve.run.limits)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from typing import Any

import redis
from pydantic import ValidationError

from rsieve import keys, redis_keys
from rsieve.envelope import CorruptOutput, open_envelope, seal
from rsieve.errors import NotFoundError
from rsieve.generate.generation import ModelInfo, ModelReply
from rsieve.generate.progress import ShardProgress, asked_digest, resumed
from rsieve.run.limits import ewma, limit_ceiling, shard_time_limit
from rsieve.schemas import STAGE_TASKS
from services.stage_context import StageContext

log = logging.getLogger("rsieve")

# The tasks whose limit follows their model's pace, by the stage whose pace it is.
PACED = {STAGE_TASKS[stage]: stage for stage in ("generate", "judge")}


def observe_pace(ctx: StageContext, stage: str, seconds: float, items: int) -> None:
    """One more observation of `stage`'s pace: `items` answered in `seconds`. Never fails
    the shard (Redis down: not recorded)."""
    if items <= 0 or seconds <= 0:
        return
    try:
        old = ctx.redis.get(redis_keys.pace(stage))
        mean = ewma(
            float(old) if old is not None else None,
            seconds / items,
            ctx.settings.shard_latency_alpha,
        )
        ctx.redis.set(redis_keys.pace(stage), f"{mean:.6f}", ex=redis_keys.KEPT_S)
    except (redis.RedisError, ValueError) as exc:
        log.warning("pace of %s not recorded: %s", stage, exc)


def pace(ctx: StageContext, stage: str) -> float | None:
    """`stage`'s observed seconds per item; None when none was observed."""
    try:
        value = ctx.redis.get(redis_keys.pace(stage))
        return float(value) if value is not None else None
    except (redis.RedisError, ValueError):
        return None


def time_limit(ctx: StageContext, task: str, kwargs: dict[str, Any]) -> int | None:
    """The hard time limit of `task` sent with `kwargs`: for a generate or judge shard, from
    its stage's pace and its lines; None (the app's task_time_limit_s) for any other."""
    stage, lines = PACED.get(task), kwargs.get("lines")
    if stage is None or not isinstance(lines, int):
        return None
    s = ctx.settings
    return shard_time_limit(
        pace(ctx, stage),
        lines,
        factor=s.shard_time_limit_factor,
        floor_s=s.task_time_limit_s,
        ceiling_s=limit_ceiling(
            s.shard_time_limit_max_s, s.visibility_timeout_s, s.unacked_restore_interval_s
        ),
    )


class Progress:
    """One delivery's view of a shard's stored progress (module docstring): the replies it
    may reuse (`replies`, by position; `info`, what answered them) and `record`, called as
    each batch returns (from any thread)."""

    def __init__(
        self, ctx: StageContext, run: str, stage: str, shard: str, identities: Sequence[str]
    ) -> None:
        self.ctx, self.run, self.stage, self.shard = ctx, run, stage, shard
        self.key = keys.progress(run, stage, shard)
        self.digest = asked_digest(identities)
        stored = self._read()
        self.replies: dict[int, ModelReply] = resumed(stored, self.digest, len(identities))
        self.reused = set(self.replies)
        self.info: ModelInfo | None = stored.info if stored and self.replies else None
        if self.replies:
            log.info("shard %s resumes: %d replies stored", shard, len(self.replies))
        self._lock = threading.Lock()
        self._started = time.monotonic()
        self._answered = 0

    def _read(self) -> ShardProgress | None:
        try:
            opened = open_envelope(self.ctx.store.get(self.key))
        except NotFoundError:
            return None
        try:
            if isinstance(opened, CorruptOutput):
                raise ValueError(opened.reason)
            return ShardProgress.model_validate_json(opened.body)
        except (ValueError, ValidationError) as exc:
            log.warning("progress %s unusable (%s): the shard starts over", self.key, exc)
            return None

    def record(
        self, positions: Sequence[int], answers: Sequence[Any], info: ModelInfo | None
    ) -> None:
        """A batch returned: its replies (failed calls are not stored) saved with the rest,
        and the stage's pace observed."""
        with self._lock:
            for k, answer in zip(positions, answers, strict=True):
                if isinstance(answer, ModelReply):
                    self.replies[k] = answer
                    self.reused.discard(k)
            self.info = info or self.info
            self._answered += len(positions)
            body = ShardProgress(
                run=self.run,
                shard=self.shard,
                stage=self.stage,
                asked=self.digest,
                info=self.info,
                replies=dict(self.replies),
            ).model_dump_json()
            answered, elapsed = self._answered, time.monotonic() - self._started
            self.ctx.store.put(self.key, seal(body.encode()), content_type="application/json")
        observe_pace(self.ctx, self.stage, elapsed, answered)

    def clear(self) -> None:
        """The shard's output is stored: its progress is no longer needed."""
        try:
            self.ctx.store.delete(self.key)
        except NotFoundError:
            pass
