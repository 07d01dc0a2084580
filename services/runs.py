"""A run's bookkeeping: how it comes to be (`create_run`), what it is (`spec`, its own
`run_settings`), what it has stored (`load_run`, `stage_outputs`) and how it is resumed
(`reconcile`, the one resume: `rsieve reconcile`, the API's POST /runs/<run>/resume and
the sweeper). The one module of services that code outside them may call (the command
line drives the same run logic: docs in CONTRIBUTING.md, "Where code goes"); `connect`
gives such code the context the services run on."""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Iterator
from typing import Any

from rsieve import keys
from rsieve.clean.profiles import PROFILES_FILE, FamilyProfile, profiles_of
from rsieve.compact.settle import dataset_conflict
from rsieve.dataset.audit import plan_reconcile
from rsieve.errors import ConflictError, NotFoundError
from rsieve.run.submission import run_id
from rsieve.schemas import STAGES, RunSpec, ShardOutput
from rsieve.settings import SAMPLING, TRAINING, Settings
from rsieve.verify import protocol_versions
from services.outputs import load, load_json, shard_index, stored_shards
from services.stage import clear_stop
from services.stage_context import StageContext

__all__ = [
    "StageContext",
    "compacted",
    "connect",
    "create_run",
    "dataset_profiles",
    "fingerprint",
    "load_run",
    "reconcile",
    "run_settings",
    "spec",
    "stage_outputs",
]

SPECS_KEPT = 1024  # run specs (and their settings) a process keeps; a few KB each


def connect(settings: Settings) -> StageContext:
    """The context the services run on, for code outside them (the command line): the
    same bucket, Redis and queues, so what it reads and sends is what a worker would."""
    from services.worker import bootstrap  # the wiring imports every concern, this among them

    return bootstrap(settings)


def fingerprint(ctx: StageContext, settings: Settings | None = None) -> dict[str, object]:
    """A run's decision inputs beside its pool: every DECIDING setting (of `settings`,
    the run's, when it chose its own sampling), and the registered evaluation sets by
    their content's sha256 when there are any (adding or changing a set makes the next
    submission of a pool a new run)."""
    sets = {
        name: hashlib.sha256(ctx.store.get(key)).hexdigest()
        for key in ctx.store.list(keys.EVALSETS_PREFIX)
        if (name := keys.evalset_name(key)) is not None
    }
    return (settings or ctx.settings).fingerprint() | ({"evalsets": sets} if sets else {})


def create_run(
    ctx: StageContext,
    *,
    pool_uri: str,
    pool_sha256: str,
    dataset: str,
    settings: Settings | None = None,
    index_extra: dict[str, Any] | None = None,
) -> str:
    """The one way a run comes to be (POST /runs and the watched folders): its id from
    the pool, the dataset and what decides it; refused (ConflictError) when the dataset
    was made with other sampling; written once (spec, then its index entry) and handed
    to ingest. Submitting it again returns the same id and writes nothing."""
    settings = settings or ctx.settings
    decides, protocols = fingerprint(ctx, settings), protocol_versions()
    run = run_id(pool_sha256, dataset, decides, protocols)
    conflict = dataset_conflict(load_json(ctx, keys.manifest(dataset)), settings.samples)
    if conflict:
        raise ConflictError(conflict)
    if ctx.store.exists(keys.run_spec(run)):
        return run
    written = RunSpec(
        run=run,
        dataset=dataset,
        pool_uri=pool_uri,
        pool_sha256=pool_sha256,
        settings=decides,
        protocols=protocols,
    )
    ctx.store.put(keys.run_spec(run), written.model_dump_json(indent=1).encode())
    entry = {"run": run, "dataset": dataset, "pool_uri": pool_uri, "submitted_at": time.time()}
    ctx.store.put(
        keys.run_index(run),
        json.dumps(entry | (index_extra or {})).encode(),
        content_type="application/json",
    )
    ctx.next("rsieve.ingest", run=run)
    return run


def spec(ctx: StageContext, run: str) -> RunSpec:
    """The run's spec. run.json is written once, at submission, before any task of the
    run is sent (`create_run`): read once per process, not once per task (a task of a
    200,000-item run's ingest read it up to three times)."""
    cache = ctx.cache("specs", SPECS_KEPT)
    found = cache.get(run)
    if found is None:
        found = cache.put(run, RunSpec.model_validate_json(ctx.store.get(keys.run_spec(run))))
    return found


def run_settings(ctx: StageContext, run: str) -> Settings:
    """The service's settings with the run's own sampling and training acceptance, as
    its spec records them."""
    cache = ctx.cache("run_settings", SPECS_KEPT)
    found = cache.get(run)
    if found is None:
        recorded = spec(ctx, run).settings
        chosen = ctx.settings.for_run({k: recorded[k] for k in SAMPLING if k in recorded})
        # Validated when the run was submitted (Settings' own validators).
        found = cache.put(
            run, chosen.model_copy(update={k: recorded[k] for k in TRAINING if k in recorded})
        )
    return found


def dataset_profiles(ctx: StageContext, dataset: str) -> dict[str, FamilyProfile]:
    """The dataset's family profiles as its current commit holds them (the manifest's
    profiles.json; none before its first commit, or one made before profiles)."""
    manifest = load_json(ctx, keys.manifest(dataset)) or {}
    stored = (manifest.get("files") or {}).get(PROFILES_FILE)
    return profiles_of(load_json(ctx, keys.dataset_file(dataset, stored)) if stored else None)


def stage_outputs(ctx: StageContext, run: str, stage: str) -> Iterator[ShardOutput]:
    """Every stored output of `stage` for the run, in shard order, each seal checked: read
    one at a time as they are consumed (an export of a large run never holds them all)."""
    shards = sorted(stored_shards(ctx, run, stage))
    return (load(ctx, run, stage, shard) for shard in shards)


def load_run(
    ctx: StageContext, run: str
) -> tuple[dict[str, Any] | None, dict[str, dict[str, ShardOutput]]]:
    """The shard index and every stored stage output of a run."""
    index = shard_index(ctx, run)
    outputs: dict[str, dict[str, ShardOutput]] = {}
    for stage in STAGES:
        outputs[stage] = {
            shard: load(ctx, run, stage, shard) for shard in sorted(stored_shards(ctx, run, stage))
        }
    return index, outputs


def compacted(ctx: StageContext, run: str) -> bool:
    dataset = spec(ctx, run).dataset
    try:
        manifest = json.loads(ctx.store.get(keys.manifest(dataset)))
    except NotFoundError:
        return False
    return run in manifest.get("runs", [])


def reconcile(ctx: StageContext, run: str) -> list[tuple[str, dict[str, Any]]]:
    """Enqueue every shard's next missing stage; returns what was enqueued. A stopped
    run is resumed: its stop, failed record and counted errors are cleared first."""
    clear_stop(ctx, run)
    present = {stage: stored_shards(ctx, run, stage) for stage in STAGES}
    plan = plan_reconcile(shard_index(ctx, run), present, compacted=compacted(ctx, run))
    for task, kwargs in plan:
        ctx.next(task, run=run, **kwargs)
    return plan
