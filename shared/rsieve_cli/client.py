"""Client side of a run: upload a pool folder, submit it, follow it, export the dataset.
Used by the CLI and the end-to-end tests."""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import httpx

from rsieve.adapters.pools import read_pool
from rsieve.adapters.storage import S3Store, write_packs
from rsieve.cascade import verify_generation
from rsieve.cleaning import pool_image_path
from rsieve.errors import PermanentError

__all__ = [
    "export_dataset",
    "pool_files",
    "recheck_outcomes",
    "submit",
    "upload_pool",
    "wait_for_run",
]


def pool_files(folder: Path) -> list[str]:
    """items.jsonl and every file its lines name that lies inside the folder (a symbolic
    link leaving the folder is not one)."""
    if not (folder / "items.jsonl").is_file():
        raise PermanentError(f"{folder} is not a pool: it has no items.jsonl")
    return ["items.jsonl", *sorted(read_pool(folder).files)]


def upload_pool(store: S3Store, folder: Path, *, family: str | None = None) -> str:
    """Upload once under pools/<digest>/ (digest over every file's name and bytes), in the
    pool contract whatever the folder's format (ingest.read_pool: items.jsonl folder,
    Parquet / HF dataset folder, InfinityMM records). The images go in packs with their
    index (`_packs/`, rsieve.packs), a few objects instead of one per image. Image files
    the upload refused (symbolic links leaving the folder) are listed in `_refused.json`
    for the cleaner. `_complete` is written last and holds the digest."""
    pool = read_pool(folder, family=family)
    names = sorted(pool.files)
    digest = hashlib.sha256()
    extra: dict[str, bytes] = {"items.jsonl": pool.items}
    if pool.refused:
        extra["_refused.json"] = json.dumps(pool.refused, sort_keys=True).encode()
    # The digest's order (items.jsonl, the images, _refused.json) keeps earlier pools' ids.
    for name in ["items.jsonl", *names, *(["_refused.json"] if pool.refused else [])]:
        data = extra[name] if name in extra else pool.read(name)
        digest.update(name.encode() + b"\0" + hashlib.sha256(data).digest())
    pool_sha = digest.hexdigest()
    prefix = f"pools/{pool_sha}/"
    if not store.exists(prefix + "_complete"):
        # In line order, so a shard's images lie together.
        write_packs(store, prefix, ((n, pool.read(n)) for n in _in_line_order(pool.items, names)))
        for name, data in extra.items():
            store.put(prefix + name, data)
        store.put(prefix + "_complete", pool_sha.encode())
    return f"s3://{store.bucket}/{prefix}"


def _in_line_order(items: bytes, names: list[str]) -> list[str]:
    """`names` in the order items.jsonl first names them (the rest after, sorted)."""
    wanted, order = set(names), dict[str, int]()
    for raw in items.splitlines():
        try:
            image = json.loads(raw).get("image")
        except (ValueError, AttributeError):
            continue
        if isinstance(image, str) and (path := pool_image_path(image)) in wanted:
            order.setdefault(path, len(order))
    return sorted(names, key=lambda n: (order.get(n, len(order)), n))


def _headers(token: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"} if token else {}


def submit(api_url: str, pool_uri: str, dataset: str, token: str | None = None) -> str:
    resp = httpx.post(
        f"{api_url}/runs",
        json={"pool_uri": pool_uri, "dataset": dataset},
        headers=_headers(token),
        timeout=30,
    )
    if resp.status_code >= 400:
        raise PermanentError(f"the API refused the run: {resp.status_code} {resp.text}")
    return str(resp.json()["run"])


def wait_for_run(
    api_url: str,
    run: str,
    *,
    timeout: float,
    token: str | None = None,
    on_status: Callable[[dict[str, Any]], None] | None = None,
    poll_s: float = 1.0,
) -> dict[str, Any]:
    """Poll the run's status every `poll_s` until it is done (compacted). A poll is one
    Redis round trip and one S3 read on the API's side (services/api/runs.py); once a
    second keeps a progress bar live without costing the run anything measurable."""
    deadline = time.monotonic() + timeout
    status: dict[str, Any] = {"stages": "no answer yet"}
    while True:
        try:
            resp = httpx.get(f"{api_url}/runs/{run}", headers=_headers(token), timeout=30)
        except httpx.HTTPError:
            resp = None  # the API (or the storage behind it) is briefly away: keep waiting
        if resp is None or resp.status_code >= 500:
            if time.monotonic() > deadline:
                raise TimeoutError(f"run {run}: no status from the API after {timeout:.0f}s")
            time.sleep(poll_s)
            continue
        resp.raise_for_status()
        status = resp.json()
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
    for name, key in manifest["files"].items():
        path = staging / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(store.get(prefix + key))
    (staging / "manifest.json").write_text(json.dumps(manifest, indent=1))
    shutil.rmtree(target, ignore_errors=True)
    staging.rename(target)
    return target


def _decision_view(o: Any) -> dict[str, Any]:
    d = o.decision
    return {
        "place": o.place,
        "reason": o.reason,
        **(
            {
                "protocol": d.protocol,
                "version": d.version,
                "accepted": d.accepted,
                "score": d.score,
                "variant": d.variant,
                "threshold": d.threshold,
            }
            if d is not None
            else {"decision": None}
        ),
    }


def recheck_outcomes(outcomes: Iterable[Any]) -> tuple[int, list[dict[str, Any]]]:
    """Recompute each stored verifier outcome from its stored generation with today's
    rsieve.verify; return how many were checked and those that differ (stored vs now)."""
    checked, diffs = 0, []
    for stored in outcomes:
        checked += 1
        try:
            now = _decision_view(verify_generation(stored.generation))
        except Exception as exc:  # noqa: BLE001 - a protocol gone or failing is a difference
            now = {"error": f"{type(exc).__name__}: {exc}"}
        before = _decision_view(stored)
        if now != before:
            item = stored.generation.item
            diffs.append(
                {
                    "id": item.id,
                    "line": item.line,
                    "family": item.family,
                    "stored": before,
                    "recomputed": now,
                }
            )
    return checked, diffs


def run_manifest(store: S3Store, dataset: str, run: str) -> dict[str, Any] | None:
    """The dataset's manifest if `run` is committed in it (one run or a growing dataset's
    `runs`), else None."""
    try:
        manifest = json.loads(store.get(f"datasets/{dataset}/manifest.json"))
    except FileNotFoundError:
        return None
    committed = manifest.get("runs") or [manifest.get("run")]
    return dict(manifest) if run in committed else None


def run_file_key(store: S3Store, dataset: str, run: str, name: str) -> str:
    """Where a committed run's README.md, run_report.json or quarantine.jsonl is stored:
    under commits/<run>/ (growing datasets), else at the dataset's top (one run)."""
    prefix = f"datasets/{dataset}/"
    key = f"{prefix}commits/{run}/{name}"
    return key if store.exists(key) else prefix + name
