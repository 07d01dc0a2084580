"""Run identity, shared by the API's POST /runs and the cleaner's watcher (pure).

`run = <dataset>-sha256(pool digest, dataset, decision settings, protocol versions)[:12]`:
submitting the same pool with the same settings again gives the same run."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

__all__ = ["run_id"]


def run_id(
    pool_sha256: str, dataset: str, fingerprint: Mapping[str, Any], protocols: Mapping[str, str]
) -> str:
    """The run's name; `fingerprint` is Settings.fingerprint(), `protocols` the verifier's
    protocol versions."""
    key = json.dumps([pool_sha256, dataset, fingerprint, protocols], sort_keys=True)
    return f"{dataset}-{hashlib.sha256(key.encode()).hexdigest()[:12]}"
