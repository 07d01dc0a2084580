"""Incremental compaction rules: which outcomes a run adds to a dataset, how its shards are
named, and the manifest that commits them.

A dataset grows run by run. Every committed run's qa keys (sha256 of image sha256 and
question) are stored beside the data; a new run adds only outcomes whose key is not there
yet. Shards are immutable once committed; the manifest, written last, is the only pointer
readers follow, so a crash before it leaves the previous dataset as it was.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from typing import Any

from rsieve import keys
from rsieve.clean.profiles import PROFILES_FILE
from rsieve.schemas import Outcome

__all__ = ["MANIFEST_VERSION", "dedupe", "next_manifest", "qa_key", "shard_name"]

MANIFEST_VERSION = 1


def qa_key(image_sha256: str, question: str) -> str:
    return hashlib.sha256(f"{image_sha256}\0{question}".encode()).hexdigest()


def dedupe(outcomes: Iterable[Outcome], existing: set[str]) -> tuple[list[Outcome], list[str]]:
    """(outcomes to add, ids skipped because the dataset already holds their key).

    Within a run the pool's own duplicates were already quarantined by the cleaner."""
    added: list[Outcome] = []
    skipped: list[str] = []
    for outcome in outcomes:
        item = outcome.generation.item
        if qa_key(item.image_sha256, item.question) in existing:
            skipped.append(item.id)
        else:
            added.append(outcome)
    return added, skipped


shard_name = keys.data_shard  # a committed shard's path, relative to the dataset's prefix


def next_manifest(
    previous: dict[str, Any] | None,
    *,
    dataset: str,
    run: str,
    shards: list[dict[str, Any]],
    adds_up: bool,
    sampled: bool = False,
    qa_keys: dict[str, str] | None = None,
    legacy_key_runs: list[str] | None = None,
) -> dict[str, Any]:
    """The manifest after committing `run`: the previous shards plus this run's, and the
    current file of each bucket of the dataset's key index (rsieve.compact.keyindex)."""
    kept = [s for s in (previous or {}).get("shards", []) if s["run"] != run]
    all_shards = sorted(kept + shards, key=lambda s: (s["split"], s["path"]))
    splits: dict[str, int] = {}
    for shard in all_shards:
        splits[shard["split"]] = splits.get(shard["split"], 0) + shard["rows"]
    runs = [r for r in (previous or {}).get("runs", []) if r != run] + [run]
    # A best-of-n dataset says so (its rows have rsieve.compact.rows.SAMPLED_FEATURES); a dataset
    # keeps the schema of its first run.
    sampled = bool((previous or {}).get("sampled", sampled))
    return {
        **({"sampled": True} if sampled else {}),
        "manifest_version": MANIFEST_VERSION,
        "dataset": dataset,
        "run": run,
        "runs": runs,
        "adds_up": adds_up,
        "shards": all_shards,
        "qa_keys": dict(sorted((qa_keys or {}).items())),
        **({"legacy_key_runs": legacy_key_runs} if legacy_key_runs else {}),
        "splits": dict(sorted(splits.items())),
        # Export path -> stored key (relative to the dataset prefix). The card, report
        # and quarantine of a commit live under commits/<run>/, so nothing a reader
        # follows from the manifest changes before the manifest does.
        "files": {
            **{
                name: keys.commit_file(run, name)
                for name in (
                    "README.md",
                    "run_report.json",
                    "quarantine.jsonl",
                    "run_spec.json",
                    PROFILES_FILE,
                )
            },
            **{f"reports/{r}.json": keys.commit_file(r, "run_report.json") for r in runs},
            **{s["path"]: s["path"] for s in all_shards},
        },
    }
