"""Judge each thing once, over the real stack: the example pool (RapidOCR through Triton)
run into two datasets, two runs with the same prompts for the judge (`obedient-judge`
through Triton). The second run calls the judge zero times, as Triton's own statistics
count its inferences, and its report and card count every verdict and probe as reused."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from rsieve.adapters.storage import S3Store
from rsieve.judge.judgecache import CACHE_PREFIX
from rsieve_cli.local.stack import REPO_ROOT, Stack
from tests.conftest import stack_settings
from tests.e2e.cli import run_cli

POOL = REPO_ROOT / "examples" / "pool"
JUDGE = "obedient-judge"


@pytest.fixture(scope="module")
def stack(start_stack: Any) -> Iterator[Stack]:
    started: Stack = start_stack(
        ["rapidocr", JUDGE],
        settings_env={"RSIEVE_JUDGE_MODEL": JUDGE, "RSIEVE_SHARD_SIZE": "6"},
    )
    yield started
    started.down()  # not kept to the session's end: the suite's stacks add up in memory


def _inferences(stack: Stack) -> int:
    """Items the judge model has run, as Triton counts them (its statistics extension)."""
    url = f"http://127.0.0.1:{stack.config.triton_http_port}/v2/models/{JUDGE}/stats"
    stats = httpx.get(url, timeout=10).json()["model_stats"]
    return sum(int(s.get("inference_count", 0)) for s in stats)


def _run(stack: Stack, out: Path, dataset: str) -> tuple[dict[str, Any], str]:
    result = run_cli(stack, "run", str(POOL), "--out", str(out), "--dataset", dataset)
    assert result.returncode == 0, result.stderr[-3000:]
    path = out / dataset
    report = json.loads((path / "run_report.json").read_text())
    assert report["adds_up"]
    return report, (path / "README.md").read_text()


def test_a_second_run_of_the_same_prompts_calls_the_judge_zero_times(
    stack: Stack, tmp_path: Path
) -> None:
    assert _inferences(stack) == 0
    first, _ = _run(stack, tmp_path, "first")
    called = _inferences(stack)
    usage = first["tokens"]["total"]["judge"]
    verdicts = sum(sum(f["judge_verdicts"].values()) for f in first["families"].values())
    assert verdicts > 0 and usage["calls"] == verdicts
    # Every call the report counts is one Triton ran, and nothing else ran: a prompt asked
    # twice in one shard is one call, its repeat counted as reused.
    assert called == usage["calls"] + usage["calibration"]["calls"] > verdicts
    assert first["judge_reused"]["verdicts"] == 0
    assert list(S3Store(stack_settings(stack)).list(CACHE_PREFIX))

    second, card = _run(stack, tmp_path, "second")
    assert second["run"] != first["run"]
    assert _inferences(stack) == called  # the judge was called zero times
    reused = second["judge_reused"]
    assert reused["verdicts"] == verdicts
    probes = usage["calibration"]["calls"] + first["judge_reused"]["calibration"]
    assert reused["calibration"] == probes > 0
    for family, figures in second["families"].items():
        assert figures["judge_reused"] == sum(figures["judge_verdicts"].values()), family
        # A reused reply is applied as a fresh one: the same verdicts, the same places.
        before = first["families"][family]
        for key in ("accepted", "promoted_by_judge", "rejected_by_reason", "judge_verdicts"):
            assert figures[key] == before[key], (family, key)
    again = second["tokens"]["total"]["judge"]
    assert (again["calls"], again["prompt_tokens"], again["reused"]) == (0, 0, verdicts)
    assert (again["calibration"]["calls"], again["calibration"]["reused"]) == (0, probes)
    assert second["calibration"] and all(
        c["reused"] == sum(c["probes"].values()) for c in second["calibration"].values()
    )
    assert f"Reused: {verdicts} of the {verdicts} verdicts" in card
    assert f"and {probes} calibration probes were judged before" in card
    assert "reused from the verdict cache: no call was made for them" in card
