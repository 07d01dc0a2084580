"""Continuous ingestion, the pure parts: pool folders under the watched prefix, when one is
ready, the beat schedule, and the run id shared with POST /runs."""

from __future__ import annotations

import hashlib
import re

from rsieve.run.submission import run_id
from rsieve.run.watch import pool_folders, readiness, watch_prefix
from rsieve.settings import Settings
from rsieve.verify import protocol_versions
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


def test_beat_schedule_watches_only_with_a_prefix_and_sweeps_unless_off() -> None:
    assert set(beat_schedule(Settings())) == {"rsieve-sweep"}
    assert beat_schedule(Settings(sweep_interval_s=0)) == {}
    sweep = beat_schedule(Settings(sweep_interval_s=60))["rsieve-sweep"]
    assert sweep["task"] == "rsieve.sweep" and sweep["schedule"] == 60
    entry = beat_schedule(Settings(watch_prefix="inbox/", watch_interval_s=7))["rsieve-watch"]
    assert entry["task"] == "rsieve.watch" and entry["schedule"] == 7
    assert entry["options"]["queue"] == "clean"


def test_run_id_is_pinned_for_known_inputs() -> None:
    # Computed once by hand and pinned: a change to the formula (rsieve.run.submission) changes
    # every run id, so earlier runs would no longer be found on resubmission.
    fp = {"generator_model": "rapidocr", "temperature": 0.0}
    assert run_id("abc", "ds", fp, {"alnum": "1"}) == "ds-5f123acd5641"
    assert run_id("abc", "other", fp, {"alnum": "1"}) == "other-04c30bb6f34f"


def test_run_id_follows_every_input() -> None:
    pool = hashlib.sha256(b"items.jsonl and images").hexdigest()
    fp, protocols = Settings().fingerprint(), protocol_versions()
    rid = run_id(pool, "ds", fp, protocols)
    assert re.fullmatch(r"ds-[0-9a-f]{12}", rid), rid
    # Same inputs, the same id, whatever the order of the settings.
    assert run_id(pool, "ds", dict(reversed(list(fp.items()))), dict(protocols)) == rid
    # One pool byte, one decision setting, the dataset or a protocol version: another run.
    other_pool = hashlib.sha256(b"items.jsonl and imagez").hexdigest()
    assert run_id(other_pool, "ds", fp, protocols) != rid
    assert run_id(pool, "ds", Settings(temperature=0.7).fingerprint(), protocols) != rid
    assert run_id(pool, "ds", Settings(purity_min_items=21).fingerprint(), protocols) != rid
    assert run_id(pool, "ds2", fp, protocols) != rid
    assert run_id(pool, "ds", fp, {**protocols, "alnum": "2"}) != rid
