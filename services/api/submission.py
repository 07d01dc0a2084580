"""Submitting a run through the API: a stored pool (its digest streamed in bounded memory)
or a folder under the allowed roots, uploaded first; the run itself is made by
Context.create_run, as for the watcher."""

from __future__ import annotations

import contextlib
import hashlib
import heapq
import json
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from fastapi import HTTPException
from pydantic import ValidationError

from rsieve.adapters.pools import upload_pool
from rsieve.adapters.storage import parse_s3_uri
from rsieve.errors import ConflictError, NotFoundError, PermanentError
from rsieve.run.packs import INDEX as PACK_INDEX
from rsieve.run.packs import INDEX_BUCKETS, index_bucket_key, read_index
from rsieve.run.submission import ITEMS, REFUSED, digest_of
from rsieve.run.watch import COMPLETE
from services.context import Context


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
