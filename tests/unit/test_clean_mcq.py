"""Multiple-choice normalisation, table-driven from cases/clean_mcq.jsonl: each case names
the question, the reference, the status and pattern expected and the rewritten pair."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from rsieve.mcq import normalise_mcq

CASES = [
    json.loads(line)
    for line in (Path(__file__).parent / "cases" / "clean_mcq.jsonl").read_text().splitlines()
]


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_case(case: dict[str, Any]) -> None:
    got = normalise_mcq(case["question"], case["answer"], case["options"])
    assert (got.status, got.pattern) == (case["status"], case["pattern"]), got.detail
    assert got.question == case["want_question"]
    assert got.answer == case["want_answer"]


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_idempotent(case: dict[str, Any]) -> None:
    once = normalise_mcq(case["question"], case["answer"], case["options"])
    twice = normalise_mcq(once.question, once.answer, case["options"])
    assert (twice.question, twice.answer) == (once.question, once.answer)
    if once.status == "normalised":
        assert twice.status == "lettered"


def test_meta_keeps_the_original() -> None:
    q, a = "What animal is this? Options: A cat, B dog", "dog"
    got = normalise_mcq(q, a)
    meta = got.meta(q, a)
    assert meta == {
        "status": "normalised",
        "pattern": "options_prefix",
        "original_question": q,
        "original_answer": a,
        "options": {"A": "cat", "B": "dog"},
    }
    ambiguous = normalise_mcq(q, "horse")
    assert ambiguous.meta(q, "horse") == {
        "status": "ambiguous",
        "pattern": "options_prefix",
        "detail": "the reference names no option, or several",
    }
    assert normalise_mcq("What word?", "x").meta("What word?", "x") is None


def test_multi_reference_naming_one_option() -> None:
    got = normalise_mcq("Which? (a) cat (b) dog", ["b", "dog"])
    assert (got.status, got.answer) == ("normalised", "B")
