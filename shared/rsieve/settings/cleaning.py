"""What the cleaner decides: the bounds on an item, provenance, task purity, near
duplicates and evaluation sets (docs/cleaning.md). All deciding."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, Field

from rsieve.images import MAX_PIXELS
from rsieve.settings.roles import DECIDES


class CleaningSettings(BaseModel):
    # Bounds on an item.
    image_max_pixels: Annotated[int, DECIDES] = MAX_PIXELS
    image_max_bytes: Annotated[int, DECIDES] = 32 * 1024 * 1024
    text_max_chars: Annotated[int, DECIDES] = 16_384
    provenance_policy: Annotated[Literal["strict", "lenient"], DECIDES] = "strict"
    # Folders a local-path `source` may be read from to check it holds the attached image
    # (docs/cleaning.md); none by default, so local paths are unresolvable.
    provenance_roots: Annotated[list[str], DECIDES] = []
    # Buckets an s3:// `source` may be read from besides the services' own (s3_bucket);
    # any other bucket is unresolvable, whatever the credentials reach.
    provenance_buckets: Annotated[list[str], DECIDES] = []
    # Task purity (docs/cleaning.md): a family whose measured off-task share exceeds the
    # threshold keeps only its on-task items; families under min_items are measured only.
    purity_threshold: Annotated[float, DECIDES] = Field(0.05, ge=0, le=1)
    purity_min_items: Annotated[int, DECIDES] = Field(20, ge=1)
    purity_embedding: Annotated[bool, DECIDES] = Field(
        True, description="settle open questions by embedding"
    )
    # Origin first (docs/cleaning.md): family -> the source dataset names accepted as its
    # benchmark origin (JSON, e.g. {"TextVQA": ["textvqa"]}); an item of another origin is
    # off-task. A family not named here takes its dominant origin, if it has one.
    purity_origins: Annotated[dict[str, list[str]], DECIDES] = {}
    # Near-duplicate images and evaluation sets (docs/cleaning.md, "Decontamination"): two
    # images match when their perceptual hashes differ in at most this many of 64 bits
    # (bench/bench_phash.py on 352 real images: no false match below 12).
    near_duplicate_distance: Annotated[int, DECIDES] = Field(8, ge=0, le=16)
    # What makes an item `contaminated`: its image alone matching an image of a registered
    # evaluation set ("image"), or the image and the question ("image_and_question").
    evalset_match: Annotated[Literal["image", "image_and_question"], DECIDES] = "image"
