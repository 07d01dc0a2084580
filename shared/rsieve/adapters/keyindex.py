"""The dataset's qa-key index in object storage (rules: rsieve.compact.keyindex): which of a run's
keys the dataset holds, and the buckets' next files. Each bucket's file is read in ranged
GETs of one chunk, and its next version is written through a temporary file, so memory
is the run's keys plus one chunk whatever the dataset's size."""

from __future__ import annotations

import itertools
import json
import tempfile
from collections.abc import Iterator
from typing import Any

from rsieve import keys
from rsieve.adapters.storage import ObjectStore
from rsieve.compact.keyindex import (
    CHUNK_KEYS,
    KEY_BYTES,
    IndexStats,
    by_bucket,
    digest,
    merged,
    present,
)

__all__ = ["held_keys", "legacy_runs", "write_buckets"]


def legacy_runs(previous: dict[str, Any] | None) -> list[str]:
    """Runs whose keys are per-run JSON lists: every run of a manifest written before the
    index, and those its successors carried over."""
    if not previous:
        return []
    if "qa_keys" not in previous:
        return list(previous.get("runs", []))
    return list(previous.get("legacy_key_runs", []))


def _chunks(store: ObjectStore, key: str, chunk_keys: int) -> Iterator[bytes]:
    size = store.size(key) or 0
    step = chunk_keys * KEY_BYTES
    for start in range(0, size, step):
        yield store.get_range(key, start, min(start + step, size))


def held_keys(
    store: ObjectStore,
    prefix: str,
    previous: dict[str, Any] | None,
    run_keys: list[tuple[str, str]],
    stats: IndexStats,
    *,
    chunk_keys: int = CHUNK_KEYS,
) -> set[str]:
    """Those of the run's (image sha256, qa key) pairs the dataset already holds, as qa
    keys: only the buckets the run touches are read, each streamed once."""
    stats.run_keys = len(run_keys)
    found: set[bytes] = set()
    pointers = (previous or {}).get("qa_keys", {})
    for bucket, wanted in by_bucket(run_keys).items():
        if bucket in pointers:
            stats.buckets += 1
            found |= present(_chunks(store, prefix + pointers[bucket], chunk_keys), wanted, stats)
    for old in legacy_runs(previous):
        legacy = json.loads(store.get(prefix + keys.legacy_run_keys(old)))
        stats.legacy_keys += len(legacy)
        stats.hold(0)
        found |= {digest(k) for k in legacy} & {digest(k) for _, k in run_keys}
    return {k for _, k in run_keys if digest(k) in found}


def write_buckets(
    store: ObjectStore,
    prefix: str,
    previous: dict[str, Any] | None,
    run: str,
    added_keys: list[tuple[str, str]],
    stats: IndexStats,
    *,
    chunk_keys: int = CHUNK_KEYS,
) -> dict[str, str]:
    """Write the next file of every bucket the run adds to; returns those buckets' new
    files (bucket -> file), which replace theirs in the manifest's `qa_keys`."""
    pointers: dict[str, str] = (previous or {}).get("qa_keys", {})
    written: dict[str, str] = {}
    for bucket, added in by_bucket(added_keys).items():
        current = pointers.get(bucket)
        chunks = _chunks(store, prefix + current, chunk_keys) if current else iter(())
        path = keys.qa_key_bucket(bucket, run)
        out = merged(chunks, added, chunk_keys=chunk_keys, stats=stats)
        first = next(out, b"")
        second = next(out, None)
        if second is None:  # one chunk: one PUT (most buckets of most runs)
            store.put(prefix + path, first)
        else:
            with tempfile.NamedTemporaryFile(prefix="rsieve-keys-") as tmp:
                for part in itertools.chain((first, second), out):  # a chunk at a time
                    tmp.write(part)
                tmp.flush()
                store.put_file(prefix + path, tmp.name)
        written[bucket] = path
    return written
