"""Client side of a run: upload a pool folder, submit it, follow it, export the dataset.
Used by the CLI and the end-to-end tests."""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from rsieve.adapters.storage import S3Store
from rsieve.cleaning import pool_image_path
from rsieve.errors import PermanentError

__all__ = ["export_dataset", "pool_files", "submit", "upload_pool", "wait_for_run"]


def pool_files(folder: Path) -> list[str]:
    """items.jsonl and every file its lines name that lies inside the folder."""
    items = folder / "items.jsonl"
    if not items.is_file():
        raise PermanentError(f"{folder} is not a pool: it has no items.jsonl")
    names: set[str] = set()
    for raw in items.read_bytes().split(b"\n"):
        try:
            image = json.loads(raw).get("image")
        except (ValueError, AttributeError):
            continue
        path = pool_image_path(image) if isinstance(image, str) else None
        if path and (folder / path).is_file():
            names.add(path)
    return ["items.jsonl", *sorted(names)]


def upload_pool(store: S3Store, folder: Path) -> str:
    """Upload once under pools/<digest>/ (digest over every file's name and bytes);
    `_complete` is written last and holds the digest."""
    files = pool_files(folder)
    digest = hashlib.sha256()
    for name in files:
        digest.update(name.encode() + b"\0" + hashlib.sha256((folder / name).read_bytes())
                      .digest())
    pool_sha = digest.hexdigest()
    prefix = f"pools/{pool_sha}/"
    if not store.exists(prefix + "_complete"):
        for name in files:
            store.put(prefix + name, (folder / name).read_bytes())
        store.put(prefix + "_complete", pool_sha.encode())
    return f"s3://{store.bucket}/{prefix}"


def _headers(token: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"} if token else {}


def submit(api_url: str, pool_uri: str, dataset: str, token: str | None = None) -> str:
    resp = httpx.post(f"{api_url}/runs", json={"pool_uri": pool_uri, "dataset": dataset},
                      headers=_headers(token), timeout=30)
    if resp.status_code >= 400:
        raise PermanentError(f"the API refused the run: {resp.status_code} {resp.text}")
    return str(resp.json()["run"])


def wait_for_run(api_url: str, run: str, *, timeout: float, token: str | None = None,
                 on_status: Callable[[dict[str, Any]], None] | None = None,
                 poll_s: float = 0.5) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        status = httpx.get(f"{api_url}/runs/{run}", headers=_headers(token), timeout=30).json()
        if on_status:
            on_status(status)
        if status.get("done"):
            return dict(status)
        if time.monotonic() > deadline:
            raise TimeoutError(f"run {run} not done after {timeout:.0f}s: {status['stages']}")
        time.sleep(poll_s)


def export_dataset(store: S3Store, dataset: str, dest: Path) -> Path:
    """Copy the dataset's manifest-listed files to dest/<dataset>/, replacing what was there."""
    prefix = f"datasets/{dataset}/"
    manifest = json.loads(store.get(prefix + "manifest.json"))
    target = dest / dataset
    staging = dest / f".{dataset}.partial"
    shutil.rmtree(staging, ignore_errors=True)
    for name in manifest["files"]:
        path = staging / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(store.get(prefix + name))
    (staging / "manifest.json").write_text(json.dumps(manifest, indent=1))
    shutil.rmtree(target, ignore_errors=True)
    staging.rename(target)
    return target
