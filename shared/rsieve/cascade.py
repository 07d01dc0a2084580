"""The decision cascade: the cheap string protocol first, then the judge on what it
rejected. Pure functions from stored records to outcomes."""

from __future__ import annotations

import hashlib

from rsieve.judge import TEMPLATE_SHA256, build_judge_prompt, read_verdict
from rsieve.schemas import Generation, Outcome, Verdict
from rsieve.verify import verify

__all__ = ["apply_verdict", "judge_prompt", "needs_judge", "verify_generation"]


def verify_generation(gen: Generation) -> Outcome:
    """Accepted by the protocol, rejected for a generation failure, or pending the judge
    (rejected with reason None)."""
    if gen.failure is not None or gen.answer is None:
        return Outcome(generation=gen, decision=None, verdict=None, place="rejected",
                       reason=gen.failure or "empty_answer", promoted_by=None)
    item = gen.item
    options = {"options": item.options} if item.options else {}
    decision = verify(item.protocol, gen.answer, item.references, **options)
    if decision.accepted:
        return Outcome(generation=gen, decision=decision, verdict=None, place="accepted",
                       reason=None, promoted_by="verifier")
    return Outcome(generation=gen, decision=decision, verdict=None, place="rejected",
                   reason=None, promoted_by=None)


def needs_judge(outcome: Outcome) -> bool:
    return outcome.place == "rejected" and outcome.reason is None


def judge_prompt(outcome: Outcome) -> str:
    """The judge's prompt for an outcome: the stored question (byte-identical to what the
    model received), the references and the model's answer after its reasoning."""
    gen = outcome.generation
    return build_judge_prompt(gen.item.question, gen.item.references, gen.answer or "")


def apply_verdict(outcome: Outcome, *, model: str, prompt: str, raw_output: str | None,
                  finish_reason: str = "stop", failure: str | None = None) -> Outcome:
    """Only CORRECT promotes. A failed call is UNSURE with its cause, never WRONG."""
    parsed = read_verdict(raw_output, finish_reason, failure)
    verdict, cause = parsed.verdict, parsed.cause
    record = Verdict(verdict=verdict, cause=cause, model=model,  # type: ignore[arg-type]
                     prompt_sha256=hashlib.sha256(prompt.encode()).hexdigest(),
                     template_sha256=TEMPLATE_SHA256, prompt=prompt,
                     raw_output=raw_output or "")
    if verdict == "CORRECT":
        return outcome.model_copy(update={"verdict": record, "place": "accepted",
                                          "reason": None, "promoted_by": "judge"})
    reason = "wrong_answer" if verdict == "WRONG" else "judge_unsure"
    return outcome.model_copy(update={"verdict": record, "reason": reason})
