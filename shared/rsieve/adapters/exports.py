"""A dataset's committed files out of object storage: the export to a folder, and where a
committed run's manifest and files are."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from rsieve.adapters.storage import ObjectStore

__all__ = ["export_dataset", "run_file_key", "run_manifest"]


def export_dataset(store: ObjectStore, dataset: str, dest: Path) -> Path:
    """Copy the dataset's manifest-listed files to dest/<dataset>/, replacing what was there."""
    prefix = f"datasets/{dataset}/"
    manifest = json.loads(store.get(prefix + "manifest.json"))
    target = dest / dataset
    staging = dest / f".{dataset}.partial"
    shutil.rmtree(staging, ignore_errors=True)
    for name, key in manifest["files"].items():
        path = staging / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(store.get(prefix + key))
    (staging / "manifest.json").write_text(json.dumps(manifest, indent=1))
    shutil.rmtree(target, ignore_errors=True)
    staging.rename(target)
    return target


def run_manifest(store: ObjectStore, dataset: str, run: str) -> dict[str, Any] | None:
    """The dataset's manifest if `run` is committed in it (one run or a growing dataset's
    `runs`), else None."""
    try:
        manifest = json.loads(store.get(f"datasets/{dataset}/manifest.json"))
    except FileNotFoundError:
        return None
    committed = manifest.get("runs") or [manifest.get("run")]
    return dict(manifest) if run in committed else None


def run_file_key(store: ObjectStore, dataset: str, run: str, name: str) -> str:
    """Where a committed run's README.md, run_report.json or quarantine.jsonl is stored:
    under commits/<run>/ (growing datasets), else at the dataset's top (one run)."""
    prefix = f"datasets/{dataset}/"
    key = f"{prefix}commits/{run}/{name}"
    return key if store.exists(key) else prefix + name
