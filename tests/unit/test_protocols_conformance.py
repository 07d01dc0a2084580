"""Conformance corpora: every protocol against the public reference implementation.

Each case in tests/unit/cases/conformance_<protocol>.jsonl holds the score THE REFERENCE
(tests/unit/cases/references.py, transcribed from the evaluation code it names) gives.
The test recomputes that score, then requires rsieve's protocol to agree, except for cases
marked with a `deviation` documented in docs/verifiers.md, where rsieve must give the
recorded `rsieve` score instead. Regenerate with `python -m tests.unit.cases.generate`.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests.unit.cases.generate import SOURCES, reference_score, rsieve_score, same

CASES_DIR = Path(__file__).parent / "cases"
DOC = Path(__file__).resolve().parents[2] / "docs" / "verifiers.md"
CORPUS: list[dict[str, Any]] = [
    json.loads(line)
    for path in sorted(CASES_DIR.glob("conformance_*.jsonl"))
    for line in path.read_text(encoding="utf-8").splitlines()
    if line
]


def _documented_deviations() -> set[str]:
    return set(
        re.findall(
            r"`((?:anls|vqa|mc|relaxed|alnum|math)_[a-z0-9_]+)`", DOC.read_text(encoding="utf-8")
        )
    )


@pytest.mark.parametrize("case", CORPUS, ids=[f"{c['protocol']}-{i}" for i, c in enumerate(CORPUS)])
def test_case_agrees_with_reference(case: dict[str, Any]) -> None:
    protocol = case["protocol"]
    ref = reference_score(protocol, case)
    assert same(protocol, ref, case["score"]), "the stored score is not the reference's"
    ours = rsieve_score(protocol, case)
    if "deviation" in case:
        assert case["deviation"] in _documented_deviations()
        assert not same(protocol, ref, ours)
        assert same(protocol, ours, case["rsieve"])
    else:
        assert same(protocol, ref, ours), (case, ours)


def test_every_corpus_is_several_hundred_cases_with_a_source() -> None:
    counts = Counter(c["protocol"] for c in CORPUS)
    assert set(counts) == set(SOURCES)
    for protocol, n in counts.items():
        assert n >= 200, (protocol, n)
    assert all(c["source"] == SOURCES[c["protocol"]] for c in CORPUS)


@pytest.mark.parametrize("needle", ["\u00a0", "\u200b", "０", "<think>", "%", "1,000"])
def test_corpus_holds_the_tricky_inputs(needle: str) -> None:
    assert any(needle in c["prediction"] for c in CORPUS)


def test_corpus_holds_empty_and_whitespace_answers_and_exact_boundaries() -> None:
    preds = {c["prediction"] for c in CORPUS}
    assert "" in preds and "   " in preds
    # ANLS at exactly 0.5 distance; ChartQA at exactly 5% (10.5 vs 10, 105 vs 100).
    assert any(c["protocol"] == "anls" and c["score"] == 0.5 for c in CORPUS)
    assert any(
        c["protocol"] == "relaxed"
        and c["prediction"] == "10.5"
        and c["references"] == ["10"]
        and c["score"] == 1.0
        for c in CORPUS
    )


def test_deviations_are_few_and_all_documented() -> None:
    reasons = Counter(c["deviation"] for c in CORPUS if "deviation" in c)
    assert set(reasons) <= _documented_deviations()
    assert sum(reasons.values()) < 0.05 * len(CORPUS)


def test_vqa_tables_are_the_official_ones() -> None:
    from rsieve.verify import (
        VQA_ARTICLES,
        VQA_CONTRACTIONS,
        VQA_MANUAL_MAP,
        VQA_PUNCT,
        vqa_digit_article,
        vqa_punctuation,
    )
    from tests.unit.cases.references import OfficialVQAEval

    official = OfficialVQAEval()
    assert VQA_CONTRACTIONS == official.contractions
    assert VQA_MANUAL_MAP == official.manualMap
    assert list(VQA_ARTICLES) == official.articles
    assert list(VQA_PUNCT) == official.punct
    for text in ("a.b.c", "3,000 dogs", "t-shirt", "isnt it? yes!", "." * 40 + "x", "1.5."):
        assert vqa_punctuation(text) == official.processPunctuation(text)
        assert vqa_digit_article(text) == official.processDigitArticle(text)


def test_the_doc_states_the_corpus_sizes() -> None:
    counts = Counter(c["protocol"] for c in CORPUS)
    text = " ".join(DOC.read_text(encoding="utf-8").split())
    stated = ", ".join(f"{p} {counts[p]}" for p in SOURCES)
    assert f"hold {sum(counts.values()):,} cases ({stated})" in text


@pytest.mark.parametrize("protocol", sorted(SOURCES))
def test_decisions_record_what_recomputes_them(protocol: str) -> None:
    from rsieve.verify import PROTOCOLS, protocol_versions, verify

    case = next(c for c in CORPUS if c["protocol"] == protocol)
    options = {"options": case["options"]} if "options" in case else {}
    d = verify(protocol, case["prediction"], case["references"], **options)
    proto = PROTOCOLS[protocol]
    assert (d.protocol, d.version, d.threshold) == (protocol, proto.version, proto.threshold)
    assert d.constants == proto.constants and d.constants
    assert protocol_versions()[protocol] == proto.version
    again = verify(protocol, case["prediction"], case["references"], **options)
    assert again == d
