"""The sweeper: `rsieve.sweep` (clean queue, sent by Celery beat every `sweep_interval_s`)
finds runs that stalled with no message in flight (rsieve.dataset.audit.stalled: nothing recorded
for `sweep_after_s`) and reconciles them, enqueuing each shard's next missing stage or the
compaction (`Context.reconcile`, what `rsieve reconcile RUN` does by hand). Safe to run any
time: every stage skips shards whose output exists. Compacted runs are remembered in Redis
(`DONE`), so a sweep reads only the runs still open. A stopped run (services/stage.py: every
item of a shard failed) is left alone: resuming it is a person's call, once it is fixed."""

from __future__ import annotations

import json
import logging
import time

from rsieve import keys, redis_keys
from rsieve.adapters.metrics import progress
from rsieve.dataset.audit import stalled
from rsieve.schemas import STAGES
from services.context import Context
from services.stage import stopped

log = logging.getLogger("rsieve")

DONE = redis_keys.SWEEP_DONE  # runs found compacted: never looked at again


def register_sweep(ctx: Context) -> None:
    @ctx.app.task(name="rsieve.sweep", ignore_result=True, shared=False)
    def sweep_task() -> list[str]:
        return sweep(ctx)


def sweep(ctx: Context, now: float | None = None) -> list[str]:
    """One sweep; returns the runs reconciled."""
    now = time.time() if now is None else now
    swept = []
    for key in ctx.store.list(keys.RUN_INDEX_PREFIX):
        entry = json.loads(ctx.store.get(key))
        run = entry["run"]
        if ctx.redis.sismember(DONE, run):
            continue
        if ctx.compacted(run):
            ctx.redis.sadd(DONE, run)
            continue
        if stopped(ctx, run):  # a person resumes it (`rsieve reconcile`) once it is fixed
            continue
        last = [p["last_t"] for p in progress(ctx.redis, run, STAGES).values() if p["last_t"]]
        since = float(entry.get("submitted_at") or 0.0)
        if stalled(max(last, default=None), since, now, ctx.settings.sweep_after_s):
            plan = ctx.reconcile(run)
            log.warning("run %s stalled: reconciled, %d task(s) enqueued", run, len(plan))
            swept.append(run)
    return swept
