"""Reasoning/answer parsing for both styles, truncation and refusals: a table of cases."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rsieve.generate.think import parse_output
from rsieve.schemas import REJECT_REASONS

CASES = [
    json.loads(line)
    for line in (Path(__file__).parent / "cases" / "think.jsonl").read_text().splitlines()
    if line
]


@pytest.mark.parametrize("case", CASES, ids=[c["raw"][:40] for c in CASES])
def test_parse_output(case: dict[str, str | None]) -> None:
    parsed = parse_output(str(case["raw"]), str(case["finish"]))
    assert (parsed.reasoning, parsed.answer, parsed.failure) == (
        case["reasoning"],
        case["answer"],
        case["failure"],
    )


def test_every_failure_is_a_reject_reason() -> None:
    failures = {c["failure"] for c in CASES} - {None}
    assert failures == {"truncated_reasoning", "truncated_answer", "empty_answer", "refusal"}
    assert failures <= set(REJECT_REASONS)
