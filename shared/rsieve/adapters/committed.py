"""Where a dataset keeps a committed run: whether a run is committed (its manifest) and
where its README.md, run_report.json and quarantine.jsonl are. Apart from
rsieve.adapters.exports (which writes exports and imports `datasets`) so that the API and
the command line read a run's files without it."""

from __future__ import annotations

import json
from typing import Any

from rsieve import keys
from rsieve.adapters.storage import ObjectStore

__all__ = ["run_file_key", "run_manifest"]


def run_manifest(store: ObjectStore, dataset: str, run: str) -> dict[str, Any] | None:
    """The dataset's manifest if `run` is committed in it (one run or a growing dataset's
    `runs`), else None."""
    try:
        manifest = json.loads(store.get(keys.manifest(dataset)))
    except FileNotFoundError:
        return None
    committed = manifest.get("runs") or [manifest.get("run")]
    return dict(manifest) if run in committed else None


def run_file_key(store: ObjectStore, dataset: str, run: str, name: str) -> str:
    """Where a committed run's README.md, run_report.json or quarantine.jsonl is stored:
    under commits/<run>/ (growing datasets), else at the dataset's top (one run)."""
    key = keys.dataset_file(dataset, keys.commit_file(run, name))
    return key if store.exists(key) else keys.dataset_file(dataset, name)
