"""The API's HTTP client: upload a pool folder and submit it, submit a pool already in the
bucket, follow a run. Used by the command line and the end-to-end tests. A client needs
the API's address and token only, never the services' S3 key: `upload` sends the pool as
a tar archive through `POST /runs/upload` (docs/security.md)."""

from __future__ import annotations

import json
import os
import tarfile
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from rsieve.adapters.pools import pool_files, pool_format
from rsieve.errors import PermanentError
from rsieve.settings import Settings

__all__ = ["api_request", "archive_pool", "submit", "upload", "wait_for_run"]


def _headers(settings: Settings) -> dict[str, str]:
    token = settings.api_token.get_secret_value() if settings.api_token else None
    return {"Authorization": f"Bearer {token}"} if token else {}


def api_request(
    settings: Settings,
    method: str,
    path: str,
    *,
    timeout: float | httpx.Timeout = 60,
    **kwargs: Any,
) -> httpx.Response:
    """The command line's one way to the API: settings.api_url, with settings.api_token
    as a bearer token (never logged)."""
    return httpx.request(
        method, f"{settings.api_url}{path}", headers=_headers(settings), timeout=timeout, **kwargs
    )


def archive_pool(folder: Path, into: Path) -> list[str]:
    """Write the pool in `folder` as an uncompressed tar (images barely compress) at `into`;
    the names it holds. An items.jsonl pool sends items.jsonl and the files its lines name;
    a Parquet or InfinityMM pool every file. A symbolic link is sent as the file it names
    when that lies inside the folder, and left out when it leaves it (its lines are then
    quarantined `missing_image`): nothing outside the folder is ever sent."""
    root = folder.resolve()
    if pool_format(folder) == "folder":
        names = pool_files(folder)
    else:
        names = sorted(
            p.relative_to(folder).as_posix()
            for p in folder.rglob("*")
            if p.is_file() and not p.name.startswith(".")
        )
    sent = []
    with tarfile.open(into, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for name in names:
            path = (folder / name).resolve()
            if not path.is_relative_to(root) or not path.is_file():
                continue
            info = tf.gettarinfo(str(path), arcname=name)
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            with path.open("rb") as f:
                tf.addfile(info, f)
            sent.append(name)
    return sent


def upload(
    settings: Settings,
    folder: Path,
    dataset: str,
    *,
    busy_retries: int = 20,
    sampling: dict[str, Any] | None = None,
) -> str:
    """Send the pool in `folder` to the API (`POST /runs/upload`) and submit it as
    `dataset`; the run id. The archive is written to a temporary file first and streamed
    from it. While every upload slot is taken (429), wait as the API's Retry-After says.
    `sampling`: the run's own sampling settings (best-of-n), else the services'."""
    with tempfile.TemporaryDirectory(prefix="rsieve-send-") as tmp:
        archive = Path(tmp) / f"{folder.resolve().name or 'pool'}.tar"
        archive_pool(folder, archive)
        for attempt in range(busy_retries + 1):
            with archive.open("rb") as f:
                resp = api_request(
                    settings,
                    "POST",
                    "/runs/upload",
                    data={"dataset": dataset}
                    | ({"sampling": json.dumps(sampling)} if sampling else {}),
                    files={"pool": (archive.name, f, "application/x-tar")},
                    # The API answers once the pool is packed into the bucket: minutes for
                    # a big one.
                    timeout=httpx.Timeout(60, read=3600),
                )
            if resp.status_code != 429 or attempt == busy_retries:
                break
            time.sleep(float(resp.headers.get("retry-after", "5")))
        if resp.status_code == 413:
            size = os.path.getsize(archive)
            raise PermanentError(
                f"the pool ({size} bytes as an archive) is larger than the API takes in one "
                "upload (RSIEVE_API_MAX_REQUEST_BYTES): ask the operator to place it under a "
                "pool root or the watched prefix"
            )
    if resp.status_code >= 400:
        raise PermanentError(f"the API refused the upload: {resp.status_code} {resp.text}")
    return str(resp.json()["run"])


def submit(
    settings: Settings, pool_uri: str, dataset: str, sampling: dict[str, Any] | None = None
) -> str:
    """Submit a pool already in the services' bucket (placed by the operator or the
    services) to the API at settings.api_url, with settings.api_token; `sampling`: the
    run's own sampling settings (best-of-n), else the services'."""
    resp = api_request(
        settings,
        "POST",
        "/runs",
        json={"pool_uri": pool_uri, "dataset": dataset}
        | ({"sampling": sampling} if sampling else {}),
        timeout=30,
    )
    if resp.status_code >= 400:
        raise PermanentError(f"the API refused the run: {resp.status_code} {resp.text}")
    return str(resp.json()["run"])


def wait_for_run(
    settings: Settings,
    run: str,
    *,
    timeout: float,
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
            resp = api_request(settings, "GET", f"/runs/{run}", timeout=30)
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
