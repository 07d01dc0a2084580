"""Run identity, shared by the API's POST /runs and the cleaner's watcher (pure).

`run = <dataset>-sha256(pool digest, dataset, decision settings, protocol versions)[:12]`:
submitting the same pool with the same settings again gives the same run. The format is
written here (`run_id`) and read here (`is_run_id`, `RUN_PATTERN`), nowhere else."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping
from typing import Any

from rsieve.schemas import DATASET_PATTERN
from rsieve.settings import identity

__all__ = [
    "ITEMS",
    "RECORD_SUFFIXES",
    "REFUSED",
    "RUN_PATTERN",
    "digest_of",
    "is_run_id",
    "pool_digest",
    "run_id",
]

ITEMS, REFUSED = "items.jsonl", "_refused.json"
# Files of a pool that are records, not images (items.jsonl, Parquet, InfinityMM JSON):
# never held to image_max_bytes.
RECORD_SUFFIXES = frozenset({".jsonl", ".parquet", ".json"})
RUN_DIGEST_HEX = 12  # hex digits of the digest a run id ends with
# What `run_id` writes: a dataset's name, a dash, the digest's first RUN_DIGEST_HEX digits.
RUN_PATTERN = re.compile(DATASET_PATTERN.removesuffix("$") + rf"-[0-9a-f]{{{RUN_DIGEST_HEX}}}$")


def pool_digest(items: bytes, files: Mapping[str, str], refused: bytes | None = None) -> str:
    """A pool's digest: sha256 over items.jsonl, then every image file in name order, then
    `_refused.json` if any, each as name, NUL, sha256 of its bytes. `files`: name -> the
    hex sha256 of its bytes (what a pack index records, so the API recomputes the digest of
    an uploaded pool without reading its images)."""
    return digest_of(
        hashlib.sha256(items).digest(),
        ((name, bytes.fromhex(files[name])) for name in sorted(files)),
        None if refused is None else hashlib.sha256(refused).digest(),
    )


def digest_of(
    items_sha256: bytes, files: Iterable[tuple[str, bytes]], refused_sha256: bytes | None
) -> str:
    """`pool_digest` from the sha256s alone, `files` streamed in name order (the API
    digests a pool of millions of images without holding its index: services/api/submission.py)."""
    digest = hashlib.sha256()
    digest.update(ITEMS.encode() + b"\0" + items_sha256)
    previous: str | None = None
    for name, sha in files:
        if previous is not None and name <= previous:
            raise ValueError(f"pool files out of name order: {name!r} after {previous!r}")
        previous = name
        digest.update(name.encode() + b"\0" + sha)
    if refused_sha256 is not None:
        digest.update(REFUSED.encode() + b"\0" + refused_sha256)
    return digest.hexdigest()


def run_id(
    pool_sha256: str, dataset: str, fingerprint: Mapping[str, Any], protocols: Mapping[str, str]
) -> str:
    """The run's name; `fingerprint` is Settings.fingerprint(), `protocols` the verifier's
    protocol versions."""
    key = json.dumps([pool_sha256, dataset, identity(dict(fingerprint)), protocols], sort_keys=True)
    return f"{dataset}-{hashlib.sha256(key.encode()).hexdigest()[:RUN_DIGEST_HEX]}"


def is_run_id(name: str) -> bool:
    """Whether `name` is a run id as `run_id` writes them (the API refuses any other name
    before it looks in the bucket). Whole: `$` alone would let a trailing newline by."""
    return RUN_PATTERN.fullmatch(name) is not None
