"""Properties: rapidfuzz ANLS equals the pure-Python quadratic reference exactly; VQA equals
the official float mean."""

from __future__ import annotations

from hypothesis import example, given, settings
from hypothesis import strategies as st
from rapidfuzz.distance import Levenshtein

from rsieve.verify import PROTOCOLS
from tests.unit.cases.references import card_levenshtein, lmms_levenshtein_distance


def anls_pure_python(prediction: str, references: list[str]) -> float:
    """The rule of docs/verifiers.md with the card's quadratic edit distance."""
    pred = " ".join(prediction.strip().lower().split())
    best = 0.0
    for ref in references:
        gold = " ".join(ref.strip().lower().split())
        longest = max(len(pred), len(gold))
        d = card_levenshtein(pred, gold) / longest if longest else 0.0
        if d < 0.5:
            best = max(best, 1.0 - d)
    return best


# Near-misses are common over a small alphabet; the wide one brings Unicode case folding,
# NBSP, zero-width spaces and full-width digits.
SMALL = st.text(alphabet="abAB 1\t\u00a0", max_size=24)
WIDE = st.text(alphabet=st.characters(blacklist_categories=["Cs"]), max_size=60)
LONG = st.text(alphabet="abcdefghij kLMN0123", min_size=20, max_size=200)


@settings(max_examples=400, deadline=None, derandomize=True, database=None)
@given(prediction=SMALL | WIDE, references=st.lists(SMALL | WIDE, min_size=1, max_size=4))
@example(prediction="abxx", references=["abcd"])
@example(prediction="\u200bab", references=["ab"])
@example(prediction="", references=[""])
def test_anls_equals_pure_python(prediction: str, references: list[str]) -> None:
    assert PROTOCOLS["anls"](prediction, references) == anls_pure_python(prediction, references)


@settings(max_examples=150, deadline=None, derandomize=True, database=None)
@given(a=LONG, b=LONG)
def test_rapidfuzz_distance_equals_both_quadratic_loops(a: str, b: str) -> None:
    d = Levenshtein.distance(a, b)
    assert d == card_levenshtein(a, b) == lmms_levenshtein_distance(a, b)
    assert PROTOCOLS["anls"](a, [b]) == anls_pure_python(a, [b])


VQA_WORDS = st.sampled_from(
    [
        "2",
        "two",
        "Two.",
        "yes",
        "no",
        "t-shirt",
        "the dog",
        "dogs",
        "3,000",
        "isnt",
        "a.b",
        "red",
        "",
        "None",
    ]
)


@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(prediction=VQA_WORDS, answers=st.lists(VQA_WORDS, min_size=1, max_size=10))
def test_vqa_equals_official_on_normalised_answers(prediction: str, answers: list[str]) -> None:
    """With annotation-style (normalised) answers, rsieve's exact-division mean equals the
    official float mean of vqaEval.py to 1e-12."""
    from rsieve.verify import vqa_norm
    from tests.unit.cases.references import official_vqa

    annotation = [vqa_norm(a) for a in answers]
    got = PROTOCOLS["vqa"](prediction, answers)
    assert abs(got - official_vqa(prediction, annotation)) < 1e-12
