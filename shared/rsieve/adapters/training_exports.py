"""A committed run's samples out of object storage for preference optimisation and RL
(`rsieve export RUN --format dpo|kto|rl`): the judge stage's settled outcomes, shard by
shard, through the pure rules (rsieve.dataset.preference, rsieve.dataset.rlsets) to a
folder, with the images read from the pool's packs. One shard's outcomes and one pack read
are in memory at a time; output parts close past `shard_bytes`."""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, Literal

from rsieve.adapters.exports import EmptyExport, SplitWriter
from rsieve.adapters.storage import ObjectStore, PackReader
from rsieve.dataset.preference import (
    KTO_FEATURES,
    PAIR_FEATURES,
    Gate,
    PairCounts,
    PairRules,
    item_pairs,
    kto_rows,
    pair_splits,
)
from rsieve.dataset.rlsets import Band, Layout, RlCounts, layout_features, rl_row
from rsieve.dataset.training_card import render_pairs_card, render_rl_card, split_front_matter
from rsieve.judge.calibration import untrusted_families
from rsieve.schemas import Item, Outcome

__all__ = ["TrainingFormat", "export_preference", "export_rl", "target_name"]

TrainingFormat = Literal["dpo", "kto", "rl"]


def target_name(run: str, fmt: str, layout: str | None = None) -> str:
    """The export's folder name under --to: one per run, format and layout (a run id
    begins with its dataset's name)."""
    tail = f"-{layout}" if layout and layout != "trl" else ""
    return f"{run}-{fmt}{tail}"


def _staging(dest: Path, name: str) -> Path:
    staging = dest / f".{name}.partial"
    shutil.rmtree(staging, ignore_errors=True)
    (staging / "data").mkdir(parents=True)
    return staging


def _publish(dest: Path, name: str, staging: Path) -> Path:
    target = dest / name
    shutil.rmtree(target, ignore_errors=True)
    staging.rename(target)
    return target


def _images(store: ObjectStore, outcomes: Sequence[Outcome]) -> Callable[[Item], bytes]:
    refs = [r for o in outcomes if (r := o.generation.item.image_at)]
    reader = PackReader(store, refs)

    def image(item: Item) -> bytes:
        if item.image_at is None:
            raise ValueError(f"item {item.id}: its output records no pack of its image")
        return reader.get(item.image_sha256)

    return image


def _trusted(report: dict[str, Any], bound: float) -> Callable[[str], bool]:
    summary = report.get("calibration") or {}
    held = untrusted_families(summary, bound)
    return lambda family: family in summary and family not in held


def export_preference(
    store: ObjectStore,
    shards: Iterable[Sequence[Outcome]],
    dest: Path,
    *,
    dataset: str,
    run: str,
    fmt: Literal["dpo", "kto"],
    rules: PairRules,
    report: dict[str, Any],
    bound: float,
    sampling: dict[str, Any],
    shard_bytes: int = 256 << 20,
) -> Path:
    """Write one run's preference data (`dpo`: `<Family>_pairs` and `<Family>_format_pairs`;
    `kto`: `<Family>`) to dest/<run>-<fmt>/ with its card; `shards`: the judge
    stage's settled outcomes, shard by shard. Raises EmptyExport when no row is made."""
    name = target_name(run, fmt)
    staging = _staging(dest, name)
    features = PAIR_FEATURES if fmt == "dpo" else KTO_FEATURES
    writers: dict[str, SplitWriter] = {}
    counts: dict[str, PairCounts] = {}
    trusted = _trusted(report, bound)
    gate = Gate.of_report(report.get("trace_gate"))

    def writer(split: str) -> SplitWriter:
        if split not in writers:
            writers[split] = SplitWriter(staging / "data", split, shard_bytes, features)
        return writers[split]

    for outcomes in shards:
        image_of = _images(store, outcomes)
        for head in outcomes:
            item = head.generation.item
            image = {"bytes": image_of(item), "path": item.image_sha256}
            pairs_split, format_split = pair_splits(item.family)
            if fmt == "dpo":
                rows, format_rows, c = item_pairs(
                    head, image, rules, trusted=trusted, gate=gate, run=run
                )
                writer(pairs_split).write(rows)
                writer(format_split).write(format_rows)
            else:
                rows, c = kto_rows(head, image, rules, trusted=trusted, gate=gate, run=run)
                writer(pairs_split.removesuffix("_pairs")).write(rows)
            counts.setdefault(item.family, PairCounts()).add(c)
    files = {s: names for s, w in sorted(writers.items()) if (names := w.finish())}
    if not files:
        shutil.rmtree(staging, ignore_errors=True)
        raise EmptyExport(f"run {run} has no {fmt} rows: no item has {_need(fmt)}")
    rows_per_split = {s: writers[s].rows for s in files}
    front = split_front_matter(features, files, rows_per_split, tags=[fmt, "preference"])
    card = render_pairs_card(
        dataset, run, fmt, rules, counts, rows_per_split, sampling, front_matter=front
    )
    (staging / "README.md").write_text(card)
    return _publish(dest, name, staging)


def _need(fmt: str) -> str:
    return "an accepted and a refused sample" if fmt == "dpo" else "a sample on either side"


def export_rl(
    store: ObjectStore,
    shards: Iterable[Sequence[Outcome]],
    dest: Path,
    *,
    dataset: str,
    run: str,
    layout: Layout,
    band: Band,
    training_rule_of: Callable[[Item], str],
    sampling: dict[str, Any],
    shard_bytes: int = 256 << 20,
) -> Path:
    """Write one run's RL prompt set in `layout` to dest/<run>-rl[-<layout>]/
    with its card: `trl` and `easyr1` a Hugging Face dataset (split `train`), `verl` one
    `train.parquet`. Raises EmptyExport when no item lies in the band."""
    name = target_name(run, "rl", layout)
    staging = _staging(dest, name)
    features = layout_features(layout)
    # verl reads the files it is given (data.train_files); one file is what its examples use.
    out = SplitWriter(
        staging / "data", "train", shard_bytes if layout != "verl" else 1 << 62, features
    )
    counts: dict[str, RlCounts] = {}
    index = 0
    for outcomes in shards:
        image_of = _images(store, outcomes)
        rows = []
        for head in outcomes:
            item = head.generation.item
            row, place = rl_row(
                head,
                image_of(item),
                training_rule=training_rule_of(item),
                band=band,
                layout=layout,
                index=index,
                run=run,
            )
            counts.setdefault(item.family, RlCounts()).count(place)
            if row is not None:
                rows.append(row)
                index += 1
        out.write(rows)
    files = out.finish("train.parquet" if layout == "verl" else None)
    if not files:
        shutil.rmtree(staging, ignore_errors=True)
        raise EmptyExport(
            f"run {run} has no item whose pass rate lies in ({band.low}, {band.high})"
        )
    if layout == "verl":
        (staging / "data").rmdir()
    front = (
        split_front_matter(features, {"train": files}, {"train": out.rows}, tags=["rl"])
        if layout != "verl"
        else None
    )
    card = render_rl_card(dataset, run, layout, band, counts, sampling, front_matter=front)
    (staging / "README.md").write_text(card)
    return _publish(dest, name, staging)
