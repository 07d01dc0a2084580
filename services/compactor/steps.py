"""The compactor's steps (rsieve.run.partitions): the plan, routing a group of shards, one
partition's compaction, and the commit. What is composed is rsieve.commit's; this reads
and writes. Every step is idempotent: what it stored is found and not done again.

Under runs/<run>/compact/ (keys built by rsieve.keys): `plan.json` (partitions, groups),
`route/<partition>/<group>.json` (a group's outcomes and quarantines for that partition),
`route/calibration/<group>.json`, `calibration.json` (the run's calibration records and
summary), and per generation of the dataset (`g<n>`: its manifest's number of runs, what
the partitions deduplicated against) `g<n>/<partition>.json` (the partition's summary) and
`g<n>/<partition>.quarantine.jsonl`."""

from __future__ import annotations

import io
import json
from typing import Any

from PIL import Image
from pydantic import BaseModel

from rsieve import keys, redis_keys
from rsieve.adapters.keyindex import held_keys, legacy_runs, write_buckets
from rsieve.adapters.parquet import upload_splits
from rsieve.adapters.storage import PackReader
from rsieve.compact.compaction import next_manifest
from rsieve.compact.keyindex import IndexStats
from rsieve.compact.rows import assemble_rows
from rsieve.compact.traces import (
    LengthBand,
    TraceLimits,
    gate_summary,
    length_bands,
    merge_lengths,
    trace_lengths,
)
from rsieve.dataset.commit import (
    commit_files,
    compose_report,
    near_keys,
    partition_summary,
    qa_entries,
    quarantine_listing,
    settle,
)
from rsieve.dataset.report import token_usage, tokens_summed
from rsieve.images import IMAGE_FORMATS
from rsieve.judge.calibration import CalibrationRecord, bottom_k, summarise
from rsieve.judge.sequential import FamilyStop
from rsieve.run.partitions import (
    merge_summaries,
    outcome_partition,
    partition_count,
    partition_label,
    quarantine_partition,
    route_groups,
    sorted_lines,
)
from rsieve.schemas import STAGES, Outcome, Quarantined
from services.context import Context

EXAMPLES = 3  # rows per split shown on the card


def generation(manifest: dict[str, Any] | None) -> int:
    """A dataset's generation: its number of committed runs."""
    return len((manifest or {}).get("runs", []))


def plan(ctx: Context, run: str) -> dict[str, Any]:
    """The run's partitions and routing groups, decided once (settings may change)."""
    key = keys.compact_plan(run)
    stored = ctx.load_json(key)
    if stored is not None:
        return stored
    index = ctx.shard_index(run) or {}
    s = ctx.settings
    count = partition_count(index["lines"], s.compact_partition_items)
    groups = route_groups(index["shards"], s.compact_route_shards) if count > 1 else []
    made = {"partitions": count, "groups": groups}
    ctx.store.put(key, json.dumps(made).encode())
    return made


def missing_routes(ctx: Context, run: str, groups: int) -> list[int]:
    stored = set(ctx.store.list(keys.compact_routed_prefix(run)))
    return [g for g in range(groups) if keys.compact_routed(run, g) not in stored]


def missing_partitions(ctx: Context, run: str, count: int, gen: int) -> list[int]:
    stored = set(ctx.store.list(keys.compact_generation_prefix(run, gen)))
    return [p for p in range(count) if _summary_key(run, gen, p) not in stored]


def _piece(run: str, partition: int, group: int) -> str:
    return keys.compact_piece(run, partition_label(partition), group)


def _summary_key(run: str, gen: int, partition: int) -> str:
    return keys.compact_summary(run, gen, partition_label(partition))


def _quarantine_key(run: str, gen: int, partition: int) -> str:
    return keys.compact_quarantine(run, gen, partition_label(partition))


def _stored_shard(
    ctx: Context, run: str, shard: str
) -> tuple[list[Outcome], list[Quarantined], list[CalibrationRecord]]:
    """A shard's judged outcomes, its items quarantined at any stage, its calibration."""
    quarantined = [q for stage in STAGES[:-1] for q in ctx.quarantined(run, stage, shard)]
    judged = ctx.load(run, "judge", shard)
    cal = ctx.calibration_shard(run, shard)
    records: list[CalibrationRecord] = list(cal.records) if cal else []
    return judged.outcomes, quarantined + judged.quarantined, records


def route(ctx: Context, run: str, group: int) -> None:
    """A group of shards' outcomes and quarantines, each to its partition's piece. The
    outcomes pass as the judge stored them (JSON, not validated here: the partition
    validates them once)."""
    the_plan = plan(ctx, run)
    if keys.compact_routed(run, group) in set(ctx.store.list(keys.compact_routed_prefix(run))):
        return
    count = the_plan["partitions"]
    pieces: list[dict[str, list[Any]]] = [{"outcomes": [], "quarantined": []} for _ in range(count)]
    records: list[CalibrationRecord] = []
    stops: list[dict[str, Any]] = []
    lengths: list[dict[str, list[int]]] = []
    for shard in the_plan["groups"][group]:
        judged = ctx.load_raw(run, "judge", shard)
        lengths.append(trace_lengths(judged["outcomes"]))
        for o in judged["outcomes"]:
            p = outcome_partition(o["generation"]["item"]["image_sha256"], count)
            pieces[p]["outcomes"].append(o)
        earlier = [
            q.model_dump(mode="json") for st in STAGES[:-1] for q in ctx.quarantined(run, st, shard)
        ]
        for q in earlier + judged["quarantined"]:
            pieces[quarantine_partition(q["line"], count)]["quarantined"].append(q)
        if cal := ctx.calibration_shard(run, shard):
            records += cal.records
            stops.append({f: st.model_dump() for f, st in cal.stops.items()})
    for p, piece in enumerate(pieces):
        ctx.store.put(_piece(run, p, group), json.dumps(piece).encode())
    # The run's summary needs each group's bottom-k alone; the tokens of every call; its
    # trace gate, every accepted trace's length (a family's median is not mergeable).
    marked = {
        "trace_lengths": merge_lengths(lengths),
        "records": [
            r.model_dump(mode="json")
            for r in bottom_k(records, ctx.settings.judge_calibration_size)
        ],
        "tokens": token_usage((), records),
        "stops": stops,
    }
    ctx.store.put(keys.compact_routed(run, group), json.dumps(marked).encode())  # the group's mark


class _Piece(BaseModel):
    outcomes: list[Outcome]
    quarantined: list[Quarantined]


def calibration(ctx: Context, run: str, groups: int | None) -> dict[str, Any]:
    """The run's calibration summary, the token usage of its calibration calls and its
    families' trace length bands (rsieve.compact.traces), from its shards, or from its
    routing groups' bottom-k, usage and trace lengths; stored once: `{"summary", "tokens",
    "trace_bands"}`."""
    key = keys.compact_calibration(run)
    stored = ctx.load_json(key)
    if stored is None:
        records: list[CalibrationRecord] = []
        stops: list[dict[str, FamilyStop]] = []
        tokens: list[dict[str, Any]] = []
        lengths: list[dict[str, list[int]]] = []
        if groups is None:
            for shard in (ctx.shard_index(run) or {})["shards"]:
                lengths.append(trace_lengths(ctx.load_raw(run, "judge", shard)["outcomes"]))
                if cal := ctx.calibration_shard(run, shard):
                    records += cal.records
                    stops.append(dict(cal.stops))
            tokens.append(token_usage((), records))
        else:
            for g in range(groups):
                marked = json.loads(ctx.store.get(keys.compact_routed(run, g)))
                records += [CalibrationRecord.model_validate(r) for r in marked["records"]]
                tokens.append(marked["tokens"])
                stops += [
                    {f: FamilyStop.model_validate(st) for f, st in part.items()}
                    for part in marked.get("stops", [])  # routed before sequential calibration
                ]
                lengths.append(marked.get("trace_lengths", {}))  # routed before the gate
        s = ctx.settings
        summary = summarise(
            records,
            size=s.judge_calibration_size,
            bound=s.judge_false_promotion_bound,
            stops=stops,
        )
        bands = length_bands(merge_lengths(lengths), TraceLimits.of(ctx.run_settings(run)))
        stored = {
            "summary": summary,
            "tokens": tokens_summed(tokens),
            "trace_bands": {family: band.as_dict() for family, band in bands.items()},
        }
        ctx.store.put(key, json.dumps(stored).encode())
    return stored


def trace_bands(calibrated: dict[str, Any]) -> dict[str, LengthBand]:
    return {f: LengthBand(**b) for f, b in calibrated.get("trace_bands", {}).items()}


def _partition_input(
    ctx: Context, run: str, partition: int, the_plan: dict[str, Any]
) -> tuple[list[Outcome], list[Quarantined]]:
    if the_plan["partitions"] == 1:
        outcomes: list[Outcome] = []
        quarantined: list[Quarantined] = []
        for shard in sorted((ctx.shard_index(run) or {})["shards"]):
            o, q, _ = _stored_shard(ctx, run, shard)
            outcomes += o
            quarantined += q
        return outcomes, quarantined
    outcomes, quarantined = [], []
    for group in range(len(the_plan["groups"])):
        piece = _Piece.model_validate_json(ctx.store.get(_piece(run, partition, group)))
        outcomes += piece.outcomes
        quarantined += piece.quarantined
    return outcomes, quarantined


def compact_partition(ctx: Context, run: str, partition: int, gen: int) -> bool:
    """One partition's rows, key index buckets, near keys and example images against the
    dataset at generation `gen`, then its summary. False when the dataset has moved on
    (another run committed): the coordinator must plan against the new generation."""
    s, spec = ctx.settings, ctx.spec(run)
    prefix = keys.dataset_prefix(spec.dataset)
    previous = ctx.load_json(keys.manifest(spec.dataset))
    if generation(previous) != gen:
        return False
    the_plan = plan(ctx, run)
    key = _summary_key(run, gen, partition)
    if ctx.store.exists(key):
        return True
    label = partition_label(partition) if the_plan["partitions"] > 1 else None
    outcomes, quarantined = _partition_input(ctx, run, partition, the_plan)
    calibrated = calibration(ctx, run, len(the_plan["groups"]) if label else None)
    stats = IndexStats()
    existing = held_keys(
        ctx.store, prefix, previous, qa_entries(outcomes), stats, chunk_keys=s.key_index_chunk_keys
    )
    settled = settle(
        outcomes,
        calibration=calibrated["summary"],
        bound=s.judge_false_promotion_bound,
        existing_keys=existing,
        traces=TraceLimits.of(ctx.run_settings(run)),
        bands=trace_bands(calibrated),
    )
    reader = PackReader(
        ctx.store, [r for o in settled.outcomes if (r := o.generation.item.image_at)]
    )
    sampled = bool((previous or {}).get("sampled", spec.settings.get("samples", 1) > 1))
    rows = assemble_rows(settled.added, run)
    shards = upload_splits(ctx.store, prefix, run, rows, reader.get, s, sampled, label)
    qa_keys = write_buckets(
        ctx.store,
        prefix,
        previous,
        run,
        qa_entries(settled.added),
        stats,
        chunk_keys=s.key_index_chunk_keys,
    )
    ctx.store.put(
        keys.near_keys(spec.dataset, f"{run}-{label}" if label else run), near_keys(settled.added)
    )
    ctx.store.put(_quarantine_key(run, gen, partition), quarantine_listing(quarantined).encode())
    stored = {
        "shards": shards,
        "qa_keys": qa_keys,
        "examples": _examples(ctx, prefix, settled.added, reader.get),
        "dataset_keys": stats.as_dict(),
    }
    ctx.store.put(key, json.dumps(partition_summary(settled, quarantined, **stored)).encode())
    return True


def _examples(
    ctx: Context, prefix: str, added: list[Outcome], image_of: Any
) -> dict[str, list[Any]]:
    """The partition's first rows per split, with their first line and the image beside
    the card (the commit keeps the first rows of the run)."""
    first_line: dict[str, int] = {}
    for o in added:
        first_line.setdefault(o.generation.item.image_sha256, o.generation.item.line)
    examples: dict[str, list[Any]] = {}
    for split, rows in assemble_rows(added).items():
        for row in rows[:EXAMPLES]:
            data = image_of(row["image_sha256"])
            with Image.open(io.BytesIO(data), formats=IMAGE_FORMATS) as img:  # the header
                ext = (img.format or "bin").lower()
            path = keys.example_image(row["image_sha256"], ext)
            ctx.store.put(prefix + path, data)
            examples.setdefault(split, []).append(
                [first_line[row["image_sha256"]], row["qa"][0], path]
            )
    return examples


def commit(ctx: Context, run: str, gen: int, partitions: int) -> bool:
    """The run committed from its partitions' summaries: the card, report, quarantine and
    run spec under commits/<run>/, then the manifest (the commit point). One commit per
    dataset at a time (a Redis lock held for the commit alone); False when another run
    committed since the partitions were made."""
    s, spec = ctx.settings, ctx.spec(run)
    with ctx.redis.lock(redis_keys.compact_lock(spec.dataset), timeout=s.task_time_limit_s):
        previous = ctx.load_json(keys.manifest(spec.dataset))
        if previous and run in previous.get("runs", []):
            return True
        if generation(previous) != gen:
            return False
        summaries = [_summary_key(run, gen, p) for p in range(partitions)]
        merged = merge_summaries(json.loads(ctx.store.get(k)) for k in summaries)
        calibrated = calibration(ctx, run, None)
        summary = calibrated["summary"]
        bound = s.judge_false_promotion_bound
        cleaning = ctx.load_json(keys.cleaning(run))
        report = compose_report(
            merged,
            run=run,
            index=ctx.shard_index(run) or {},
            calibration_tokens=calibrated["tokens"],
            calibration=summary,
            bound=bound,
            cleaning=cleaning,
            trace_gate=gate_summary(TraceLimits.of(ctx.run_settings(run)), trace_bands(calibrated)),
            samples=ctx.run_settings(run).samples,
        )
        quarantine = "".join(
            sorted_lines(
                ctx.store.get(_quarantine_key(run, gen, p)).decode().splitlines(keepends=True)
                for p in range(partitions)
            )
        )
        manifest = next_manifest(
            previous,
            dataset=spec.dataset,
            run=run,
            shards=merged["shards"],
            adds_up=report["adds_up"],
            sampled=bool((previous or {}).get("sampled", spec.settings.get("samples", 1) > 1)),
            qa_keys=(previous or {}).get("qa_keys", {}) | merged["qa_keys"],
            legacy_key_runs=legacy_runs(previous),
        )
        examples = merged["examples"]
        manifest["files"].update({path: path for rows in examples.values() for _, path in rows})
        reviews = [
            json.loads(ctx.store.get(key))
            for r in manifest["runs"]
            for key in ctx.store.list(keys.reviews_prefix(r))
        ]
        files = commit_files(
            report=report,
            quarantine=quarantine,
            spec=spec,
            manifest=manifest,
            examples=examples,
            reviews=reviews,
            merged=merged,
            calibration=summary,
            cleaning=cleaning,
            bound=bound,
            profiles=ctx.dataset_profiles(spec.dataset),
        )
        for name, data in files.items():
            ctx.store.put(keys.dataset_file(spec.dataset, keys.commit_file(run, name)), data)
        # The commit point, written last; then browsing copies of the current commit.
        ctx.store.put(keys.manifest(spec.dataset), json.dumps(manifest, indent=1).encode())
        for name, data in files.items():
            ctx.store.put(keys.dataset_file(spec.dataset, name), data)
        return True
