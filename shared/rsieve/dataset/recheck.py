"""Recheck a published dataset from its files alone (no stack, no stored outputs).

Every qa entry carries what its decision needs (rsieve.compact.rows): the protocol and its
version and constants, the references, the multiple-choice options, the whole
post-reasoning answer (`full_answer`, or `wrong_vlm` in a rejected split) and the
variant that passed. `recheck_entries` recomputes, for each entry:

- the verifier decision with today's rsieve.verify: both numbers, the benchmark's
  (accepted, score, variant; a protocol whose version changed since is a difference, named
  as such) and training acceptance under the entry's recorded rule (accepted, variant;
  a near miss in an accepted split without a judge promotion is a difference);
- the training target: an accepted entry's `answer` is the form that passed
  (`rsieve.compact.splits.passed_text`), and the shown reference is the canonical one
  (`rsieve.compact.splits.canonical_reference`);
- the judge hold-back: from the run report's calibration figures (k of n known-wrong
  probes the judge called CORRECT) and the bound in run_spec.json, which families may
  promote by the judge (`rsieve.judge.calibration`'s rule, Wilson 95% upper bound recomputed),
  and that every judge promotion lies in one of them and every `judge_untrusted` entry in
  none;
- the trace gate (rsieve.compact.traces): every `_RS_think` entry's reasoning checked
  again with the constants and length bands the run report's `trace_gate` records (each
  stored `trace_checks` value must come out the same), and no entry that failed a check
  in `_RS_think`;
- the blind pass: no entry answerable without its image where the run's `blind_policy`
  keeps such entries out.

Pure: the caller reads the Parquet rows and the JSON files (rsieve_cli.commands.recheck)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from rsieve.compact.splits import canonical_reference, passed_text
from rsieve.compact.traces import (
    TRACE_CHECKS_VERSION,
    AskedEntry,
    LengthBand,
    TraceLimits,
    check_trace,
)
from rsieve.judge.calibration import wilson
from rsieve.judge.verdicts import guard
from rsieve.verify import PROTOCOLS, TRAINING_RULES, verify

__all__ = ["RecheckResult", "held_back_families", "recheck_entries"]


@dataclass
class RecheckResult:
    decisions: int = 0  # verifier decisions recomputed
    agreed: int = 0
    hold_back_checked: int = 0  # judge promotions and judge_untrusted entries checked
    traces_checked: int = 0  # `_RS_think` reasoning checked again by the trace gate
    differences: list[dict[str, Any]] = field(default_factory=list)

    @property
    def agreement(self) -> float:
        return self.agreed / self.decisions if self.decisions else 1.0

    def summary(self) -> dict[str, Any]:
        return {
            "decisions": self.decisions,
            "agreed": self.agreed,
            "agreement": round(self.agreement, 6),
            "hold_back_checked": self.hold_back_checked,
            "traces_checked": self.traces_checked,
            "differences": self.differences,
        }


def held_back_families(calibration: Mapping[str, Mapping[str, Any]], bound: float) -> set[str]:
    """Families whose judge promotions are held back, recomputed from the report's
    calibration counts: no false-promotion figure, or its Wilson 95% upper bound above
    `bound` (a bound of 1 holds nothing back). Families absent from the calibration are
    held back too (the caller checks entries of those against this rule)."""
    if bound >= 1.0:
        return set()
    held = set()
    for family, entry in calibration.items():
        fp = entry.get("false_promotion") or {}
        k, n = int(fp.get("k") or 0), int(fp.get("n") or 0)
        if not n or wilson(k, n)[1] > bound:
            held.add(family)
    return held


def _differs(what: str, entry: Mapping[str, Any], split: str, **detail: Any) -> dict[str, Any]:
    return {"check": what, "split": split, "id": entry.get("id"), **detail}


def _recheck_trace(
    result: RecheckResult,
    kind: str,
    family: str,
    qa: Mapping[str, Any],
    gate: Mapping[str, Any] | None,
) -> None:
    stored = {c: v for c, v in (qa.get("trace_checks") or {}).items() if v is not None}
    if kind == "RS_think" and not all(stored.values()):
        result.differences.append(_differs("trace_gate", qa, kind, failed=sorted(stored)))
    reasoning = qa.get("reasoning") or ""
    if kind != "RS_think" or gate is None or not stored or not reasoning.strip():
        return
    if gate.get("version") != TRACE_CHECKS_VERSION:
        result.differences.append(
            _differs("trace_checks_version", qa, kind, stored=gate.get("version"))
        )
        return
    result.traces_checked += 1
    asked = AskedEntry(
        question=qa.get("question") or "",
        references=list(qa.get("references") or []),
        options={o["label"]: o["text"] for o in qa.get("options") or []} or None,
        protocol=(qa.get("verification") or {}).get("protocol") or qa.get("protocol") or "",
    )
    band = (gate.get("length_bands") or {}).get(family)
    now = check_trace(
        reasoning,
        qa.get("full_answer") or "",
        asked,
        TraceLimits.of_gate(gate),
        LengthBand(**band) if band else None,
    )
    if {c: now.checks.get(c) for c in stored} != stored:
        result.differences.append(
            _differs("trace_checks", qa, kind, stored=stored, recomputed=now.checks)
        )


def _recheck_blind(
    result: RecheckResult, kind: str, qa: Mapping[str, Any], blind_policy: str | None
) -> None:
    """An entry answerable without its image where the run's blind policy keeps it out."""
    if qa.get("answerable_without_image") and (
        (blind_policy == "nothink" and kind == "RS_think")
        or (blind_policy == "drop" and kind != "rejected")
    ):
        result.differences.append(_differs("blind_pass", qa, kind, policy=blind_policy))


def _recheck_reference(result: RecheckResult, kind: str, qa: Mapping[str, Any]) -> None:
    """The shown reference is the canonical one of the entry's references."""
    references = list(qa.get("references") or [])
    if not references:
        return
    shown = qa.get("answer") if kind == "rejected" else qa.get("org_answer")
    if shown != canonical_reference(references):
        result.differences.append(
            _differs("reference", qa, kind, stored=shown, expected=canonical_reference(references))
        )


def _recheck_decision(result: RecheckResult, kind: str, qa: Mapping[str, Any]) -> bool:
    """The verifier decision recomputed with today's rsieve.verify, and an accepted entry's
    training target. False when the entry's protocol or training rule no longer exists:
    nothing more of it can be recomputed, its hold-back included."""
    stored = qa.get("verification")
    prediction = qa.get("wrong_vlm") if kind == "rejected" else qa.get("full_answer")
    if stored is None or prediction is None:
        return True
    result.decisions += 1
    protocol = stored["protocol"]
    if protocol not in PROTOCOLS:
        result.differences.append(_differs("protocol_gone", qa, kind, protocol=protocol))
        return False
    rule = stored.get("training_rule")
    if rule is not None and rule not in TRAINING_RULES:
        result.differences.append(_differs("training_rule_gone", qa, kind, rule=rule))
        return False
    references = list(qa.get("references") or [])
    options = {o["label"]: o["text"] for o in qa.get("options") or []}
    now = verify(
        protocol, prediction, references, training=rule, **({"options": options} if options else {})
    )
    before: tuple[Any, ...] = (
        stored["version"],
        bool(stored["accepted"]),
        round(float(stored["score"]), 6),
        stored.get("variant"),
    )
    after: tuple[Any, ...] = (now.version, now.accepted, round(now.score, 6), now.variant)
    if rule is not None and now.training is not None:
        before += (stored.get("training_accepted"), stored.get("training_variant"))
        after += (now.training.accepted, now.training.variant)
        stored_constants = stored.get("training_constants")
        if stored_constants and json.loads(stored_constants) != now.training.constants:
            result.differences.append(_differs("training_constants", qa, kind, rule=rule))
    by_verifier = kind != "rejected" and qa.get("promoted_by") == "verifier"
    if by_verifier and now.near_miss:
        result.differences.append(_differs("near_miss_accepted", qa, kind, rule=rule))
    constants = json.loads(stored["constants"]) if stored.get("constants") else now.constants
    if before == after and constants == now.constants:
        result.agreed += 1
    else:
        what = "protocol_version" if before[0] != after[0] else "decision"
        result.differences.append(
            _differs(what, qa, kind, stored=list(before), recomputed=list(after))
        )
    if by_verifier:
        target = passed_text(
            prediction,
            stored.get("training_variant") if rule is not None else stored.get("variant"),
        )
        if qa.get("answer") != target:
            result.differences.append(
                _differs("answer", qa, kind, stored=qa.get("answer"), expected=target)
            )
    return True


def _recheck_hold_back(
    result: RecheckResult,
    kind: str,
    family: str,
    qa: Mapping[str, Any],
    calibration: Mapping[str, Mapping[str, Any]],
    held: set[str],
) -> None:
    """A judge promotion lies in a family that may promote (and passes the guard); a
    `judge_untrusted` entry, or a near miss the judge called CORRECT, in one that may not."""
    judge = qa.get("judge") or {}
    if kind != "rejected" and qa.get("promoted_by") == "judge":
        result.hold_back_checked += 1
        # A judge promotion whose candidate the guard flags should never have happened.
        if guard(
            qa.get("question") or "",
            list(qa.get("references") or []),
            qa.get("full_answer") or qa.get("answer") or "",
            (qa.get("verification") or {}).get("protocol"),
        ):
            result.differences.append(_differs("guard", qa, kind, family=family))
        if family in held or family not in calibration:
            result.differences.append(_differs("hold_back", qa, kind, family=family, held=True))
    elif kind == "rejected" and (
        qa.get("reason") == "judge_untrusted"
        or (qa.get("reason") == "near_miss" and judge.get("verdict") == "CORRECT")
    ):
        if qa.get("reason") == "near_miss" and guard(
            qa.get("question") or "",
            list(qa.get("references") or []),
            qa.get("wrong_vlm") or "",
            (qa.get("verification") or {}).get("protocol"),
        ):
            return  # a guarded CORRECT: held back by the guard, not the calibration
        result.hold_back_checked += 1
        trusted = family in calibration and family not in held
        if trusted or judge.get("verdict") != "CORRECT":
            result.differences.append(_differs("hold_back", qa, kind, family=family, held=False))


def recheck_entries(
    entries: Iterable[tuple[str, str, Mapping[str, Any]]],
    *,
    calibration: Mapping[str, Mapping[str, Any]] | None,
    bound: float | None,
    trace_gate: Mapping[str, Any] | None = None,
    blind_policy: str | None = None,
) -> RecheckResult:
    """`entries`: (split kind, family, qa entry) for every qa entry of the export (kind:
    RS_think, RS_nothink or rejected). `calibration` and `bound`: the run report's
    calibration summary and run_spec.json's bound (None: the hold-back is not checked).
    `trace_gate`: the run report's (None: the run had none; only its split is checked).
    `blind_policy`: the run's, when it ran the blind pass (run_spec.json): no entry
    answerable without its image in `_RS_think` (nothink) or a training split (drop)."""
    result = RecheckResult()
    held = held_back_families(calibration or {}, bound) if bound is not None else None
    for kind, family, qa in entries:
        _recheck_trace(result, kind, family, qa, trace_gate)
        _recheck_blind(result, kind, qa, blind_policy)
        _recheck_reference(result, kind, qa)
        if _recheck_decision(result, kind, qa) and held is not None:
            _recheck_hold_back(result, kind, family, qa, calibration or {}, held)
    return result
