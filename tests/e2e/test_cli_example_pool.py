"""`rsieve run` on the example pool, over the real stack with the real OCR model
(RapidOCR behind Triton) and the abstaining CPU judge: the user's path end to end."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import datasets
import pytest

from rsieve.local.stack import REPO_ROOT, Stack

POOL = REPO_ROOT / "examples" / "pool"


@pytest.fixture(scope="module")
def stack(start_stack: Any) -> Stack:
    return start_stack(["rapidocr", "judge-abstain"])  # type: ignore[no-any-return]


def _cli(stack: Stack, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "RSIEVE_STACK_DIR": str(stack.dir), "COLUMNS": "120"}
    return subprocess.run([sys.executable, "-m", "rsieve.cli", *args], env=env, text=True,
                          capture_output=True, timeout=600, cwd=REPO_ROOT)


def test_run_exports_a_loadable_dataset_twice_identically(stack: Stack, tmp_path: Path
                                                          ) -> None:
    first = _cli(stack, "run", str(POOL), "--out", str(tmp_path / "a"), "--dataset", "ex")
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
    ids = [qa["id"] for split in ds if not split.endswith("_RS_nothink")
           for row in ds[split] for qa in row["qa"]]
    assert len(ids) == len(set(ids)) == 36
    for row in ds["SynthWords_RS_think"]:
        for qa in row["qa"]:
            assert qa["answer"] and qa["reasoning"].startswith("recognised")

    second = _cli(stack, "run", str(POOL), "--out", str(tmp_path / "b"), "--dataset", "ex")
    assert second.returncode == 0, second.stderr[-3000:]
    again = datasets.load_dataset(str(tmp_path / "b" / "ex"))
    assert {s: again[s]["qa"] for s in again} == {s: ds[s]["qa"] for s in ds}


def test_stack_status_lists_every_process(stack: Stack) -> None:
    result = _cli(stack, "stack", "status", "--json")
    assert result.returncode == 0, result.stderr
    status = json.loads(result.stdout)
    assert set(status) == {"redis", "s3", "triton", "cleaner", "generator", "verifier",
                           "judge", "compactor", "api"}
    assert all(status.values())
