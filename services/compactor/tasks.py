"""Compactor: adds a finished run to its dataset under datasets/<dataset>/: new Parquet
shards per split (only items the dataset does not hold yet), the card, the run's report
and quarantine, and the manifest last (the commit point). One compaction per dataset at a
time (a Redis lock); streaming, so memory is bounded by the row-group size."""

from __future__ import annotations

import io
import json
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from PIL import Image

from rsieve.adapters.parquet import write_split_parts
from rsieve.adapters.storage import PackReader
from rsieve.calibration import (
    CalibrationShard,
    calibration_key,
    hold_back,
    promotions_listing,
    render_calibration_markdown,
    summarise,
)
from rsieve.card import render_card
from rsieve.cleaning import render_cleaning
from rsieve.compaction import dedupe, next_manifest, qa_key, shard_name
from rsieve.errors import NotFoundError
from rsieve.report import run_report
from rsieve.rows import assemble_rows
from services.common import Context, StageTask

STAGES = ("clean", "generate", "verify", "judge")


def register(ctx: Context) -> None:
    @ctx.app.task(name="rsieve.compact", base=StageTask)
    def compact(run: str) -> None:
        spec = ctx.spec(run)
        prefix = f"datasets/{spec.dataset}/"
        with ctx.redis.lock(
            f"rsieve:compact:{spec.dataset}", timeout=ctx.settings.task_time_limit_s
        ):
            previous = _load_json(ctx, prefix + "manifest.json")
            if previous and run in previous.get("runs", []):
                return
            index = json.loads(ctx.store.get(f"runs/{run}/shards.json"))
            outcomes, quarantined = [], []
            for shard in index["shards"]:
                for stage in STAGES[:-1]:
                    quarantined += ctx.quarantined(run, stage, shard)
                judged = ctx.load(run, "judge", shard)
                quarantined += judged.quarantined
                outcomes += judged.outcomes
            bound = ctx.settings.judge_false_promotion_bound
            summary = summarise(
                _calibration_records(ctx, run, index["shards"]),
                size=ctx.settings.judge_calibration_size,
                bound=bound,
            )
            outcomes = hold_back(outcomes, summary, bound)
            report = run_report(
                run=run,
                lines=index["lines"],
                outcomes=outcomes,
                quarantined=quarantined,
                blank_lines=index["blank_lines"],
            )
            report["calibration"] = summary
            report["judge_promotions"] = promotions_listing(outcomes)
            existing: set[str] = set()
            for old in (previous or {}).get("runs", []):
                existing.update(json.loads(ctx.store.get(f"{prefix}keys/{old}.json")))
            added, skipped = dedupe(outcomes, existing)
            report["already_in_dataset"] = skipped
            cleaning = _load_json(ctx, f"runs/{run}/cleaning.json")
            if cleaning is not None:
                report["cleaning"] = cleaning
            images = _images(ctx, outcomes)
            shards = _write_splits(ctx, prefix, run, assemble_rows(added, run), images)
            ctx.store.put(
                f"{prefix}keys/{run}.json",
                json.dumps(
                    sorted(
                        qa_key(o.generation.item.image_sha256, o.generation.item.question)
                        for o in added
                    )
                ).encode(),
            )
            manifest = next_manifest(
                previous, dataset=spec.dataset, run=run, shards=shards, adds_up=report["adds_up"]
            )
            families = {o.generation.item.family for o in outcomes}
            examples = _examples(ctx, prefix, manifest, added, images)
            manifest["files"].update({path: path for rows in examples.values() for _, path in rows})
            card = render_card(
                dataset=spec.dataset,
                spec=spec.model_dump()
                | {"protocols_used": sorted({o.generation.item.protocol for o in outcomes})},
                report=report,
                manifest=manifest,
                split_families=_split_families(manifest, families),
                examples=examples,
                cleaning_md="\n".join(render_cleaning(cleaning)) if cleaning else "",
                calibration_md=render_calibration_markdown(summary, bound=bound)
                + _human_review_md(ctx, manifest["runs"], report),
            )
            quarantine = "".join(
                json.dumps(q.model_dump(), ensure_ascii=False) + "\n"
                for q in sorted(quarantined, key=lambda q: q.line)
            )
            commit = {
                "run_report.json": json.dumps(report, indent=1).encode(),
                "quarantine.jsonl": quarantine.encode(),
                "README.md": card.encode(),
            }
            for name, data in commit.items():
                ctx.store.put(f"{prefix}commits/{run}/{name}", data)
            ctx.store.put(
                prefix + "manifest.json",  # the commit point, written last
                json.dumps(manifest, indent=1).encode(),
            )
            for name, data in commit.items():  # browsing copies of the current commit
                ctx.store.put(prefix + name, data)


def _calibration_records(ctx: Context, run: str, shards: list[str]) -> list[Any]:
    records: list[Any] = []
    for shard in shards:
        try:
            raw = ctx.store.get(calibration_key(run, shard))
        except NotFoundError:
            continue
        records += CalibrationShard.model_validate_json(raw).records
    return records


def _human_review_md(ctx: Context, runs: list[str], report: dict[str, Any]) -> str:
    """People's calls on judge promotions (the review page) for every run in the dataset,
    counted at compaction time: a review made later counts at the next compaction."""
    counts: dict[str, dict[str, int]] = {}
    for run in runs:
        for key in ctx.store.list(f"runs/{run}/reviews/"):
            review = json.loads(ctx.store.get(key))
            fam = counts.setdefault(
                review.get("family") or "(unknown)", {"confirmed": 0, "wrong": 0}
            )
            if review.get("verdict") in fam:
                fam[review["verdict"]] += 1
    report["human_review"] = counts
    if not counts:
        return "\n\nNo judge promotion has been reviewed by a person yet."
    rows = [f"| {f} | {c['confirmed']} | {c['wrong']} |" for f, c in sorted(counts.items())]
    return (
        "\n\n### Reviewed by a person\n\n| family | confirmed | wrong |\n|---|---|---|\n"
        + "\n".join(rows)
    )


def _load_json(ctx: Context, key: str) -> dict[str, Any] | None:
    try:
        return dict(json.loads(ctx.store.get(key)))
    except NotFoundError:
        return None


def _images(ctx: Context, outcomes: list[Any]) -> Callable[[str], bytes]:
    """Image bytes by sha256 for rows written in pool order: a whole stretch of a pack per
    read (PackReader), images/<sha256> for items cleaned before packs existed."""
    reader = PackReader(
        ctx.store, [ref for o in outcomes if (ref := o.generation.item.image_at) is not None]
    )

    def image_of(sha: str) -> bytes:
        return reader.get(sha) if sha in reader else ctx.store.get(f"images/{sha}")

    return image_of


def _write_splits(
    ctx: Context,
    prefix: str,
    run: str,
    splits: dict[str, list[dict[str, Any]]],
    image_of: Callable[[str], bytes],
) -> list[dict[str, Any]]:
    """Each split's rows into Parquet files of bounded size, uploaded under their final
    names once the count is known."""
    shards: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="rsieve-compact-") as tmp:
        for split, rows in splits.items():
            parts = write_split_parts(
                rows,
                Path(tmp),
                split,
                image_of=image_of,
                shard_bytes=ctx.settings.parquet_shard_bytes,
                group_rows=ctx.settings.parquet_row_group_rows,
            )
            for i, (path, n) in enumerate(parts):
                name = shard_name(split, run, i, len(parts))
                ctx.store.put_file(prefix + name, str(path))
                shards.append(
                    {
                        "path": name,
                        "split": split,
                        "rows": n,
                        "run": run,
                        "bytes": path.stat().st_size,
                    }
                )
    return shards


def _split_families(manifest: dict[str, Any], families: set[str]) -> dict[str, str]:
    from rsieve.rows import split_name

    known = {split_name(f, k): f for f in families for k in ("RS_think", "RS_nothink", "rejected")}
    return {
        s: known.get(s, s.rsplit("_RS_", 1)[0].removesuffix("_rejected"))
        for s in manifest["splits"]
    }


def _examples(
    ctx: Context,
    prefix: str,
    manifest: dict[str, Any],
    added: list[Any],
    image_of: Callable[[str], bytes],
) -> dict[str, list[tuple[dict[str, Any], str]]]:
    """Up to three entries per split this run added, with their images beside the card."""
    examples: dict[str, list[tuple[dict[str, Any], str]]] = {}
    for split, rows in assemble_rows(added).items():
        for row in rows[:3]:
            data = image_of(row["image_sha256"])
            with Image.open(io.BytesIO(data)) as img:  # header only: the format
                ext = (img.format or "bin").lower()
            path = f"examples/{row['image_sha256'][:16]}.{ext}"
            ctx.store.put(prefix + path, data)
            examples.setdefault(split, []).append((row["qa"][0], path))
    return examples
