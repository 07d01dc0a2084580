"""`rsieve run` on the example pool with the local stack's own judge, Qwen2.5-Coder-1.5B-
Instruct on llama.cpp's server: the card names it as a language model with its verdicts,
and a second run of the same pool asks it nothing (every verdict reused)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from rsieve_cli.local.stack import QWEN_JUDGE_MODEL, REPO_ROOT, Stack
from tests.e2e.cli import run_cli

pytestmark = pytest.mark.integration
POOL = REPO_ROOT / "examples" / "pool"


@pytest.fixture(scope="module")
def stack(start_stack: Callable[..., Stack]) -> Iterator[Stack]:
    started: Stack = start_stack(["rapidocr", QWEN_JUDGE_MODEL])
    yield started
    # Stopped with the module, not at the session's end: its judge server holds a 1.1 GB
    # model, and the suite's stacks add up in memory.
    started.down()


def _prompt_tokens_read(stack: Stack) -> float:
    """llama.cpp's counter of prompt tokens it has read, from its /metrics."""
    c = stack.config
    text = httpx.get(
        f"http://127.0.0.1:{c.judge_port}/metrics",
        headers={"Authorization": f"Bearer {c.judge_key}"},
        timeout=10,
    ).text
    found = re.search(r"^llamacpp:prompt_tokens_total\s+(\S+)$", text, re.M)
    assert found, text[:500]
    return float(found.group(1))


def test_the_qwen_judge_judges_and_a_rerun_asks_it_nothing(stack: Stack, tmp_path: Path) -> None:
    first = run_cli(stack, "run", str(POOL), "--out", str(tmp_path / "a"), "--dataset", "qa")
    assert first.returncode == 0, first.stdout + first.stderr
    export = tmp_path / "a" / "qa"
    report = json.loads((export / "run_report.json").read_text())
    (judge,) = report["models"]["judges"]
    assert judge["model"] == QWEN_JUDGE_MODEL and judge["kind"] == "llm"
    verdicts = sum(sum(f["judge_verdicts"].values()) for f in report["families"].values())
    assert verdicts > 0
    failed = sum(f["judge_verdicts"]["FAILED"] for f in report["families"].values())
    assert failed == 0, report["families"]  # a judge that answers, unlike SmolLM2
    card = (export / "README.md").read_text()
    assert f"`{QWEN_JUDGE_MODEL}`, a text-only language model" in card
    read = _prompt_tokens_read(stack)
    assert read > 0

    second = run_cli(stack, "run", str(POOL), "--out", str(tmp_path / "b"), "--dataset", "qb")
    assert second.returncode == 0, second.stdout + second.stderr
    assert _prompt_tokens_read(stack) == read  # not one call: every verdict was reused
    again = json.loads((tmp_path / "b" / "qb" / "run_report.json").read_text())
    assert {fam: f["judge_verdicts"] for fam, f in again["families"].items()} == {
        fam: f["judge_verdicts"] for fam, f in report["families"].items()
    }
