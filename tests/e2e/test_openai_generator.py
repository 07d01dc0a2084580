"""The generator on a real OpenAI-compatible server: `transformers serve` serving the tiny
LLaVA checkpoint scripts/build_tiny_vlm.py builds (random weights: its answers are
nonsense and never asserted on), the judge the abstaining stand-in on Triton. The example
pool goes through the whole stack over the `openai` interface: every image reaches the
model as a data URL, every generation records what answered and its token usage, and the
run's trainer export loads."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import datasets
import pytest

from rsieve.adapters.storage import S3Store
from rsieve.schemas import ShardOutput
from rsieve_cli.local.stack import REPO_ROOT, Stack
from tests.checkpoints import build_tiny_vlm
from tests.conftest import stack_settings
from tests.e2e.openai_server import Server

POOL = REPO_ROOT / "examples" / "pool"
SERVED = "tiny-llava"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    checkpoint = build_tiny_vlm(tmp_path_factory.mktemp("tiny") / "checkpoint")
    with Server.serving(tmp_path_factory.mktemp("serve"), SERVED, checkpoint) as srv:
        yield srv


@pytest.fixture(scope="module")
def stack(start_stack: Callable[..., Stack], server: Server) -> Stack:
    return start_stack(
        ["judge-abstain"],
        settings_env={
            "RSIEVE_MODEL_INTERFACE": "openai",
            "RSIEVE_JUDGE_INTERFACE": "auto",  # the judge stays on Triton
            "RSIEVE_GENERATOR_OPENAI_URL": server.url,
            "RSIEVE_GENERATOR_MODEL": SERVED,
            "RSIEVE_JUDGE_MODEL": "judge-abstain",
            "RSIEVE_MAX_NEW_TOKENS": "8",
            "RSIEVE_ENGINE_CAPACITY": "4",
        },
    )


def test_the_example_pool_is_generated_over_the_openai_interface(
    stack: Stack, server: Server, tmp_path: Path
) -> None:
    env = {**os.environ, "RSIEVE_STACK_DIR": str(stack.dir), "COLUMNS": "160"}

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "rsieve_cli.app", *args],
            env=env,
            text=True,
            capture_output=True,
            timeout=900,
            cwd=REPO_ROOT,
        )

    result = cli("run", str(POOL), "--out", str(tmp_path), "--dataset", "gen")
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads((tmp_path / "gen" / "run_report.json").read_text())
    assert report["adds_up"]
    [generator] = report["models"]["generators"]
    assert (generator["model"], generator["kind"]) == (SERVED, "vlm")
    store = S3Store(stack_settings(stack))
    generations = [
        g
        for key in store.list(f"runs/{report['run']}/generate/")
        for g in ShardOutput.model_validate_json(store.get(key)).generations
    ]
    assert len(generations) == generator["outputs"] == server.completions() > 0
    for g in generations:
        assert (g.interface, g.model_version, g.thinking_mode) == ("openai", SERVED, "server")
        assert g.sampling == {"temperature": 0.0, "max_tokens": 8, "seed": 0}
        assert g.chat_template is None and g.image_sent is not None
        # The image reached the model: LLaVA's image tokens outnumber any question's.
        assert g.input_tokens is not None and g.input_tokens > 2 * len(g.item.question.split())
        assert g.output_tokens is not None and 0 < g.output_tokens <= 8
    usage = report["tokens"]["by_model"][0]
    assert (usage["role"], usage["calls"], usage["calls_without_usage"]) == (
        "generator",
        len(generations),
        0,
    )
    assert usage["prompt_tokens"] == sum(g.input_tokens or 0 for g in generations)
    # Random weights answer nonsense: the run's rows are rejected, exported on request.
    out = tmp_path / "trainer"
    result = cli("export", report["run"], "--to", str(out), "--format", "messages")
    accepted = sum(f["accepted"] for f in report["families"].values())
    if accepted:
        assert result.returncode == 0, result.stderr[-3000:]
    else:  # nothing to train on is said, not written as an empty dataset
        assert result.returncode == 1 and "no accepted rows" in result.stdout + result.stderr
    result = cli(
        "export", report["run"], "--to", str(out), "--format", "messages", "--include-rejected"
    )
    assert result.returncode == 0, result.stderr[-3000:]
    rows = datasets.load_dataset(str(out / "gen-messages"))
    rejected = sum(f["rejected"] for f in report["families"].values())
    assert rows["rejected"].num_rows == rejected > 0
