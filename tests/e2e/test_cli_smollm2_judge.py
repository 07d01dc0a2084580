"""`rsieve run` on example pool items over a stack serving SmolLM2: RapidOCR generates and
SmolLM2-135M-Instruct, a real language model, judges through Triton. Its real outputs
are parsed, its verdicts counted, its families found too small to calibrate and its
promotions held back, and the card says all of it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from rsieve_cli.local.stack import REPO_ROOT, Stack
from tests.e2e.pools import example_subset


@pytest.fixture(scope="module")
def stack(start_stack: Callable[..., Stack]) -> Stack:
    return start_stack(["rapidocr", "judge-smollm2"])


def test_the_example_pool_is_judged_by_smollm2(stack: Stack, tmp_path: Path) -> None:
    # Items of every family, some accepted (calibration) and some rejected (verdicts); the
    # whole pool says no more at several times the CPU time.
    pool = example_subset(tmp_path / "pool", {"SynthWords": 6, "SynthAmounts": 3, "SynthChoice": 3})
    env = {**os.environ, "RSIEVE_STACK_DIR": str(stack.dir), "COLUMNS": "120"}
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "rsieve_cli.app",
            "run",
            str(pool),
            "--out",
            str(tmp_path),
            "--dataset",
            "ex",
        ],
        env=env,
        text=True,
        capture_output=True,
        timeout=900,
        cwd=REPO_ROOT,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    path = tmp_path / "ex"
    report = json.loads((path / "run_report.json").read_text())
    assert report["adds_up"]
    assert report["models"]["judges"] == [
        {
            "model": "judge-smollm2",
            "kind": "llm",
            "verdicts": report["models"]["judges"][0]["verdicts"],
        }
    ]
    judged = {f: v["judge_verdicts"] for f, v in report["families"].items()}
    total = sum(sum(v.values()) for v in judged.values())
    assert total == report["models"]["judges"][0]["verdicts"] > 0
    # Every judged item ends with exactly one of the four states, with causes for failures.
    for family, counts in report["families"].items():
        failed = counts["judge_verdicts"]["FAILED"]
        assert sum(counts["judge_failure_causes"].values()) == failed, family
        assert counts["rejected_by_reason"].get("judge_failed", 0) == failed
    # Production's calibration on the stack too: these families' few accepted items could
    # never give the 73 clean verdicts 5% needs, so none is probed, and the card says why.
    calibration = report["calibration"]
    assert calibration and all(
        c["stop"]["stop"] == "too_small" and c["stop"]["asked"] == 0 == sum(c["probes"].values())
        for c in calibration.values()
    )
    card = (path / "README.md").read_text()
    assert "`judge-smollm2`, a text-only language model" in card
    assert "an OCR engine" in card
    assert "| family | judged | CORRECT | WRONG | UNSURE | failed |" in card
    assert "## Judge calibration" in card and "held back, too small to calibrate" in card
    # A family too small to calibrate never clears the bound: no promotion is accepted.
    assert all(c["held_back"] for c in calibration.values())
    assert sum(f["promoted_by_judge"] for f in report["families"].values()) == 0
