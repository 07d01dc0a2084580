"""Image packs: a pool's images stored as a few large objects instead of one object each.

Every object-store round trip costs the services 2-3 ms of CPU (boto3 signs, sends and
parses each one), which is ten times what the rules cost per item (docs/performance.md,
"What shapes the figures"). So a pool's images travel in packs: each pack is the images'
bytes one after the other, and `_packs/index.json` says where each image (by its path in
the pool) lies: pack, offset, length and sha256. `rsieve.adapters.pools.upload_pool`
writes them; ingest writes them for a pool that came without (written by another tool).
A stage reads the images of a shard with one ranged GET per stretch of a pack
(`plan_reads`), not one GET per image.

Pure: building, indexing and slicing; the reads are the services'.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from hashlib import sha256

from pydantic import BaseModel, ConfigDict

from rsieve.errors import PermanentError
from rsieve.hashindex import hash_hex, image_hashes, informative, perceptual_hash
from rsieve.images import MAX_PIXELS
from rsieve.run.partitions import key_partition
from rsieve.schemas import ImageRef

__all__ = [
    "INDEX",
    "INDEX_BUCKETED_FROM",
    "INDEX_BUCKETS",
    "PackIndex",
    "PackWriter",
    "Read",
    "image_phash",
    "image_phashes",
    "index_bucket_key",
    "index_buckets",
    "plan_reads",
    "read_index",
    "slice_read",
]

INDEX = "_packs/index.json"  # under the pool's prefix, written after its packs
# A large pool's index is also written in buckets by path (rsieve.run.partitions.key_partition
# over INDEX_BUCKETS), before INDEX: a task that needs some paths' entries (ingest's join,
# one partition of the paths) reads its buckets, not the whole index.
INDEX_BUCKETS = 256
INDEX_BUCKETED_FROM = 4096  # images; a smaller index is read whole


def index_bucket_key(bucket: int) -> str:
    return f"_packs/index/{bucket:02x}.json"


def index_buckets(index: PackIndex) -> list[PackIndex]:
    """The index cut into its INDEX_BUCKETS buckets (every one, empty or not)."""
    out = [PackIndex() for _ in range(INDEX_BUCKETS)]
    for path, ref in index.images.items():
        out[key_partition(path, INDEX_BUCKETS)].images[path] = ref
    return out


PACK_BYTES = 64 * 1024 * 1024  # a pack is closed once it passes this size


class PackIndex(BaseModel):
    """A pool's `_packs/index.json`: path in the pool -> where its bytes are."""

    model_config = ConfigDict(extra="forbid")

    version: int = 1
    images: dict[str, ImageRef] = {}


def read_index(raw: bytes, key: str) -> PackIndex:
    """A stored pack index (or a bucket of one) at `key`. Pool data that does not parse is
    not a stage's to redo: it refuses the run (PermanentError naming the object and the
    fix), at submission and at ingest."""
    try:
        return PackIndex.model_validate_json(raw)
    except ValueError as exc:
        first = " ".join(str(exc).split())[:120]
        raise PermanentError(
            f"the pool's pack index {key} is corrupt; upload the pool again and submit it"
            f" ({len(raw)} bytes: {first})"
        ) from exc


# Larger images get no hash: the cleaner quarantines them (image_too_large) unread.
PHASH_MAX_PIXELS = MAX_PIXELS


def image_phash(data: bytes) -> str | None:
    """The perceptual hash of an image's bytes (16 hex), or None for bytes Pillow cannot
    read as an accepted format, an image over PHASH_MAX_PIXELS (by its header, before any
    decode), or a degenerate hash (a flat image: rsieve.hashindex.informative)."""
    try:
        h = perceptual_hash(data, max_pixels=PHASH_MAX_PIXELS)
    except ValueError:
        return None
    return hash_hex(h) if informative(h) else None


def image_phashes(data: bytes) -> tuple[str | None, tuple[str, ...]]:
    """`image_phash` and the hashes of the image's light crops (rsieve.hashindex.image_hashes),
    those informative and unlike it, distinct: (None, ()) where `image_phash` is None."""
    try:
        found = image_hashes(data, max_pixels=PHASH_MAX_PIXELS)
    except ValueError:
        return None, ()
    if not informative(found[0]):
        return None, ()
    crops = dict.fromkeys(h for h in found[1:] if informative(h) and h != found[0])
    return hash_hex(found[0]), tuple(map(hash_hex, crops))


@dataclass
class PackWriter:
    """Adds images in order and hands back each pack once it is full: streaming, so
    memory is bounded by one pack. Pack keys are `<prefix>_packs/<n>.pack`; an image whose
    bytes were already added (same sha256) is not stored twice."""

    prefix: str
    max_bytes: int = PACK_BYTES
    index: PackIndex = field(default_factory=PackIndex)
    _parts: list[bytes] = field(default_factory=list)
    _size: int = 0
    _count: int = 0
    _by_sha: dict[str, ImageRef] = field(default_factory=dict)

    def _key(self) -> str:
        return f"{self.prefix}_packs/{self._count:05d}.pack"

    def add(self, path: str, data: bytes) -> tuple[str, bytes] | None:
        """Index `path`; returns (key, bytes) of a pack this addition closed, else None."""
        digest = sha256(data).hexdigest()
        if digest in self._by_sha:
            self.index.images[path] = self._by_sha[digest]
            return None
        phash, crops = image_phashes(data)
        ref = ImageRef(
            pack=self._key(),
            offset=self._size,
            length=len(data),
            sha256=digest,
            phash=phash,
            crop_phashes=crops,
        )
        self.index.images[path] = self._by_sha[digest] = ref
        self._parts.append(data)
        self._size += len(data)
        return self.flush() if self._size >= self.max_bytes else None

    def flush(self) -> tuple[str, bytes] | None:
        """The open pack, if it holds anything."""
        if not self._parts:
            return None
        done = (self._key(), b"".join(self._parts))
        self._parts, self._size, self._count = [], 0, self._count + 1
        return done


@dataclass(frozen=True)
class Read:
    """One ranged GET: bytes [start, end) of `pack`, holding `refs`."""

    pack: str
    start: int
    end: int
    refs: tuple[ImageRef, ...]


def plan_reads(
    refs: Iterable[ImageRef], *, max_gap: int = 1024 * 1024, max_span: int = 32 * 1024 * 1024
) -> list[Read]:
    """The fewest ranged GETs that fetch `refs`: neighbours in a pack share a read when the
    bytes between them are at most `max_gap` (cheaper to fetch than a round trip) and the
    read stays within `max_span` (bounded memory). An image longer than `max_span` is
    read alone."""
    unique = sorted(
        {(r.pack, r.offset, r.length): r for r in refs}.values(), key=lambda r: (r.pack, r.offset)
    )
    reads: list[Read] = []
    group: list[ImageRef] = []
    end = 0
    for ref in unique:
        if group and (
            ref.pack != group[0].pack
            or ref.offset - end > max_gap
            or ref.offset + ref.length - group[0].offset > max_span
        ):
            reads.append(Read(group[0].pack, group[0].offset, end, tuple(group)))
            group = []
        end = max(end, ref.offset + ref.length) if group else ref.offset + ref.length
        group.append(ref)
    if group:
        reads.append(Read(group[0].pack, group[0].offset, end, tuple(group)))
    return reads


def slice_read(read: Read, data: bytes) -> Iterator[tuple[str, bytes]]:
    """(sha256, bytes) of each image in a read's bytes; a short read (the pack is not what
    the index says) yields what it holds and no more."""
    view = memoryview(data)
    for ref in read.refs:
        start = ref.offset - read.start
        piece = bytes(view[start : start + ref.length])
        if len(piece) == ref.length:
            yield ref.sha256, piece
