"""Cleaner: cuts a submitted pool into shards, then validates each shard's items, checks
provenance, stores images once by sha256, and hands clean items to the generator."""

from __future__ import annotations

import hashlib
import json

from rsieve.cleaning import check_provenance, clean_item, inspect_image, parse_line, pool_image_path
from rsieve.errors import NotFoundError
from rsieve.schemas import Item, Quarantined, ShardOutput
from rsieve.shards import PoolLine, ShardInput, split_pool
from services.common import Context, StageTask


def register(ctx: Context) -> None:
    @ctx.app.task(name="rsieve.ingest", base=StageTask)
    def ingest(run: str) -> None:
        spec, store = ctx.spec(run), ctx.store
        if not store.exists(f"runs/{run}/shards.json"):
            prefix = spec.pool_uri.split("/", 3)[3]
            shards, blank = split_pool(store.get(f"{prefix}items.jsonl"), ctx.settings.shard_size)
            names = [f"{i:05d}" for i in range(len(shards))]
            for name, lines in zip(names, shards, strict=True):
                store.put(f"runs/{run}/input/{name}.json",
                          ShardInput(run=run, shard=name, lines=lines).model_dump_json().encode())
            index = {"shards": {n: len(s) for n, s in zip(names, shards, strict=True)},
                     "lines": sum(map(len, shards)), "blank_lines": blank}
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
            out = ShardOutput(run=run, shard=shard, stage="clean", lines=lines, items=[],
                              quarantined=[])
            for pool_line in shard_in.lines:
                result = _clean_line(ctx, spec.pool_uri, pool_line)
                (out.items if isinstance(result, Item) else out.quarantined).append(result)
            ctx.save(out)
        ctx.next("rsieve.generate", run=run, shard=shard, lines=lines)


def _clean_line(ctx: Context, pool_uri: str, pool_line: PoolLine) -> Item | Quarantined:
    s, line = ctx.settings, pool_line.line
    if not pool_line.utf8:
        return Quarantined(id=None, line=line, family=None, stage="clean", reason="invalid_utf8")
    parsed = parse_line(pool_line.raw.encode(), line, text_max_chars=s.text_max_chars)
    if isinstance(parsed, Quarantined):
        return parsed

    def quarantine(reason: str, detail: str = "") -> Quarantined:
        return Quarantined(id=parsed.id, line=line, family=parsed.family, stage="clean",
                           reason=reason, detail=detail)

    if pool_line.duplicate_of is not None:
        return quarantine("duplicate_id", f"first on line {pool_line.duplicate_of}")
    path = pool_image_path(parsed.image)
    if path is None:
        return quarantine("image_outside_pool", parsed.image)
    try:
        data = ctx.store.get(pool_uri.split("/", 3)[3] + path)
    except NotFoundError:
        return quarantine("missing_image", path)
    if problem := inspect_image(data, max_pixels=s.image_max_pixels,
                                max_bytes=s.image_max_bytes):
        return quarantine(*problem)
    sha = hashlib.sha256(data).hexdigest()
    admitted, check = check_provenance(parsed.source, sha, s.provenance_policy)
    if not admitted:
        return quarantine("provenance", check)
    if not ctx.store.exists(f"images/{sha}"):
        ctx.store.put(f"images/{sha}", data)
    return clean_item(parsed, line=line, image_sha256=sha, provenance_check=check,
                      policy=s.provenance_policy, pool_uri=pool_uri)
