"""What the run routes do, apart from HTTP: submit, progress, quarantine, review items.
Everything is read from S3 (the source of truth) but a run's progress:
shard counts and rates come from the workers' Redis progress records (one round trip),
because listing every stage's outputs on each poll costs the API more than the run's
other work does (docs/performance.md). S3 answers when asked (`exact`) and whenever Redis
cannot (away, no records, a finished run's records short of its shards)."""

from __future__ import annotations

import contextlib
import hashlib
import heapq
import json
import re
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

from fastapi import HTTPException
from pydantic import ValidationError

from rsieve import keys
from rsieve.adapters.exports import run_file_key, run_manifest
from rsieve.adapters.holdings import Holdings
from rsieve.adapters.metrics import progress
from rsieve.adapters.pools import upload_pool
from rsieve.adapters.storage import parse_s3_uri
from rsieve.errors import ConflictError, NotFoundError, PermanentError
from rsieve.run.holdings import run_liveness, stage_eta
from rsieve.run.packs import INDEX as PACK_INDEX
from rsieve.run.packs import INDEX_BUCKETS, index_bucket_key, read_index
from rsieve.run.submission import ITEMS, REFUSED, digest_of
from rsieve.run.watch import COMPLETE
from rsieve.schemas import DATASET_PATTERN, STAGES, ImageRef, Outcome, RunSpec, ShardOutput
from services.api.models import StageProgress
from services.common import Context


def submit(
    ctx: Context, pool_uri: str, dataset: str, sampling: dict[str, Any] | None = None
) -> str:
    """`sampling`: the run's own choice of the SAMPLING settings (best-of-n), else the
    services'."""
    try:
        settings = ctx.settings.for_run(sampling)
    except ValidationError as exc:  # what was wrong, never the settings it was checked in
        raise HTTPException(422, "; ".join(e["msg"] for e in exc.errors())) from None
    except ValueError as exc:
        raise HTTPException(422, str(exc)) from None
    bucket, prefix = parse_s3_uri(pool_uri)
    if bucket != ctx.settings.s3_bucket or not prefix.endswith("/"):
        raise HTTPException(422, f"pool_uri must be s3://{ctx.settings.s3_bucket}/<prefix>/")
    if not ctx.store.exists(prefix + COMPLETE):
        raise HTTPException(404, "pool upload is not complete (no _complete marker)")
    pool_sha = stored_pool_digest(ctx, prefix)
    try:
        run = ctx.create_run(
            pool_uri=pool_uri, pool_sha256=pool_sha, dataset=dataset, settings=settings
        )
    except ConflictError as exc:
        raise HTTPException(409, str(exc)) from None
    return run


def stored_pool_digest(ctx: Context, prefix: str) -> str:
    """The digest of the pool stored under `prefix`, computed here, never taken from the
    uploader's `_complete` marker (which only says the upload is whole): from items.jsonl
    and the pack index's sha256 of every image (the cleaner re-hashes each image against
    the index: `image_digest_mismatch`), or, for a pool written without packs, from every
    object under the prefix, read here.

    Memory stays bounded whatever the pool's size: items.jsonl is hashed in ranged reads,
    and a large pool's index is read bucket by bucket (the buckets ingest's join reads),
    each bucket sorted to a temporary file and the files merged in name order."""
    store = ctx.store
    items_sha = _streamed_sha256(ctx, prefix + ITEMS)
    refused = _streamed_sha256(ctx, prefix + REFUSED) if store.exists(prefix + REFUSED) else None
    if store.exists(prefix + index_bucket_key(0)):
        with tempfile.TemporaryDirectory(prefix="rsieve-digest-") as tmp:
            return digest_of(items_sha, _bucket_entries(ctx, prefix, Path(tmp)), refused)
    try:
        index = read_index(store.get(prefix + PACK_INDEX), prefix + PACK_INDEX)
        files = {path: ref.sha256 for path, ref in index.images.items()}
    except NotFoundError:
        skip = {ITEMS, REFUSED, COMPLETE}
        files = {
            key[len(prefix) :]: hashlib.sha256(store.get(key)).hexdigest()
            for key in store.list(prefix)
            if key[len(prefix) :] not in skip and not key[len(prefix) :].startswith("_packs/")
        }
    return digest_of(
        items_sha, ((name, bytes.fromhex(files[name])) for name in sorted(files)), refused
    )


DIGEST_CHUNK = 8 * 1024 * 1024  # bytes of a pool file the API holds while hashing it


def _streamed_sha256(ctx: Context, key: str) -> bytes:
    size = ctx.store.size(key)
    if size is None:
        raise NotFoundError(key)
    digest = hashlib.sha256()
    for at in range(0, size, DIGEST_CHUNK):
        digest.update(ctx.store.get_range(key, at, min(size, at + DIGEST_CHUNK)))
    return digest.digest()


MERGE_FAN_IN = 16  # sorted files one merge reads at once (open files per digest)


def _bucket_entries(ctx: Context, prefix: str, tmp: Path) -> Iterator[tuple[str, bytes]]:
    """(path, sha256) of every image of a bucketed pack index, in path order: each bucket
    (1/256 of the index) sorted and written to `tmp` as JSON lines, then the files merged,
    MERGE_FAN_IN at a time, so a digest holds few files open whatever the index."""
    runs = []
    for bucket in range(INDEX_BUCKETS):
        key = prefix + index_bucket_key(bucket)
        index = read_index(ctx.store.get(key), key)
        path = tmp / f"0-{bucket:03d}.jsonl"
        with path.open("w", encoding="utf-8") as out:
            for name in sorted(index.images):
                out.write(json.dumps([name, index.images[name].sha256]) + "\n")
        runs.append(path)
    level = 0
    while len(runs) > MERGE_FAN_IN:
        level += 1
        merged = []
        for at in range(0, len(runs), MERGE_FAN_IN):
            path = tmp / f"{level}-{at:03d}.jsonl"
            with path.open("w", encoding="utf-8") as out:
                out.writelines(_merged(runs[at : at + MERGE_FAN_IN]))
            merged.append(path)
        for done in runs:
            done.unlink()
        runs = merged
    for line in _merged(runs):
        name, sha = json.loads(line)
        yield name, bytes.fromhex(sha)


def _merged(paths: list[Path]) -> Iterator[str]:
    """The lines of sorted JSON-lines files of [path, sha256], merged in path order."""
    with contextlib.ExitStack() as stack:
        files = [stack.enter_context(p.open(encoding="utf-8")) for p in paths]
        yield from heapq.merge(*files, key=lambda line: json.loads(line)[0])


def submit_folder(
    ctx: Context, folder: Path, dataset: str, sampling: dict[str, Any] | None = None
) -> str:
    try:
        uri = upload_pool(ctx.store, folder, image_max_bytes=ctx.settings.image_max_bytes)
    except PermanentError as exc:
        raise HTTPException(422, str(exc)) from None
    return submit(ctx, uri, dataset, sampling)


def pool_under_roots(ctx: Context, path: str) -> Path:
    roots = [Path(r).resolve() for r in ctx.settings.api_pool_roots]
    if not roots:
        raise HTTPException(403, "no pool roots are configured (RSIEVE_API_POOL_ROOTS)")
    folder = Path(path).resolve()
    if not any(folder.is_relative_to(root) for root in roots):
        raise HTTPException(403, "pool_path is not under a configured pool root")
    if not (folder / "items.jsonl").is_file():
        raise HTTPException(422, f"{path} is not a pool: it has no items.jsonl")
    return folder


RUN_PATTERN = re.compile(DATASET_PATTERN.removesuffix("$") + r"-[0-9a-f]{12}$")  # run_id


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
    if not RUN_PATTERN.match(run):
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


# --- review -------------------------------------------------------------------------------

REVIEWS_KEPT = 16  # runs whose judged items an API process keeps for the review page


def reviews(ctx: Context, run: str) -> dict[str, dict[str, Any]]:
    found = {}
    for key in ctx.store.list(keys.reviews_prefix(run)):
        r = json.loads(ctx.store.get(key))
        found[r["item_id"]] = r
    return found


def _review_item(o: Outcome) -> dict[str, Any] | None:
    gen, item = o.generation, o.generation.item
    promoted = o.verdict is not None and o.verdict.verdict == "CORRECT"
    if o.place == "accepted" and not promoted:
        return None
    return {
        "id": item.id,
        "line": item.line,
        "family": item.family,
        "kind": "promoted" if promoted else "rejected",
        "reason": o.reason,
        "image_sha256": item.image_sha256,
        "question": item.question,
        "reference": item.references,
        "answer": gen.answer,
        "reasoning": gen.reasoning,
        "raw_output": gen.raw_output,
        "decision": o.decision.model_dump() if o.decision else None,
        "verdict": (
            o.verdict.model_dump(exclude={"prompt"}) | {"promoted": o.place == "accepted"}
            if o.verdict
            else None
        ),
    }


def review_items(ctx: Context, run: str) -> list[dict[str, Any]]:
    """The judge stage's rejected items and judge CORRECTs (promoted or held back), in
    pool order; cached per run and number of judged shards (outputs are write-once)."""
    return _reviewed(ctx, run)[0]


def _reviewed(ctx: Context, run: str) -> tuple[list[dict[str, Any]], dict[str, ImageRef]]:
    """(review items, image sha256 -> where in the pool's packs), one cache entry."""
    shards = sorted(ctx.stored_shards(run, "judge"))
    key = (run, len(shards))
    cache = ctx.cache("reviews", REVIEWS_KEPT)
    entry = cache.get(key)
    if entry is None:
        items: list[dict[str, Any]] = []
        images: dict[str, ImageRef] = {}
        for shard in shards:
            out: ShardOutput = ctx.load(run, "judge", shard)
            items += [r for o in out.outcomes if (r := _review_item(o)) is not None]
            images |= {
                o.generation.item.image_sha256: o.generation.item.image_at
                for o in out.outcomes
                if o.generation.item.image_at is not None
            }
        entry = cache.put(key, (sorted(items, key=lambda r: r["line"]), images))
    return entry


def image(ctx: Context, run: str, sha: str) -> bytes:
    """A judged item's image: a ranged read of the pool's pack (one image's bytes)."""
    ref = _reviewed(ctx, run)[1].get(sha)
    if ref is None:
        raise NotFoundError(f"run {run} has no judged item with image {sha}")
    data = ctx.store.get_range(ref.pack, ref.offset, ref.offset + ref.length)
    if hashlib.sha256(data).hexdigest() != sha:
        raise NotFoundError(f"{ref.pack} does not hold image {sha}")
    return data


def tally(items: list[dict[str, Any]], field: str) -> dict[str, int]:
    return dict(sorted(Counter(str(i[field]) for i in items if i[field] is not None).items()))
