"""Protocols and the verify() decision, from a table of cases in cases/verify.jsonl."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from rsieve.verify import PROTOCOLS, variants, verify

CASES = [
    json.loads(line)
    for line in (Path(__file__).parent / "cases" / "verify.jsonl").read_text().splitlines()
    if line
]


@pytest.mark.parametrize(
    "case", CASES, ids=[f"{c['protocol']}:{c['prediction'][:20]!r}" for c in CASES]
)
def test_table(case: dict[str, Any]) -> None:
    options = {"options": case["options"]} if "options" in case else {}
    decision = verify(case["protocol"], case["prediction"], case["references"], **options)
    assert decision.accepted is case["accepted"]
    assert decision.variant == case["variant"]
    assert decision.protocol == case["protocol"]
    assert decision.version == PROTOCOLS[case["protocol"]].version


def test_every_protocol_scores_in_unit_interval() -> None:
    for name, proto in PROTOCOLS.items():
        for pred, refs in (("", ["x"]), ("abc", ["abc"]), ("1", ["2"])):
            assert 0.0 <= proto(pred, refs) <= 1.0, name


def test_variants_are_tried_without_repeats() -> None:
    assert [name for name, _ in variants("one line")] == ["whole"]
    assert [name for name, _ in variants("a\nb\n\nc")] == ["whole", "first_line", "first_paragraph"]


def test_decision_records_constants_for_recomputation() -> None:
    d = verify("alnum", "x", ["y"])
    assert d.constants["pattern"] == "[^a-z0-9]"
    assert d.threshold == 1.0 and not d.accepted and d.score == 0.0
