"""The review page and what it reads: a run's rejected items and judge promotions, the
images by content address, and a person's call on each promotion (runs/<run>/reviews/)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Annotated, Literal

from fastapi import APIRouter, HTTPException, Query, Response
from fastapi import Path as PathParam
from fastapi.responses import HTMLResponse

from rsieve import keys
from rsieve.errors import NotFoundError
from services.api import reviews, runs
from services.api.deps import Authorised
from services.api.models import ReviewCreate, ReviewItem, ReviewItemsPublic, ReviewPublic

router = APIRouter(tags=["review"])
PAGE = Path(__file__).resolve().parents[1] / "review.html"
SHA256 = r"^[0-9a-f]{64}$"
_MAGIC = (
    (b"\x89PNG", "image/png"),
    (b"\xff\xd8", "image/jpeg"),
    (b"GIF8", "image/gif"),
    (b"RIFF", "image/webp"),
    (b"BM", "image/bmp"),
    (b"II*\x00", "image/tiff"),
    (b"MM\x00*", "image/tiff"),
)


@router.get("/review", response_class=HTMLResponse, include_in_schema=False)
def page() -> HTMLResponse:
    """Static HTML and JS (no data in it): every request it makes carries the token."""
    return HTMLResponse(PAGE.read_text(), headers={"Cache-Control": "no-cache"})


@router.get("/runs/{run}/review/items", response_model=ReviewItemsPublic)
def items(
    run: str,
    ctx: Authorised,
    kind: Literal["all", "promoted", "rejected"] = "all",
    family: str | None = None,
    reason: str | None = None,
    offset: Annotated[int, Query(ge=0)] = 0,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
) -> ReviewItemsPublic:
    """Rejected items and judge CORRECTs in pool order; families and reasons are counted
    before the family/reason filters, for the page's menus."""
    runs.spec(ctx, run)
    found = reviews.review_items(ctx, run)
    if kind != "all":
        found = [i for i in found if i["kind"] == kind]
    families, reasons = runs.tally(found, "family"), runs.tally(found, "reason")
    found = [
        i
        for i in found
        if (family is None or i["family"] == family) and (reason is None or i["reason"] == reason)
    ]
    page_items = found[offset : offset + limit]
    if page_items:
        done = reviews.reviews(ctx, run)
        page_items = [i | {"review": done.get(i["id"])} for i in page_items]
    return ReviewItemsPublic(
        data=[ReviewItem(**i) for i in page_items],
        count=len(found),
        families=families,
        reasons=reasons,
    )


@router.put("/runs/{run}/reviews/{item_id}", response_model=ReviewPublic)
def review(run: str, item_id: str, body: ReviewCreate, ctx: Authorised) -> ReviewPublic:
    """A person confirms a judge promotion or marks it wrong (the last call stands)."""
    runs.spec(ctx, run)
    item = next(
        (
            i
            for i in reviews.review_items(ctx, run)
            if i["id"] == item_id and i["kind"] == "promoted"
        ),
        None,
    )
    if item is None:
        raise HTTPException(404, f"run {run!r} has no judge promotion {item_id!r}")
    record = ReviewPublic(run=run, item_id=item_id, at=time.time(), **body.model_dump())
    stored = record.model_dump() | {"family": item["family"]}
    ctx.store.put(
        keys.review(run, item_id), json.dumps(stored).encode(), content_type="application/json"
    )
    return record


@router.get("/runs/{run}/reviews", response_model=list[ReviewPublic])
def list_reviews(run: str, ctx: Authorised) -> list[ReviewPublic]:
    runs.spec(ctx, run)
    return [
        ReviewPublic(**{k: v for k, v in r.items() if k != "family"})
        for r in reviews.reviews(ctx, run).values()
    ]


@router.get(
    "/images/{sha256}", response_class=Response, responses={200: {"content": {"image/*": {}}}}
)
def image(sha256: Annotated[str, PathParam(pattern=SHA256)], ctx: Authorised) -> Response:
    """An image stored by its sha256 (images/<sha256>: those the generator re-encoded)."""
    try:
        return _image_response(ctx.store.get(keys.image(sha256)))
    except NotFoundError:
        raise HTTPException(404, "no such image") from None


@router.get(
    "/runs/{run}/images/{sha256}",
    response_class=Response,
    responses={200: {"content": {"image/*": {}}}},
)
def run_image(
    run: str, sha256: Annotated[str, PathParam(pattern=SHA256)], ctx: Authorised
) -> Response:
    """The image of one of a run's judged items, as uploaded (from the pool's packs)."""
    runs.spec(ctx, run)
    try:
        return _image_response(reviews.image(ctx, run, sha256))
    except NotFoundError:
        raise HTTPException(404, "no such image in this run") from None


def _image_response(data: bytes) -> Response:
    media = next((m for magic, m in _MAGIC if data.startswith(magic)), "application/octet-stream")
    return Response(
        data, media_type=media, headers={"Cache-Control": "private, max-age=31536000, immutable"}
    )
