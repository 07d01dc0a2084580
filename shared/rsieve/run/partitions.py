"""Compaction in partitions: how a run's outcomes are cut so that no compaction task holds
more than a partition, whatever the run's size (docs/decisions.md, "Partitions").

An outcome goes to the partition of its image (the first byte of the image's sha256,
modulo the partition count), so every qa entry of one image lands in one partition and a
row is still one image per split; a partition's buckets of the key index
(rsieve.compact.keyindex) are its own. An item quarantined before it had an outcome goes to the
partition of its line. The count is a power of two, so partitions are unions of the
key index's 256 buckets.

A run of one partition is compacted by one task. A larger run is routed first (one task
per group of shards writes each partition its piece), then compacted one task per
partition, then committed from the partitions' summaries (`merge_summaries`)."""

from __future__ import annotations

import hashlib
import heapq
import json
from collections.abc import Iterable, Iterator
from typing import Any

__all__ = [
    "MAX_PARTITIONS",
    "key_partition",
    "merge_summaries",
    "outcome_partition",
    "partition_count",
    "partition_label",
    "quarantine_partition",
    "route_groups",
    "sorted_lines",
]

MAX_PARTITIONS = 256  # the key index's buckets
EXAMPLES_PER_SPLIT = 3


def partition_count(lines: int, partition_items: int) -> int:
    """The fewest partitions, a power of two up to MAX_PARTITIONS, of at most
    `partition_items` pool lines each (where MAX_PARTITIONS allows)."""
    count = 1
    while count < MAX_PARTITIONS and count * partition_items < lines:
        count *= 2
    return count


def outcome_partition(image_sha256: str, partitions: int) -> int:
    return int(image_sha256[:2], 16) % partitions


def key_partition(key: str, partitions: int) -> int:
    """The partition of any string key (an id, a path, a question key, a family): its
    sha256's first 8 bytes modulo the count, so every task that routes it agrees."""
    return (
        int.from_bytes(hashlib.sha256(key.encode("utf-8", "surrogatepass")).digest()[:8])
        % partitions
    )


def quarantine_partition(line: int, partitions: int) -> int:
    return line % partitions


def partition_label(partition: int) -> str:
    return f"p{partition:03d}"


def route_groups(shards: Iterable[str], per_group: int) -> list[list[str]]:
    """The run's shards (sorted) in groups of `per_group`, one routing task each."""
    ordered = sorted(shards)
    return [ordered[i : i + per_group] for i in range(0, len(ordered), per_group)]


def sorted_lines(parts: Iterable[Iterable[str]]) -> Iterator[str]:
    """Quarantine listings (JSON lines, each sorted by its `"line"`) merged in line order."""
    return heapq.merge(*parts, key=lambda text: int(json.loads(text)["line"]))


def _union(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """Models seen (role -> model -> field -> sorted values), united."""
    out: dict[str, Any] = {}
    for role in sorted(set(a) | set(b)):
        models = {}
        for model in sorted(set(a.get(role, {})) | set(b.get(role, {}))):
            fa, fb = a.get(role, {}).get(model, {}), b.get(role, {}).get(model, {})
            models[model] = {
                f: sorted(set(fa.get(f, [])) | set(fb.get(f, [])))
                for f in sorted(set(fa) | set(fb))
            }
        out[role] = models
    return out


def merge_summaries(summaries: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """What the commit needs of every partition, from their summaries: the manifest's
    shard entries and key index files, the report's parts, the judge promotions, the ids
    already in the dataset (in line order), the models, protocols and families seen, and
    the card's examples (the first rows by line, as one partition would have chosen)."""
    shards: list[dict[str, Any]] = []
    qa_keys: dict[str, str] = {}
    promotions: list[dict[str, Any]] = []
    skipped: list[tuple[int, str]] = []
    models: dict[str, Any] = {}
    protocols: set[str] = set()
    families: set[str] = set()
    examples: dict[str, list[tuple[int, dict[str, Any], str]]] = {}
    stats: dict[str, int] = {}
    parts = []
    for s in summaries:
        shards += s["shards"]
        qa_keys |= s["qa_keys"]
        promotions += s["promotions"]
        skipped += [(line, item) for line, item in s["already_in_dataset"]]
        models = _union(models, s["models"])
        protocols |= set(s["protocols"])
        families |= set(s["families"])
        for split, rows in s["examples"].items():
            examples.setdefault(split, []).extend((line, qa, path) for line, qa, path in rows)
        for key, value in s["dataset_keys"].items():
            stats[key] = (
                max(stats.get(key, 0), value) if key == "held" else stats.get(key, 0) + value
            )
        parts.append(s["report"])
    return {
        "shards": shards,
        "qa_keys": qa_keys,
        "report_parts": parts,
        "promotions": sorted(promotions, key=lambda r: (r["family"], r["line"])),
        "already_in_dataset": [item for _, item in sorted(skipped)],
        "models": models,
        "protocols": sorted(protocols),
        "families": sorted(families),
        "examples": {
            split: [
                (qa, path) for _, qa, path in sorted(rows, key=lambda r: r[0])[:EXAMPLES_PER_SPLIT]
            ]
            for split, rows in examples.items()
        },
        "dataset_keys": stats,
    }
