"""What the run routes do, apart from HTTP: a run's spec, shards, progress, liveness and
quarantine. Everything is read from S3 (the source of truth) but a run's progress:
shard counts and rates come from the workers' Redis progress records (one round trip),
because listing every stage's outputs on each poll costs the API more than the run's
other work does (docs/performance.md). S3 answers when asked (`exact`) and whenever Redis
cannot (away, no records, a finished run's records short of its shards). Submission is
services/api/submission.py; the review page's data services/api/reviews.py."""

from __future__ import annotations

import json
import time
from collections import Counter
from typing import Any, Literal

from fastapi import HTTPException

from rsieve import keys
from rsieve.adapters.committed import run_file_key, run_manifest
from rsieve.adapters.holdings import Holdings
from rsieve.adapters.metrics import progress
from rsieve.errors import NotFoundError
from rsieve.run.holdings import run_liveness, stage_eta
from rsieve.run.submission import is_run_id
from rsieve.schemas import STAGES, RunSpec
from services.api.models import StageProgress
from services.context import Context

WRITE_ONCE_KEPT = 4096  # write-once objects an API process keeps in memory


def _write_once(ctx: Context, key: str) -> bytes:
    """An object written once and never changed (a run's spec, its shard index, its entry in
    the run index): from S3 until it exists, then from memory. NotFoundError is not kept."""
    cache = ctx.cache("write_once", WRITE_ONCE_KEPT)
    data = cache.get(key)
    if data is None:
        data = cache.put(key, ctx.store.get(key))
    return bytes(data)


def spec(ctx: Context, run: str) -> RunSpec:
    if not is_run_id(run):
        raise HTTPException(404, f"no run {run!r}")
    try:
        return RunSpec.model_validate_json(_write_once(ctx, keys.run_spec(run)))
    except NotFoundError:
        raise HTTPException(404, f"no run {run!r}") from None


def shard_index(ctx: Context, run: str) -> dict[str, Any] | None:
    try:
        return dict(json.loads(_write_once(ctx, keys.shards(run))))
    except NotFoundError:
        return None


def index_entry(ctx: Context, run: str) -> dict[str, Any] | None:
    try:
        return dict(json.loads(_write_once(ctx, keys.run_index(run))))
    except NotFoundError:
        return None


def manifest(ctx: Context, s: RunSpec) -> dict[str, Any] | None:
    return run_manifest(ctx.store, s.dataset, s.run)


def run_file(ctx: Context, s: RunSpec, name: str) -> bytes:
    return ctx.store.get(run_file_key(ctx.store, s.dataset, s.run, name))


def live_progress(ctx: Context, run: str) -> dict[str, dict[str, Any]] | None:
    """The workers' progress records per stage (rsieve.adapters.metrics.progress), None when Redis
    does not answer."""
    try:
        return progress(ctx.redis, run, STAGES)
    except Exception:  # noqa: BLE001 - progress is advisory; S3 still answers
        return None


def shard_counts(
    ctx: Context,
    run: str,
    live: dict[str, dict[str, Any]] | None,
    *,
    exact: bool,
    finished: bool = False,
    shards: int | None = None,
) -> tuple[dict[str, int], Literal["redis", "s3"]]:
    """Shards each stage has stored, and where that was counted: the progress records
    (written right after each output is stored), or by listing S3 when asked (`exact`),
    when Redis is away, when it has no record of the run (a new run lists empty prefixes;
    a Redis rebuilt mid-run would otherwise read as no progress), or when a finished run's
    records fall short of its shards. Counts from Redis can only lag S3, and only if a
    record was lost (a metrics write is never retried)."""
    counts = {stage: int(live[stage]["shards"]) for stage in STAGES} if live else {}
    if (
        exact
        or not any(counts.values())
        or (finished and any(n != shards for n in counts.values()))
    ):
        return {stage: len(ctx.stored_shards(run, stage)) for stage in STAGES}, "s3"
    return counts, "redis"


def stage_progress(
    live: dict[str, dict[str, Any]] | None,
    shards: int | None,
    done: dict[str, int],
    submitted_at: float | None,
) -> dict[str, StageProgress]:
    """Shard counts as given; items per family and timing from the workers' Redis records
    (absent when Redis was rebuilt: counts stay, rates become unknown)."""
    live = live or {}
    now = time.time()
    out: dict[str, StageProgress] = {}
    for stage in STAGES:
        rec = live.get(stage) or {}
        n = done[stage]
        p = StageProgress(
            shards_done=n,
            shards_total=shards,
            items=rec.get("items") if rec.get("shards") == n else None,
            families=rec.get("families", {}),
        )
        start = submitted_at or rec.get("first_t")
        finished = shards is not None and n >= shards
        end = rec.get("last_t") if finished else now
        if start and end and n and end > start:
            p.rate_shards_s = round(n / (end - start), 4)
            if p.items is not None:
                p.rate_items_s = round(p.items / (end - start), 3)
            if shards is not None:
                p.eta_s = 0.0 if finished else round((shards - n) / p.rate_shards_s, 1)
        out[stage] = p
    return out


def liveness(ctx: Context, run: str) -> dict[str, Any] | None:
    """The run's shards in flight (stage -> holder, age, orphaned), its orphaned shards
    requeued, its failed shards and whether it can finish (rsieve.run.holdings); None when
    Redis does not answer."""
    try:
        h = Holdings(ctx.redis, ctx.settings.holder_lapse_s)
        holdings = [x for x in h.all() if x.run == run]
        alive = h.alive({x.holder for x in holdings})
        return run_liveness(run, holdings, alive, h.requeued(run), h.failed(run), time.time())
    except Exception:  # noqa: BLE001 - advisory, as progress is
        return None


def count_liveness(
    ctx: Context,
    progress: dict[str, StageProgress],
    shards: int | None,
    view: dict[str, Any] | None,
) -> None:
    """Each stage's ETA counts its orphaned shards not yet requeued (the wait for their
    holder's heartbeat to lapse and a watcher to requeue them) and is unknown (None) while
    the run has failed shards: it cannot finish."""
    if view is None:
        return
    s = ctx.settings
    for stage, p in progress.items():
        flights = view["in_flight"].get(stage, [])
        p.in_flight = len(flights)
        p.orphaned = sum(1 for f in flights if f["orphaned"])
        if shards is None or (p.rate_shards_s is None and not view["failed"]):
            continue
        p.eta_s = stage_eta(
            shards - p.shards_done,
            p.rate_shards_s,
            pending_orphans=p.orphaned,
            orphan_wait_s=s.holder_lapse_s + s.heartbeat_s,
            failed=len(view["failed"]),
        )


def quarantined(ctx: Context, s: RunSpec) -> list[dict[str, Any]]:
    """Every quarantined item of the run: from the published quarantine.jsonl once the
    run is compacted, else from the stage outputs stored so far."""
    if manifest(ctx, s) is not None:
        raw = run_file(ctx, s, "quarantine.jsonl").decode()
        return [json.loads(line) for line in raw.splitlines() if line.strip()]
    rows = [
        q.model_dump()
        for stage in STAGES
        for shard in ctx.stored_shards(s.run, stage)
        for q in ctx.quarantined(s.run, stage, shard)
    ]
    return sorted(rows, key=lambda q: q["line"])


def tally(items: list[dict[str, Any]], field: str) -> dict[str, int]:
    return dict(sorted(Counter(str(i[field]) for i in items if i[field] is not None).items()))
