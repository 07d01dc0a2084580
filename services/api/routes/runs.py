"""Runs: submit (S3 URI, path under a pool root, or an uploaded archive), list, status
with live progress, report, quarantine (paged), calibration, resume."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, File, Form, HTTPException, Query, UploadFile
from pydantic import ValidationError

from rsieve import keys
from rsieve.judge.calibration import CalibrationShard, review_tally, summarise
from rsieve.schemas import DATASET_PATTERN
from services.api import reviews, runs, submission
from services.api.archive import ArchiveError, extract_pool
from services.api.deps import Authorised
from services.api.models import (
    QuarantinedPublic,
    QuarantinePublic,
    RunCreate,
    RunCreated,
    RunPublic,
    RunsPublic,
    RunSummary,
    Sampling,
)

router = APIRouter(prefix="/runs", tags=["runs"])
Offset = Annotated[int, Query(ge=0)]
Limit = Annotated[int, Query(ge=1, le=1000)]


@router.post("", status_code=202, response_model=RunCreated)
def submit(req: RunCreate, ctx: Authorised) -> RunCreated:
    """Submit a pool uploaded to the bucket (`pool_uri`) or a folder under a configured
    pool root (`pool_path`). The same pool, dataset and settings give the same run."""
    if (req.pool_uri is None) == (req.pool_path is None):
        raise HTTPException(422, "give exactly one of pool_uri and pool_path")
    sampling = req.sampling.chosen() if req.sampling else None
    if req.pool_uri is not None:
        if not req.pool_uri.startswith("s3://"):
            raise HTTPException(422, "pool_uri must be an s3:// URI")
        run = submission.submit(ctx, req.pool_uri, req.dataset, sampling)
    else:
        folder = submission.pool_under_roots(ctx, str(req.pool_path))
        run = submission.submit_folder(ctx, folder, req.dataset, sampling)
    return RunCreated(run=run, status_url=f"/runs/{run}")


@router.post("/upload", status_code=202, response_model=RunCreated)
def submit_upload(
    ctx: Authorised,
    pool: Annotated[UploadFile, File()],
    dataset: Annotated[str, Form(pattern=DATASET_PATTERN)],
    sampling: Annotated[str | None, Form(max_length=1024)] = None,
) -> RunCreated:
    """Submit a pool as an archive (tar, tar.gz or zip) of its folder (any pool format) at
    the top or in its one folder. Links, absolute names and `..` are refused; an image over
    the byte limit is left out and its lines quarantined (docs/security.md)."""
    s = ctx.settings
    try:  # the run's own sampling, as JSON (models.Sampling), checked before any extraction
        chosen = Sampling.model_validate_json(sampling).chosen() if sampling else None
    except ValidationError as exc:
        raise HTTPException(422, "; ".join(e["msg"] for e in exc.errors())) from None
    work = Path(tempfile.mkdtemp(prefix="rsieve-upload-"))
    try:
        try:  # the body as the server spooled it (no second copy), bounded by BodyLimit
            folder = extract_pool(
                pool.file,
                work / "pool",
                max_files=s.api_max_upload_files,
                max_bytes=s.api_max_extracted_bytes,
                max_ratio=s.api_max_expansion_ratio,
                max_member_bytes=s.image_max_bytes,
            )
        except ArchiveError as exc:
            raise HTTPException(422, str(exc)) from None
        run = submission.submit_folder(ctx, folder, dataset, chosen)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return RunCreated(run=run, status_url=f"/runs/{run}")


@router.get("", response_model=RunsPublic)
def list_runs(ctx: Authorised, offset: Offset = 0, limit: Limit = 100) -> RunsPublic:
    """Submitted runs, newest first."""
    entries = [json.loads(ctx.store.get(k)) for k in ctx.store.list(keys.RUN_INDEX_PREFIX)]
    entries.sort(key=lambda e: -float(e.get("submitted_at") or 0))
    data = [RunSummary(**e) for e in entries[offset : offset + limit]]
    return RunsPublic(data=data, count=len(entries))


@router.get("/{run}", response_model=RunPublic)
def status(
    run: str,
    ctx: Authorised,
    exact: Annotated[
        bool,
        Query(
            description="count stored shards by listing S3 (the truth) rather than from the "
            "workers' progress records in Redis"
        ),
    ] = False,
) -> RunPublic:
    """Per stage: shards stored, items per family, rates and ETA; the shards workers hold
    (holder, age), those orphaned by a dead worker and requeued, failed shards and whether
    the run can finish (docs/operations.md). The counts come from the
    workers' Redis progress records (one round trip per poll); from S3 with `exact` and
    whenever Redis cannot answer for them (`counted_from` says which). Whether the run is
    done is always read from S3 (the dataset's manifest)."""
    spec = runs.spec(ctx, run)
    index = runs.shard_index(ctx, run)
    entry = runs.index_entry(ctx, run) or {}
    shards = len(index["shards"]) if index else None
    manifest = runs.manifest(ctx, spec)
    live = runs.live_progress(ctx, run)
    done, source = runs.shard_counts(
        ctx, run, live, exact=exact, finished=manifest is not None, shards=shards
    )
    progress = runs.stage_progress(live, shards, done, entry.get("submitted_at"))
    view = runs.liveness(ctx, run)
    runs.count_liveness(ctx, progress, shards, view)
    return RunPublic(
        run=run,
        dataset=spec.dataset,
        pool_uri=spec.pool_uri,
        submitted_at=entry.get("submitted_at"),
        shards=shards,
        lines=index["lines"] if index else None,
        stages=done,
        counted_from=source,
        progress=progress,
        **(view or {}),
        done=manifest is not None,
        manifest=manifest,
    )


@router.get("/{run}/report", responses={409: {"description": "not compacted yet"}})
def report(run: str, ctx: Authorised) -> dict[str, Any]:
    """The run report (per family: in, accepted, rejected, quarantined by reason)."""
    spec = runs.spec(ctx, run)
    if runs.manifest(ctx, spec) is None:
        raise HTTPException(409, "run not compacted yet")
    return dict(json.loads(runs.run_file(ctx, spec, "run_report.json")))


@router.get("/{run}/quarantine", response_model=QuarantinePublic)
def quarantine(
    run: str,
    ctx: Authorised,
    offset: Offset = 0,
    limit: Limit = 100,
    family: str | None = None,
    reason: str | None = None,
) -> QuarantinePublic:
    """Items that reached no split, in pool order, filtered by family and reason."""
    rows = runs.quarantined(ctx, runs.spec(ctx, run))
    reasons = runs.tally(rows, "reason")
    rows = [
        r
        for r in rows
        if (family is None or r["family"] == family) and (reason is None or r["reason"] == reason)
    ]
    page = [QuarantinedPublic.model_validate(r) for r in rows[offset : offset + limit]]
    return QuarantinePublic(data=page, count=len(rows), reasons=reasons)


@router.get("/{run}/calibration", responses={404: {"description": "no calibration stored"}})
def calibration(run: str, ctx: Authorised) -> dict[str, Any]:
    """The judge's calibration per family (Wilson 95%), from runs/<run>/calibration/, and
    the people's reviews of its promotions."""
    runs.spec(ctx, run)
    stored = list(ctx.store.list(keys.calibration_prefix(run)))
    if not stored:
        raise HTTPException(404, f"run {run!r} has no calibration stored")
    shards = [CalibrationShard.model_validate(json.loads(ctx.store.get(k))) for k in stored]
    records = [r for shard in shards for r in shard.records]
    s = ctx.settings
    families = summarise(
        records,
        size=s.judge_calibration_size,
        bound=s.judge_false_promotion_bound,
        stops=[shard.stops for shard in shards],
    )
    human = review_tally(reviews.reviews(ctx, run).values())
    return {"run": run, "records": len(records), "families": families, "human_review": human}


@router.post("/{run}/resume", status_code=202)
def resume(run: str, ctx: Authorised) -> dict[str, Any]:
    """Enqueue every shard's next missing stage, as `rsieve reconcile` does (the one
    resume: services.runs.reconcile). A stopped run is resumed (its stop and counted errors
    cleared). `enqueued`: each task sent and its arguments beside the run."""
    runs.spec(ctx, run)
    plan = ctx.reconcile(run)
    return {"run": run, "enqueued": [[task, kwargs] for task, kwargs in plan]}
