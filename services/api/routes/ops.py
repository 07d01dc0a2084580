"""Liveness, readiness (Redis, S3, Triton) and the Prometheus scrape point."""

from __future__ import annotations

import itertools
from typing import Any

import httpx
from fastapi import APIRouter, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from rsieve import keys
from rsieve.adapters.metrics import RedisCollector
from rsieve.adapters.queues import QUEUES
from services.api.deps import Authorised, Ctx

router = APIRouter(tags=["operations"])


@router.get("/healthz")
def healthz() -> dict[str, str]:
    """The process answers (no dependency checked)."""
    return {"status": "ok"}


@router.get("/readyz", responses={503: {"description": "a dependency is not ready"}})
def readyz(ctx: Ctx) -> JSONResponse:
    """What the API itself needs: Redis answers PING and the bucket lists. Triton is the
    workers' dependency, not the API's (in Kubernetes the network policy keeps the API
    from it)."""
    checks: dict[str, Any] = {}
    try:
        checks["redis"] = bool(ctx.redis.ping())
    except Exception as exc:  # noqa: BLE001 - any failure is "not ready", with its cause
        checks["redis"] = f"{type(exc).__name__}: {exc}"[:200]
    try:
        list(itertools.islice(ctx.store.list(keys.INDEX_PREFIX), 1))
        checks["s3"] = True
    except Exception as exc:  # noqa: BLE001
        checks["s3"] = f"{type(exc).__name__}: {exc}"[:200]
    ready = all(v is True for v in checks.values())
    return JSONResponse({"ready": ready, "checks": checks}, status_code=200 if ready else 503)


@router.get("/metrics", response_class=Response, responses={200: {"content": {"text/plain": {}}}})
def metrics(ctx: Authorised) -> Response:
    """Every service's counters (aggregated in Redis by the workers), queue depth, unacked
    messages and Triton's in-flight requests, in Prometheus' text format."""
    url = ctx.settings.triton_metrics_url
    fetch = (lambda: httpx.get(url, timeout=2).text) if url else None
    registry = CollectorRegistry(auto_describe=False)
    registry.register(
        RedisCollector(ctx.redis, queues=sorted(set(QUEUES.values())), triton_metrics=fetch)
    )
    return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)
