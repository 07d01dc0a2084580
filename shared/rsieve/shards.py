"""Cutting a pool file into shards of lines: the unit of work on the queues."""

from __future__ import annotations

import json

from pydantic import BaseModel, ConfigDict

from rsieve.packs import ImageRef

__all__ = ["PoolLine", "ShardInput", "shard_label", "split_pool"]


class PoolLine(BaseModel):
    model_config = ConfigDict(frozen=True)

    line: int  # 1-based line in items.jsonl
    raw: str  # the line, decoded with errors escaped, so invalid UTF-8 survives JSON
    utf8: bool
    duplicate_of: int | None = None
    # Decisions that need the whole pool, taken at ingest (cleaning.assess_pool):
    # (reason, detail) for image_symlink, duplicate_item or off_task, and the purity rule
    # that settled the line's question, recorded in clean_meta.
    verdict: tuple[str, str] | None = None
    purity: str | None = None
    # Where the line's image lies in the pool's packs (rsieve.packs), None if not uploaded.
    image: ImageRef | None = None


def shard_label(n: int) -> str:
    """The name of a run's n-th shard (0-based): runs/<run>/<stage>/<label>.json."""
    return f"{n:05d}"


class ShardInput(BaseModel):
    run: str
    shard: str
    lines: list[PoolLine]


def split_pool(data: bytes, shard_size: int) -> tuple[list[list[PoolLine]], list[int]]:
    """Non-blank lines in shards of `shard_size`, and the numbers of the blank lines.

    An id seen on an earlier line marks the later line as its duplicate: ids are unique
    across the whole pool, which no single shard can see."""
    first_line_of: dict[str, int] = {}
    lines: list[PoolLine] = []
    blank: list[int] = []
    parts = data.split(b"\n")
    if parts and parts[-1] == b"":
        parts.pop()  # the terminating newline ends the last line; it opens no new one
    for number, raw in enumerate(parts, start=1):
        if not raw.strip():
            blank.append(number)
            continue
        try:
            text, utf8 = raw.decode("utf-8"), True
        except UnicodeDecodeError:
            text, utf8 = raw.decode("utf-8", "backslashreplace"), False
        duplicate_of = None
        if utf8:
            try:
                obj = json.loads(text)
            except ValueError:
                obj = None
            item_id = obj.get("id") if isinstance(obj, dict) else None
            if isinstance(item_id, str):
                duplicate_of = first_line_of.setdefault(item_id, number)
                duplicate_of = None if duplicate_of == number else duplicate_of
        lines.append(PoolLine(line=number, raw=text, utf8=utf8, duplicate_of=duplicate_of))
    shards = [lines[i : i + shard_size] for i in range(0, len(lines), shard_size)]
    return shards, blank
