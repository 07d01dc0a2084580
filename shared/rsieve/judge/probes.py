"""What judge calibration asks, as pure functions (docs/judge.md): which accepted items
are probed, and the known-wrong candidates built from them. rsieve.judge.calibration
reads what the judge answered.

- **Sensitivity (agreement).** The judge grades a deterministic sample of answers the
  string verifier accepted; agreement is the share it calls CORRECT.
- **Specificity (false promotion).** The judge grades known-wrong candidates built from the
  same sampled items: another item's reference, the reference with one digit changed, a
  swapped option letter, the reference truncated, a published "master key" (":",
  "Thought process:" ...), and the near misses of the item's own protocol: one letter of
  the reference changed, two adjacent digits swapped (a date's 2021 as 2012), a number 3%
  off, each kept only where the benchmark's scorer passes it (ANLS, relaxed accuracy), so
  a judge that waves near misses through is caught. A candidate is only a probe if the
  family's training acceptance refuses it (rsieve.verify.TRAINING_RULES), so it is wrong
  by the family's rule.

The sample is a bottom-k sample by a hash of the item id: each shard probes the `size`
lowest-ranked eligible accepted items per family, and `summarise` keeps the `size`
lowest-ranked per family over all shards, which is exactly the run-wide bottom-k (a
uniform sample that does not depend on how the pool was sharded). An item is eligible when
its rank is below its family's rate (`calibration_rates`): about `CALIBRATION_OVERSAMPLING`
times `size` over the family's item count known when the pool was planned, so the run
probes about that many items per family whatever the number of shards, instead of `size`
per shard.
"""

from __future__ import annotations

import hashlib
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from decimal import ROUND_HALF_UP, Decimal, InvalidOperation
from typing import Literal

from pydantic import BaseModel, ConfigDict

from rsieve.judge.cascade import DEFAULT_POLICY
from rsieve.judge.verdicts import build_judge_prompt
from rsieve.schemas import Decision, Outcome
from rsieve.verify import TrainingPolicy, verify

__all__ = [
    "CALIBRATION_OVERSAMPLING",
    "MASTER_KEYS",
    "NEAR_MISS_KINDS",
    "NEAR_MISS_NUMBER_OFF",
    "SAMPLING_VERSION",
    "WRONG_KINDS",
    "Probe",
    "ProbeKind",
    "calibration_probes",
    "calibration_rates",
    "known_wrong",
    "probe_prompt",
    "sample_for_calibration",
    "sample_rank",
]
SAMPLING_VERSION = "calibration/1"
# Known-wrong candidates that the benchmark's scorer would pass: probed only where it does.
NEAR_MISS_KINDS = ("letter_changed", "digits_swapped", "number_off")
# How far off a near-miss number is: inside relaxed accuracy's 5%, outside any rounding.
NEAR_MISS_NUMBER_OFF = Decimal("1.03")
WRONG_KINDS = (
    "other_reference",
    "digit_changed",
    "option_swapped",
    "truncated",
    "master_key",
    *NEAR_MISS_KINDS,
)
# Published "master key" answers that fool LLM judges (Zhao et al. 2025, "One Token to
# Fool LLM-as-a-Judge"): no content, only a lead-in.
MASTER_KEYS = (":", "Thought process:", "Solution", "Let's solve this problem step by step.")
# Eligible items per family, run-wide, as a multiple of the calibration size. Above 1
# because the rate is set from the family's items when the pool is planned, and only the
# verifier-accepted ones among them can be sampled: 1.5 still gives the full `size` when
# about two thirds are accepted. Not 2: the eligible count is binomial around 1.5 x size,
# so the items probed stay under 2 x size but for a chance of about 1 in 1,000 at size 60
# (1 in 75 at size 30, 1 in 12 at size 10), whatever the sharding.
CALIBRATION_OVERSAMPLING = 1.5


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


ProbeKind = Literal[
    "agreement",
    "other_reference",
    "digit_changed",
    "option_swapped",
    "truncated",
    "master_key",
    "letter_changed",
    "digits_swapped",
    "number_off",
]


class Probe(_Model):
    """One calibration question for the judge: a candidate whose right verdict is known."""

    kind: ProbeKind
    expected: Literal["CORRECT", "WRONG"]
    item_id: str
    family: str
    protocol: str
    rank: float
    question: str
    references: list[str]
    candidate: str
    # other_reference: the item whose reference was borrowed.
    source_item_id: str | None = None


def sample_rank(item_id: str) -> float:
    """The item's place in the calibration order: uniform in [0, 1), fixed by its id."""
    digest = hashlib.sha256(f"{SAMPLING_VERSION}\0{item_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def calibration_rates(
    family_items: Mapping[str, int],
    *,
    size: int,
    rate: float = 1.0,
    oversampling: float = CALIBRATION_OVERSAMPLING,
) -> dict[str, float]:
    """Each family's eligible rate: min(`rate`, `oversampling` x `size` / its items), from
    the item counts known when the pool was planned (`family_items`). The rank-based
    sample then probes about `oversampling` x `size` of the family's accepted items
    run-wide, whatever the sharding; a family of at most that many items keeps `rate`."""
    return {
        family: min(rate, oversampling * size / n) if n > 0 else rate
        for family, n in sorted(family_items.items())
    }


def _candidates(outcomes: Iterable[Outcome]) -> dict[str, list[tuple[float, str, Outcome]]]:
    """Per family, the verifier-accepted outcomes with an answer, in rank order."""
    by_family: dict[str, list[tuple[float, str, Outcome]]] = defaultdict(list)
    for o in outcomes:
        if o.place != "accepted" or o.promoted_by != "verifier" or o.generation.answer is None:
            continue
        item = o.generation.item
        by_family[item.family].append((sample_rank(item.id), item.id, o))
    return {f: sorted(xs, key=lambda t: t[:2]) for f, xs in sorted(by_family.items())}


def sample_for_calibration(
    outcomes: Iterable[Outcome],
    *,
    size: int,
    rate: float = 1.0,
    rates: Mapping[str, float] | None = None,
) -> list[Outcome]:
    """Per family, the `size` lowest-ranked verifier-accepted outcomes whose rank is below
    the family's rate (`rates`, else `rate`), in rank order."""
    chosen: list[Outcome] = []
    for family, ranked in _candidates(outcomes).items():
        below = (rates or {}).get(family, rate)
        chosen += [o for r, _, o in ranked if r < below][:size]
    return chosen


def _decide(outcome: Outcome, candidate: str, policy: TrainingPolicy) -> Decision:
    item = outcome.generation.item
    options = {"options": item.options} if item.options else {}
    rule = policy.rule_for(item.family, item.protocol)
    return verify(item.protocol, candidate, item.references, training=rule, **options)


def _rejects(outcome: Outcome, candidate: str, policy: TrainingPolicy) -> bool:
    """Known wrong: training acceptance refuses it (the benchmark may still pass it)."""
    decision = _decide(outcome, candidate, policy)
    return not decision.accepted or decision.near_miss


def _probe(
    outcome: Outcome, kind: ProbeKind, candidate: str, *, source: str | None = None
) -> Probe:
    item = outcome.generation.item
    return Probe(
        kind=kind,
        expected="CORRECT" if kind == "agreement" else "WRONG",
        item_id=item.id,
        family=item.family,
        protocol=item.protocol,
        rank=sample_rank(item.id),
        question=item.question,
        references=list(item.references),
        candidate=candidate,
        source_item_id=source,
    )


def _pick(rank: float, n: int, salt: int = 0) -> int:
    return (int(rank * 2**32) + salt) % n


def _digit_changed(reference: str, rank: float) -> str | None:
    places = [i for i, ch in enumerate(reference) if ch.isdigit() and ch.isascii()]
    if not places:
        return None
    i = places[_pick(rank, len(places))]
    digit = (int(reference[i]) + 1 + _pick(rank, 9, 7)) % 10  # never the same digit
    return reference[:i] + str(digit) + reference[i + 1 :]


def _option_swapped(outcome: Outcome, reference: str) -> str | None:
    item = outcome.generation.item
    letters = sorted(item.options) if item.options else []
    ref = reference.strip().strip("().").upper()
    if not letters and len(ref) == 1 and ref in "ABCDE":
        letters = list("ABCDE")
    if ref not in letters or len(letters) < 2:
        return None
    return letters[(letters.index(ref) + 1) % len(letters)]


def _letter_changed(reference: str, rank: float) -> str | None:
    places = [i for i, ch in enumerate(reference) if ch.isascii() and ch.isalpha()]
    if not places:
        return None
    i = places[_pick(rank, len(places), 11)]
    ch = reference[i]
    base = ord("a") if ch.islower() else ord("A")
    other = chr(base + (ord(ch) - base + 1 + _pick(rank, 25, 13)) % 26)  # never the same
    return reference[:i] + other + reference[i + 1 :]


def _digits_swapped(reference: str, rank: float) -> str | None:
    pairs = [
        i
        for i in range(len(reference) - 1)
        if reference[i].isdigit()
        and reference[i + 1].isdigit()
        and reference[i] != reference[i + 1]
        and reference[i : i + 2].isascii()
    ]
    if not pairs:
        return None
    i = pairs[_pick(rank, len(pairs), 17)]
    return reference[:i] + reference[i + 1] + reference[i] + reference[i + 2 :]


def _number_off(reference: str) -> str | None:
    """The reference 3% higher, written at its own precision (a trailing "%" kept)."""
    text = reference.strip()
    percent = text.endswith("%")
    try:
        value = Decimal(text.rstrip("%"))
    except InvalidOperation:
        return None
    if not value.is_finite() or not value:
        return None
    try:
        off = (value * NEAR_MISS_NUMBER_OFF).quantize(value, rounding=ROUND_HALF_UP)
    except InvalidOperation:
        return None
    return f"{off}%" if percent else str(off)


def _truncated(reference: str) -> str | None:
    text = reference.strip()
    if sum(ch.isalnum() for ch in text) < 2:
        return None
    return text[: max(1, len(text) // 2)].rstrip()


def known_wrong(
    outcome: Outcome, peers: Sequence[Outcome] = (), policy: TrainingPolicy | None = None
) -> list[Probe]:
    """The known-wrong candidates of one sampled item, each refused by the family's
    training acceptance (`policy`'s rule; a candidate it accepts is not known to be wrong,
    and is dropped); the near-miss kinds only where the benchmark's scorer passes them.
    `peers`: the family's other accepted items, in rank order (for other_reference)."""
    policy = policy or DEFAULT_POLICY
    item = outcome.generation.item
    reference = item.references[0]
    rank = sample_rank(item.id)
    built: list[tuple[ProbeKind, str | None, str | None]] = []
    others = [p for p in peers if p.generation.item.id != item.id]
    if others:
        # The next peer in rank order whose reference this item's protocol rejects.
        start = _pick(rank, len(others))
        for j in range(len(others)):
            other = others[(start + j) % len(others)].generation.item
            if _rejects(outcome, other.references[0], policy):
                built.append(("other_reference", other.references[0], other.id))
                break
    built.append(("digit_changed", _digit_changed(reference, rank), None))
    built.append(("option_swapped", _option_swapped(outcome, reference), None))
    built.append(("truncated", _truncated(reference), None))
    built.append(("master_key", MASTER_KEYS[_pick(rank, len(MASTER_KEYS), 3)], None))
    probes = [
        _probe(outcome, kind, cand, source=src)
        for kind, cand, src in built
        if cand is not None and cand.strip() and _rejects(outcome, cand, policy)
    ]
    seen = {p.candidate for p in probes}
    for kind, cand in (
        ("letter_changed", _letter_changed(reference, rank)),
        ("digits_swapped", _digits_swapped(reference, rank)),
        ("number_off", _number_off(reference)),
    ):
        if cand is None or cand in seen or not _decide(outcome, cand, policy).near_miss:
            continue
        seen.add(cand)
        probes.append(_probe(outcome, kind, cand))  # type: ignore[arg-type]
    return probes


def calibration_probes(
    outcomes: Iterable[Outcome],
    *,
    size: int,
    rate: float = 1.0,
    rates: Mapping[str, float] | None = None,
    policy: TrainingPolicy | None = None,
) -> list[Probe]:
    """Every probe for one shard: per sampled accepted item, its agreement probe (the
    model's own accepted answer) and its known-wrong candidates (`policy`: the run's
    training acceptance, which says what is known to be wrong). The peers whose
    references become `other_reference` candidates are the shard's accepted items of the
    family, sampled or not, in rank order: a sparse sample (a low rate) keeps them."""
    outcomes = list(outcomes)
    sampled = sample_for_calibration(outcomes, size=size, rate=rate, rates=rates)
    peers = {f: [o for _, _, o in xs] for f, xs in _candidates(outcomes).items()}
    probes: list[Probe] = []
    for o in sampled:
        probes.append(_probe(o, "agreement", o.generation.answer or ""))
        probes += known_wrong(o, peers[o.generation.item.family], policy)
    return probes


def probe_prompt(probe: Probe) -> str:
    """The judge prompt of a probe: built exactly as for a real verifier rejection."""
    return build_judge_prompt(probe.question, probe.references, probe.candidate)
