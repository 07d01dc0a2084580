"""Where an outcome goes and what it trains on: the split names and kinds, the reference a
row shows, the form of an accepted answer that is its training target. Pure, and apart
from rsieve.compact.rows (the rows' schema) so that what decides them does not import
`datasets`: every service reads these, only the compactor writes rows."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence

from rsieve.schemas import Decision, Outcome
from rsieve.verify import variants

__all__ = [
    "SPLIT_KINDS",
    "canonical_reference",
    "passed_text",
    "split_kinds",
    "split_name",
    "target_variant",
]

SPLIT_KINDS = ("RS_think", "RS_nothink", "rejected")


def split_name(family: str, kind: str) -> str:
    """`<Family>_<kind>`, with characters `datasets` refuses in split names mapped to `_`."""
    return f"{re.sub(r'[^0-9A-Za-z_]', '_', family)}_{kind}"


def split_kinds(outcome: Outcome) -> tuple[str, ...]:
    """The splits an outcome's qa entry goes to. An accepted answer with no reasoning (the
    model wrote no think block: a checkpoint without a thinking mode, or one that skipped
    it) goes to `_RS_nothink` only: a `_RS_think` entry with empty reasoning would teach a
    model to answer in thinking mode without thinking (docs/models.md). So does one whose
    reasoning failed the trace gate (rsieve.compact.traces): the answer passed, the
    reasoning is unfit to train on; and, under blind_policy `nothink`, one the blind pass
    found answerable without its image (rsieve.judge.blind)."""
    if outcome.place != "accepted":
        return ("rejected",)
    if not (outcome.generation.reasoning or "").strip():
        return ("RS_nothink",)
    if outcome.trace is not None and not outcome.trace.passed:
        return ("RS_nothink",)
    blind = outcome.generation.blind
    if blind is not None and blind.answerable and blind.policy == "nothink":
        return ("RS_nothink",)
    return ("RS_think", "RS_nothink")


def canonical_reference(references: Sequence[str]) -> str:
    """The one reference a row shows as `answer` (rejected) or `org_answer` (accepted): the
    most frequent, ties to the first listed (VQA's ten annotators agree on the majority);
    the full list is the row's `references`."""
    counts = Counter(references)
    return max(references, key=lambda r: (counts[r], -references.index(r)))


def target_variant(decision: Decision) -> str | None:
    """The form an accepted answer is trained on: the first that training acceptance took
    (a form the benchmark also passes), else, for a decision from before training
    acceptance, the benchmark's."""
    training = decision.training
    return training.variant if training is not None else decision.variant


def passed_text(answer: str, variant: str | None) -> str:
    """The form of the answer that passed the verifier (rsieve.verify.variants: whole,
    first_line or first_paragraph): an accepted row's training target. No variant (a
    judge promotion: the judge read the whole answer): the whole answer, stripped."""
    forms = dict(variants(answer))
    return forms.get(variant or "whole", forms["whole"])
