"""Continuous ingestion, the pure part: which pool folders under the watched prefix are
ready to be taken. The cleaner's `rsieve.watch` task (services/cleaner/watch.py), run by
Celery beat every `watch_interval_s`, lists the prefix and takes each ready folder once.

A pool folder is a direct child of the prefix (`<prefix><name>/`). It is ready when it
holds a `_complete` marker, or when its `items.jsonl` has kept the same non-zero size from
one look to a later one at least an interval after (a half-uploaded file grows between
looks). A folder that holds the
`_taken.json` marker was taken and is never taken again."""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["COMPLETE", "TAKEN", "pool_folders", "readiness", "watch_prefix"]

COMPLETE = "_complete"
TAKEN = "_taken.json"


def watch_prefix(prefix: str) -> str:
    """The configured prefix as a folder ('' stays '': watching is off)."""
    prefix = prefix.strip().lstrip("/")
    return prefix if not prefix or prefix.endswith("/") else prefix + "/"


def pool_folders(sizes: Mapping[str, int], prefix: str) -> dict[str, dict[str, int]]:
    """Object sizes under `prefix` grouped by pool folder: {folder: {name in it: size}}.
    Objects directly under the prefix belong to no pool."""
    folders: dict[str, dict[str, int]] = {}
    for key, size in sizes.items():
        if not key.startswith(prefix):
            continue
        name, sep, rest = key[len(prefix) :].partition("/")
        if sep and name and rest:
            folders.setdefault(f"{prefix}{name}/", {})[rest] = size
    return dict(sorted(folders.items()))


def readiness(
    files: Mapping[str, int], seen: tuple[int, float] | None, now: float, min_stable_s: float
) -> tuple[bool, str]:
    """(ready, why) for one folder. `seen` is (items.jsonl size, when first seen at that
    size) from earlier looks, None if never seen; the size must have held for at least
    `min_stable_s` (one interval), so looks that run back to back never count as two."""
    if TAKEN in files:
        return False, "taken"
    if COMPLETE in files:
        return True, "marker"
    size = files.get("items.jsonl")
    if size is None:
        return False, "no items.jsonl and no _complete marker"
    if size > 0 and seen is not None and seen[0] == size and now - seen[1] >= min_stable_s:
        return True, "stable size"
    return False, f"items.jsonl size {size} (seen before: {seen}): waiting"
