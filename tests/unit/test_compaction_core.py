"""Incremental compaction rules and the card's front matter."""

from __future__ import annotations

import datasets
import yaml

from rsieve.compact.compaction import dedupe, next_manifest, qa_key, shard_name
from rsieve.dataset.card import card_front_matter
from tests.unit._records import accepted, make_item


def test_dedupe_skips_keys_already_in_the_dataset() -> None:
    a, b = accepted(make_item("a", question="Q1")), accepted(make_item("b", question="Q2"))
    existing = {qa_key(a.generation.item.image_sha256, "Q1")}
    added, skipped = dedupe([a, b], existing)
    assert [o.generation.item.id for o in added] == ["b"] and skipped == ["a"]


def test_key_depends_on_image_and_question() -> None:
    assert qa_key("x", "Q") != qa_key("y", "Q") != qa_key("x", "R")


def test_manifest_grows_and_replaces_a_rerun() -> None:
    shard = {
        "path": shard_name("F_RS_think", "r1", 0, 1),
        "split": "F_RS_think",
        "rows": 3,
        "run": "r1",
    }
    first = next_manifest(None, dataset="d", run="r1", shards=[shard], adds_up=True)
    assert first["runs"] == ["r1"] and first["splits"] == {"F_RS_think": 3}
    assert first["files"][shard["path"]] == shard["path"]
    assert first["files"]["README.md"] == "commits/r1/README.md"
    second_shard = shard | {"path": shard_name("F_RS_think", "r2", 0, 1), "run": "r2", "rows": 2}
    second = next_manifest(first, dataset="d", run="r2", shards=[second_shard], adds_up=True)
    assert second["runs"] == ["r1", "r2"] and second["splits"] == {"F_RS_think": 5}
    again = next_manifest(second, dataset="d", run="r2", shards=[second_shard], adds_up=True)
    assert again["splits"] == {"F_RS_think": 5} and again["runs"] == ["r1", "r2"]


def test_shard_names_are_deterministic_and_per_run() -> None:
    assert shard_name("S", "run-1", 2, 10) == "data/S-run-1-00002-of-00010.parquet"


def test_front_matter_is_what_the_hub_reads() -> None:
    manifest = {
        "shards": [{"path": "data/a.parquet", "split": "F_rejected", "rows": 1}],
        "splits": {"F_rejected": 1},
    }
    meta = yaml.safe_load(yaml.safe_dump(card_front_matter(manifest)))
    assert meta["configs"][0]["data_files"] == [{"split": "F_rejected", "path": ["data/a.parquet"]}]
    features = datasets.Features._from_yaml_list(meta["dataset_info"]["features"])
    assert features["image"] == datasets.Image()
    assert meta["dataset_info"]["splits"] == [{"name": "F_rejected", "num_examples": 1}]
