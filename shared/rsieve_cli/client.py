"""The API's HTTP client: submit an uploaded pool, follow its run. Used by the command line
and the end-to-end tests (uploading a pool: rsieve.adapters.pools.upload_pool; exporting a
dataset: rsieve.adapters.exports)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import httpx

from rsieve.errors import PermanentError
from rsieve.settings import Settings

__all__ = ["submit", "wait_for_run"]


def _headers(settings: Settings) -> dict[str, str]:
    token = settings.api_token.get_secret_value() if settings.api_token else None
    return {"Authorization": f"Bearer {token}"} if token else {}


def submit(settings: Settings, pool_uri: str, dataset: str) -> str:
    """Submit an uploaded pool to the API at settings.api_url, with settings.api_token."""
    resp = httpx.post(
        f"{settings.api_url}/runs",
        json={"pool_uri": pool_uri, "dataset": dataset},
        headers=_headers(settings),
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
            resp = httpx.get(
                f"{settings.api_url}/runs/{run}", headers=_headers(settings), timeout=30
            )
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
