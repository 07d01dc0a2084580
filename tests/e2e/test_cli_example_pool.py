"""`rsieve run` on the example pool, over the real stack with the real OCR model
(RapidOCR behind Triton) and the abstaining CPU judge: the user's path end to end."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import datasets
import pytest

from rsieve_cli.local.stack import REPO_ROOT, Stack
from tests.conftest import stack_settings
from tests.e2e.cli import run_cli, run_script

POOL = REPO_ROOT / "examples" / "pool"


@pytest.fixture(scope="module")
def stack(start_stack: Callable[..., Stack]) -> Stack:
    return start_stack(["rapidocr", "judge-abstain"])


def test_run_exports_a_loadable_dataset_twice_identically(stack: Stack, tmp_path: Path) -> None:
    first = run_cli(stack, "run", str(POOL), "--out", str(tmp_path / "a"), "--dataset", "ex")
    assert first.returncode == 0, first.stderr[-3000:]
    assert "SynthWords_RS_think" in first.stdout
    path = tmp_path / "a" / "ex"
    ds = datasets.load_dataset(str(path))
    report = json.loads((path / "run_report.json").read_text())
    assert report["adds_up"] and report["lines"] == 36
    words, choice = report["families"]["SynthWords"], report["families"]["SynthChoice"]
    # The OCR model reads the clean renders and misses the hard ones (see the pool script).
    assert words["accepted"] >= 10 and words["rejected"] >= 3
    # Letters are not words, and the abstaining judge can never promote.
    assert choice["accepted"] == 0 and choice["rejected_by_reason"] == {"judge_unsure": 6}
    ids = [
        qa["id"]
        for split in ds
        if not split.endswith("_RS_nothink")
        for row in ds[split]
        for qa in row["qa"]
    ]
    assert len(ids) == len(set(ids)) == 36
    for row in ds["SynthWords_RS_think"]:
        for qa in row["qa"]:
            assert qa["answer"] and qa["reasoning"].startswith("recognised")
    rechecked = run_cli(stack, "recheck", str(path), "--json")
    assert rechecked.returncode == 0, rechecked.stdout[-3000:] + rechecked.stderr[-2000:]
    summary = json.loads(rechecked.stdout)
    assert summary["agreement"] == 1.0 and summary["decisions"] >= 25, summary

    second = run_cli(stack, "run", str(POOL), "--out", str(tmp_path / "b"), "--dataset", "ex")
    assert second.returncode == 0, second.stderr[-3000:]
    again = datasets.load_dataset(str(tmp_path / "b" / "ex"))
    assert {s: again[s]["qa"] for s in again} == {s: ds[s]["qa"] for s in ds}


def test_stack_status_lists_every_process(stack: Stack) -> None:
    result = run_cli(stack, "stack", "status", "--json")
    assert result.returncode == 0, result.stderr
    status = json.loads(result.stdout)
    assert set(status) == {
        "redis",
        "s3",
        "triton",
        "cleaner",
        "generator",
        "verifier",
        "judge",
        "compactor",
        "beat",  # the sweeper's, on by default
        "api",
    }
    assert all(status.values())


def test_submit_status_export_card_recheck(stack: Stack, tmp_path: Path) -> None:
    """The operator's commands on one run of the example pool, and their failures."""
    submitted = run_cli(stack, "submit", str(POOL), "--dataset", "ops", "--json")
    assert submitted.returncode == 0, submitted.stderr[-2000:]
    run = json.loads(submitted.stdout)["run"]
    assert run.startswith("ops-")
    # A client elsewhere: the API's address and token, no stack, no S3 key that works.
    settings = stack_settings(stack)
    assert settings.api_token is not None
    again = run_cli(
        stack,
        "submit",
        str(POOL),
        "--dataset",
        "ops",
        RSIEVE_STACK_DIR=str(tmp_path / "no-stack"),
        RSIEVE_API_URL=settings.api_url,
        RSIEVE_API_TOKEN=settings.api_token.get_secret_value(),
        RSIEVE_S3_ENDPOINT="http://127.0.0.1:9",
        RSIEVE_S3_ACCESS_KEY="not-the-services-key",
        RSIEVE_S3_SECRET_KEY="not-the-services-key",
    )
    assert again.returncode == 0, again.stderr[-2000:]
    assert again.stdout.strip() == run  # same pool, same run

    watched = run_cli(stack, "status", run, "--watch", "--interval", "0.5")
    assert watched.returncode == 0, watched.stderr[-2000:]
    assert "judge" in watched.stdout and "SynthWords" in watched.stdout
    status = json.loads(run_cli(stack, "status", run, "--json").stdout)
    assert status["done"] and status["progress"]["judge"]["eta_s"] == 0
    assert status["progress"]["clean"]["families"]["SynthWords"] >= 10
    listed = run_cli(stack, "status")
    assert listed.returncode == 0 and run in listed.stdout

    exported = run_cli(stack, "export", run, "--to", str(tmp_path))
    assert exported.returncode == 0, exported.stderr[-2000:]
    assert Path(exported.stdout.strip()) == tmp_path / "ops"
    assert json.loads((tmp_path / "ops" / "run_report.json").read_text())["adds_up"]
    card = run_cli(stack, "card", run)
    assert card.returncode == 0 and "SynthWords" in card.stdout

    rechecked = run_cli(stack, "recheck", run, "--json")
    assert rechecked.returncode == 0, rechecked.stderr[-2000:]
    result = json.loads(rechecked.stdout)
    assert result["checked"] >= 30 and result["differences"] == []
    assert run_cli(stack, "audit", run).returncode == 0

    # The rewards score every stored answer of the run as the verifier did.
    parity = run_script(stack, "scripts.reward_parity", run)
    assert parity.returncode == 0, parity.stdout[-3000:] + parity.stderr[-3000:]
    assert "trl" in parity.stdout and "easyr1" in parity.stdout
    # One sample per question: no item has both sides of a pair, and the export says so.
    pairs = run_cli(stack, "export", run, "--to", str(tmp_path), "--format", "dpo")
    assert pairs.returncode == 1, pairs.stdout + pairs.stderr
    assert "no dpo rows" in pairs.stdout + pairs.stderr

    for args in (
        ["status", "ops-000000000000"],
        ["export", "ops-000000000000", "--to", "x"],
        ["card", "nope-000000000000"],
        ["recheck", "nope-000000000000"],
    ):
        failed = run_cli(stack, *args)
        assert failed.returncode == 1 and "Traceback" not in failed.stderr, failed.stderr
        assert "no run" in failed.stderr and "fix:" in failed.stderr, failed.stderr

    # A stored decision that today's protocols no longer reproduce is reported (exit 1).
    from rsieve.adapters.storage import S3Store
    from rsieve.settings import Settings

    store = S3Store(Settings.from_env_map(stack.config.env()))
    key = sorted(k for k in store.list(f"runs/{run}/verify/"))[0]
    original = store.get(key)
    shard = json.loads(original)
    first = next(o for o in shard["verified"] if o["decision"])
    first["decision"]["score"] = 0.5
    store.put(key, json.dumps(shard).encode())
    try:
        tampered = run_cli(stack, "recheck", run)
        assert tampered.returncode == 1, tampered.stderr[-2000:]
        assert "1 differ" in tampered.stdout and first["generation"]["item"]["id"] in (
            tampered.stderr
        )
    finally:
        store.put(key, original)
