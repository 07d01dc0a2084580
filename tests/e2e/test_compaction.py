"""The dataset grows run by run: a second pool overlapping the first adds only what is new
(the overlap is quarantined at ingest, before any model call); a compactor that dies
before its commit leaves the published dataset as it was, and the rerun completes it;
recompacting the same inputs gives byte-identical shards."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

import datasets
import pytest
import yaml

from rsieve.adapters.exports import export_dataset
from rsieve.adapters.pools import upload_pool
from rsieve.adapters.storage import S3Store
from rsieve_cli.client import submit, wait_for_run
from rsieve_cli.local.stack import Stack
from services.common import bootstrap
from services.compactor.tasks import register as register_compactor
from tests.conftest import stack_settings
from tests.e2e.pools import word_pool

DATASET = "growing"


class _DiesBeforeCommit(S3Store):
    """The real store, except that the manifest write kills the compaction."""

    def put(self, key: str, data: bytes, **kwargs: Any) -> None:
        if key.endswith("/manifest.json"):
            raise SystemExit("compactor killed before the manifest")
        super().put(key, data, **kwargs)


@pytest.fixture(scope="module")
def setup(start_stack: Any, tmp_path_factory: pytest.TempPathFactory) -> tuple[Stack, Path, Path]:
    root = tmp_path_factory.mktemp("grow")
    replay: dict[str, dict[str, str]] = {}
    first = word_pool(root / "first", "grow", replay, count=8)
    # The second pool repeats the first pool's first four items and brings four new ones.
    second = word_pool(root / "second", "more", replay, count=4)
    lines = (first / "items.jsonl").read_text().splitlines()[:4]
    for n in range(4):
        shutil.copy(first / f"{n}.png", second / f"a{n}.png")
        lines[n] = lines[n].replace(f'"{n}.png"', f'"a{n}.png"').replace('"grow-', '"again-')
    with (second / "items.jsonl").open("a") as fh:
        fh.write("\n".join(lines) + "\n")
    replay_file = root / "replay.json"
    replay_file.write_text(json.dumps(replay))
    stack = start_stack(
        ["replay"],
        triton_env={"RSIEVE_REPLAY_FILE": str(replay_file)},
        settings_env={
            "RSIEVE_GENERATOR_MODEL": "replay",
            "RSIEVE_JUDGE_MODEL": "replay",
            "RSIEVE_SHARD_SIZE": "4",
            "RSIEVE_PARQUET_ROW_GROUP_ROWS": "2",
            "RSIEVE_PARQUET_SHARD_BYTES": "1024",
        },
    )
    return stack, first, second


def _upload_and_submit(stack: Stack, pool: Path) -> str:
    settings = stack_settings(stack)
    return submit(settings, upload_pool(S3Store(settings), pool), DATASET)


def _ids(path: Path) -> list[str]:
    ds = datasets.load_dataset(str(path))
    return sorted(
        qa["id"]
        for split in ds
        if not split.endswith("_RS_nothink")
        for row in ds[split]
        for qa in row["qa"]
    )


def test_growth_crash_and_recompaction(setup: tuple[Stack, Path, Path], tmp_path: Path) -> None:
    stack, first, second = setup
    settings = stack_settings(stack)
    store = S3Store(settings)
    run_a = _upload_and_submit(stack, first)
    wait_for_run(settings, run_a, timeout=180)
    before = export_dataset(store, DATASET, tmp_path / "a")
    assert _ids(before) == [f"grow-{i:03d}" for i in range(8)]
    manifest_a = store.get(f"datasets/{DATASET}/manifest.json")
    assert len(json.loads(manifest_a)["shards"]) > 2, "the shard size bound splits a split"

    # The second run is compacted here, in-process, so the crash can be placed exactly.
    stack.stop("compactor")
    run_b = _upload_and_submit(stack, second)
    ctx = bootstrap(settings)
    register_compactor(ctx)
    deadline = time.monotonic() + 120
    while len(ctx.stored_shards(run_b, "judge")) < 2:
        assert time.monotonic() < deadline
        time.sleep(0.2)
    compact = ctx.app.tasks["rsieve.compact"]
    ctx.__dict__["store"] = _DiesBeforeCommit(settings)
    with pytest.raises(SystemExit):
        compact.run(run=run_b)
    assert store.get(f"datasets/{DATASET}/manifest.json") == manifest_a
    assert _ids(export_dataset(store, DATASET, tmp_path / "crashed")) == _ids(before)

    ctx.__dict__["store"] = S3Store(settings)
    compact.run(run=run_b)
    after = export_dataset(store, DATASET, tmp_path / "b")
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
    store.put(f"datasets/{DATASET}/manifest.json", manifest_a)
    compact.run(run=run_b)
    for path, data in shards_b.items():
        assert store.get(f"datasets/{DATASET}/{path}") == data
    card = (after / "README.md").read_text()
    front = card.split("---")[1]
    meta = yaml.safe_load(front)
    features = datasets.Features._from_yaml_list(meta["dataset_info"]["features"])
    assert "image" in features and features["image"] == datasets.Image()
    listed = {f for c in meta["configs"][0]["data_files"] for f in c["path"]}
    assert listed == {s["path"] for s in manifest_b["shards"]}
    stack.up()
