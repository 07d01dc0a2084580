"""Streaming Parquet writing for dataset splits: memory bounded by one row group, files
closed once they pass a byte bound. Images are fetched through `image_of`, one row group
at a time, so the compactor never holds more than a group's image bytes."""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq

from rsieve import keys
from rsieve.compact.rows import features
from rsieve.settings import Settings

if TYPE_CHECKING:
    from rsieve.adapters.storage import ObjectStore

__all__ = ["upload_splits", "write_split_parts"]


def write_split_parts(
    rows: list[dict[str, Any]],
    folder: Path,
    split: str,
    *,
    image_of: Callable[[str], bytes],
    shard_bytes: int,
    group_rows: int,
    sampled: bool = False,
) -> list[tuple[Path, int]]:
    """Write `rows` (without image bytes) as Parquet parts under `folder`: (path, rows).
    `sampled`: in the best-of-n schema (rsieve.compact.rows.SAMPLED_FEATURES)."""
    schema = features(sampled).arrow_schema
    parts: list[tuple[Path, int]] = []
    writer: pq.ParquetWriter | None = None
    path = folder / f"{split}-{len(parts):05d}.parquet"
    size = count = 0
    for start in range(0, len(rows), group_rows):
        group = rows[start : start + group_rows]
        table = pa.Table.from_pylist(
            [
                row
                | {"image": {"bytes": image_of(row["image_sha256"]), "path": row["image_sha256"]}}
                for row in group
            ],
            schema=schema,
        )
        if writer is None:
            path = folder / f"{split}-{len(parts):05d}.parquet"
            writer = pq.ParquetWriter(path, schema)
        writer.write_table(table)
        size, count = size + table.nbytes, count + len(group)
        del table
        if size >= shard_bytes:
            writer.close()
            parts.append((path, count))
            writer, size, count = None, 0, 0
    if writer is not None:
        writer.close()
        parts.append((path, count))
    return parts


def upload_splits(
    store: ObjectStore,
    prefix: str,
    run: str,
    splits: dict[str, list[dict[str, Any]]],
    image_of: Callable[[str], bytes],
    settings: Settings,
    sampled: bool = False,
    partition: str | None = None,
) -> list[dict[str, Any]]:
    """Each split's rows into Parquet files of bounded size (settings.parquet_shard_bytes,
    row groups of settings.parquet_row_group_rows), uploaded under their final names
    (`keys.data_shard`, with the compaction `partition`'s label when the run has several) once
    the count is known: the manifest's shard entries."""
    shards: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="rsieve-compact-") as tmp:
        for split, rows in splits.items():
            parts = write_split_parts(
                rows,
                Path(tmp),
                split,
                image_of=image_of,
                shard_bytes=settings.parquet_shard_bytes,
                group_rows=settings.parquet_row_group_rows,
                sampled=sampled,
            )
            for i, (path, n) in enumerate(parts):
                name = keys.data_shard(split, run, i, len(parts), partition)
                store.put_file(prefix + name, str(path))
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
