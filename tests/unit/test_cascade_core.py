"""The decision cascade: verifier first, then the judge's verdict on what it rejected."""

from __future__ import annotations

import hashlib

import pytest

from rsieve.judge.cascade import (
    REASON_OF,
    apply_verdict,
    judge_prompt,
    needs_judge,
    verdict_state,
    verify_generation,
)
from rsieve.judge.verdicts import TEMPLATE_SHA256, build_judge_prompt
from rsieve.schemas import REJECT_REASONS, Outcome
from tests.unit._records import make_generation, make_item


def _pending() -> Outcome:
    out = verify_generation(make_generation(make_item(references=["COFFEE"]), "It reads COFFEE."))
    assert needs_judge(out)
    return out


@pytest.mark.parametrize("failure", ["truncated_reasoning", "empty_answer", "truncated_answer"])
def test_generation_failure_is_rejected_with_its_reason(failure: str) -> None:
    gen = make_generation(
        make_item(), None, raw_output="<think>cut", failure=failure, finish_reason="length"
    )
    out = verify_generation(gen)
    assert (out.place, out.reason, out.decision, out.verdict, out.promoted_by) == (
        "rejected",
        failure,
        None,
        None,
        None,
    )
    assert not needs_judge(out)
    assert out.generation == gen


def test_failure_wins_over_an_answer() -> None:
    gen = make_generation(make_item(), "COFFEE", failure="truncated_answer")
    out = verify_generation(gen)
    assert (out.place, out.reason, out.decision) == ("rejected", "truncated_answer", None)


def test_missing_answer_without_failure_is_empty_answer() -> None:
    out = verify_generation(make_generation(make_item(), None))
    assert (out.place, out.reason, out.decision) == ("rejected", "empty_answer", None)


def test_accepted_by_protocol_is_promoted_by_verifier() -> None:
    out = verify_generation(make_generation(make_item(references=["COFFEE"]), "coffee."))
    assert (out.place, out.reason, out.promoted_by, out.verdict) == (
        "accepted",
        None,
        "verifier",
        None,
    )
    assert out.decision is not None
    assert (out.decision.protocol, out.decision.accepted, out.decision.variant) == (
        "alnum",
        True,
        "whole",
    )
    assert not needs_judge(out)


def test_first_line_variant_is_recorded() -> None:
    out = verify_generation(
        make_generation(
            make_item(references=["COFFEE"]), "COFFEE\nThe sign reads coffee in capitals."
        )
    )
    assert out.place == "accepted"
    assert out.decision is not None and out.decision.variant == "first_line"


def test_mc_options_reach_the_protocol() -> None:
    item = make_item(
        family="SynthChoice", protocol="mc", references=["B"], options={"A": "cat", "B": "dog"}
    )
    assert verify_generation(make_generation(item, "dog")).place == "accepted"
    assert verify_generation(make_generation(item, "cat")).place == "rejected"


def test_rejected_by_protocol_is_pending_judge() -> None:
    out = _pending()
    assert (out.place, out.reason, out.promoted_by, out.verdict) == ("rejected", None, None, None)
    assert out.decision is not None
    assert out.decision.accepted is False and out.decision.variant is None
    assert needs_judge(out)


def test_judge_prompt_uses_stored_question_references_and_answer() -> None:
    out = _pending()
    item = out.generation.item
    assert judge_prompt(out) == build_judge_prompt(
        item.question, item.references, "It reads COFFEE."
    )


def test_correct_promotes_by_judge() -> None:
    pending = _pending()
    prompt = judge_prompt(pending)
    out = apply_verdict(
        pending, model="judge-m", prompt=prompt, raw_output="<think>same word</think>\nCORRECT"
    )
    assert (out.place, out.reason, out.promoted_by) == ("accepted", None, "judge")
    assert out.decision == pending.decision
    assert out.generation == pending.generation
    v = out.verdict
    assert v is not None
    assert (v.verdict, v.cause, v.model) == ("CORRECT", None, "judge-m")
    assert v.prompt == prompt
    assert v.prompt_sha256 == hashlib.sha256(prompt.encode()).hexdigest()
    assert v.template_sha256 == TEMPLATE_SHA256
    assert v.raw_output == "<think>same word</think>\nCORRECT"


@pytest.mark.parametrize(
    ("raw", "verdict", "reason", "cause"),
    [
        ("WRONG", "WRONG", "wrong_answer", None),
        ("The words differ.\nWRONG", "WRONG", "wrong_answer", None),
        ("UNSURE", "UNSURE", "judge_unsure", None),
        ("The reference is unreadable.\n**UNSURE**", "UNSURE", "judge_unsure", None),
        ("maybe", "FAILED", "judge_failed", "judge_unparsable"),
        ("CORRECT, probably\nor not", "FAILED", "judge_failed", "judge_unparsable"),
        ("", "FAILED", "judge_failed", "judge_empty"),
        ("<think>it says COFFEE</think>", "FAILED", "judge_failed", "judge_empty"),
    ],
)
def test_non_correct_verdicts_stay_rejected(
    raw: str, verdict: str, reason: str, cause: str | None
) -> None:
    pending = _pending()
    out = apply_verdict(pending, model="judge-m", prompt="P", raw_output=raw)
    assert (out.place, out.reason, out.promoted_by) == ("rejected", reason, None)
    assert out.verdict is not None
    assert (out.verdict.verdict, out.verdict.cause) == (verdict, cause)
    assert out.verdict.prompt_sha256 == hashlib.sha256(b"P").hexdigest()
    assert out.verdict.template_sha256 == TEMPLATE_SHA256


def test_truncated_judge_output_is_failed_even_if_it_says_correct() -> None:
    out = apply_verdict(
        _pending(), model="m", prompt="P", raw_output="CORRECT", finish_reason="length"
    )
    assert (out.place, out.reason, out.promoted_by) == ("rejected", "judge_failed", None)
    assert out.verdict is not None
    assert (out.verdict.verdict, out.verdict.cause) == ("FAILED", "judge_truncated")


@pytest.mark.parametrize("failure", ["deadline exceeded", None])
def test_failed_judge_call_is_failed_never_wrong_nor_unsure(failure: str | None) -> None:
    pending = _pending()
    out = apply_verdict(pending, model="judge-m", prompt="P", raw_output=None, failure=failure)
    assert (out.place, out.reason, out.promoted_by) == ("rejected", "judge_failed", None)
    v = out.verdict
    assert v is not None
    assert v.verdict == "FAILED"
    assert v.cause == f"call_failed: {failure or 'no output'}"
    assert v.raw_output == ""
    assert v.prompt_sha256 == hashlib.sha256(b"P").hexdigest()
    assert v.template_sha256 == TEMPLATE_SHA256


def test_failed_judge_cause_is_bounded() -> None:
    out = apply_verdict(_pending(), model="m", prompt="P", raw_output=None, failure="x" * 1000)
    assert out.verdict is not None and out.verdict.cause is not None
    assert len(out.verdict.cause) <= 300


@pytest.mark.parametrize(
    ("raw", "finish", "failure"),
    [
        (None, "stop", "UNAVAILABLE"),
        ("", "stop", None),
        ("garbage", "stop", None),
        ("CORRECT", "length", None),
        ("UNSURE", "stop", None),
        ("WRONG", "stop", None),
    ],
)
def test_only_correct_promotes(raw: str | None, finish: str, failure: str | None) -> None:
    out = apply_verdict(
        _pending(), model="m", prompt="P", raw_output=raw, finish_reason=finish, failure=failure
    )
    assert (out.place, out.promoted_by) == ("rejected", None)
    assert out.reason in REJECT_REASONS


def test_every_reason_of_a_verdict_is_documented() -> None:
    assert set(REASON_OF) == {"WRONG", "UNSURE", "FAILED"}
    assert set(REASON_OF.values()) <= set(REJECT_REASONS)
    assert "failed" not in REJECT_REASONS["judge_unsure"]


def test_model_kind_is_recorded_and_optional() -> None:
    out = apply_verdict(
        _pending(), model="judge-smollm2", prompt="P", raw_output="WRONG", model_kind="llm"
    )
    assert out.verdict is not None and out.verdict.model_kind == "llm"
    out = apply_verdict(_pending(), model="m", prompt="P", raw_output="WRONG")
    assert out.verdict is not None and out.verdict.model_kind is None


@pytest.mark.parametrize(
    ("verdict", "cause", "state"),
    [
        ("CORRECT", None, ("CORRECT", None)),
        ("UNSURE", None, ("UNSURE", None)),
        ("FAILED", "call_failed: UNAVAILABLE", ("FAILED", "call_failed")),
        ("FAILED", "judge_truncated", ("FAILED", "judge_truncated")),
        # Stored before FAILED existed: a failure was UNSURE with a cause.
        ("UNSURE", "judge_failed: timeout", ("FAILED", "call_failed")),
        ("UNSURE", "judge_empty", ("FAILED", "judge_empty")),
        ("FAILED", "something else", ("FAILED", "unknown")),
    ],
)
def test_verdict_state_reads_old_and_new_records(
    verdict: str, cause: str | None, state: tuple[str, str | None]
) -> None:
    assert verdict_state(verdict, cause) == state


def test_apply_verdict_does_not_mutate_input() -> None:
    pending = _pending()
    apply_verdict(pending, model="m", prompt="P", raw_output="CORRECT")
    assert (pending.place, pending.reason, pending.verdict) == ("rejected", None, None)


def test_prompt_hash_covers_non_ascii_prompt() -> None:
    prompt = "Qu'est-ce qui est écrit ? ‹candidate›"
    out = apply_verdict(_pending(), model="m", prompt=prompt, raw_output="WRONG")
    assert out.verdict is not None
    assert out.verdict.prompt_sha256 == hashlib.sha256(prompt.encode("utf-8")).hexdigest()
