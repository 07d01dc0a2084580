"""Best-of-n, the settling side (docs/sampling.md): several answers per question, each
verified, settled into one place per item with its pass rate. Pure.

- `to_judge`: which rejected samples the judge sees: only those of items no sample of
  which passed the verifier, the first `judge_samples` of each; with `judge_pair_rejections`,
  also one per distinct refused answer of each item that passed (`refused_of_passed`).
- `settle`: the samples of one item (after the verifier and the judge) as the item's one
  `Outcome`: accepted when any sample was accepted (the first accepted, with the others
  kept as `keep` says), else rejected (its first judged sample); `Outcome.samples` records
  every sample, which were accepted and which were kept.

With one sample (the default) `settle` returns the one outcome as it was. rsieve.generate.draws
says which samples are asked.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from typing import Any, Literal

from rsieve.compact.splits import passed_text, target_variant
from rsieve.judge.cascade import needs_judge
from rsieve.schemas import Outcome, Quarantined, Samples
from rsieve.verify import canonical, verify

__all__ = [
    "answer_form",
    "dataset_conflict",
    "in_window",
    "kept_samples",
    "pass_rate",
    "same_answer",
    "samples_saved",
    "sampling_summary",
    "settle",
    "settle_all",
    "to_judge",
]

Keep = Literal["first", "distinct"]


def to_judge(
    verified: Sequence[Outcome], judge_samples: int, pair_rejections: bool = False
) -> list[int]:
    """Indexes into `verified` (every sample of a shard, items' samples together) of the
    rejected samples the judge is asked about: those pending a verdict, of items none of
    whose samples the verifier accepted, the first `judge_samples` per item; with
    `pair_rejections`, also the first sample of each distinct refused answer of every item
    the verifier accepted (`refused_of_passed`)."""
    accepted_lines = {o.generation.item.line for o in verified if o.place == "accepted"}
    leaders = set(refused_of_passed(verified).values()) if pair_rejections else set()
    asked: dict[int, int] = {}
    chosen: list[int] = []
    for i, o in enumerate(verified):
        line = o.generation.item.line
        if i in leaders:
            chosen.append(i)
            continue
        if not needs_judge(o) or line in accepted_lines:
            continue
        if o.generation.sample is not None and asked.get(line, 0) >= judge_samples:
            continue
        asked[line] = asked.get(line, 0) + 1
        chosen.append(i)
    return chosen


def answer_form(outcome: Outcome) -> tuple[str, str]:
    """What makes two refused answers of an item the same one for the judge: the answer's
    normal form under the item's protocol, else (no form) its text with spacing folded."""
    item, answer = outcome.generation.item, outcome.generation.answer or ""
    form = canonical(item.protocol, answer, item.options)
    # Tagged, so that a text without a form never equals another answer's form.
    return ("form", form) if form is not None else ("text", _folded(answer))


def refused_of_passed(verified: Sequence[Outcome]) -> dict[int, int]:
    """Every sample pending a verdict (`needs_judge`) of an item some sample of which the
    verifier accepted, by index into `verified`, mapped to the index of the first such
    sample of the item with the same answer (`answer_form`): the one the judge is asked
    about, whose verdict the others share."""
    accepted_lines = {o.generation.item.line for o in verified if o.place == "accepted"}
    first: dict[tuple[int, tuple[str, str]], int] = {}
    out: dict[int, int] = {}
    for i, o in enumerate(verified):
        line = o.generation.item.line
        if line in accepted_lines and needs_judge(o):
            out[i] = first.setdefault((line, answer_form(o)), i)
    return out


def _folded(text: str | None) -> str:
    return re.sub(r"\s+", " ", text or "").strip()


def same_answer(protocol: str, a: str, b: str, options: dict[str, str] | None = None) -> bool:
    """Whether two answers are the same answer under a protocol: the same normal form
    (rsieve.verify.canonical); for a protocol without one, each matched to the other as
    its reference."""
    fa, fb = canonical(protocol, a, options), canonical(protocol, b, options)
    if fa is not None and fb is not None:
        return fa == fb
    extra: dict[str, Any] = {"options": options} if options else {}
    return verify(protocol, a, [b], **extra).accepted and verify(protocol, b, [a], **extra).accepted


def _same_answer(a: Outcome, b: Outcome) -> bool:
    """Whether two accepted answers, in the forms that passed, are the same answer."""
    item = a.generation.item

    def text(o: Outcome) -> str:
        decision = o.decision if o.promoted_by == "verifier" else None
        return passed_text(
            o.generation.answer or "", target_variant(decision) if decision else None
        )

    return same_answer(item.protocol, text(a), text(b), item.options)


def kept_samples(accepted: Sequence[Outcome], keep: Keep, max_kept: int) -> list[Outcome]:
    """The accepted samples an item keeps, in sample order: `first`, the first; `distinct`,
    each whose answer the protocol does not match to a kept one's and whose reasoning
    (spacing folded) differs from every kept one's; at most `max_kept`."""
    if not accepted:
        return []
    if keep == "first":
        return [accepted[0]]
    kept: list[Outcome] = []
    for o in accepted:
        if len(kept) >= max_kept:
            break
        reasoning = _folded(o.generation.reasoning)
        if any(_same_answer(o, k) or _folded(k.generation.reasoning) == reasoning for k in kept):
            continue
        kept.append(o)
    return kept


def _wrong(o: Outcome) -> str:
    gen = o.generation
    return gen.answer if gen.answer is not None else gen.raw_output


def settle(
    samples: Sequence[Outcome], keep: Keep = "first", max_kept: int = 1, circular: bool = False
) -> Outcome:
    """The samples of one item (sample order) as the item's one Outcome. `circular`: the
    samples saw the options rotated (`circular_items`); the item is accepted only when
    every sample was, and otherwise rejected `circular_inconsistent` (a lucky guess is not
    training data)."""
    if len(samples) == 1 and samples[0].generation.sample is None:
        return samples[0]  # one sample: the card's process, untouched
    ordered = sorted(samples, key=lambda o: o.generation.sample or 0)
    accepted = [o for o in ordered if o.place == "accepted"]
    if circular and accepted and len(accepted) < len(ordered):
        head = next(o for o in ordered if o.place != "accepted")
        head = head.model_copy(
            update={"place": "rejected", "reason": "circular_inconsistent", "promoted_by": None}
        )
        return head.model_copy(update={"samples": _record(ordered, head, accepted, [])})
    # A refused sample the judge promoted on an item the verifier passed (judge_pair_rejections)
    # counts in the pass rate only: the item's answer stays the verifier's, and so its place.
    by_verifier = [o for o in accepted if o.promoted_by == "verifier"]
    kept = kept_samples(by_verifier or accepted, keep, max_kept)
    if kept:
        head = kept[0]
    else:  # rejected: the first sample the judge saw, else the first sample
        head = next((o for o in ordered if o.verdict is not None), ordered[0])
    return head.model_copy(update={"samples": _record(ordered, head, accepted, kept)})


def _record(
    ordered: Sequence[Outcome], head: Outcome, accepted: Sequence[Outcome], kept: Sequence[Outcome]
) -> Samples:
    wrong: list[str] = []
    for o in ordered:
        if o.place == "rejected" and _wrong(o) not in wrong:
            wrong.append(_wrong(o))
    return Samples(
        n=len(ordered),
        passed=[o.generation.sample or 0 for o in accepted],
        kept=[o.generation.sample or 0 for o in kept],
        wrong=wrong,
        others=[o for o in ordered if o.generation.sample != head.generation.sample],
    )


def in_window(
    outcomes: Sequence[Outcome], window: Sequence[float]
) -> tuple[list[Outcome], list[Quarantined]]:
    """Settled outcomes split by a pass-rate window [low, high] (empty: all kept): an
    accepted item whose pass rate lies outside is quarantined `pass_rate_window`; rejected
    items (none accepted) stay in the rejected split, as without a window."""
    if not window:
        return list(outcomes), []
    low, high = window
    kept: list[Outcome] = []
    out: list[Quarantined] = []
    for o in outcomes:
        passed, n = pass_rate(o)
        if o.place == "accepted" and not low <= passed / n <= high:
            item = o.generation.item
            out.append(
                Quarantined(
                    id=item.id,
                    line=item.line,
                    family=item.family,
                    stage="judge",
                    reason="pass_rate_window",
                    detail=f"{passed}/{n} accepted, outside [{low}, {high}]",
                )
            )
        else:
            kept.append(o)
    return kept, out


def settle_all(
    outcomes: Sequence[Outcome], keep: Keep = "first", max_kept: int = 1, circular: bool = False
) -> list[Outcome]:
    """A shard's sample outcomes settled item by item (`settle`), in the order the items
    first appear: one outcome per item."""
    by_line: dict[int, list[Outcome]] = {}
    for o in outcomes:
        by_line.setdefault(o.generation.item.line, []).append(o)
    return [settle(group, keep, max_kept, circular) for group in by_line.values()]


def dataset_conflict(manifest: dict[str, object] | None, samples: int) -> str | None:
    """Why a run cannot join a dataset (None when it can): a dataset's rows have one schema,
    with the best-of-n fields (its runs asked several samples) or without."""
    if manifest is None or bool(manifest.get("sampled")) == (samples > 1):
        return None
    has = "with" if manifest.get("sampled") else "without"
    return (
        f"dataset {manifest.get('dataset')} holds rows {has} the best-of-n fields; a run "
        f"with samples={samples} goes to another dataset"
    )


def pass_rate(outcome: Outcome) -> tuple[int, int]:
    """(samples accepted, samples answered) of an item's settled outcome; (1, 1) or (0, 1)
    with one sample."""
    if outcome.samples is None:
        return (1 if outcome.place == "accepted" else 0), 1
    return len(outcome.samples.passed), outcome.samples.n


def sampling_summary(outcomes: Sequence[Outcome]) -> dict[str, dict[str, Any]]:
    """Per family, for a best-of-n run (empty otherwise): items settled, samples
    answered, the pass-rate histogram (`"k/n"` -> items), and the yield: items accepted
    at n, and at 1 (sample 0 accepted; the judge saw sample 0 only when no sample passed
    the verifier, so this is a lower bound of what one sample would have yielded)."""
    counts: dict[str, Counter[str]] = {}
    histograms: dict[str, Counter[tuple[int, int]]] = {}
    drawn: dict[str, Counter[int]] = {}
    for o in outcomes:
        if o.samples is None:
            continue
        family = o.generation.item.family
        passed, n = pass_rate(o)
        c = counts.setdefault(family, Counter())
        c["items"] += 1
        c["samples"] += n
        c["accepted_at_n"] += o.place == "accepted"
        c["accepted_at_1"] += 0 in o.samples.passed
        histograms.setdefault(family, Counter())[(passed, n)] += 1
        drawn.setdefault(family, Counter())[n] += 1
        for sample in (o, *o.samples.others):
            tokens = sample.generation.output_tokens
            if tokens is not None:
                c["output_tokens"] += tokens
                c["samples_with_tokens"] += 1
    return {
        family: {
            "items": c["items"],
            "samples": c["samples"],
            "pass_histogram": {f"{k}/{n}": v for (k, n), v in sorted(histograms[family].items())},
            # Adaptive best-of-n (rsieve.generate.adaptive): samples answered per item.
            "drawn_histogram": {str(n): v for n, v in sorted(drawn[family].items())},
            "accepted_at_n": c["accepted_at_n"],
            "accepted_at_1": c["accepted_at_1"],
            "output_tokens": c["output_tokens"],
            "samples_with_tokens": c["samples_with_tokens"],
        }
        for family, c in sorted(counts.items())
    }


def samples_saved(figures: dict[str, Any], samples: int) -> dict[str, Any]:
    """A family's `sampling_summary` figures with what adaptive stopping saved against
    drawing every one of `samples` per item: the samples not drawn, and the tokens they
    would have cost at the family's mean output tokens per drawn sample (an estimate;
    None when no sample reported its tokens)."""
    not_drawn = max(0, figures["items"] * samples - figures["samples"])
    known = figures.get("samples_with_tokens") or 0
    mean = figures.get("output_tokens", 0) / known if known else None
    return figures | {
        "samples_max": samples,
        "samples_not_drawn": not_drawn,
        "tokens_saved_estimate": round(not_drawn * mean) if mean is not None else None,
    }
