"""The dataset's qa-key index: what a compaction deduplicates against, read in bounded
memory whatever the dataset's size or number of runs.

A qa key (rsieve.compact.compaction.qa_key: sha256 of image sha256 and question) is stored as its
first KEY_BYTES bytes. Keys are bucketed by the first byte of the image's sha256 (256
buckets), so every qa entry of one image lands in one bucket. Each bucket is one file of
sorted, distinct keys. A commit that adds keys to a bucket writes a new version of the
bucket's file (rsieve.keys.qa_key_bucket), and the manifest names each bucket's current version. A
compaction streams each bucket's file once, in chunks of `chunk_keys` keys: it holds its
own run's keys plus one chunk, never the dataset's (`IndexStats` counts both).

Datasets committed before the index (their manifests have no `qa_keys`) keep their older
runs' per-run JSON key lists (rsieve.keys.legacy_run_keys); those runs are listed in the manifest's
`legacy_key_runs` and still read whole (docs/decisions.md)."""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

__all__ = [
    "CHUNK_KEYS",
    "KEY_BYTES",
    "IndexStats",
    "bucket_of",
    "by_bucket",
    "digest",
    "keys_of",
    "merged",
    "present",
]

# 128 bits: the chance that two of 10^10 distinct qa entries share a key is below 10^-18.
KEY_BYTES = 16
CHUNK_KEYS = 65_536  # one read of a bucket's file: 1 MiB


@dataclass
class IndexStats:
    """What one compaction read of the index: keys streamed from the buckets' files, the
    most keys it held in memory at once (its own plus one chunk), buckets read."""

    run_keys: int = 0
    streamed: int = 0
    held: int = 0
    buckets: int = 0
    legacy_keys: int = 0

    def hold(self, chunk_keys: int) -> None:
        self.held = max(self.held, self.run_keys + chunk_keys + self.legacy_keys)

    def as_dict(self) -> dict[str, int]:
        return {
            "run_keys": self.run_keys,
            "streamed": self.streamed,
            "held": self.held,
            "buckets": self.buckets,
            "legacy_keys": self.legacy_keys,
        }


def digest(qa_key_hex: str) -> bytes:
    return bytes.fromhex(qa_key_hex)[:KEY_BYTES]


def bucket_of(image_sha256: str) -> str:
    return image_sha256[:2]


def by_bucket(entries: Iterable[tuple[str, str]]) -> dict[str, list[bytes]]:
    """(image sha256, qa key hex) pairs -> bucket -> its sorted, distinct key digests."""
    buckets: dict[str, set[bytes]] = {}
    for image_sha256, key in entries:
        buckets.setdefault(bucket_of(image_sha256), set()).add(digest(key))
    return {b: sorted(keys) for b, keys in sorted(buckets.items())}


def keys_of(chunk: bytes) -> list[bytes]:
    if len(chunk) % KEY_BYTES:
        raise ValueError(f"a key index chunk of {len(chunk)} bytes is not whole keys")
    return [chunk[i : i + KEY_BYTES] for i in range(0, len(chunk), KEY_BYTES)]


def present(
    chunks: Iterable[bytes], wanted: Iterable[bytes], stats: IndexStats | None = None
) -> set[bytes]:
    """Those of `wanted` found in a bucket's file, read as `chunks` (whole keys each)."""
    wanted = set(wanted)
    found: set[bytes] = set()
    for chunk in chunks:
        keys = keys_of(chunk)
        if stats is not None:
            stats.streamed += len(keys)
            stats.hold(len(keys))
        found.update(wanted.intersection(keys))
    return found


def merged(
    chunks: Iterable[bytes],
    added: list[bytes],
    *,
    chunk_keys: int = CHUNK_KEYS,
    stats: IndexStats | None = None,
) -> Iterator[bytes]:
    """The bucket's next file, in chunks: its current keys (sorted, read as `chunks`) and
    `added` (sorted), merged, each key once."""

    def current() -> Iterator[bytes]:
        for chunk in chunks:
            keys = keys_of(chunk)
            if stats is not None:
                stats.streamed += len(keys)
                stats.hold(len(keys))
            yield from keys

    out: list[bytes] = []
    last = b""
    for key in heapq.merge(current(), added):
        if key == last:
            continue
        last = key
        out.append(key)
        if len(out) == chunk_keys:
            yield b"".join(out)
            out = []
    if out:
        yield b"".join(out)
