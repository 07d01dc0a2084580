"""ANLS equals the card's pure-Python reference on random short strings."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from rsieve.verify import PROTOCOLS
from tests.unit.cases.references import card_levenshtein as levenshtein


def _norm(text: str) -> str:
    return " ".join(text.strip().lower().split())


def anls_reference(prediction: str, references: list[str]) -> float:
    pred = _norm(prediction)
    best = 0.0
    for ref in references:
        gold = _norm(ref)
        longest = max(len(pred), len(gold))
        d = levenshtein(pred, gold) / longest if longest else 0.0
        best = max(best, 1.0 - d if d < 0.5 else 0.0)
    return best


# A small alphabet makes near matches (and the 0.5 boundary) common; spaces and case
# exercise the normalisation.
_TEXT = st.text(alphabet="abcAB 12\t", max_size=12)


@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(prediction=_TEXT, references=st.lists(_TEXT, min_size=1, max_size=3))
def test_anls_matches_card_reference(prediction: str, references: list[str]) -> None:
    got = PROTOCOLS["anls"](prediction, references)
    want = anls_reference(prediction, references)
    assert math.isclose(got, want, abs_tol=1e-9), (got, want)
    assert 0.0 <= got <= 1.0


@settings(max_examples=100, deadline=None, derandomize=True, database=None)
@given(prediction=st.text(max_size=10), reference=st.text(max_size=10))
def test_anls_matches_card_reference_on_any_text(prediction: str, reference: str) -> None:
    got = PROTOCOLS["anls"](prediction, [reference])
    assert math.isclose(got, anls_reference(prediction, [reference]), abs_tol=1e-9)


def test_anls_boundary_examples() -> None:
    anls = PROTOCOLS["anls"]
    assert anls("abcd", ["abcd"]) == 1.0
    assert anls("ABCD ", ["abcd"]) == 1.0
    assert anls("abcx", ["abcd"]) == 0.75
    assert anls("abxx", ["abcd"]) == 0.0  # d == 0.5 is not < 0.5
    assert anls("", [""]) == 1.0
    assert anls("", ["a"]) == 0.0
    assert anls("abcx", ["zzzz", "abcd"]) == 0.75
