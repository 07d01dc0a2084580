"""Row assembly: outcomes to dataset rows, one row per image per split.

Pure: rows carry `image_sha256`; the compactor puts the stored image bytes in. The `qa`
schema is one union for all splits (fields that do not apply are null), so every split of
the dataset shares one set of features.
"""

from __future__ import annotations

import json
from collections import defaultdict
from typing import Any

import datasets

from rsieve.compact.splits import (
    SPLIT_KINDS,
    canonical_reference,
    passed_text,
    split_kinds,
    split_name,
    target_variant,
)
from rsieve.schemas import TRACE_CHECKS, Outcome

__all__ = ["FEATURES", "SAMPLED_FEATURES", "SAMPLE_FIELDS", "assemble_rows", "features"]

_DECISION = {
    "protocol": datasets.Value("string"),
    "version": datasets.Value("string"),
    # The protocol's constants as JSON: with the references and options, what a recheck
    # needs to recompute the decision from the row alone (rsieve.dataset.recheck).
    "constants": datasets.Value("string"),
    "variant": datasets.Value("string"),
    "score": datasets.Value("float64"),
    "threshold": datasets.Value("float64"),
    "accepted": datasets.Value("bool"),
    # Training acceptance beside the benchmark's pass (rsieve.verify.TRAINING_RULES): the
    # rule, its constants as JSON, whether it accepted and at which variant. A near miss
    # has `accepted` true and `training_accepted` false.
    "training_rule": datasets.Value("string"),
    "training_constants": datasets.Value("string"),
    "training_accepted": datasets.Value("bool"),
    "training_variant": datasets.Value("string"),
}
_JUDGE = {
    "verdict": datasets.Value("string"),
    "cause": datasets.Value("string"),
    "model": datasets.Value("string"),
    "template_sha256": datasets.Value("string"),
    "prompt_sha256": datasets.Value("string"),
    "raw_output": datasets.Value("string"),
}
FEATURES = datasets.Features(
    {
        "image": datasets.Image(),
        "qa": datasets.List(
            {
                "id": datasets.Value("string"),
                "question": datasets.Value("string"),
                "answer": datasets.Value("string"),
                "full_answer": datasets.Value("string"),
                "org_answer": datasets.Value("string"),
                "references": datasets.List(datasets.Value("string")),
                "options": datasets.List(
                    {"label": datasets.Value("string"), "text": datasets.Value("string")}
                ),
                "protocol": datasets.Value("string"),
                "reasoning": datasets.Value("string"),
                "wrong_vlm": datasets.Value("string"),
                "reason": datasets.Value("string"),
                "promoted_by": datasets.Value("string"),
                "model": datasets.Value("string"),
                "verification": _DECISION,
                "judge": _JUDGE,
                # The trace gate (rsieve.compact.traces) on an accepted answer's reasoning:
                # each check true when the trace passed it, null when it was not run (no
                # reasoning, a check turned off, `length` in a family too small to have a
                # band); the reasons of the failed ones. An entry whose trace failed one
                # is in `_RS_nothink` only.
                "trace_checks": {name: datasets.Value("bool") for name in TRACE_CHECKS},
                "trace_reasons": datasets.List(datasets.Value("string")),
                # The blind pass (rsieve.judge.blind): true when the model, asked again
                # without the image, still answered right; false when it did not; null
                # when no blind pass ran (not asked for, not accepted, or its request
                # failed).
                "answerable_without_image": datasets.Value("bool"),
            }
        ),
        "clean_meta": {
            "run": datasets.Value("string"),
            "pool": datasets.Value("string"),
            "policy": datasets.Value("string"),
            # Per item of the row: where it came from and what the cleaner decided.
            "provenance": datasets.List(
                {
                    "id": datasets.Value("string"),
                    "line": datasets.Value("int64"),
                    "source": datasets.Value("string"),
                    "check": datasets.Value("string"),
                    # The task-purity rule that kept it (docs/cleaning.md).
                    "purity": datasets.Value("string"),
                    # Multiple-choice normalisation as JSON (status, pattern and, when the
                    # question or reference was rewritten, the originals and the options).
                    "mcq": datasets.Value("string"),
                }
            ),
        },
        "image_sha256": datasets.Value("string"),
    }
)


# Best-of-n runs (samples > 1; rsieve.compact.settle) add to every qa entry: which sample it is
# and its seed, the item's pass rate (`passed` of `samples` answered, and the ratio) and,
# for a rejected item, every distinct wrong answer (`wrong_vlm` keeps the settled one's).
# A run with one sample per item writes FEATURES exactly, so its rows are as they were.
SAMPLE_FIELDS = {
    "sample": datasets.Value("int64"),
    "seed": datasets.Value("int64"),
    "passed": datasets.Value("int64"),
    "samples": datasets.Value("int64"),
    "pass_rate": datasets.Value("float64"),
    "wrong_answers": datasets.List(datasets.Value("string")),
}
SAMPLED_FEATURES = datasets.Features(
    {
        **FEATURES,
        "qa": datasets.List({**FEATURES["qa"].feature, **SAMPLE_FIELDS}),
    }
)


def features(sampled: bool) -> datasets.Features:
    """The rows' features: SAMPLED_FEATURES for a best-of-n run, else FEATURES."""
    return SAMPLED_FEATURES if sampled else FEATURES


def _qa(outcome: Outcome, kind: str) -> dict[str, Any]:
    gen = outcome.generation
    item = gen.item
    decision = None
    if outcome.decision:
        training = outcome.decision.training
        decision = outcome.decision.model_dump(exclude={"constants", "training"}) | {
            "constants": json.dumps(outcome.decision.constants, sort_keys=True),
            "training_rule": training.rule if training else None,
            "training_constants": (
                json.dumps(training.constants, sort_keys=True) if training else None
            ),
            "training_accepted": training.accepted if training else None,
            "training_variant": training.variant if training else None,
        }
    # The verdict's token counts, and whether its reply was reused from the verdict cache,
    # are the run report's (cost), not the row's.
    judge = (
        outcome.verdict.model_dump(exclude={"prompt", "input_tokens", "output_tokens", "reused"})
        if outcome.verdict
        else None
    )
    entry: dict[str, Any] = {
        "id": item.id,
        "question": item.question,
        "answer": None,
        "full_answer": None,
        "org_answer": None,
        "references": list(item.references),
        "options": [{"label": k, "text": v} for k, v in (item.options or {}).items()] or None,
        "protocol": item.protocol,
        "reasoning": None,
        "wrong_vlm": None,
        "reason": None,
        "promoted_by": outcome.promoted_by,
        "model": gen.model,
        "verification": decision,
        "judge": judge,
        "trace_checks": None,
        "trace_reasons": None,
        "answerable_without_image": gen.blind.answerable if gen.blind else None,
    }
    if outcome.trace is not None and kind != "rejected":
        entry["trace_checks"] = {name: outcome.trace.checks.get(name) for name in TRACE_CHECKS}
        entry["trace_reasons"] = list(outcome.trace.reasons)
    reference = canonical_reference(item.references)
    if kind == "rejected":
        entry.update(
            answer=reference,
            wrong_vlm=gen.answer if gen.answer is not None else gen.raw_output,
            reason=outcome.reason,
        )
    else:
        whole = gen.answer or ""
        verified = outcome.decision if outcome.promoted_by == "verifier" else None
        variant = target_variant(verified) if verified else None
        entry.update(answer=passed_text(whole, variant), full_answer=whole, org_answer=reference)
        if kind == "RS_think":
            entry["reasoning"] = gen.reasoning
    return entry


def _sample_fields(outcome: Outcome, head: Outcome, kind: str) -> dict[str, Any]:
    """The best-of-n fields of one qa entry: `outcome` is the sample the entry holds,
    `head` the item's settled outcome (its `samples` record)."""
    record = head.samples
    assert record is not None
    gen = outcome.generation
    return {
        "sample": gen.sample,
        "seed": gen.seed,
        "passed": len(record.passed),
        "samples": record.n,
        "pass_rate": len(record.passed) / record.n,
        "wrong_answers": list(record.wrong) if kind == "rejected" else None,
    }


def _entries(outcome: Outcome, kind: str) -> list[dict[str, Any]]:
    """The qa entries of an item in a split: one, or with best-of-n one per kept sample
    (accepted splits; the settled sample first, then the others in sample order)."""
    if outcome.samples is None:
        return [_qa(outcome, kind)]
    if kind == "rejected":
        return [_qa(outcome, kind) | _sample_fields(outcome, outcome, kind)]
    return [
        _qa(o, kind) | _sample_fields(o, outcome, kind)
        for o in _kept(outcome)
        if kind in split_kinds(o)
    ]


def _kept(outcome: Outcome) -> list[Outcome]:
    """An accepted item's kept samples: the settled one first, then the others kept."""
    if outcome.samples is None:
        return [outcome]
    others = {o.generation.sample: o for o in outcome.samples.others}
    return [outcome] + [others[k] for k in outcome.samples.kept[1:] if k in others]


def _item_kinds(outcome: Outcome) -> list[str]:
    """The splits an item's qa entries go to: its kept samples' (split_kinds), together."""
    if outcome.place != "accepted":
        return ["rejected"]
    kinds = {k for o in _kept(outcome) for k in split_kinds(o)}
    return [k for k in SPLIT_KINDS if k in kinds]


def _json_or_none(value: Any) -> str | None:
    return None if value is None else json.dumps(value, sort_keys=True, ensure_ascii=False)


def _clean_meta(outcomes: list[Outcome], run: str) -> dict[str, Any]:
    first = outcomes[0].generation.item.clean_meta
    return {
        "run": run,
        "pool": first["pool"],
        "policy": json.dumps(first["policy"], sort_keys=True),
        "provenance": [
            {
                "id": o.generation.item.id,
                "line": o.generation.item.line,
                "source": json.dumps(
                    o.generation.item.clean_meta["source"], sort_keys=True, ensure_ascii=False
                ),
                "check": o.generation.item.clean_meta["provenance"],
                "purity": o.generation.item.clean_meta.get("purity"),
                "mcq": _json_or_none(o.generation.item.clean_meta.get("mcq")),
            }
            for o in outcomes
        ],
    }


def assemble_rows(outcomes: list[Outcome], run: str = "") -> dict[str, list[dict[str, Any]]]:
    """Split name -> rows (without image bytes), deterministic order (first pool line)."""
    groups: dict[tuple[str, str], list[Outcome]] = defaultdict(list)
    for outcome in sorted(outcomes, key=lambda o: o.generation.item.line):
        family = outcome.generation.item.family
        for kind in _item_kinds(outcome):
            groups[(split_name(family, kind), outcome.generation.item.image_sha256)].append(outcome)
    splits: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for (split, sha), members in groups.items():
        kind = next(k for k in SPLIT_KINDS if split.endswith("_" + k))
        splits[split].append(
            {
                "image_sha256": sha,
                "qa": [entry for o in members for entry in _entries(o, kind)],
                "clean_meta": _clean_meta(members, run),
            }
        )
    return dict(sorted(splits.items()))
