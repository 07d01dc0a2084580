"""Cleaning's rules on the FakeStack (tests/fakestack.py: every service's task in process),
moved from the real stack (tests/e2e/test_clean_pool.py, test_pool_semantics.py; see
docs/testing.md): every kind of bad input is quarantined by the cleaner with its own
reason and pool line, duplicates are kept once, flattened multiple choice is re-rendered,
cleaning.json is written and the run goes on to a report that adds up; a pool written by
hand without packs is packed at ingest; task purity by origin; conversation pools give
the folder format's items. tests/e2e/test_capabilities.py keeps one real-stack run of the
bad pool."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from rsieve.adapters.pools import pool_files
from tests.fakestack import FakeStack
from tests.rule_pools import (
    BAD_POOL_LINES,
    bad_pool,
    big_pool_objects,
    conversation_items,
    conversation_pools,
    textvqa_slice,
)


@pytest.fixture(scope="module")
def result(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[dict[int, tuple[str | None, str]], Path, dict[str, Any]]:
    root = tmp_path_factory.mktemp("clean")
    pool, expected = bad_pool(root)
    stack = FakeStack(shard_size=5, model_retries=0)
    store = stack.store
    run = stack.run(pool, "clean-test")
    cleaning = stack.json(f"runs/{run}/cleaning.json")
    clean_items, _ = stack.clean_outputs(run)
    # The same pool as another tool would write it: each file its own object, no packs,
    # no _refused.json (the symbolic link is simply not there). Ingest packs it.
    for name in pool_files(pool):
        store.put(f"by-hand/{name}", (pool / name).read_bytes())
    store.put("by-hand/_complete", b"written by hand")
    stack.run(f"s3://{store.bucket}/by-hand/", "clean-by-hand")
    by_hand = stack.export("clean-by-hand", root / "out-by-hand")
    for name, data in big_pool_objects().items():
        store.put(f"by-hand-big/{name}", data)
    big = stack.run(f"s3://{store.bucket}/by-hand-big/", "clean-by-hand-big")
    return (
        expected,
        stack.export("clean-test", root / "out"),
        {
            "cleaning": cleaning,
            "items": clean_items,
            "by_hand": by_hand,
            "by_hand_index": stack.json("by-hand/_packs/index.json"),
            "big_index": stack.json("by-hand-big/_packs/index.json"),
            "big_quarantine": stack.clean_outputs(big)[1],
        },
    )


def _cleaner_quarantine(path: Path) -> dict[int, tuple[str | None, str]]:
    quarantine = [json.loads(x) for x in (path / "quarantine.jsonl").read_text().splitlines()]
    return {q["line"]: (q["id"], q["reason"]) for q in quarantine if q["stage"] == "clean"}


def test_each_bad_item_has_its_reason_and_line(result: Any) -> None:
    expected, path, _ = result
    assert _cleaner_quarantine(path) == expected
    report = json.loads((path / "run_report.json").read_text())
    assert report["adds_up"] is True and report["lines"] == BAD_POOL_LINES


def test_good_items_pass_and_multiple_choice_is_normalised(result: Any) -> None:
    _, _, stored = result
    items = {i["id"]: i for i in stored["items"]}
    assert set(items) == {"ok", "mc"}
    mc = items["mc"]
    assert mc["question"].startswith("Which?\nA. cat\nB. dog\n") and mc["references"] == ["B"]
    assert mc["clean_meta"]["mcq"]["original_answer"] == "dog"
    fams = stored["cleaning"]["families"]
    assert fams["SynthWords"]["duplicate_items"] == 1 and fams["MMBench"]["mcq"] == {
        "normalised": 1
    }
    assert stored["cleaning"]["files_refused"] == {
        "escape.png": "symbolic link to a file outside the pool folder"
    }


def test_a_pool_without_packs_is_packed_at_ingest(result: Any) -> None:
    expected, _, stored = result
    # Every line ends as with the packed upload, but the link nobody uploaded is missing.
    assert {
        line: (item, "missing_image" if reason == "image_symlink" else reason)
        for line, (item, reason) in expected.items()
    } == _cleaner_quarantine(stored["by_hand"])
    report = json.loads((stored["by_hand"] / "run_report.json").read_text())
    assert report["adds_up"] is True and report["lines"] == BAD_POOL_LINES
    images = stored["by_hand_index"]["images"]
    assert images and all(ref["pack"].startswith("by-hand/_packs/") for ref in images.values())
    assert len(stored["big_index"]["images"]) == 150
    assert not [q for q in stored["big_quarantine"] if q["reason"] == "missing_image"]


def test_foreign_origin_items_in_a_benchmark_family_are_off_task(tmp_path: Path) -> None:
    """The card's case (tests/rule_pools.py, textvqa_slice): every foreign item is
    quarantined off_task by the origin rule; no genuine item is dropped."""
    pool, genuine, foreign = textvqa_slice(tmp_path / "textvqa-slice")
    stack = FakeStack(shard_size=16, model_retries=0)
    run = stack.run(pool, "textvqa-slice")
    items, quarantined = stack.clean_outputs(run)
    off_task = {q["id"]: q for q in quarantined if q["reason"] == "off_task"}
    assert set(off_task) == foreign, sorted(off_task)
    assert {i["id"] for i in items} == genuine  # every genuine item went on to the model
    assert all(i["clean_meta"]["purity"] == "origin_on" for i in items)
    purity = stack.json(f"runs/{run}/cleaning.json")["families"]["TextVQA"]["purity"]
    assert purity["by_rule"]["origin_off"] == len(foreign) == 4
    assert purity["by_rule"]["origin_on"] == len(genuine) == 24


def test_conversation_pools_give_the_same_items_as_the_folder_format(tmp_path: Path) -> None:
    stack = FakeStack(shard_size=16, model_retries=0)
    found = {}
    for name, pool in conversation_pools(tmp_path).items():
        run = stack.run(pool, f"conv-{name}")
        items, quarantined = stack.clean_outputs(run)
        assert quarantined == [], (name, quarantined)
        found[name] = conversation_items(items)
    assert len(found["folder"]) == 3
    assert found["llava"] == found["folder"] == found["sharegpt"]
