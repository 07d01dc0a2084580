"""One real-stack run per rule-level capability, on one stack (Redis, SeaweedFS, Triton's
replay model, the workers, the API) shared by them: a pool is cleaned, conversation pools
uploaded through the API give the folder format's items, an evaluation set added by the
CLI quarantines copies before any model call (Triton's own counters), a dataset grows
run by run, and the blind pass asks Triton without the image. They prove the wiring;
every rule is asserted exactly on the FakeStack (tests/unit/test_cleaning_fakestack.py,
test_decontamination_fakestack.py, test_compaction_fakestack.py; docs/testing.md lists
what moved). Replaces
tests/e2e/test_clean_pool.py, test_pool_semantics.py, test_decontamination.py and
test_compaction.py, which started a stack each."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import datasets
import httpx
import pytest

from rsieve.adapters.exports import export_dataset
from rsieve.adapters.pools import upload_pool
from rsieve.adapters.storage import S3Store
from rsieve_cli.client import submit, upload, wait_for_run
from rsieve_cli.local.replay import replay_key
from rsieve_cli.local.stack import Stack
from tests.conftest import stack_settings
from tests.e2e.cli import run_cli
from tests.e2e.pools import QUESTION, word_pool
from tests.rule_pools import (
    BAD_POOL_LINES,
    COUNT,
    bad_pool,
    cheque_pools,
    conversation_items,
    conversation_pools,
    copies,
    growing_pools,
    originals,
    originals_replay,
    picture_pool,
)


@pytest.fixture(scope="module")
def pools(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Every pool of the module, and the replay model's recordings for all of them (the
    bad pool and the conversation pools have none: cleaning is their test)."""
    root = tmp_path_factory.mktemp("pools")
    replay = originals_replay()
    first, second = growing_pools(root / "grow", replay)
    # The blind pass: asked without an image, the replay model says the first item's word.
    blind = word_pool(root / "blind", "blind", replay, count=4)
    replay[replay_key(QUESTION, None)] = {
        "text": "<think>no image</think>BLIND0",
        "finish_reason": "stop",
    }
    return {"replay": replay, "grow": (first, second), "blind": blind, "root": root}


@pytest.fixture(scope="module")
def stack(
    start_stack: Callable[..., Stack],
    pools: dict[str, Any],
    tmp_path_factory: pytest.TempPathFactory,
) -> Stack:
    replay = tmp_path_factory.mktemp("replay") / "replay.json"
    replay.write_text(json.dumps(pools["replay"]))
    return start_stack(
        ["replay"],
        triton_env={"RSIEVE_REPLAY_FILE": str(replay)},
        settings_env={
            "RSIEVE_GENERATOR_MODEL": "replay",
            "RSIEVE_JUDGE_MODEL": "replay",
            "RSIEVE_SHARD_SIZE": "8",
            # No retry: every failed generation is one request (Triton's counters below).
            "RSIEVE_MODEL_RETRIES": "0",
            "RSIEVE_PURITY_EMBEDDING": "false",
        },
    )


def _clean_outputs(stack: Stack, run: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    store = S3Store(stack_settings(stack))
    items, quarantined = [], []
    for key in sorted(store.list(f"runs/{run}/clean/")):
        out = json.loads(store.get(key))
        items += out["items"]
        quarantined += out["quarantined"]
    return items, quarantined


def _requests(stack: Stack) -> float:
    """Every inference request Triton has received, successful or not."""
    text = httpx.get(stack_settings(stack).triton_metrics_url or "", timeout=10).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(("nv_inference_request_success{", "nv_inference_request_failure{"))
    )


def test_a_pool_is_cleaned(stack: Stack, tmp_path: Path) -> None:
    """Every bad line quarantined by the cleaner with its reason and line; the two good
    items (one multiple choice, re-rendered) go on; the report adds up."""
    pool, expected = bad_pool(tmp_path)
    settings = stack_settings(stack)
    store = S3Store(settings)
    run = submit(settings, upload_pool(store, pool), "clean-test")
    wait_for_run(settings, run, timeout=300)
    path = export_dataset(store, "clean-test", tmp_path / "out")
    quarantine = [json.loads(x) for x in (path / "quarantine.jsonl").read_text().splitlines()]
    cleaner = {q["line"]: (q["id"], q["reason"]) for q in quarantine if q["stage"] == "clean"}
    assert cleaner == expected
    report = json.loads((path / "run_report.json").read_text())
    assert report["adds_up"] is True and report["lines"] == BAD_POOL_LINES
    items = {i["id"]: i for i in _clean_outputs(stack, run)[0]}
    assert set(items) == {"ok", "mc"} and items["mc"]["references"] == ["B"]
    cleaning = json.loads(store.get(f"runs/{run}/cleaning.json"))
    assert cleaning["files_refused"] == {
        "escape.png": "symbolic link to a file outside the pool folder"
    }


def test_conversation_pools_uploaded_through_the_api(stack: Stack, tmp_path: Path) -> None:
    """The API's upload (POST /runs/upload) of a folder pool, a LLaVA Parquet and a
    ShareGPT JSONL: the same clean items."""
    settings = stack_settings(stack)
    found = {}
    for name, pool in conversation_pools(tmp_path).items():
        run = upload(settings, pool, f"conv-{name}")
        wait_for_run(settings, run, timeout=300)
        items, quarantined = _clean_outputs(stack, run)
        assert quarantined == [], (name, quarantined)
        found[name] = conversation_items(items)
    assert len(found["folder"]) == 3
    assert found["llava"] == found["folder"] == found["sharegpt"]


def test_an_evaluation_set_added_by_the_cli_quarantines_copies(
    stack: Stack, tmp_path: Path
) -> None:
    settings = stack_settings(stack)
    first = picture_pool(tmp_path / "originals", originals(), "orig")
    copied = picture_pool(tmp_path / "copies", copies(), "copy")
    added = run_cli(stack, "evalset", "add", "pictures-test", str(first))
    assert added.returncode == 0, added.stderr[-2000:]
    assert f"{COUNT} of {COUNT} lines hashed" in added.stderr.replace("\n", " ")
    try:
        before = _requests(stack)
        run = upload(settings, copied, "free")
        wait_for_run(settings, run, timeout=300)
        found = {q["id"]: q["reason"] for q in _clean_outputs(stack, run)[1]}
        contaminated = [i for i, reason in found.items() if reason == "contaminated"]
        assert len(contaminated) >= 0.95 * COUNT, found
        # At most a generation and a judgement per item that went on; none for the rest.
        assert _requests(stack) - before <= 2 * (COUNT - len(contaminated))
    finally:
        removed = run_cli(stack, "evalset", "remove", "pictures-test")
    assert removed.returncode == 0, removed.stderr[-2000:]


def test_a_dataset_grows_run_by_run(stack: Stack, pools: dict[str, Any], tmp_path: Path) -> None:
    """A second pool overlapping the first adds only what is new; the overlap is
    quarantined at ingest as already in the dataset."""
    first, second = pools["grow"]
    settings = stack_settings(stack)
    store = S3Store(settings)
    runs = []
    for pool in (first, second):
        runs.append(submit(settings, upload_pool(store, pool), "growing"))
        wait_for_run(settings, runs[-1], timeout=300)
    after = export_dataset(store, "growing", tmp_path / "b")
    manifest = json.loads(store.get("datasets/growing/manifest.json"))
    assert manifest["runs"] == runs
    quarantine = [json.loads(x) for x in (after / "quarantine.jsonl").read_text().splitlines()]
    repeated = {q["id"]: q for q in quarantine if q["reason"] == "duplicate_item"}
    assert sorted(repeated) == [f"again-{i:03d}" for i in range(4)]
    assert all("already in the dataset" in q["detail"] for q in repeated.values())
    accepted = json.loads(store.get("datasets/growing/run_report.json"))["families"]
    assert accepted["SynthWords"]["accepted"] == 4  # the second run's new items alone


def test_a_family_remembers_its_task_between_runs(stack: Stack, tmp_path: Path) -> None:
    """12 genuine amount items into a dataset, then a pool of only 8 general questions on
    the same images into it: judged against the dataset's profile of the family (its
    profiles.json), not against each other, they are quarantined off_task."""
    genuine, general = cheque_pools(tmp_path)
    settings = stack_settings(stack)
    store = S3Store(settings)
    runs = []
    for pool in (genuine, general):
        runs.append(submit(settings, upload_pool(store, pool), "cheques"))
        wait_for_run(settings, runs[-1], timeout=300)
    _, quarantined = _clean_outputs(stack, runs[1])
    off_task = [q for q in quarantined if q["reason"] == "off_task"]
    # Every one: the family is 20 items with the dataset's 12, and the pool's share 100%.
    assert len(off_task) == 8, quarantined
    assert all("off-task share 100.0% > 5.0%" in q["detail"] for q in off_task)
    spec = json.loads(store.get(f"datasets/cheques/commits/{runs[1]}/run_spec.json"))
    assert spec["dataset_profiles"] == {"OrandCar": {"items": 12, "runs": 1}}
    path = export_dataset(store, "cheques", tmp_path / "out")
    profiles = json.loads((path / "profiles.json").read_text())
    assert profiles["OrandCar"]["runs"] == 2
    assert profiles["OrandCar"]["items"] == 12 + 8 - len(off_task)


def test_the_blind_pass_asks_triton_without_the_image(
    stack: Stack, pools: dict[str, Any], tmp_path: Path
) -> None:
    """The rsieve interface sends the accepted items again with no image tensor; the one
    the replay model answers right blind is flagged, the others not."""
    settings = stack_settings(stack)
    store = S3Store(settings)
    before = _requests(stack)
    run = submit(settings, upload_pool(store, pools["blind"]), "blinded", {"blind_pass": True})
    wait_for_run(settings, run, timeout=300)
    path = export_dataset(store, "blinded", tmp_path / "out")
    fam = json.loads((path / "run_report.json").read_text())["families"]["SynthWords"]
    assert (fam["accepted"], fam["blind_asked"], fam["blind_answerable"]) == (4, 4, 1)
    assert fam["blind_failed"] == 0
    flags = {
        qa["id"]: qa["answerable_without_image"]
        for rows in datasets.load_dataset(str(path)).values()
        for row in rows
        for qa in row["qa"]
    }
    assert flags == {"blind-000": True, "blind-001": False, "blind-002": False, "blind-003": False}
    # The four with their images and again without, each at least one (batched) request;
    # nothing else reaches Triton: with hold-back off (bound 1) calibration asks nothing.
    assert _requests(stack) - before >= 2
