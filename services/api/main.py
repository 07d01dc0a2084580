"""The API: submit a run for an uploaded pool, follow its progress, read its report."""


import hashlib
import json
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Header, HTTPException

from rsieve.adapters.storage import parse_s3_uri
from rsieve.errors import NotFoundError
from rsieve.schemas import RunRequest, RunSpec
from rsieve.verify import protocol_versions
from services.common import Context, bootstrap

STAGES = ("clean", "generate", "verify", "judge")


def create_app(ctx: Context | None = None) -> FastAPI:
    app = FastAPI(title="rsieve", version="0.1.0")
    state: dict[str, Context] = {}

    def context() -> Context:
        if "ctx" not in state:
            state["ctx"] = ctx or bootstrap()
        return state["ctx"]

    def authorised(ctx: Annotated[Context, Depends(context)],
                   authorization: Annotated[str | None, Header()] = None) -> Context:
        token = ctx.settings.api_token
        if token is not None and authorization != f"Bearer {token.get_secret_value()}":
            raise HTTPException(401, "missing or wrong bearer token")
        return ctx

    Ctx = Annotated[Context, Depends(authorised)]

    @app.get("/healthz")
    def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.post("/runs", status_code=202)
    def submit(req: RunRequest, ctx: Ctx) -> dict[str, Any]:
        bucket, prefix = parse_s3_uri(req.pool_uri)
        if bucket != ctx.settings.s3_bucket or not prefix.endswith("/"):
            raise HTTPException(422, f"pool_uri must be s3://{ctx.settings.s3_bucket}/<prefix>/")
        try:
            pool_sha = ctx.store.get(f"{prefix}_complete").decode().strip()
        except NotFoundError:
            raise HTTPException(404, "pool upload is not complete (no _complete marker)") from None
        fingerprint = json.dumps([pool_sha, req.dataset, ctx.settings.fingerprint(),
                                  protocol_versions()], sort_keys=True)
        run = f"{req.dataset}-{hashlib.sha256(fingerprint.encode()).hexdigest()[:12]}"
        spec_key = f"runs/{run}/run.json"
        if not ctx.store.exists(spec_key):
            spec = RunSpec(run=run, dataset=req.dataset, pool_uri=req.pool_uri,
                           pool_sha256=pool_sha, settings=ctx.settings.fingerprint(),
                           protocols=protocol_versions())
            ctx.store.put(spec_key, spec.model_dump_json(indent=1).encode())
            ctx.next("rsieve.ingest", run=run)
        return {"run": run, "status_url": f"/runs/{run}"}

    @app.post("/runs/{run}/resume", status_code=202)
    def resume(run: str, ctx: Ctx) -> dict[str, str]:
        """Re-enqueue the run from ingest; every stage skips the shards it already wrote."""
        _spec(ctx, run)
        ctx.next("rsieve.ingest", run=run)
        return {"run": run}

    @app.get("/runs/{run}")
    def status(run: str, ctx: Ctx) -> dict[str, Any]:
        spec = _spec(ctx, run)
        try:
            index = json.loads(ctx.store.get(f"runs/{run}/shards.json"))
        except NotFoundError:
            index = None
        done = {stage: sum(1 for _ in ctx.store.list(f"runs/{run}/{stage}/")) for stage in STAGES}
        manifest = _manifest(ctx, spec)
        return {"run": run, "dataset": spec.dataset,
                "shards": len(index["shards"]) if index else None,
                "lines": index["lines"] if index else None,
                "stages": done, "done": manifest is not None, "manifest": manifest}

    @app.get("/runs/{run}/report")
    def report(run: str, ctx: Ctx) -> dict[str, Any]:
        spec = _spec(ctx, run)
        if _manifest(ctx, spec) is None:
            raise HTTPException(409, "run not compacted yet")
        return dict(json.loads(ctx.store.get(f"datasets/{spec.dataset}/run_report.json")))

    return app


def _spec(ctx: Context, run: str) -> RunSpec:
    try:
        return ctx.spec(run)
    except NotFoundError:
        raise HTTPException(404, f"no run {run!r}") from None


def _manifest(ctx: Context, spec: RunSpec) -> dict[str, Any] | None:
    try:
        manifest = json.loads(ctx.store.get(f"datasets/{spec.dataset}/manifest.json"))
    except NotFoundError:
        return None
    return manifest if manifest.get("run") == spec.run else None
