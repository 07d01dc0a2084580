"""A dataset's committed files out of object storage: the export to a folder (the card
format as committed, or the trainer format: rsieve.dataset.trainer), and where a committed run's
manifest and files are."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

import datasets
import pyarrow as pa
import pyarrow.parquet as pq

from rsieve import keys
from rsieve.adapters.storage import ObjectStore
from rsieve.dataset.trainer import (
    MESSAGES_FEATURES,
    TRAINER_SPLITS,
    family_of,
    messages_front_matter,
    messages_rows,
    render_messages_card,
    trainer_split,
)
from rsieve.errors import NotFoundError

__all__ = [
    "EmptyExport",
    "SplitWriter",
    "export_dataset",
    "export_messages",
]

_CHUNK = 16 << 20  # bytes per ranged read when a shard is copied to a local file


class EmptyExport(ValueError):
    """No row of the dataset goes to any split of the export."""


def export_dataset(store: ObjectStore, dataset: str, dest: Path) -> Path:
    """Copy the dataset's manifest-listed files to dest/<dataset>/, replacing what was there."""
    manifest = json.loads(store.get(keys.manifest(dataset)))
    target = dest / dataset
    staging = dest / f".{dataset}.partial"
    shutil.rmtree(staging, ignore_errors=True)
    for name, key in manifest["files"].items():
        path = staging / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(store.get(keys.dataset_file(dataset, key)))
    (staging / keys.MANIFEST).write_text(json.dumps(manifest, indent=1))
    shutil.rmtree(target, ignore_errors=True)
    staging.rename(target)
    return target


class SplitWriter:
    """One split's Parquet parts under `folder` (rows of `features`), each closed once it
    passes `shard_bytes`; named `<split>-<i>-of-<n>.parquet` when the count is known."""

    def __init__(
        self,
        folder: Path,
        split: str,
        shard_bytes: int,
        features: datasets.Features = MESSAGES_FEATURES,
    ) -> None:
        self.folder, self.split, self.shard_bytes = folder, split, shard_bytes
        self.schema = features.arrow_schema
        self.parts: list[Path] = []
        self.rows = 0
        self._writer: pq.ParquetWriter | None = None
        self._size = 0

    def write(self, rows: list[dict[str, Any]]) -> None:
        if not rows:
            return
        table = pa.Table.from_pylist(rows, schema=self.schema)
        if self._writer is None:
            self.parts.append(self.folder / f".{self.split}-{len(self.parts)}.parquet")
            self._writer = pq.ParquetWriter(self.parts[-1], self.schema)
        self._writer.write_table(table)
        self.rows += len(rows)
        self._size += table.nbytes
        if self._size >= self.shard_bytes:
            self.close()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer, self._size = None, 0

    def finish(self, single: str | None = None) -> list[str]:
        """Close and rename the parts to their final names: data/ paths in the export, or
        the one file `single` (its writer never closed a part early)."""
        self.close()
        if single is not None:
            if len(self.parts) > 1:
                raise ValueError(f"{self.split}: {len(self.parts)} parts for one file")
            for part in self.parts:
                part.rename(self.folder.parent / single)
            return [single] if self.parts else []
        names = []
        for i, part in enumerate(self.parts):
            name = f"data/{self.split}-{i:05d}-of-{len(self.parts):05d}.parquet"
            part.rename(self.folder.parent / name)
            names.append(name)
        return names


def _download(store: ObjectStore, key: str, path: Path) -> None:
    """Copy one stored object to `path` in ranged reads (never the whole object in memory)."""
    size = store.size(key)
    if size is None:
        raise NotFoundError(key)
    with path.open("wb") as fh:
        for start in range(0, size, _CHUNK):
            fh.write(store.get_range(key, start, min(start + _CHUNK, size)))


def _families(store: ObjectStore, dataset: str, manifest: dict[str, Any]) -> list[str]:
    """Every family named in the committed runs' reports (for split name -> family)."""
    families: set[str] = set()
    for run in manifest.get("runs") or [manifest.get("run")]:
        key = manifest["files"].get(f"reports/{run}.json")
        try:
            report = json.loads(store.get(keys.dataset_file(dataset, key))) if key else {}
        except NotFoundError:
            report = {}
        families.update(report.get("families") or {})
    return sorted(families)


def export_messages(
    store: ObjectStore,
    dataset: str,
    dest: Path,
    *,
    include_rejected: bool = False,
    group_rows: int = 256,
    shard_bytes: int = 256 << 20,
) -> Path:
    """Write the dataset's committed rows in the trainer format (rsieve.dataset.trainer) to
    dest/<dataset>-messages/, replacing what was there: `data/<split>-<i>-of-<n>.parquet`
    for the splits `think`, `nothink` (and `rejected` when asked) with a README.md whose
    YAML lists them, so `datasets.load_dataset(folder)` gives those splits.

    Streaming: one committed shard at a time is copied to a temporary file and read
    `group_rows` card rows at a time; output parts close past `shard_bytes`. Raises
    EmptyExport when no row goes to any split (nothing accepted, rejected not asked for)."""
    manifest = json.loads(store.get(keys.manifest(dataset)))
    families = _families(store, dataset, manifest)
    name = f"{dataset}-messages"
    target = dest / name
    staging = dest / f".{name}.partial"
    shutil.rmtree(staging, ignore_errors=True)
    (staging / "data").mkdir(parents=True)
    wanted = [s for s in TRAINER_SPLITS.values() if include_rejected or s != "rejected"]
    writers = {s: SplitWriter(staging / "data", s, shard_bytes) for s in wanted}
    counts: dict[str, dict[str, int]] = {}
    with tempfile.TemporaryDirectory(prefix="rsieve-export-") as tmp:
        local = Path(tmp) / "shard.parquet"
        for shard in manifest["shards"]:
            split = trainer_split(shard["split"])
            if split not in writers:
                continue
            family = family_of(shard["split"], families)
            path = manifest["files"].get(shard["path"], shard["path"])
            _download(store, keys.dataset_file(dataset, path), local)
            with pq.ParquetFile(local) as parquet:
                for batch in parquet.iter_batches(batch_size=group_rows):
                    rows = [
                        r
                        for row in batch.to_pylist()
                        for r in messages_rows(
                            row, shard["split"], family=family, include_rejected=include_rejected
                        )
                    ]
                    writers[split].write(rows)
                    by_family = counts.setdefault(split, {})
                    by_family[family] = by_family.get(family, 0) + len(rows)
                    del rows, batch
    files = {s: names for s, w in writers.items() if (names := w.finish())}
    if not files:
        shutil.rmtree(staging, ignore_errors=True)
        raise EmptyExport(f"dataset {dataset} has no accepted rows to export")
    rows_per_split = {s: writers[s].rows for s in files}
    card = render_messages_card(
        dataset,
        list(manifest.get("runs") or [manifest.get("run")]),
        {s: c for s, c in counts.items() if s in files},
        include_rejected=include_rejected,
        front_matter=messages_front_matter(files, rows_per_split),
    )
    (staging / "README.md").write_text(card)
    shutil.rmtree(target, ignore_errors=True)
    staging.rename(target)
    return target
