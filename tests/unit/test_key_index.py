"""The dataset's qa-key index (rsieve.compact.keyindex; rsieve.adapters.keyindex on an in-memory
store): a run dedups against every earlier run while holding its own keys and one chunk
of the index, however many runs came before; and through the compactor task, a dataset
grown run by run, a dataset committed before the index, and a redelivered compaction."""

from __future__ import annotations

import hashlib
import io
import json
import random
from pathlib import Path
from typing import Any

import pytest

from rsieve.adapters.keyindex import held_keys, legacy_runs, write_buckets
from rsieve.compact.compaction import qa_key
from rsieve.compact.keyindex import (
    KEY_BYTES,
    IndexStats,
    bucket_of,
    by_bucket,
    digest,
    keys_of,
    merged,
    present,
)
from services.context import Context
from tests.e2e.pools import picture
from tests.fakes import MemoryStore
from tests.fakestack import FakeStack
from tests.unit.test_best_of_n import Abstain, StochasticStandIn


def _entry(rng: random.Random, image: str | None = None) -> tuple[str, str]:
    image = image or hashlib.sha256(rng.randbytes(8)).hexdigest()
    return image, qa_key(image, f"question {rng.random()}")


def test_merged_is_sorted_distinct_and_chunked() -> None:
    rng = random.Random(1)
    current = sorted({rng.randbytes(KEY_BYTES) for _ in range(50)})
    added = sorted({rng.randbytes(KEY_BYTES) for _ in range(30)} | set(current[:5]))
    chunks = [b"".join(current[i : i + 7]) for i in range(0, len(current), 7)]
    out = list(merged(chunks, added, chunk_keys=16))
    assert all(len(c) <= 16 * KEY_BYTES for c in out) and len(out[0]) == 16 * KEY_BYTES
    keys = [k for c in out for k in keys_of(c)]
    assert keys == sorted(set(current) | set(added))
    assert present(chunks, added) == set(current[:5])
    with pytest.raises(ValueError, match="not whole keys"):
        keys_of(b"x" * (KEY_BYTES + 1))


def test_keys_are_bucketed_by_the_images_first_byte() -> None:
    rng = random.Random(2)
    image = "ab" + "0" * 62
    entries = [_entry(rng, image) for _ in range(3)] + [_entry(rng) for _ in range(20)]
    buckets = by_bucket(entries)
    assert len(buckets["ab"]) >= 3
    for bucket, keys in buckets.items():
        assert keys == sorted(set(keys))
        assert {digest(k) for img, k in entries if bucket_of(img) == bucket} == set(keys)


def test_ten_runs_dedup_against_all_earlier_ones_holding_their_own_keys_and_one_chunk() -> None:
    """Every run's images share one bucket, so each run reads all that came before. Each run
    repeats ten entries of every earlier run: all of them are found. What it holds at once
    (its own keys and one chunk) does not grow with the runs; what it streams does."""
    store, prefix, chunk = MemoryStore(), "datasets/d/", 64
    rng = random.Random(3)
    image = "7f" + "1" * 62
    manifest: dict[str, Any] | None = None
    runs: list[list[tuple[str, str]]] = []
    held, streamed = [], []
    for n in range(10):
        repeats = [e for earlier in runs for e in earlier[:10]]
        entries = [_entry(rng, image) for _ in range(500)] + repeats
        stats = IndexStats()
        found = held_keys(store, prefix, manifest, entries, stats, chunk_keys=chunk)
        assert found == {k for _, k in repeats}
        new = [e for e in entries if e[1] not in found]
        written = write_buckets(store, prefix, manifest, f"run{n}", new, stats, chunk_keys=chunk)
        pointers = (manifest or {}).get("qa_keys", {}) | written
        manifest = {"runs": [f"run{i}" for i in range(n + 1)], "qa_keys": pointers}
        runs.append(new)
        held.append(stats.held)
        streamed.append(stats.streamed)
        assert stats.held <= len(entries) + chunk
    assert max(held) <= 500 + 90 + chunk  # the last run's own keys (500 + 9 x 10) and a chunk
    assert streamed == sorted(streamed) and streamed[-1] >= 2 * 9 * 500
    assert manifest is not None  # written by every run
    stored = store.get(prefix + manifest["qa_keys"]["7f"])
    assert keys_of(stored) == sorted({digest(k) for run in runs for _, k in run})


def test_a_dataset_from_before_the_index_still_dedups_and_is_carried_over() -> None:
    store, prefix = MemoryStore(), "datasets/d/"
    rng = random.Random(4)
    old = [_entry(rng) for _ in range(20)]
    store.put(prefix + "keys/old.json", json.dumps(sorted(k for _, k in old)).encode())
    legacy = {"runs": ["old"], "shards": []}  # a manifest written before the index
    assert legacy_runs(legacy) == ["old"]
    entries = old[:4] + [_entry(rng) for _ in range(6)]
    stats = IndexStats()
    assert held_keys(store, prefix, legacy, entries, stats) == {k for _, k in old[:4]}
    assert stats.legacy_keys == 20
    assert legacy_runs({"runs": ["old", "new"], "qa_keys": {}, "legacy_key_runs": ["old"]}) == [
        "old"
    ]
    assert legacy_runs({"runs": ["a"], "qa_keys": {}}) == []


# Through the compactor task: pools of pictures of their own, answered right by the
# stochastic stand-in at p = 1, one store across runs. An entry repeated from an earlier
# run carries another answer, so that ingest's screen against the dataset (which keys on
# the answer too: docs/cleaning.md) lets it through to compaction, which keys on the image
# and the question alone.


def _pool(folder: Path, ids: list[int], repeats: tuple[int, ...] = ()) -> Path:
    folder.mkdir(parents=True)
    lines = []
    for i in ids:
        buf = io.BytesIO()
        picture(f"ki-{i}", (64, 48)).save(buf, format="PNG")
        (folder / f"{i}.png").write_bytes(buf.getvalue())
        word = f"W{i:04d}X"
        lines.append(
            json.dumps(
                {
                    "id": f"ki-{i}",
                    "family": "SynthWords",
                    "image": f"{i}.png",
                    "question": f"Say the word {word}",
                    "answer": word + ("Z" if i in repeats else ""),
                    "source": {"sha256": hashlib.sha256(buf.getvalue()).hexdigest()},
                }
            )
        )
    (folder / "items.jsonl").write_text("\n".join(lines) + "\n")
    return folder


def _dataset(**settings: Any) -> tuple[Context, MemoryStore, FakeStack]:
    stack = FakeStack(
        judge=Abstain(), generator=StochasticStandIn(1.0), **({"shard_size": 8} | settings)
    )
    return stack.ctx, stack.store, stack


def _run(stack: FakeStack, pool: Path) -> str:
    return stack.run(pool, "grown")


def _report(store: MemoryStore, run: str) -> dict[str, Any]:
    return dict(json.loads(store.get(f"datasets/grown/commits/{run}/run_report.json")))


def test_a_dataset_grown_run_by_run_adds_each_entry_once(tmp_path: Path) -> None:
    ctx, store, stack = _dataset(key_index_chunk_keys=4)
    first = _run(stack, _pool(tmp_path / "a", list(range(12))))
    second = _run(stack, _pool(tmp_path / "b", [0, 1, 2, *range(12, 20)], (0, 1, 2)))
    third = _run(stack, _pool(tmp_path / "c", [3, 13, *range(20, 26)], (3, 13)))
    assert _report(store, first)["already_in_dataset"] == []
    assert sorted(_report(store, second)["already_in_dataset"]) == ["ki-0", "ki-1", "ki-2"]
    assert sorted(_report(store, third)["already_in_dataset"]) == ["ki-13", "ki-3"]
    manifest = json.loads(store.get("datasets/grown/manifest.json"))
    assert manifest["runs"] == [first, second, third] and "legacy_key_runs" not in manifest
    keys = {
        k
        for path in manifest["qa_keys"].values()
        for k in keys_of(store.get("datasets/grown/" + path))
    }
    assert len(keys) == 26  # every entry of the dataset, once
    stats = _report(store, third)["dataset_keys"]
    assert stats["run_keys"] == 8 and stats["held"] <= 8 + 4
    # A compaction delivered again writes nothing.
    before = dict(store.objects)
    ctx.app.tasks["rsieve.compact"](run=third)
    assert store.objects == before


def test_a_dataset_committed_before_the_index_keeps_its_keys(tmp_path: Path) -> None:
    ctx, store, stack = _dataset()
    first = _run(stack, _pool(tmp_path / "a", list(range(6))))
    # What a compaction before the index left: per-run JSON keys, no qa_keys.
    manifest = json.loads(store.get("datasets/grown/manifest.json"))
    keys = sorted(
        k
        for path in manifest.pop("qa_keys").values()
        for k in keys_of(store.get("datasets/grown/" + path))
    )
    for key in list(store.objects):
        if key.startswith("datasets/grown/keys/qa/"):
            del store.objects[key]
    index = json.loads(store.get(f"runs/{first}/shards.json"))
    outcomes = [o for shard in index["shards"] for o in ctx.load(first, "judge", shard).outcomes]
    store.put(
        f"datasets/grown/keys/{first}.json",
        json.dumps(
            sorted(
                qa_key(o.generation.item.image_sha256, o.generation.item.question) for o in outcomes
            )
        ).encode(),
    )
    assert len(keys) == len(outcomes)
    store.put("datasets/grown/manifest.json", json.dumps(manifest).encode())
    second = _run(stack, _pool(tmp_path / "b", [0, 1, 6, 7], (0, 1)))
    assert sorted(_report(store, second)["already_in_dataset"]) == ["ki-0", "ki-1"]
    manifest = json.loads(store.get("datasets/grown/manifest.json"))
    assert manifest["legacy_key_runs"] == [first]
    third = _run(stack, _pool(tmp_path / "c", [2, 6, 8], (2, 6)))
    assert sorted(_report(store, third)["already_in_dataset"]) == ["ki-2", "ki-6"]
    assert json.loads(store.get("datasets/grown/manifest.json"))["legacy_key_runs"] == [first]
