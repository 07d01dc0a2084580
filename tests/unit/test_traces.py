"""The trace gate (rsieve.compact.traces) on crafted traces: each check alone, then the
routing of a failed trace to `_RS_nothink` only, per sample with best-of-n."""

from __future__ import annotations

import dataclasses

import pytest

from rsieve.compact.rows import assemble_rows
from rsieve.compact.splits import split_kinds
from rsieve.compact.traces import (
    LengthBand,
    TraceLimits,
    check_trace,
    conclusion,
    gate_outcome,
    guessing_phrase,
    length_bands,
    merge_lengths,
    mixed_run,
    repeated_share,
    script_of,
    trace_lengths,
)
from rsieve.judge.cascade import verify_generation
from rsieve.schemas import TRACE_CHECKS, Item, Outcome, Samples
from rsieve.settings import Settings
from tests.unit._records import make_generation, make_item

LIMITS = TraceLimits.of(Settings())
WORD = make_item(references=["COFFEE"])
SOUND = (
    "The image shows a paper cup with a word printed on it in capital letters. "
    "Reading left to right: C, O, F, F, E, E. The third and fourth letters are both F, "
    "and the last two are both E. So the word is COFFEE."
)


def failed(trace: str, answer: str = "COFFEE", item: Item = WORD) -> list[str]:
    report = check_trace(trace, answer, item, LIMITS)
    return [name for name, passed in report.checks.items() if not passed]


def test_a_sound_trace_passes_every_check_but_length_without_a_band() -> None:
    report = check_trace(SOUND, "COFFEE", WORD, LIMITS)
    assert report.passed and report.reasons == []
    assert list(report.checks) == [c for c in TRACE_CHECKS if c != "length"]


# --- repetition -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "loop",
    [
        "Wait, let me check again. " * 40,  # a sentence
        "the the the the " * 30,  # a word
        "C O F F E E " * 30,  # a span of letters
        "hm" * 200,  # characters without spaces
        "!" * 300,
    ],
)
def test_a_loop_fails_repetition(loop: str) -> None:
    assert failed(SOUND + " " + loop + " So the word is COFFEE.") == ["repetition"]


def test_a_loop_in_a_script_written_without_spaces_fails_repetition() -> None:
    item = make_item(question="图中的单词是什么？", references=["COFFEE"])
    trace = "杯子上的字母是 COFFEE。" + "让我再检查一下。" * 30 + "答案是 COFFEE。"
    assert failed(trace, item=item) == ["repetition"]


def test_a_loop_of_characters_in_a_trace_with_typographic_punctuation_fails() -> None:
    # Not ASCII (the dash and quotes), no ideograph: split on spaces, loops looked for in
    # its long words.
    trace = f"The cup says \u201cCOFFEE\u201d \u2014 {'ha' * 200} \u2014 so the word is COFFEE."
    assert failed(trace) == ["repetition"]
    assert repeated_share(trace, 8) > 0.8


def test_repetition_measures_the_repeats_beyond_the_first() -> None:
    # Said once, a span repeats nothing; said four times in 16 tokens, three quarters.
    assert repeated_share("one two three four five six seven eight", 4) == 0.0
    assert repeated_share("a b c d " * 4, 4) == pytest.approx(0.75)
    assert repeated_share("a b c d " * 4, 8) == 1.0  # overlapping occurrences, capped
    # A sound trace repeats little even in short spans.
    assert repeated_share(SOUND, 4) < 0.3


def test_a_long_trace_that_repeats_a_phrase_now_and_then_passes() -> None:
    steps = " ".join(f"Step {i}: the letter at position {i} is clear." for i in range(1, 40))
    # Its 4-token template repeats (0.43 of it), its 8-token spans (the default) do not.
    assert repeated_share(steps, 4) > LIMITS.repetition_max_share
    assert repeated_share(steps, LIMITS.repetition_span) < LIMITS.repetition_max_share
    assert failed(steps + " So the word is COFFEE.") == []


def test_repetition_constants_come_from_the_limits() -> None:
    trace = SOUND + " " + "Wait, let me check again. " * 4
    assert failed(trace) == []
    strict = dataclasses.replace(LIMITS, repetition_max_share=0.1)
    assert not check_trace(trace, "COFFEE", WORD, strict).checks["repetition"]


# --- language mixing ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("run", "script"),
    [("这个词是咖啡", "cjk"), ("это слово кофе", "cyrillic"), ("これはコーヒーです", "cjk")],
)
def test_a_foreign_run_in_english_reasoning_fails_language_mixing(run: str, script: str) -> None:
    trace = f"Reading left to right: C, O, F, F, E, E. {run}. So the word is COFFEE."
    assert failed(trace) == ["language_mixing"]
    assert script_of(run) == script
    reason = check_trace(trace, "COFFEE", WORD, LIMITS).reasons[0]
    assert reason.startswith(f"language_mixing: {script} run")


@pytest.mark.parametrize(
    ("question", "trace"),
    [
        (
            "图中的单词是什么？",
            "图中杯子上写着 COFFEE 这个词。让我 проверить 一下。答案是 COFFEE。",
        ),
        ("Какое слово на картинке?", "На чашке написано COFFEE. 我看到了 это слово. Ответ COFFEE."),
    ],
)
def test_the_reverse_english_in_a_foreign_trace_is_allowed_a_third_script_is_not(
    question: str, trace: str
) -> None:
    item = make_item(question=question, references=["COFFEE"])
    assert failed(trace, item=item) == ["language_mixing"]
    clean = trace.replace("проверить", "").replace("我看到了", "")
    assert failed(clean, item=item) == []


def test_reasoning_in_another_language_than_the_question_fails() -> None:
    trace = "Буквы на чашке: C, O, F, F, E, E. Значит, слово COFFEE."
    assert failed(trace) == ["language_mixing"]
    assert "the question is in latin, the trace in cyrillic" in " ".join(
        check_trace(trace, "COFFEE", WORD, LIMITS).reasons
    )


def test_a_run_that_joins_two_scripts_is_told_apart() -> None:
    # "кофе咖啡" is one run of non-Latin letters: its Cyrillic and CJK halves are two runs.
    assert mixed_run("Reading the cup: кофе咖啡, so COFFEE.", "кофе", 2) == "咖啡"
    assert script_of("кофе咖啡") == "cyrillic"
    assert script_of("咖啡店里。кофе") == "cjk"  # 4 + 1: CJK punctuation counts with CJK


def test_a_reference_or_option_in_another_script_may_be_quoted() -> None:
    item = make_item(question="What word is written on the sign?", references=["東京"])
    trace = "The sign has two characters, 東京, which is Tokyo. So the word is 東京."
    assert failed(trace, "東京", item) == []
    assert mixed_run(trace, "", 2) == "東京"
    options = {"A": "Москва", "B": "Paris"}
    mc = make_item(
        protocol="mc", question="Which city? A. Москва B. Paris", references=["A"], options=options
    )
    assert failed("The sign reads Москва, option A. So the answer is A.", "A", mc) == []


# --- inconsistent ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("protocol", "reference", "trace", "answer", "agrees"),
    [
        ("alnum", "COFFEE", "So the word is coffee.", "COFFEE", True),
        ("alnum", "COFFEE", "The letters spell TOFFEE. So the word is TOFFEE.", "COFFEE", False),
        ("alnum", "COFFEE", "So the answer is COFFEE because the cup says so.", "COFFEE", True),
        ("number", "42", "Adding them up, the total is 42.0.", "42", True),
        ("number", "42", "So the answer is 41.", "42", False),
        ("exact", "blue", "The sky region is blue. The answer is: Blue", "blue", True),
        ("exact", "blue", "Hmm, the answer is red.", "blue", False),
        ("anls", "Acme Corp.", "The header text reads 'ACME Corp'.", "Acme Corp.", True),
        # ANLS passes SHOP for STOP (0.75); a trace that concludes SHOP contradicts STOP.
        ("anls", "STOP", "It looks like SHOP. So the text is SHOP.", "STOP", False),
        ("relaxed", "100", "The bar reaches 105, so the value is 105.", "100", False),
        ("relaxed", "100", "The bar reaches 100.0, so the value is 100.", "100", True),
        ("math", "1/2", "Simplifying, we get \\boxed{\\frac12}", "0.5", True),
        ("math", "1/2", "Simplifying, we get \\boxed{3/4}", "1/2", False),
        ("alnum", "COFFEE", "No conclusion is stated in so many words here.", "COFFEE", True),
    ],
)
def test_the_stated_conclusion_is_read_with_the_items_protocol(
    protocol: str, reference: str, trace: str, answer: str, agrees: bool
) -> None:
    item = make_item(protocol=protocol, references=[reference])
    assert ("inconsistent" not in failed(trace, answer, item)) is agrees


@pytest.mark.parametrize(
    ("trace", "answer", "agrees"),
    [
        ("So the answer is B.", "B", True),
        ("The correct option is dog.", "B", True),
        ("At first I thought A. Looking again, the answer is (B) dog.", "B", True),
        ("So the answer is (A) cat.", "B", False),
        ("The answer is: A", "B", False),
    ],
)
def test_multiple_choice_compares_letters(trace: str, answer: str, agrees: bool) -> None:
    options = {"A": "cat", "B": "dog"}
    item = make_item(
        protocol="mc", question="Which? A. cat B. dog", references=["B"], options=options
    )
    assert ("inconsistent" not in failed(trace, answer, item)) is agrees


def test_the_last_conclusion_counts() -> None:
    trace = "The word is TOFFEE? No: the first letter is a C. So the word is COFFEE."
    assert conclusion(trace) == "COFFEE"
    # The tail is read first; a trace that concludes early and then only checks is read
    # whole, and a conclusion in the tail beats an earlier one however long the trace.
    checking = " Then I check each letter once more against the print." * 40
    assert conclusion("So the word is TOFFEE." + checking) == "TOFFEE"
    assert conclusion("So the word is TOFFEE." + checking + " The word is COFFEE.") == "COFFEE"
    assert conclusion("Nothing concluded.") is None
    assert conclusion("It is \\boxed{42}.") == "42"


# --- guessing ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "phrase",
    [
        "I cannot see the image",
        "I can\u2019t view the picture",
        "No image is provided",
        "without seeing the image",
        "I'm just guessing",
        "I will have to guess",
        "my best guess",
        "Unable to read the image",
    ],
)
def test_saying_it_cannot_see_or_guesses_fails_guessing(phrase: str) -> None:
    trace = f"{phrase}, but a word like this on a cup is usually COFFEE. So the word is COFFEE."
    assert failed(trace) == ["guessing"]
    found = guessing_phrase(trace)
    assert found is not None and phrase.endswith(found)


@pytest.mark.parametrize(
    "trace",
    [
        SOUND,
        "The image clearly shows six letters; I can see the picture well. The word is COFFEE.",
        "Nothing here is guesswork: each letter is sharp. The word is COFFEE.",
        "The bookmaker's odds of a no-image layout are low. The word is COFFEE.",
    ],
)
def test_seeing_the_image_is_not_guessing(trace: str) -> None:
    assert guessing_phrase(trace) is None


# --- length ------------------------------------------------------------------------------


def test_length_bands_are_robust_and_floored() -> None:
    lengths = {"Words": [1000 + 10 * (i % 5) for i in range(40)] + [50_000], "Tiny": [100] * 5}
    bands = length_bands(lengths, LIMITS)
    assert set(bands) == {"Words"}  # Tiny has fewer than length_min_traces
    words = bands["Words"]
    assert words.traces == 41 and words.median == 1020
    # The MAD is 10 characters: the half-width is the floor, not 6 x 1.4826 x 10.
    assert (words.low, words.high) == (1020 - 400, 1020 + 400)
    wide = length_bands({"W": [100 * i for i in range(1, 41)]}, LIMITS)["W"]
    assert wide.high - wide.median == pytest.approx(6 * 1.4826 * 1000)


def test_a_trace_far_outside_its_familys_band_fails_length() -> None:
    band = LengthBand(median=float(len(SOUND)), low=0.0, high=len(SOUND) + 400.0, traces=50)
    long = SOUND + "".join(f" Letter {i} is {chr(65 + i % 26)}." for i in range(120))
    report = check_trace(long, "COFFEE", WORD, LIMITS, band)
    assert report.checks["length"] is False
    assert report.reasons[0].startswith(f"length: {len(long)} characters, outside 0-")
    assert check_trace(SOUND, "COFFEE", WORD, LIMITS, band).checks["length"] is True


def test_trace_lengths_count_every_accepted_sample_with_reasoning() -> None:
    head = accepted_with(SOUND)
    other = accepted_with("x" * 10, sample=1)
    no_reasoning = accepted_with("", sample=2)
    head = head.model_copy(
        update={
            "samples": Samples(
                n=3, passed=[0, 1, 2], kept=[0], wrong=[], others=[other, no_reasoning]
            )
        }
    )
    raw = head.model_dump(mode="json")
    assert trace_lengths([raw]) == {"SynthWords": [len(SOUND), 10]}
    assert merge_lengths([{"A": [1]}, {"A": [2], "B": [3]}]) == {"A": [1, 2], "B": [3]}


# --- settings, routing -------------------------------------------------------------------


def test_each_check_can_be_turned_off_and_an_unknown_one_is_refused() -> None:
    looping = SOUND + " " + "Wait, let me check again. " * 40
    off = TraceLimits.of(Settings(trace_checks=["guessing"]))
    assert check_trace(looping, "COFFEE", WORD, off).checks == {"guessing": True}
    with pytest.raises(ValueError, match="unknown trace check"):
        check_trace(SOUND, "COFFEE", WORD, dataclasses.replace(LIMITS, checks=("vibes",)))
    with pytest.raises(ValueError):
        Settings.model_validate({"trace_checks": ["vibes"]})


def accepted_with(reasoning: str, sample: int = 0) -> Outcome:
    generation = make_generation(WORD, "COFFEE", reasoning=reasoning or None)
    out = verify_generation(generation.model_copy(update={"sample": sample}))
    assert out.place == "accepted"
    return out


def test_a_failed_trace_keeps_its_answer_in_nothink_only() -> None:
    looping = gate_outcome(accepted_with(SOUND + " Wait, let me check again." * 40), LIMITS, {})
    sound = gate_outcome(accepted_with(SOUND), LIMITS, {})
    assert split_kinds(looping) == ("RS_nothink",)
    assert split_kinds(sound) == ("RS_think", "RS_nothink")
    rows = assemble_rows([looping])
    assert list(rows) == ["SynthWords_RS_nothink"]
    qa = rows["SynthWords_RS_nothink"][0]["qa"][0]
    assert qa["trace_checks"]["repetition"] is False
    assert qa["trace_checks"]["guessing"] is True and qa["trace_checks"]["length"] is None
    assert qa["trace_reasons"][0].startswith("repetition: ")
    think = assemble_rows([sound])["SynthWords_RS_think"][0]["qa"][0]
    assert think["trace_reasons"] == [] and think["trace_checks"]["repetition"] is True


def test_no_reasoning_and_rejected_answers_are_not_gated() -> None:
    bare = gate_outcome(accepted_with(""), LIMITS, {})
    assert bare.trace is None and split_kinds(bare) == ("RS_nothink",)
    wrong = verify_generation(make_generation(WORD, "TEA", reasoning="I guess TEA."))
    assert gate_outcome(wrong, LIMITS, {}).trace is None


def test_best_of_n_gates_each_sample() -> None:
    head = accepted_with(SOUND)
    looping = accepted_with(SOUND + " Wait, let me check again." * 40, sample=1)
    samples = Samples(n=2, passed=[0, 1], kept=[0, 1], wrong=[], others=[looping])
    gated = gate_outcome(head.model_copy(update={"samples": samples}), LIMITS, {})
    assert gated.trace is not None and gated.trace.passed
    assert gated.samples is not None
    other = gated.samples.others[0]
    assert other.trace is not None and not other.trace.passed
    rows = assemble_rows([gated])
    assert len(rows["SynthWords_RS_think"][0]["qa"]) == 1  # the looping sample: nothink only
    assert len(rows["SynthWords_RS_nothink"][0]["qa"]) == 2


def test_chinese_conclusions_and_guessing_are_read() -> None:
    item = make_item(question="图中的单词是什么？", references=["COFFEE"])
    assert failed("杯子上写着的字母是 TOFFEE。所以答案是 TOFFEE。", item=item) == ["inconsistent"]
    assert failed("杯子上写着的字母是 COFFEE。所以答案是：COFFEE。", item=item) == []
    assert conclusion("先看到 TEA，再看一遍，答案应该是 COFFEE，没错。") == "COFFEE"
    guess = "我看不清这张图片，只能猜是 COFFEE。答案是 COFFEE。"
    assert failed(guess, item=item) == ["guessing"]
    assert guessing_phrase(guess) == "看不清这张图片"
    assert guessing_phrase("图片很清楚，不需要猜测。答案是 COFFEE。") is None
