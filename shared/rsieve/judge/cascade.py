"""The decision cascade: the cheap string protocol first, then the judge on what it
rejected. Pure functions from stored records to outcomes."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from typing import Any

from rsieve.judge.verdicts import (
    FAILURE_CAUSES,
    TEMPLATE_SHA256,
    build_judge_prompt,
    guard,
    read_verdict,
)
from rsieve.schemas import Generation, Outcome, Verdict
from rsieve.verify import TrainingPolicy, verify

__all__ = [
    "REASON_OF",
    "apply_verdict",
    "judge_prompt",
    "needs_judge",
    "recheck_outcomes",
    "rejection_reason",
    "verdict_state",
    "verify_generation",
]


# The rejected split's reason for each verdict that does not promote.
REASON_OF = {"WRONG": "wrong_answer", "UNSURE": "judge_unsure", "FAILED": "judge_failed"}


def verdict_state(verdict: str, cause: str | None) -> tuple[str, str | None]:
    """A stored verdict as (verdict, failure cause kind): FAILED with one of
    `FAILURE_CAUSES` (or "unknown"), else the verdict and None. Records written before
    FAILED existed held a failure as UNSURE with a cause (`judge_failed: <message>` for a
    failed call): they read as the FAILED they were."""
    if verdict == "UNSURE" and cause:
        verdict = "FAILED"
    if verdict != "FAILED":
        return verdict, None
    kind = (cause or "").split(":", 1)[0].strip()
    kind = "call_failed" if kind == "judge_failed" else kind
    return "FAILED", kind if kind in FAILURE_CAUSES else "unknown"


def verify_generation(gen: Generation, policy: TrainingPolicy | None = None) -> Outcome:
    """Accepted by the protocol and its training rule (`policy`: the run's, by default the
    settings' defaults), rejected for a generation failure, or pending the judge: rejected
    with reason None, or `near_miss` when the benchmark passes what training refuses. An
    accepted answer whose blind pass found it answerable without the image is rejected
    `answerable_without_image` when the run's blind_policy is `drop`."""
    if gen.failure is not None or gen.answer is None:
        return Outcome(
            generation=gen,
            decision=None,
            verdict=None,
            place="rejected",
            reason=gen.failure or "empty_answer",
            promoted_by=None,
        )
    item = gen.item
    options = {"options": item.options} if item.options else {}
    rule = (policy or DEFAULT_POLICY).rule_for(item.family, item.protocol)
    decision = verify(item.protocol, gen.answer, item.references, training=rule, **options)
    if decision.accepted and not decision.near_miss:
        blind = gen.blind
        if blind is not None and blind.answerable and blind.policy == "drop":
            # The blind pass (rsieve.judge.blind): right without the image, and the run
            # drops such items. Not the judge's to promote: the answer is not in doubt.
            return Outcome(
                generation=gen,
                decision=decision,
                verdict=None,
                place="rejected",
                reason="answerable_without_image",
                promoted_by=None,
            )
        return Outcome(
            generation=gen,
            decision=decision,
            verdict=None,
            place="accepted",
            reason=None,
            promoted_by="verifier",
        )
    return Outcome(
        generation=gen,
        decision=decision,
        verdict=None,
        place="rejected",
        reason="near_miss" if decision.near_miss else None,
        promoted_by=None,
    )


DEFAULT_POLICY = TrainingPolicy()


def needs_judge(outcome: Outcome) -> bool:
    return outcome.place == "rejected" and outcome.reason in (None, "near_miss")


def rejection_reason(outcome: Outcome, reason: str) -> str:
    """A near miss keeps `near_miss` whatever the judge did short of promoting it (its
    verdict is recorded): the split's reason says why the benchmark's pass was not enough."""
    decision = outcome.decision
    return "near_miss" if decision is not None and decision.near_miss else reason


def judge_prompt(outcome: Outcome) -> str:
    """The judge's prompt for an outcome: the stored question (byte-identical to what the
    model received), the references and the model's answer after its reasoning."""
    gen = outcome.generation
    return build_judge_prompt(gen.item.question, gen.item.references, gen.answer or "")


def apply_verdict(
    outcome: Outcome,
    *,
    model: str,
    prompt: str,
    raw_output: str | None,
    finish_reason: str = "stop",
    failure: str | None = None,
    model_kind: str | None = None,
    input_tokens: int | None = None,
    output_tokens: int | None = None,
    reused: bool = False,
) -> Outcome:
    """Only CORRECT promotes, and never a candidate the guard flags (`judge_guarded`, the
    verdict kept: rsieve.judge.verdicts.guard). WRONG: `wrong_answer`; UNSURE (the judge said so):
    `judge_unsure`; FAILED (the call failed, or the output was empty, unparsable or cut
    off; the cause is recorded): `judge_failed`, never WRONG, never UNSURE. `model_kind`:
    what the judge model is (rsieve.schemas.MODEL_KINDS), None when undeclared; the token
    counts: the call's, when its server returned them; `reused`: the reply is an earlier
    call's, from the verdict cache (rsieve.judge.judgecache), read exactly as a fresh one."""
    parsed = read_verdict(raw_output, finish_reason, failure)
    verdict, cause = parsed.verdict, parsed.cause
    gen = outcome.generation
    guarded = guard(gen.item.question, gen.item.references, gen.answer or "", gen.item.protocol)
    record = Verdict(
        verdict=verdict,
        cause=cause,
        model=model,
        model_kind=model_kind,
        prompt_sha256=hashlib.sha256(prompt.encode()).hexdigest(),
        template_sha256=TEMPLATE_SHA256,
        prompt=prompt,
        raw_output=raw_output or "",
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        reused=reused,
        guard=guarded,
    )
    if verdict == "CORRECT" and guarded:
        return outcome.model_copy(
            update={"verdict": record, "reason": rejection_reason(outcome, "judge_guarded")}
        )
    if verdict == "CORRECT":
        return outcome.model_copy(
            update={"verdict": record, "place": "accepted", "reason": None, "promoted_by": "judge"}
        )
    return outcome.model_copy(
        update={"verdict": record, "reason": rejection_reason(outcome, REASON_OF[verdict])}
    )


def skip_judge(outcome: Outcome) -> Outcome:
    """A rejection the judge is not asked about: its family's calibration already showed
    the judge cannot clear the false-promotion bound (rsieve.judge.calibration.hopeless_families;
    the reason per family is stored with the shard's calibration)."""
    return outcome.model_copy(update={"reason": rejection_reason(outcome, "judge_skipped")})


def _decision_view(o: Any) -> dict[str, Any]:
    d = o.decision
    return {
        "place": o.place,
        "reason": o.reason,
        **(
            {
                "protocol": d.protocol,
                "version": d.version,
                "accepted": d.accepted,
                "score": d.score,
                "variant": d.variant,
                "threshold": d.threshold,
                **(
                    {
                        "training_rule": d.training.rule,
                        "training_accepted": d.training.accepted,
                        "training_variant": d.training.variant,
                    }
                    if d.training is not None
                    else {}
                ),
            }
            if d is not None
            else {"decision": None}
        ),
    }


def _stored_policy(outcome: Any) -> TrainingPolicy:
    """The rule the stored decision was made under (a record from before training
    acceptance: `benchmark`, as it was decided)."""
    d = outcome.decision
    rule = d.training.rule if d is not None and d.training is not None else "benchmark"
    return TrainingPolicy(by_protocol={}, by_family={outcome.generation.item.family: rule})


def recheck_outcomes(outcomes: Iterable[Any]) -> tuple[int, list[dict[str, Any]]]:
    """Recompute each stored verifier outcome from its stored generation with today's
    rsieve.verify; return how many were checked and those that differ (stored vs now)."""
    checked, diffs = 0, []
    for stored in outcomes:
        checked += 1
        try:
            now = _decision_view(verify_generation(stored.generation, _stored_policy(stored)))
        except Exception as exc:  # noqa: BLE001 - a protocol gone or failing is a difference
            now = {"error": f"{type(exc).__name__}: {exc}"}
        before = _decision_view(stored)
        if "training_rule" not in before:  # decided before training acceptance existed
            now = {k: v for k, v in now.items() if not k.startswith("training_")}
        if now != before:
            item = stored.generation.item
            diffs.append(
                {
                    "id": item.id,
                    "line": item.line,
                    "family": item.family,
                    "stored": before,
                    "recomputed": now,
                }
            )
    return checked, diffs
