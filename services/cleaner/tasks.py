"""Cleaner: cuts a submitted pool into shards and takes the decisions that need the whole
pool (exact duplicates, task purity: cleaning.json), then validates each shard's items,
checks provenance, normalises multiple choice, and hands clean items to the generator.

Images stay in the pool's packs (rsieve.packs): ingest reads the pack index (or packs a
pool that came without) and gives every line where its image lies; a shard's images are
then a few ranged GETs, not one object per item."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from rsieve.adapters.storage import S3Store, read_images, write_packs
from rsieve.cleaning import (
    assess_pool,
    clean_item,
    inspect_image,
    parse_line,
    pool_image_path,
)
from rsieve.errors import NotFoundError
from rsieve.packs import INDEX, PackIndex
from rsieve.provenance import verify_source
from rsieve.purity import PURITY_VERSION, load_embedder
from rsieve.schemas import Item, Quarantined, ShardOutput
from rsieve.shards import PoolLine, ShardInput, split_pool
from services.cleaner.sources import StackResolver
from services.cleaner.watch import register_watch
from services.common import Context, StageTask

REFUSED = "_refused.json"  # written by the client's upload: image path -> why not uploaded


def register(ctx: Context) -> None:
    @ctx.app.task(name="rsieve.ingest", base=StageTask)
    def ingest(run: str) -> None:
        spec, store, s = ctx.spec(run), ctx.store, ctx.settings
        if not store.exists(f"runs/{run}/shards.json"):
            prefix = spec.pool_uri.split("/", 3)[3]
            shards, blank = split_pool(store.get(f"{prefix}items.jsonl"), s.shard_size)
            refused = (
                json.loads(store.get(prefix + REFUSED)) if store.exists(prefix + REFUSED) else {}
            )
            resolver = _resolver(ctx)
            packs = _pack_index(ctx, prefix, shards)

            def image_sha256(path: str) -> str | None:
                return ref.sha256 if (ref := packs.images.get(path)) else None

            assessment = assess_pool(
                [pl for shard in shards for pl in shard],
                image_sha256=image_sha256,
                refused=refused,
                provenance_policy=s.provenance_policy,
                text_max_chars=s.text_max_chars,
                purity_threshold=s.purity_threshold,
                purity_min_items=s.purity_min_items,
                embed=_lazy_embed if s.purity_embedding else None,
                provenance=lambda source, sha: verify_source(
                    source, sha, s.provenance_policy, resolver
                ),
            )
            assessment.report["policy"]["provenance_roots"] = list(s.provenance_roots)
            store.put(
                f"runs/{run}/cleaning.json",
                json.dumps(assessment.report, indent=1, ensure_ascii=False).encode(),
                content_type="application/json",
            )
            names = [f"{i:05d}" for i in range(len(shards))]
            for name, lines in zip(names, shards, strict=True):
                lines = [
                    pl.model_copy(
                        update={
                            "verdict": assessment.verdicts.get(pl.line),
                            "purity": assessment.rules.get(pl.line),
                            "image": packs.images.get(_image_path(pl) or ""),
                        }
                    )
                    for pl in lines
                ]
                store.put(
                    f"runs/{run}/input/{name}.json",
                    ShardInput(run=run, shard=name, lines=lines).model_dump_json().encode(),
                )
            index = {
                "shards": {n: len(s) for n, s in zip(names, shards, strict=True)},
                "lines": sum(map(len, shards)),
                "blank_lines": blank,
            }
            # Blank lines are not items; the report expects every other line placed.
            store.put(f"runs/{run}/shards.json", json.dumps(index).encode())  # commit point
        index = json.loads(store.get(f"runs/{run}/shards.json"))
        for name, count in index["shards"].items():
            ctx.next("rsieve.clean", run=run, shard=name, lines=count)

    @ctx.app.task(name="rsieve.clean", base=StageTask)
    def clean(run: str, shard: str, lines: int) -> None:
        if not ctx.done(run, "clean", shard):
            spec = ctx.spec(run)
            raw = ctx.store.get(f"runs/{run}/input/{shard}.json")
            shard_in = ShardInput.model_validate_json(raw)
            resolver = _resolver(ctx)
            images = read_images(ctx.store, [pl.image for pl in shard_in.lines if pl.image])
            results = ctx.guard("clean", run, shard).run(
                shard_in.lines,
                lambda pl: _clean_line(ctx, spec.pool_uri, pl, resolver, images),
                poisoned=_poisoned,
                key=lambda pl: pl.line,
            )
            ctx.save(
                ShardOutput(
                    run=run,
                    shard=shard,
                    stage="clean",
                    lines=lines,
                    items=[r for r in results if isinstance(r, Item)],
                    quarantined=[r for r in results if isinstance(r, Quarantined)],
                )
            )
        ctx.next("rsieve.generate", run=run, shard=shard, lines=lines)

    register_watch(ctx)  # continuous ingestion (watch.py), sent by Celery beat


def _resolver(ctx: Context) -> StackResolver:
    """Provenance resolvers for one task (locations cached for its duration)."""
    stores: dict[str, S3Store] = {ctx.store.bucket: ctx.store}

    def store_for(bucket: str) -> S3Store:
        if bucket not in stores:
            stores[bucket] = S3Store(ctx.settings, bucket=bucket)
        return stores[bucket]

    return StackResolver(ctx.settings, store_for)


def _poisoned(pool_line: PoolLine) -> Quarantined:
    try:
        obj = json.loads(pool_line.raw)
    except ValueError:
        obj = {}
    obj = obj if isinstance(obj, dict) else {}
    item_id, family = obj.get("id"), obj.get("family")
    return Quarantined(
        id=item_id if isinstance(item_id, str) else None,
        line=pool_line.line,
        family=family if isinstance(family, str) else None,
        stage="clean",
        reason="max_deliveries",
        detail="the worker died on this line each time",
    )


def _lazy_embed(texts: Sequence[str]) -> np.ndarray:
    """The model is loaded only when a family has questions no template settles."""
    return load_embedder()(texts)


def _image_path(pool_line: PoolLine) -> str | None:
    """The pool path of the image a line names, if it names one inside the pool."""
    try:
        image = json.loads(pool_line.raw).get("image")
    except (ValueError, AttributeError):
        return None
    return pool_image_path(image) if isinstance(image, str) else None


def _pack_index(ctx: Context, prefix: str, shards: list[list[PoolLine]]) -> PackIndex:
    """The pool's pack index; a pool written without packs (by another tool than
    upload_pool) is packed here first, reading each of its images once, in line order."""
    try:
        return PackIndex.model_validate_json(ctx.store.get(prefix + INDEX))
    except NotFoundError:
        pass
    paths = list(
        dict.fromkeys(p for shard in shards for pl in shard if (p := _image_path(pl)) is not None)
    )

    def fetch(path: str) -> tuple[str, bytes | None]:
        try:
            return path, ctx.store.get(prefix + path)
        except NotFoundError:
            return path, None

    def fetched(step: int = 64) -> Iterator[tuple[str, bytes]]:
        with ThreadPoolExecutor(max_workers=8) as pool:
            for at in range(0, len(paths), step):  # bounded memory: `step` images in hand
                for path, data in pool.map(fetch, paths[at : at + step]):
                    if data is not None:
                        yield path, data

    return write_packs(ctx.store, prefix, fetched())


def _clean_line(
    ctx: Context,
    pool_uri: str,
    pool_line: PoolLine,
    resolver: StackResolver,
    images: dict[str, bytes],
) -> Item | Quarantined:
    s, line = ctx.settings, pool_line.line
    if not pool_line.utf8:
        return Quarantined(id=None, line=line, family=None, stage="clean", reason="invalid_utf8")
    parsed = parse_line(pool_line.raw.encode(), line, text_max_chars=s.text_max_chars)
    if isinstance(parsed, Quarantined):
        return parsed

    def quarantine(reason: str, detail: str = "") -> Quarantined:
        return Quarantined(
            id=parsed.id,
            line=line,
            family=parsed.family,
            stage="clean",
            reason=reason,
            detail=detail,
        )

    if pool_line.duplicate_of is not None:
        return quarantine("duplicate_id", f"first on line {pool_line.duplicate_of}")
    path = pool_image_path(parsed.image)
    if path is None:
        return quarantine("image_outside_pool", parsed.image)
    if pool_line.verdict and pool_line.verdict[0] == "image_symlink":
        return quarantine(*pool_line.verdict)
    ref = pool_line.image
    if ref is None or ref.sha256 not in images:
        return quarantine("missing_image", path)
    data = images[ref.sha256]
    if problem := inspect_image(data, max_pixels=s.image_max_pixels, max_bytes=s.image_max_bytes):
        return quarantine(*problem)
    sha = hashlib.sha256(data).hexdigest()
    if sha != ref.sha256:
        return quarantine("image_digest_mismatch", f"{path}: index {ref.sha256}, bytes {sha}")
    admitted, check = verify_source(parsed.source, sha, s.provenance_policy, resolver)
    if not admitted:
        return quarantine("provenance", check)
    item = clean_item(
        parsed,
        line=line,
        image_sha256=sha,
        provenance_check=check,
        policy=s.provenance_policy,
        pool_uri=pool_uri,
        purity=pool_line.purity,
        policy_extra={"purity": PURITY_VERSION, "purity_threshold": s.purity_threshold},
    )
    if isinstance(item, Item) and pool_line.verdict:  # duplicate_item, off_task
        return quarantine(*pool_line.verdict)
    return item.model_copy(update={"image_at": ref}) if isinstance(item, Item) else item
