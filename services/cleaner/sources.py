"""The cleaner's reading of a pool beyond its items: the provenance resolvers' I/O
(rsieve.clean.provenance.SourceResolver: local paths under the configured `provenance_roots`,
s3:// URIs read with the stack's storage credentials), and the pool's pack index (a pool
written without packs is packed once here). An infrastructure failure (S3 unreachable)
raises and the shard is retried: never a verdict."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import unquote, urlparse

from rsieve.adapters.storage import ObjectStore, S3Store, parse_s3_uri, write_packs
from rsieve.clean.provenance import Resolution, SourceRef
from rsieve.errors import NotFoundError, PermanentError
from rsieve.run.packs import INDEX, PackIndex, read_index
from rsieve.settings import Settings
from services.context import Context

__all__ = ["StackResolver", "pack_index", "resolver"]

# S3's bucket naming rules (3-63 characters: lowercase letters, digits, dots, hyphens).
_BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")


class StackResolver:
    """Resolves `local` and `s3` source references; results are cached per location."""

    def __init__(self, settings: Settings, store_for: Callable[[str], ObjectStore]) -> None:
        self._roots = [Path(r).resolve() for r in settings.provenance_roots]
        self._buckets = {settings.s3_bucket, *settings.provenance_buckets}
        self._max_bytes = settings.image_max_bytes
        self._store_for = store_for
        self._cache: dict[tuple[str, str], Resolution] = {}

    def resolve(self, ref: SourceRef) -> Resolution:
        key = (ref.kind, str(ref.location))
        if key not in self._cache:
            self._cache[key] = (
                self._local(str(ref.location))
                if ref.kind == "local"
                else self._s3(str(ref.location))
            )
        return self._cache[key]

    def _local(self, location: str) -> Resolution:
        if not self._roots:
            return Resolution("unresolvable", why="no provenance_roots configured")
        raw = unquote(urlparse(location).path) if location.startswith("file://") else location
        candidates = (
            [Path(raw)] if Path(raw).is_absolute() else [root / raw for root in self._roots]
        )
        for path in candidates:
            real = path.resolve()  # links followed: the file itself must lie under a root
            if not any(real.is_relative_to(root) for root in self._roots):
                return Resolution("unresolvable", why="not under a provenance root")
            if real.is_file():
                if real.stat().st_size > self._max_bytes:
                    return Resolution(
                        "found", why=f"{real.stat().st_size} bytes, more than image_max_bytes"
                    )
                with real.open("rb") as f:
                    return Resolution("found", sha256=hashlib.file_digest(f, "sha256").hexdigest())
        return Resolution("missing")

    def _s3(self, uri: str) -> Resolution:
        """Only buckets named in settings (s3_bucket, provenance_buckets), only objects of
        at most image_max_bytes (their size is listed before any byte is read)."""
        bucket, key = parse_s3_uri(uri)
        if not bucket or not key or key.endswith("/"):
            return Resolution("unresolvable", why="not an object URI")
        if not _BUCKET.fullmatch(bucket):
            return Resolution("unresolvable", why="not an S3 bucket name")
        if bucket not in self._buckets:
            return Resolution("unresolvable", why="bucket not in provenance_buckets")
        try:
            store = self._store_for(bucket)
            size = store.size(key)
            if size is None:
                return Resolution("missing")
            if size > self._max_bytes:
                return Resolution("found", why=f"{size} bytes, more than image_max_bytes")
            data = store.get(key)
        except NotFoundError:
            return Resolution("missing")
        except PermanentError as exc:  # no such bucket, access denied
            return Resolution("unresolvable", why=str(exc)[:120])
        return Resolution("found", sha256=hashlib.sha256(data).hexdigest())


def resolver(ctx: Context) -> StackResolver:
    """Provenance resolvers for one task (locations cached for its duration)."""
    stores: dict[str, ObjectStore] = {ctx.store.bucket: ctx.store}

    def store_for(bucket: str) -> ObjectStore:
        if bucket not in stores:
            stores[bucket] = S3Store(ctx.settings, bucket=bucket)
        return stores[bucket]

    return StackResolver(ctx.settings, store_for)


def pack_index(ctx: Context, prefix: str, paths: list[str]) -> PackIndex:
    """The pool's pack index; a pool written without packs (by another tool than
    upload_pool) is packed here first, reading each of its images (`paths`, in line order)
    once."""
    try:
        raw = ctx.store.get(prefix + INDEX)
    except NotFoundError:
        raw = None
    if raw is not None:
        return read_index(raw, prefix + INDEX)  # pool data: corrupt refuses the run

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
