"""Continuous ingestion, the pure parts: pool folders under the watched prefix, when one is
ready, the beat schedule, and the run id shared with POST /runs."""

from __future__ import annotations

import hashlib
import json

from rsieve.settings import Settings
from rsieve.submission import run_id
from rsieve.watch import pool_folders, readiness, watch_prefix
from services.cleaner.beat import beat_schedule


def test_watch_prefix_is_a_folder_or_off() -> None:
    assert watch_prefix("") == "" and watch_prefix("  ") == ""
    assert watch_prefix("inbox") == "inbox/" == watch_prefix("/inbox/")


def test_pool_folders_are_direct_children_of_the_prefix() -> None:
    sizes = {
        "inbox/a/items.jsonl": 10,
        "inbox/a/img/1.png": 5,
        "inbox/b/_complete": 64,
        "inbox/loose.jsonl": 3,
        "other/c/items.jsonl": 1,
        "inbox/d/": 0,
    }
    assert pool_folders(sizes, "inbox/") == {
        "inbox/a/": {"items.jsonl": 10, "img/1.png": 5},
        "inbox/b/": {"_complete": 64},
    }


def test_readiness() -> None:
    assert readiness({"items.jsonl": 10}, None, 100.0, 5)[0] is False  # first look
    assert readiness({"items.jsonl": 10}, (7, 90.0), 100.0, 5)[0] is False  # still growing
    assert readiness({"items.jsonl": 10}, (10, 90.0), 100.0, 5) == (True, "stable size")
    assert readiness({"items.jsonl": 10}, (10, 98.0), 100.0, 5)[0] is False  # too soon
    assert readiness({"items.jsonl": 0}, (0, 0.0), 100.0, 5)[0] is False  # empty: not yet
    assert readiness({"items.jsonl": 4, "_complete": 64}, None, 0, 5) == (True, "marker")
    assert readiness({"data.parquet": 4, "_complete": 64}, None, 0, 5) == (True, "marker")
    assert readiness({"a.png": 4}, (4, 0.0), 100.0, 5)[0] is False
    assert readiness({"items.jsonl": 4, "_complete": 1, "_taken.json": 9}, (4, 0.0), 100.0, 5) == (
        False,
        "taken",
    )


def test_beat_schedule_only_when_watching() -> None:
    assert beat_schedule(Settings()) == {}
    entry = beat_schedule(Settings(watch_prefix="inbox/", watch_interval_s=7))["rsieve-watch"]
    assert entry["task"] == "rsieve.watch" and entry["schedule"] == 7
    assert entry["options"]["queue"] == "clean"


def test_run_id_is_the_api_formula() -> None:
    fp, protocols = Settings().fingerprint(), {"alnum": "1"}
    key = json.dumps(["abc", "ds", fp, protocols], sort_keys=True)
    assert run_id("abc", "ds", fp, protocols) == (
        f"ds-{hashlib.sha256(key.encode()).hexdigest()[:12]}"
    )
    assert run_id("abc", "ds", fp, protocols) != run_id("abd", "ds", fp, protocols)
