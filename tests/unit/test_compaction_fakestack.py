"""Compaction's rules on the FakeStack (tests/fakestack.py), moved from the real stack
(tests/e2e/test_compaction.py; see docs/testing.md): the dataset grows run by run, a
second pool overlapping the first adds only what is new (the overlap is quarantined at
ingest, before any model call); a compactor that dies before its commit leaves the
published dataset as it was, and the rerun completes it; recompacting the same inputs
gives byte-identical shards; the card's front matter lists every shard and the image
feature. tests/e2e/test_capabilities.py keeps one real-stack growth of two runs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import datasets
import pytest
import yaml

from tests.fakes import MemoryStore
from tests.fakestack import FakeStack, ReplayModel
from tests.rule_pools import growing_pools

DATASET = "growing"


class DiesBeforeCommit(MemoryStore):
    """The store, except that while `armed` the manifest write kills the compaction."""

    armed = False

    def put(self, key: str, data: bytes, **kwargs: Any) -> None:
        if self.armed and key.endswith("/manifest.json"):
            raise SystemExit("compactor killed before the manifest")
        super().put(key, data, **kwargs)


def _ids(path: Path) -> list[str]:
    ds = datasets.load_dataset(str(path))
    return sorted(
        qa["id"]
        for split in ds
        if not split.endswith("_RS_nothink")
        for row in ds[split]
        for qa in row["qa"]
    )


def test_growth_crash_and_recompaction(tmp_path: Path) -> None:
    replay: dict[str, dict[str, str]] = {}
    first, second = growing_pools(tmp_path / "pools", replay)
    store = DiesBeforeCommit()
    model = ReplayModel(replay)
    stack = FakeStack(
        generator=model,
        judge=model,
        store=store,
        shard_size=4,
        parquet_row_group_rows=2,
        parquet_shard_bytes=1024,
    )
    run_a = stack.run(first, DATASET)
    before = stack.export(DATASET, tmp_path / "a")
    assert _ids(before) == [f"grow-{i:03d}" for i in range(8)]
    manifest_a = store.get(f"datasets/{DATASET}/manifest.json")
    assert len(json.loads(manifest_a)["shards"]) > 2, "the shard size bound splits a split"

    # The second run's compaction dies before its commit.
    run_b = stack.run_until_compaction(second, DATASET)
    store.armed = True
    with pytest.raises(SystemExit):
        stack.task("rsieve.compact", run=run_b)
    store.armed = False
    stack.done = len(stack.sent.tasks)  # what the dead compaction enqueued is lost with it
    assert store.get(f"datasets/{DATASET}/manifest.json") == manifest_a
    assert _ids(stack.export(DATASET, tmp_path / "crashed")) == _ids(before)

    stack.task("rsieve.compact", run=run_b)  # the task comes again
    stack.drain()
    after = stack.export(DATASET, tmp_path / "b")
    ids = _ids(after)
    assert ids == sorted([f"grow-{i:03d}" for i in range(8)] + [f"more-{i:03d}" for i in range(4)])
    manifest_b = json.loads(store.get(f"datasets/{DATASET}/manifest.json"))
    assert manifest_b["runs"] == [run_a, run_b]
    # The repeated items never reached the model: ingest found them in the dataset.
    quarantine = [json.loads(x) for x in (after / "quarantine.jsonl").read_text().splitlines()]
    repeated = {q["id"]: q for q in quarantine if q["reason"] == "duplicate_item"}
    assert sorted(repeated) == [f"again-{i:03d}" for i in range(4)]
    assert all("already in the dataset" in q["detail"] for q in repeated.values())
    assert json.loads((after / "run_report.json").read_text())["already_in_dataset"] == []
    rows = datasets.load_dataset(str(after))["SynthWords_RS_think"]
    assert {r["clean_meta"]["run"] for r in rows} == {run_a, run_b}

    # Recompaction of the same inputs (from the same previous commit) is byte-identical.
    shards_b = {
        s["path"]: store.get(f"datasets/{DATASET}/{s['path']}")
        for s in manifest_b["shards"]
        if s["run"] == run_b
    }
    assert shards_b
    store.put(f"datasets/{DATASET}/manifest.json", manifest_a)
    stack.task("rsieve.compact", run=run_b)
    stack.drain()
    for path, data in shards_b.items():
        assert store.get(f"datasets/{DATASET}/{path}") == data
    card = (after / "README.md").read_text()
    front = card.split("---")[1]
    meta = yaml.safe_load(front)
    features = datasets.Features._from_yaml_list(meta["dataset_info"]["features"])
    assert "image" in features and features["image"] == datasets.Image()
    listed = {f for c in meta["configs"][0]["data_files"] for f in c["path"]}
    assert listed == {s["path"] for s in manifest_b["shards"]}
