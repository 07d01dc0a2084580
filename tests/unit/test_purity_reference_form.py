"""Task purity learns a reading family's task from its references (rule
`reference_form_off`, rsieve.clean.purity): where a family's answers are the text in its
images, a question about the text that is not a reading question (handwritten or printed,
the font, the colour of the ink, how many words) is off-task, whatever the family's share.
A family whose answers are such attributes (its task is to tell them) is left alone."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pytest

from rsieve.clean.purity import (
    ATTRIBUTE_SHARE,
    DEFINITE_RULES,
    PURITY_RULES,
    REFERENCE_CHARS,
    PurityQuestion,
    attribute_answer,
    first_reference,
    measure_purity,
)
from tests.unit.test_purity_origin import ingest_pool

# Three phrasings, so the family asks no single question and has no dominant one: the
# rule that used to catch "handwritten or printed?" (single_template_off) cannot.
READING = ("Read the word in the image.", "What word is shown?", "Transcribe the text.")
WORDS = ("house", "red", "yes", "market", "coffee", "exit", "blue", "open", "print", "seven")
ABOUT_THE_TEXT = (  # (question, reference): none of them reads the text
    ("Is the text handwritten or printed?", "printed"),
    ("What is the colour of the ink?", "Blue"),
    ("How many words are written?", "2"),
    ("Which font is it, serif or sans-serif?", "serif"),
)


def _reading_family(genuine: int) -> list[PurityQuestion]:
    qs = [
        PurityQuestion(n + 1, READING[n % 3], reference=WORDS[n % len(WORDS)])
        for n in range(genuine)
    ]
    return qs + [
        PurityQuestion(genuine + k + 1, q, reference=ref)
        for k, (q, ref) in enumerate(ABOUT_THE_TEXT)
    ]


@pytest.mark.parametrize(
    ("question", "reference", "attribute"),
    [
        ("Is the text handwritten or printed?", "printed", True),
        ("Is the text handwritten or printed?", "Hand-written", True),
        ("Is the writing in cursive or block letters?", "block letters", True),
        ("What colour is the text?", "red.", True),
        ("How many words are there?", "3", True),
        ("Does the sign say open?", "Yes", True),
        ("Read the word in the image.", "market", False),
        ("What is the amount written?", "1500", False),
        ("What is written on the sign or banner?", "SALE", False),
        ("How many words are there?", "three words", False),
        ("Read the word.", "", False),
    ],
)
def test_an_attribute_answer_describes_the_text(
    question: str, reference: str, attribute: bool
) -> None:
    assert attribute_answer(question, reference) is attribute


def test_first_reference_is_the_first_answer_cut() -> None:
    assert first_reference(["Stop", "STOP"]) == "Stop"
    assert first_reference("x" * 500) == "x" * REFERENCE_CHARS
    assert first_reference([]) is None


def test_questions_about_the_text_are_dropped_whatever_the_share() -> None:
    qs = _reading_family(100)
    off = [q.line for q in qs[100:]]
    got = measure_purity("IIIT5K", "alnum", qs, threshold=0.05, min_items=20, embed=None)
    assert "reference_form_off" in DEFINITE_RULES and "reference_form_off" in PURITY_RULES
    assert {ln: got.rule_of_line[ln] for ln in off} == dict.fromkeys(off, "reference_form_off")
    # 4 of 104 is under the threshold: only a definite rule drops them.
    assert got.share < got.threshold and not got.exceeded
    assert got.dropped_lines == off
    # "red", "yes", "blue" and "print" read off a word image are transcriptions: on-task.
    assert all(not got.rule_of_line[q.line].endswith("_off") for q in qs[:100])
    assert got.reads_text is True and got.attribute_share == round(4 / 104, 4)
    summary = got.summary()
    assert summary["reference_form"] == {"reads_text": True, "attribute_share": 0.0385}
    assert "describes the text instead; reference_form_off" in got.drop_detail(off[0], None)


def test_without_references_the_family_is_measured_as_before() -> None:
    qs = [PurityQuestion(q.line, q.question) for q in _reading_family(100)]
    got = measure_purity("IIIT5K", "alnum", qs, threshold=0.05, min_items=20, embed=None)
    assert "reference_form_off" not in got.by_rule and got.reads_text is None
    # "handwritten or printed?" is open here: nothing drops it at a share under 5%.
    assert 101 not in got.dropped_lines


def test_a_family_whose_task_is_the_attribute_keeps_it() -> None:
    """Every item asks how the text was written: the answers are attributes, so the family
    does not read the text, and asking about it is its task."""
    qs = [
        PurityQuestion(
            n, "Is the text handwritten or printed?", reference=("printed", "handwritten")[n % 2]
        )
        for n in range(1, 31)
    ]
    got = measure_purity("HandOrPrint", "alnum", qs, threshold=0.05, min_items=20, embed=None)
    assert got.reads_text is False and got.attribute_share == 1.0 > ATTRIBUTE_SHARE
    assert "reference_form_off" not in got.by_rule and not got.dropped_lines


def test_only_reading_protocols_learn_it() -> None:
    qs = _reading_family(100)
    got = measure_purity("DocVQA", "anls", qs, threshold=0.05, min_items=20, embed=None)
    assert got.reads_text is None and "reference_form_off" not in got.by_rule


def test_the_ingest_rounds_quarantine_them_with_the_rule_named() -> None:
    """The reference travels from the pool line to the purity round (Candidate,
    PurityRecord): an IIIT5K pool of 60 reading items and the 4 questions about the text,
    each with its own image."""
    recs: list[dict[str, Any]] = []
    for q in _reading_family(60):
        recs.append(
            {
                "id": f"i{q.line}",
                "family": "IIIT5K",
                "image": f"w/{q.line}.png",
                "question": q.question,
                "answer": [q.reference],
                "source": {"sha256": hashlib.sha256(f"w/{q.line}.png".encode()).hexdigest()},
            }
        )
    got = ingest_pool("\n".join(json.dumps(r) for r in recs).encode() + b"\n")
    assert {ln: got.rules[ln] for ln in range(61, 65)} == dict.fromkeys(
        range(61, 65), "reference_form_off"
    )
    assert {ln for ln, (reason, _) in got.verdicts.items() if reason == "off_task"} == set(
        range(61, 65)
    )
    assert all("reference_form_off" in got.verdicts[ln][1] for ln in range(61, 65))
    purity = got.report["families"]["IIIT5K"]["purity"]
    assert purity["reference_form"]["reads_text"] is True
    assert purity["by_rule"]["reference_form_off"] == 4
