"""Compactor: adds a finished run to its dataset under datasets/<dataset>/: new Parquet
shards per split (only items the dataset does not hold yet), the card, the run's report
and quarantine, and the manifest last (the commit point). One compaction per dataset at a
time (a Redis lock); streaming, so memory is bounded by the row-group size. What is
committed is composed by rsieve.commit; this reads and writes."""

from __future__ import annotations

import contextlib
import io
import json
from collections.abc import Callable
from typing import Any

from PIL import Image

from rsieve.adapters.keyindex import held_keys, legacy_runs, write_buckets
from rsieve.adapters.parquet import upload_splits
from rsieve.adapters.storage import PackReader
from rsieve.calibration import CalibrationRecord, CalibrationShard, calibration_key
from rsieve.commit import Examples, commit_files, near_keys, plan_compaction, qa_entries
from rsieve.compaction import next_manifest
from rsieve.decontam import near_keys_key
from rsieve.errors import NotFoundError
from rsieve.images import IMAGE_FORMATS
from rsieve.keyindex import IndexStats
from rsieve.rows import assemble_rows
from rsieve.schemas import STAGES, Outcome, Quarantined
from services.common import Context


def register(ctx: Context) -> None:
    @ctx.task("rsieve.compact")
    def compact(run: str) -> None:
        s, spec = ctx.settings, ctx.spec(run)
        prefix = f"datasets/{spec.dataset}/"
        with ctx.redis.lock(f"rsieve:compact:{spec.dataset}", timeout=s.task_time_limit_s):
            previous = ctx.load_json(prefix + "manifest.json")
            if previous and run in previous.get("runs", []):
                return
            index = json.loads(ctx.store.get(f"runs/{run}/shards.json"))
            outcomes, quarantined, records = _stored(ctx, run, index["shards"])
            keys = IndexStats()
            existing = held_keys(
                ctx.store,
                prefix,
                previous,
                qa_entries(outcomes),
                keys,
                chunk_keys=s.key_index_chunk_keys,
            )
            plan = plan_compaction(
                run=run,
                index=index,
                outcomes=outcomes,
                quarantined=quarantined,
                calibration_records=records,
                existing_keys=existing,
                cleaning=ctx.load_json(f"runs/{run}/cleaning.json"),
                calibration_size=s.judge_calibration_size,
                bound=s.judge_false_promotion_bound,
            )
            refs = [ref for o in plan.outcomes if (ref := o.generation.item.image_at) is not None]
            reader = PackReader(ctx.store, refs)
            rows = assemble_rows(plan.added, run)
            # One schema per dataset: its first run's (rsieve.sampling.dataset_conflict).
            sampled = bool((previous or {}).get("sampled", spec.settings.get("samples", 1) > 1))
            shards = upload_splits(ctx.store, prefix, run, rows, reader.get, s, sampled)
            qa_keys = write_buckets(
                ctx.store,
                prefix,
                previous,
                run,
                qa_entries(plan.added),
                keys,
                chunk_keys=s.key_index_chunk_keys,
            )
            plan.report["dataset_keys"] = keys.as_dict()
            ctx.store.put(near_keys_key(spec.dataset, run), near_keys(plan.added))
            manifest = next_manifest(
                previous,
                dataset=spec.dataset,
                run=run,
                shards=shards,
                adds_up=plan.report["adds_up"],
                sampled=sampled,
                qa_keys=qa_keys,
                legacy_key_runs=legacy_runs(previous),
            )
            examples = _examples(ctx, prefix, plan.added, reader.get)
            manifest["files"].update({path: path for rows in examples.values() for _, path in rows})
            reviews = [
                json.loads(ctx.store.get(key))
                for r in manifest["runs"]
                for key in ctx.store.list(f"runs/{r}/reviews/")
            ]
            commit = commit_files(
                plan, spec=spec, manifest=manifest, examples=examples, reviews=reviews
            )
            for name, data in commit.items():
                ctx.store.put(f"{prefix}commits/{run}/{name}", data)
            # The commit point, written last; then browsing copies of the current commit.
            ctx.store.put(prefix + "manifest.json", json.dumps(manifest, indent=1).encode())
            for name, data in commit.items():
                ctx.store.put(prefix + name, data)


def _stored(
    ctx: Context, run: str, shards: list[str]
) -> tuple[list[Outcome], list[Quarantined], list[CalibrationRecord]]:
    """Every judged outcome, every item quarantined at any stage, every calibration record."""
    outcomes: list[Outcome] = []
    quarantined: list[Quarantined] = []
    records: list[CalibrationRecord] = []
    for shard in shards:
        for stage in STAGES[:-1]:  # the judge's outputs hold the outcomes
            quarantined += ctx.quarantined(run, stage, shard)
        judged = ctx.load(run, "judge", shard)
        quarantined += judged.quarantined
        outcomes += judged.outcomes
        with contextlib.suppress(NotFoundError):
            raw = ctx.store.get(calibration_key(run, shard))
            records += CalibrationShard.model_validate_json(raw).records
    return outcomes, quarantined, records


def _examples(
    ctx: Context, prefix: str, added: list[Outcome], image_of: Callable[[str], bytes]
) -> Examples:
    """Up to three entries per split this run added, with their images beside the card."""
    examples: dict[str, list[tuple[dict[str, Any], str]]] = {}
    for split, rows in assemble_rows(added).items():
        for row in rows[:3]:
            data = image_of(row["image_sha256"])
            with Image.open(io.BytesIO(data), formats=IMAGE_FORMATS) as img:  # the header
                ext = (img.format or "bin").lower()
            path = f"examples/{row['image_sha256'][:16]}.{ext}"
            ctx.store.put(prefix + path, data)
            examples.setdefault(split, []).append((row["qa"][0], path))
    return examples
