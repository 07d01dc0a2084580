"""Continuous ingestion: `rsieve.watch` (clean queue, sent by Celery beat every
`watch_interval_s`) lists `watch_prefix`, and takes each ready pool folder (rsieve.watch)
exactly once: a Redis claim (SET NX) keeps two looks from taking it together, and the
`_taken.json` marker written into the folder (run, pool URI, time) keeps it from ever being
taken again. Taking is uploading the folder as a pool (`upload_pool`: any pool format,
content-addressed under pools/<sha>/) and submitting it as POST /runs does (same run id)."""

from __future__ import annotations

import json
import logging
import tempfile
import time
from pathlib import Path
from typing import Any

from rsieve import redis_keys
from rsieve.adapters.pools import upload_pool
from rsieve.clean.cleaning import pool_image_path
from rsieve.errors import ConflictError, PermanentError
from rsieve.run.submission import RECORD_SUFFIXES
from rsieve.run.watch import COMPLETE, TAKEN, pool_folders, readiness, watch_prefix
from services.context import Context

log = logging.getLogger("rsieve")

# Its Redis keys (rsieve.redis_keys): size, claim and taken per folder, looks, takes.
LOOKS = redis_keys.WATCH_LOOKS  # looks completed (a counter)
TAKES = redis_keys.WATCH_TAKES  # hash folder -> times taken (1, always; tests read it)


def register_watch(ctx: Context) -> None:
    @ctx.app.task(name="rsieve.watch", ignore_result=True, shared=False)
    def watch() -> list[str]:
        return look(ctx)


def look(ctx: Context) -> list[str]:
    """One look at the watched prefix; returns the runs submitted by it."""
    prefix = watch_prefix(ctx.settings.watch_prefix)
    if not prefix:
        return []
    runs = []
    for folder, files in pool_folders(ctx.store.sizes(prefix), prefix).items():
        if files.get(TAKEN) is not None or ctx.redis.exists(redis_keys.watch_taken(folder)):
            continue
        size_key, now = redis_keys.watch_size(folder), time.time()
        raw = ctx.redis.get(size_key)
        seen = None
        if raw is not None:
            seen_size, seen_at = json.loads(raw)
            seen = (int(seen_size), float(seen_at))
        ready, why = readiness(files, seen, now, ctx.settings.watch_interval_s)
        size = files.get("items.jsonl", -1)
        if seen is None or seen[0] != size:  # the time a size was first seen is kept
            ctx.redis.set(size_key, json.dumps([size, now]), ex=redis_keys.KEPT_S)
        if not ready:
            log.info("watch: %s not ready: %s", folder, why)
            continue
        # The claim outlives any take (the task time limit kills a longer one); a take
        # that died is retried by a later look once it expires, and rewrites the same runs.
        if not ctx.redis.set(
            redis_keys.watch_claim(folder), "1", nx=True, ex=ctx.settings.task_time_limit_s + 60
        ):
            continue
        if ctx.store.exists(folder + TAKEN):  # listed before another look marked it
            continue
        marker = _take(ctx, folder, files)
        ctx.store.put(
            folder + TAKEN, json.dumps(marker, indent=1).encode(), content_type="application/json"
        )
        ctx.redis.set(redis_keys.watch_taken(folder), marker.get("run") or "error")
        ctx.redis.hincrby(TAKES, folder, 1)
        log.info("watch: took %s (%s): %s", folder, why, marker)
        if marker.get("run"):
            runs.append(marker["run"])
    ctx.redis.incr(LOOKS)
    return runs


def _take(ctx: Context, folder: str, sizes: dict[str, int]) -> dict[str, Any]:
    """Upload the folder as a pool and submit it; the marker to write (run or error). An
    image over image_max_bytes (by its listed size) is never fetched: a sparse file of its
    size stands in, so the upload refuses it (image_too_large) as it would the file."""
    s, store = ctx.settings, ctx.store
    marker: dict[str, Any] = {"folder": folder, "taken_at": time.time()}
    with tempfile.TemporaryDirectory(prefix="rsieve-watch-") as tmp:
        root = Path(tmp)
        for key in store.list(folder):
            name = pool_image_path(key[len(folder) :])
            if name is None or name in (TAKEN, COMPLETE):
                continue
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            size = sizes.get(key[len(folder) :], 0)
            if size > s.image_max_bytes and Path(name).suffix not in RECORD_SUFFIXES:
                with (root / name).open("wb") as placeholder:
                    placeholder.truncate(size)
                continue
            (root / name).write_bytes(store.get(key))
        try:
            pool_uri = upload_pool(store, root, image_max_bytes=s.image_max_bytes)
        except PermanentError as exc:  # not a pool: taken once, with the reason
            return marker | {"error": str(exc)[:500]}
    pool_sha, dataset = pool_uri.rstrip("/").rsplit("/", 1)[1], s.watch_dataset
    try:  # as POST /runs: the same id, the same dataset check (services.runs.create_run)
        run = ctx.create_run(
            pool_uri=pool_uri,
            pool_sha256=pool_sha,
            dataset=dataset,
            index_extra={"watched": folder},
        )
    except ConflictError as exc:  # taken once, with the reason
        return marker | {"error": str(exc)[:500]}
    return marker | {"run": run, "dataset": dataset, "pool_uri": pool_uri}
