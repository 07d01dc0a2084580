"""Streaming Parquet writing for dataset splits: memory bounded by one row group, files
closed once they pass a byte bound. Images are fetched through `image_of`, one row group
at a time, so the compactor never holds more than a group's image bytes."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from rsieve.rows import FEATURES

__all__ = ["write_split_parts"]


def write_split_parts(
    rows: list[dict[str, Any]],
    folder: Path,
    split: str,
    *,
    image_of: Callable[[str], bytes],
    shard_bytes: int,
    group_rows: int,
) -> list[tuple[Path, int]]:
    """Write `rows` (without image bytes) as Parquet parts under `folder`: (path, rows)."""
    schema = FEATURES.arrow_schema
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
