"""A run's stored outputs: each stage's sealed output per shard, read with its seal checked
and validated, and the corrupt-output redo (an output that is not what was written is moved
aside and its stage done again, never handed on or failed on for ever; docs/decisions.md).
Every function takes the process's StageContext; Context's methods of the same names
call them."""

from __future__ import annotations

import hashlib
import json
import logging
import time
from typing import Any, NoReturn, TypeVar

import redis
from celery import current_task
from pydantic import BaseModel, ValidationError

from rsieve import keys
from rsieve.dataset.audit import plan_reconcile
from rsieve.envelope import CorruptOutput, open_envelope, seal
from rsieve.errors import CorruptOutputError, NotFoundError
from rsieve.judge.calibration import CalibrationShard
from rsieve.schemas import STAGES, Quarantined, ShardOutput, ShardQuarantine
from services.stage import observe_shard
from services.stage_context import StageContext

log = logging.getLogger("rsieve")

M = TypeVar("M", bound=BaseModel)


def load_json(ctx: StageContext, key: str) -> dict[str, Any] | None:
    """A stored JSON object, None when the key is absent."""
    try:
        return dict(json.loads(ctx.store.get(key)))
    except NotFoundError:
        return None


def load(ctx: StageContext, run: str, stage: str, shard: str) -> ShardOutput:
    """A stored stage output, its seal checked (`opened`)."""
    return opened(ctx, run, stage, shard, keys.stage_output(run, stage, shard), ShardOutput)


def quarantined(ctx: StageContext, run: str, stage: str, shard: str) -> list[Quarantined]:
    """A stored output's quarantine alone (its items are not validated)."""
    key = keys.stage_output(run, stage, shard)
    return list(opened(ctx, run, stage, shard, key, ShardQuarantine).quarantined)


def load_raw(ctx: StageContext, run: str, stage: str, shard: str) -> dict[str, Any]:
    """A stored stage output as JSON, its seal checked, not validated."""
    key = keys.stage_output(run, stage, shard)
    data = ctx.store.get(key)
    return dict(json.loads(_body(ctx, run, stage, shard, key, data)))


def calibration_shard(ctx: StageContext, run: str, shard: str) -> CalibrationShard | None:
    """A shard's calibration (the judge's, sealed like its output); None when absent."""
    try:
        key = keys.calibration(run, shard)
        return opened(ctx, run, "judge", shard, key, CalibrationShard)
    except NotFoundError:
        return None


def save(ctx: StageContext, out: ShardOutput) -> None:
    ctx.store.put(
        keys.stage_output(out.run, out.stage, out.shard),
        seal(out.model_dump_json().encode()),
        content_type="application/json",
    )
    observe_shard(ctx, out)


def put_sealed(ctx: StageContext, key: str, model: BaseModel) -> None:
    """A stage's other output (a calibration shard) stored sealed as `save` stores one."""
    ctx.store.put(key, seal(model.model_dump_json().encode()), content_type="application/json")


def done(ctx: StageContext, run: str, stage: str, shard: str) -> bool:
    return ctx.store.exists(keys.stage_output(run, stage, shard))


def shard_index(ctx: StageContext, run: str) -> dict[str, Any] | None:
    return load_json(ctx, keys.shards(run))


def stored_shards(ctx: StageContext, run: str, stage: str) -> set[str]:
    prefix = keys.stage_prefix(run, stage)
    return {k[len(prefix) :].removesuffix(".json") for k in ctx.store.list(prefix)}


def opened(ctx: StageContext, run: str, stage: str, shard: str, key: str, model: type[M]) -> M:
    """The object at `key`, written by `stage` for `shard`, as `model`: its seal checked
    (rsieve.envelope) and validated. One that is not what was written is redone (`redo`
    raises CorruptOutputError), never handed on or failed on for ever."""
    data = ctx.store.get(key)
    body = _body(ctx, run, stage, shard, key, data)
    try:
        return model.model_validate_json(body)
    except ValidationError as exc:
        detail = " ".join(str(exc).split())[:500]
        redo(ctx, run, stage, shard, key, data, CorruptOutput("invalid", detail))


def _body(ctx: StageContext, run: str, stage: str, shard: str, key: str, data: bytes) -> bytes:
    found = open_envelope(data)
    if isinstance(found, CorruptOutput):
        redo(ctx, run, stage, shard, key, data, found)
    if not found.sealed:
        _count(ctx, "rsieve_unsealed_outputs", stage)
    return found.body


def _count(ctx: StageContext, name: str, *labels: str) -> None:
    try:
        ctx.metrics.inc(name, *labels)
    except redis.RedisError as exc:
        log.warning("metrics not recorded: %s", exc)


def redo(
    ctx: StageContext,
    run: str,
    stage: str,
    shard: str,
    key: str,
    data: bytes,
    found: CorruptOutput,
) -> NoReturn:
    """`stage`'s output for `shard`, found corrupt at `key`, done again: the object is
    moved aside (runs/<run>/corrupt/, with a record of why and who read it), the
    outputs of `stage` and every later stage for the shard are deleted (what followed
    from a lost output is not trusted, and a later stage must not see an earlier one
    twice), counted (rsieve_corrupt_outputs), and the shard's first missing stage is
    sent (plan_reconcile): each stage sends the next, the judge the compaction.
    Raises CorruptOutputError: the reading task ends there (StageTask)."""
    digest = hashlib.sha256(data).hexdigest()
    record = {
        "run": run,
        "stage": stage,
        "shard": shard,
        "key": key,
        "reason": found.reason,
        "detail": found.detail,
        "bytes": len(data),
        "sha256": digest,
        "read_by": getattr(current_task, "name", None),
        "at": time.time(),
    }
    ctx.store.put(keys.corrupt_copy(run, stage, shard, digest), data)
    ctx.store.put(
        keys.corrupt_record(run, stage, shard, digest),
        json.dumps(record).encode(),
        content_type="application/json",
    )
    redone = STAGES[STAGES.index(stage) :]
    for later in redone:
        ctx.store.delete(keys.stage_output(run, later, shard))
    if "judge" in redone:
        ctx.store.delete(keys.calibration(run, shard))
    _count(ctx, "rsieve_corrupt_outputs", stage, found.reason)
    log.error(
        "corrupt stored output %s (%s: %s): moved aside, %s redone for shard %s",
        key,
        found.reason,
        found.detail,
        stage,
        shard,
    )
    lines = ((shard_index(ctx, run) or {}).get("shards") or {}).get(shard)
    if lines is not None:
        present = {st: set() if st in redone else {shard} for st in STAGES}
        plan = plan_reconcile({"shards": {shard: lines}}, present, compacted=True)
        for task, kwargs in plan:
            ctx.next(task, run=run, **kwargs)
    raise CorruptOutputError(key, found.reason, found.detail)
