"""Cutting a pool file into shards of lines: the unit of work on the queues."""

from __future__ import annotations

import json

from pydantic import BaseModel, ConfigDict

from rsieve.schemas import ImageRef

__all__ = ["PoolLine", "ShardInput", "read_line", "shard_label", "split_pool"]


class PoolLine(BaseModel):
    model_config = ConfigDict(frozen=True)

    line: int  # 1-based line in items.jsonl
    raw: str  # the line, decoded with errors escaped, so invalid UTF-8 survives JSON
    utf8: bool
    duplicate_of: int | None = None
    # Decisions that need the whole pool, taken at ingest (rsieve.clean.ingestion):
    # (reason, detail) for image_symlink, image_too_large, duplicate_item, contaminated or
    # off_task, and the purity rule that settled the line's question (every line the clean
    # stage can admit has one: rsieve.clean.purity.PURITY_RULES; an `_off` rule without a
    # verdict is kept), recorded in clean_meta.
    verdict: tuple[str, str] | None = None
    purity: str | None = None
    # Where the line's image lies in the pool's packs (rsieve.run.packs), None if not uploaded.
    image: ImageRef | None = None


def shard_label(n: int) -> str:
    """The name of a run's n-th shard (0-based): runs/<run>/<stage>/<label>.json."""
    return f"{n:05d}"


class ShardInput(BaseModel):
    run: str
    shard: str
    lines: list[PoolLine]


def read_line(number: int, raw: bytes) -> tuple[PoolLine, str | None]:
    """One non-blank line of items.jsonl, and the item id it names (a string `id` of a
    JSON object), if any."""
    try:
        text, utf8 = raw.decode("utf-8"), True
    except UnicodeDecodeError:
        text, utf8 = raw.decode("utf-8", "backslashreplace"), False
    item_id = None
    if utf8:
        try:
            obj = json.loads(text)
        except ValueError:
            obj = None
        found = obj.get("id") if isinstance(obj, dict) else None
        item_id = found if isinstance(found, str) else None
    return PoolLine(line=number, raw=text, utf8=utf8), item_id


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
        pool_line, item_id = read_line(number, raw)
        if item_id is not None:
            first = first_line_of.setdefault(item_id, number)
            if first != number:
                pool_line = pool_line.model_copy(update={"duplicate_of": first})
        lines.append(pool_line)
    shards = [lines[i : i + shard_size] for i in range(0, len(lines), shard_size)]
    return shards, blank
