"""Fault injection for the fault tests, never part of a deployment: the fault tests start
their stack's services with this folder on PYTHONPATH, and Python imports sitecustomize
as it starts. A worker that meets an item whose id is in RSIEVE_TEST_CRASH_ITEM_IDS (a
JSON list) then dies on the spot (os._exit), every time, like an item that crashes its
decoder. The production code has no hook for it: ItemGuard's two entry points are wrapped
here, the crash coming after the in-flight mark an isolating delivery sets, exactly where
a real poison item would kill the worker.

RSIEVE_TEST_RAISE_FILE (a JSON file holding a list of item ids or id prefixes ending in
"-") makes the verifier raise ValueError on those items, every time, read afresh for each
item so a test can break a run and then fix it: a bug that hits one item, or a cause
that hits every item of a pool (what a broken setting does), without restarting workers.

RSIEVE_TEST_CRASH_PARTITION_OF (a dataset name) kills the compactor the first time it has
uploaded a partition's Parquet shards for that dataset, before the partition's summary
and the commit (once: a file in RSIEVE_TEST_CRASH_MARKS says it happened)."""

from __future__ import annotations

import json
import logging
import os
from typing import Any

CRASH_IDS = frozenset(json.loads(os.environ.get("RSIEVE_TEST_CRASH_ITEM_IDS") or "[]"))


def _item_id(record: Any) -> str | None:
    for path in (("id",), ("item", "id"), ("generation", "item", "id")):
        obj = record
        for attr in path:
            obj = getattr(obj, attr, None)
        if isinstance(obj, str):
            return obj
    return None


def _crash_on(item: Any) -> None:
    if _item_id(item) in CRASH_IDS:
        logging.getLogger("rsieve.fault_injection").error("crashing on item %s", _item_id(item))
        os._exit(70)


def _install() -> None:
    from services.stage import ItemGuard

    run, batch = ItemGuard.run, ItemGuard.batch

    def crashing_run(self: Any, items: Any, fn: Any, **kw: Any) -> Any:
        def crashing_fn(item: Any) -> Any:
            _crash_on(item)
            return fn(item)

        return run(self, items, crashing_fn, **kw)

    def crashing_batch(self: Any, items: Any, fn: Any, **kw: Any) -> Any:
        if not self.isolating:
            for item in items:
                _crash_on(item)
        return batch(self, items, fn, **kw)  # isolating: item by item through run

    ItemGuard.run = crashing_run  # type: ignore[method-assign]
    ItemGuard.batch = crashing_batch  # type: ignore[method-assign]


def _raises_on(path: str, item: Any) -> bool:
    try:
        patterns = json.loads(open(path).read() or "[]")
    except (OSError, ValueError):
        return False
    item_id = _item_id(item) or ""
    return any(item_id == p or (p.endswith("-") and item_id.startswith(p)) for p in patterns)


def _install_raise(path: str) -> None:
    from services.stage import ItemGuard

    run = ItemGuard.run

    def raising_run(self: Any, items: Any, fn: Any, **kw: Any) -> Any:
        if self.task != "verify":
            return run(self, items, fn, **kw)

        def raising_fn(item: Any) -> Any:
            if _raises_on(path, item):
                raise ValueError(f"injected failure on {_item_id(item)}")
            return fn(item)

        return run(self, items, raising_fn, **kw)

    ItemGuard.run = raising_run  # type: ignore[method-assign]


def _install_partition_crash(dataset: str, marks: str) -> None:
    from rsieve.adapters import parquet

    upload = parquet.upload_splits

    def crashing_upload(store: Any, prefix: str, run: str, *args: Any, **kw: Any) -> Any:
        shards = upload(store, prefix, run, *args, **kw)
        mark = os.path.join(marks, f"partition-crash-{run}")
        partition = args[4] if len(args) > 4 else kw.get("partition")
        if prefix == f"datasets/{dataset}/" and partition and not os.path.exists(mark):
            open(mark, "w").close()
            logging.getLogger("rsieve.fault_injection").error("crashing in %s", partition)
            os._exit(70)
        return shards

    parquet.upload_splits = crashing_upload


if CRASH_IDS:
    _install()
if os.environ.get("RSIEVE_TEST_RAISE_FILE"):
    _install_raise(os.environ["RSIEVE_TEST_RAISE_FILE"])
if os.environ.get("RSIEVE_TEST_CRASH_PARTITION_OF"):
    _install_partition_crash(
        os.environ["RSIEVE_TEST_CRASH_PARTITION_OF"], os.environ["RSIEVE_TEST_CRASH_MARKS"]
    )
