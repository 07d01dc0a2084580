"""The review page's data: the judged items of a run (promotions and rejections with the
verdict's reasons), the reviews people stored, and the images they look at."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from rsieve import keys
from rsieve.errors import NotFoundError
from rsieve.schemas import ImageRef, Outcome, ShardOutput
from services.context import Context

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
