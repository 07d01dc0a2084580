"""Preference data from a run's samples (`rsieve export RUN --format dpo|kto`): every sample
of every item, with the factory's own decision on it, as DPO pairs or KTO rows in TRL's
conversational vision format. Pure: settled outcomes (the judge stage's, each with its
`samples`) go in with the run's calibration and trace gate; rows and counts come out.

What a sample is to a pair (`sample_role`), in the factory's words:

- `chosen`: accepted by the verifier under the run's training rule (never a benchmark
  pass that training refuses), and, in `think` mode, a trace that passed the trace gate
  (the sample would be a `_RS_think` entry: `rsieve.compact.splits.split_kinds`); a judge
  promotion only with `chosen_include_judged`, and then only in a family whose judge
  cleared calibration.
- `refused`: scored and refused by the verifier, and nothing promoted it. A refused answer
  the judge called CORRECT or UNSURE is never a rejected side (it may be right in another
  form: a pair would teach against a right answer); `rejected_requires="judge_wrong"`
  keeps only answers the judge called WRONG.
- `format`: no scorable answer (truncated reasoning or answer, empty answer, a refusal, a
  repetition loop): paired with accepted samples in `<Family>_format_pairs`.
- `excluded`: anything else, with why (`EXCLUDED`).

Pairs are every chosen x refused of an item (the same prompt on both sides), less those
whose answers are the same under the item's protocol (`rsieve.compact.settle.same_answer`),
at most `max_pairs_per_item`, picked by a seeded draw per item (MMPR's recipe: InternVL's
reasoning data pipeline). Both sides of a pair are rendered alike: `think`,
`<think>\\n{reasoning}\\n</think>\\n\\n{answer}` (the SFT export's layout); `nothink`, the
answer alone. The chosen answer is the form that passed the verifier, as in the SFT
splits; the refused, the answer as the model wrote it.

`pass_rate` on every row is the share of the item's samples the verifier accepted under
the training rule: what `rsieve.rewards` scores 1.0 (judge promotions are not a reward's).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any, Literal

import datasets

from rsieve.compact.settle import same_answer
from rsieve.compact.splits import passed_text, split_kinds, split_name, target_variant
from rsieve.compact.traces import LengthBand, TraceLimits, gate_outcome
from rsieve.rewards import factory_accepts
from rsieve.schemas import Outcome

__all__ = [
    "EXCLUDED",
    "KTO_FEATURES",
    "MESSAGE",
    "PAIR_FEATURES",
    "Gate",
    "PairCounts",
    "PairRules",
    "chosen_answer",
    "item_pairs",
    "item_samples",
    "kto_rows",
    "pair_splits",
    "pass_rate",
    "prompt_messages",
    "sample_role",
    "sample_text",
]

Mode = Literal["think", "nothink"]
RejectedRule = Literal["not_promoted", "judge_wrong"]
Role = Literal["chosen", "refused", "format", "excluded"]

# Why a sample is on neither side (the export card counts each).
EXCLUDED: dict[str, str] = {
    "judge_correct": "refused by the verifier, but the judge called it CORRECT (promoted, "
    "held back or guarded): never a rejected side; a chosen one only with "
    "--chosen-include-judged in a calibrated family",
    "judge_unsure": "refused by the verifier; the judge said UNSURE",
    "not_judged_wrong": "refused by the verifier; --rejected-requires judge_wrong and the "
    "judge did not say WRONG",
    "trace_gate": "accepted, but its reasoning failed the trace gate (or it has none, or "
    "the blind pass found it answerable without the image): not a `think` target",
    "answerable_without_image": "right, but answerable without the image: the run drops it",
    "circular_inconsistent": "its item saw rotated options and was not right under each",
    "no_text": "no answer text to put on the rejected side of a `nothink` pair",
}

MESSAGE = datasets.List(
    {
        "role": datasets.Value("string"),
        # {"type": "image"} (text null) or {"type": "text", "text": ...}
        "content": datasets.List(
            {"type": datasets.Value("string"), "text": datasets.Value("string")}
        ),
    }
)

_TRACE = {
    "id": datasets.Value("string"),
    "family": datasets.Value("string"),
    "protocol": datasets.Value("string"),
    "references": datasets.List(datasets.Value("string")),
    "pass_rate": datasets.Value("float64"),
    "samples": datasets.Value("int64"),
    "run": datasets.Value("string"),
}

PAIR_FEATURES = datasets.Features(
    {
        "images": datasets.List(datasets.Image()),
        "prompt": MESSAGE,
        "chosen": MESSAGE,
        "rejected": MESSAGE,
        **_TRACE,
        "chosen_sample": datasets.Value("int64"),
        "rejected_sample": datasets.Value("int64"),
        "chosen_answer": datasets.Value("string"),
        "rejected_answer": datasets.Value("string"),
        # refused (a wrong answer) or the failure of a format pair's rejected side
        "rejected_reason": datasets.Value("string"),
    }
)

KTO_FEATURES = datasets.Features(
    {
        "images": datasets.List(datasets.Image()),
        "prompt": MESSAGE,
        "completion": MESSAGE,
        "label": datasets.Value("bool"),
        **_TRACE,
        "sample": datasets.Value("int64"),
        "answer": datasets.Value("string"),
        # chosen, refused or format (sample_role)
        "kind": datasets.Value("string"),
    }
)


@dataclass(frozen=True)
class PairRules:
    """How pairs are made: the export's options, recorded on its card."""

    mode: Mode = "think"
    chosen_include_judged: bool = False
    rejected_requires: RejectedRule = "not_promoted"
    max_pairs_per_item: int = 15
    seed: int = 0

    def __post_init__(self) -> None:
        if self.mode not in ("think", "nothink"):
            raise ValueError(f"mode must be think or nothink, not {self.mode!r}")
        if self.rejected_requires not in ("not_promoted", "judge_wrong"):
            raise ValueError(
                f"rejected_requires must be not_promoted or judge_wrong, not "
                f"{self.rejected_requires!r}"
            )
        if self.max_pairs_per_item < 1:
            raise ValueError("max_pairs_per_item must be at least 1")


@dataclass
class PairCounts:
    """One family's figures for the export card."""

    items: int = 0
    items_with_pairs: int = 0
    pairs: int = 0
    format_pairs: int = 0
    dropped_same_answer: int = 0
    dropped_over_cap: int = 0
    no_chosen: int = 0  # items with no chosen sample
    no_rejected: int = 0  # items with a chosen sample and no refused one
    samples: dict[str, int] = field(default_factory=dict)  # role or excluded reason -> n

    def add(self, other: PairCounts) -> None:
        for f in fields(self):
            if f.name != "samples":
                setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))
        for k, v in other.samples.items():
            self.samples[k] = self.samples.get(k, 0) + v


def item_samples(outcome: Outcome) -> list[Outcome]:
    """Every sample of a settled item, in sample order (one, without best-of-n)."""
    if outcome.samples is None:
        return [outcome]
    return sorted([outcome, *outcome.samples.others], key=lambda o: o.generation.sample or 0)


def pass_rate(samples: list[Outcome]) -> float:
    """The share of an item's samples the verifier accepted under the training rule."""
    return sum(factory_accepts(o) for o in samples) / len(samples)


def sample_role(
    sample: Outcome, rules: PairRules, *, trusted: bool, circular_failed: bool = False
) -> tuple[Role, str | None]:
    """What one (trace-gated: rsieve.compact.traces.gate_outcome) sample is to a pair, and
    for `format` its failure, for `excluded` why (EXCLUDED). `trusted`: its family's judge
    cleared calibration; `circular_failed`: its item was rejected circular_inconsistent."""
    gen = sample.generation
    if gen.failure is not None or gen.answer is None:
        if rules.mode == "nothink" and not (gen.answer or "").strip():
            return "excluded", "no_text"
        return "format", gen.failure or "empty_answer"
    verdict = sample.verdict.verdict if sample.verdict is not None else None
    kind = "RS_think" if rules.mode == "think" else "RS_nothink"
    if sample.promoted_by == "verifier":
        if circular_failed:
            return "excluded", "circular_inconsistent"
        return ("chosen", None) if kind in split_kinds(sample) else ("excluded", "trace_gate")
    if factory_accepts(sample):
        # Right by the verifier, placed elsewhere for a reason that is not the answer's.
        return "excluded", sample.reason or "answerable_without_image"
    if verdict == "CORRECT":
        if sample.promoted_by == "judge" and rules.chosen_include_judged and trusted:
            if circular_failed:
                return "excluded", "circular_inconsistent"
            return ("chosen", None) if kind in split_kinds(sample) else ("excluded", "trace_gate")
        return "excluded", "judge_correct"
    if verdict == "UNSURE":
        return "excluded", "judge_unsure"
    if rules.rejected_requires == "judge_wrong" and verdict != "WRONG":
        return "excluded", "not_judged_wrong"
    return "refused", sample.reason or "refused"


def _think(reasoning: str | None, answer: str) -> str:
    return f"<think>\n{reasoning.strip()}\n</think>\n\n{answer}" if reasoning else answer


def chosen_answer(sample: Outcome) -> str:
    """The form of an accepted sample's answer that passed (the SFT splits' target)."""
    decision = sample.decision if sample.promoted_by == "verifier" else None
    return passed_text(
        sample.generation.answer or "", target_variant(decision) if decision else None
    )


def sample_text(sample: Outcome, role: Role, mode: Mode) -> str:
    """The assistant turn a sample is on its side of a pair: chosen, the answer that passed;
    refused, the answer as written; format, what the model wrote (`think`: the whole raw
    output, a cut-off think block as it was cut; `nothink`: the answer text)."""
    gen = sample.generation
    if role == "chosen":
        answer = chosen_answer(sample)
    elif role == "format":
        if mode == "think":
            return gen.raw_output.strip()
        return (gen.answer or "").strip()
    else:
        answer = gen.answer or ""
    return _think(gen.reasoning, answer) if mode == "think" else answer


def prompt_messages(question: str) -> list[dict[str, Any]]:
    """The user turn: the image placeholder, then the question as the model received it."""
    return [
        {
            "role": "user",
            "content": [{"type": "image", "text": None}, {"type": "text", "text": question}],
        }
    ]


def _assistant(text: str) -> list[dict[str, Any]]:
    return [{"role": "assistant", "content": [{"type": "text", "text": text}]}]


def _trace(head: Outcome, samples: list[Outcome], run: str) -> dict[str, Any]:
    item = head.generation.item
    return {
        "id": item.id,
        "family": item.family,
        "protocol": item.protocol,
        "references": list(item.references),
        "pass_rate": pass_rate(samples),
        "samples": len(samples),
        "run": run,
    }


@dataclass(frozen=True)
class Gate:
    """The run's trace gate as its report records it (None: the run had none)."""

    limits: TraceLimits | None
    bands: Mapping[str, LengthBand]

    @classmethod
    def of_report(cls, trace_gate: Mapping[str, Any] | None) -> Gate:
        if not trace_gate:
            return cls(None, {})
        bands = {f: LengthBand(**b) for f, b in (trace_gate.get("length_bands") or {}).items()}
        return cls(TraceLimits.of_gate(trace_gate), bands)

    def __call__(self, outcome: Outcome) -> Outcome:
        if self.limits is None:
            return outcome
        return gate_outcome(outcome, self.limits, self.bands)


def _roles(
    head: Outcome, rules: PairRules, trusted: Callable[[str], bool], gate: Gate
) -> list[tuple[Outcome, Role, str | None]]:
    gated = item_samples(gate(head))
    circular = head.place == "rejected" and head.reason == "circular_inconsistent"
    ok = trusted(head.generation.item.family)
    return [(s, *sample_role(s, rules, trusted=ok, circular_failed=circular)) for s in gated]


def _capped(pairs: list[Any], rules: PairRules, item_id: str) -> list[Any]:
    if len(pairs) <= rules.max_pairs_per_item:
        return pairs
    # Seeded by the item, so a re-export (or one item's pairs alone) draws the same pairs.
    draw = random.Random(f"{rules.seed}:{item_id}")
    chosen = sorted(draw.sample(range(len(pairs)), rules.max_pairs_per_item))
    return [pairs[i] for i in chosen]


def item_pairs(
    head: Outcome,
    image: Any,
    rules: PairRules,
    *,
    trusted: Callable[[str], bool],
    gate: Gate,
    run: str = "",
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], PairCounts]:
    """One settled item's pair rows (`<Family>_pairs`), format pair rows
    (`<Family>_format_pairs`) and counts. `image`: the row value of its image."""
    roles = _roles(head, rules, trusted, gate)
    samples = [s for s, _, _ in roles]
    counts = PairCounts(items=1)
    for _, role, why in roles:
        key = why if role == "excluded" and why else role
        counts.samples[key] = counts.samples.get(key, 0) + 1
    chosen = [s for s, role, _ in roles if role == "chosen"]
    refused = [(s, why) for s, role, why in roles if role == "refused"]
    failed = [(s, why) for s, role, why in roles if role == "format"]
    if not chosen:
        counts.no_chosen = 1
        return [], [], counts
    if not refused:
        counts.no_rejected = 1
    item = head.generation.item
    options = item.options

    def same(c: Outcome, r: Outcome) -> bool:
        return same_answer(item.protocol, chosen_answer(c), r.generation.answer or "", options)

    pairs: list[tuple[Outcome, Outcome, str | None]] = []
    for c in chosen:
        for r, why in refused:
            if c.generation.item.question != r.generation.item.question:
                continue  # rotated options: not the same prompt
            if same(c, r):
                counts.dropped_same_answer += 1
                continue
            pairs.append((c, r, why))
    format_pairs = [
        (c, r, why)
        for c in chosen
        for r, why in failed
        if c.generation.item.question == r.generation.item.question
    ]
    kept = _capped(pairs, rules, item.id)
    kept_format = _capped(format_pairs, rules, item.id)
    counts.dropped_over_cap = len(pairs) - len(kept) + len(format_pairs) - len(kept_format)
    trace = _trace(head, samples, run)

    def row(c: Outcome, r: Outcome, why: str | None, role: Role) -> dict[str, Any]:
        return {
            "images": [image],
            "prompt": prompt_messages(c.generation.item.question),
            "chosen": _assistant(sample_text(c, "chosen", rules.mode)),
            "rejected": _assistant(sample_text(r, role, rules.mode)),
            **trace,
            "chosen_sample": c.generation.sample or 0,
            "rejected_sample": r.generation.sample or 0,
            "chosen_answer": chosen_answer(c),
            "rejected_answer": r.generation.answer,
            "rejected_reason": why,
        }

    rows = [row(c, r, why, "refused") for c, r, why in kept]
    format_rows = [row(c, r, why, "format") for c, r, why in kept_format]
    counts.pairs, counts.format_pairs = len(rows), len(format_rows)
    counts.items_with_pairs = int(bool(rows))
    return rows, format_rows, counts


def kto_rows(
    head: Outcome,
    image: Any,
    rules: PairRules,
    *,
    trusted: Callable[[str], bool],
    gate: Gate,
    run: str = "",
) -> tuple[list[dict[str, Any]], PairCounts]:
    """One settled item's KTO rows: one per chosen (label true), refused or format (label
    false) sample, by the same rules as the pairs; excluded samples make no row."""
    roles = _roles(head, rules, trusted, gate)
    samples = [s for s, _, _ in roles]
    counts = PairCounts(items=1)
    trace = _trace(head, samples, run)
    rows = []
    for s, role, why in roles:
        key = why if role == "excluded" and why else role
        counts.samples[key] = counts.samples.get(key, 0) + 1
        if role == "excluded":
            continue
        rows.append(
            {
                "images": [image],
                "prompt": prompt_messages(s.generation.item.question),
                "completion": _assistant(sample_text(s, role, rules.mode)),
                "label": role == "chosen",
                **trace,
                "sample": s.generation.sample or 0,
                "answer": chosen_answer(s) if role == "chosen" else s.generation.answer,
                "kind": role,
            }
        )
    if not any(r["label"] for r in rows):
        counts.no_chosen = 1
    elif all(r["label"] for r in rows):
        counts.no_rejected = 1
    return rows, counts


def pair_splits(family: str) -> tuple[str, str]:
    """The pair and format-pair split names of a family."""
    return split_name(family, "pairs"), split_name(family, "format_pairs")
