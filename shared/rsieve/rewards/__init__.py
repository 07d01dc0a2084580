"""The factory's verifiers as RL rewards: the same parse, the same protocol, the same
training rule, so a policy trained on a reward is rewarded for exactly the answers the
factory would have kept as training data.

A reward scores one completion against a `GroundTruth`, the JSON string exports put in
their `ground_truth` column (`encode`, `ground_truth_of`):

- the answer is taken from the completion by `rsieve.generate.think.parse_output`, the
  generator's own parse (a think block and the answer after it, `<answer>` tags). No
  other extraction: `\\boxed{B}` is read only where the protocol reads it (`mc`'s letter
  forms, Math-Verify for `math`), as the factory does;
- `accuracy` is 1.0 when `rsieve.verify.verify` accepts the answer under the item's
  training rule and it is no near miss (the benchmark passes it, training refuses it):
  `rsieve.judge.cascade.verify_generation`'s rule. The blind pass is left out (it is about
  the image, not the answer), and so are judge promotions: the judge rescues answers the
  verifier rejected, after the fact, with a model; a reward is the verifier's alone;
- `accuracy` is None (TRL skips it; verl and EasyR1 get 0.0 and verl a `valid` of 0.0)
  when the reference has no form under its protocol: an empty reference, an unknown
  protocol, `number` with "abc", `mc` with no option letter, `math` that Math-Verify
  cannot parse. Such a reference never rewards 1.0 (open-r1 PR #55 did);
- `format` is 1.0 when the parse found an answer, the think block closed if opened, and
  it is no refusal;
- a completion cut at the length limit scores 0.0 only when the trainer says so
  (`finish_reason="length"`): a trainer that cannot say scores it as stopped.

`disagreements` re-scores stored samples through each trainer interface (`rsieve.rewards.trl`,
`.verl`, `.easyr1`) and lists where a reward and the factory's stored decision differ:
the parity tests and `scripts/reward_parity.py` run it.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

from rsieve.generate.think import parse_output
from rsieve.schemas import Item, Outcome
from rsieve.verify import PROTOCOLS, TRAINING_RULES, canonical, verify

__all__ = [
    "INTERFACES",
    "Disagreement",
    "GroundTruth",
    "InterfaceCounts",
    "Parity",
    "Score",
    "decode",
    "disagreements",
    "encode",
    "factory_accepts",
    "ground_truth_of",
    "reference_parseable",
    "score",
]

# The trainers' interfaces `disagreements` scores through, in the order it reports them.
INTERFACES = ("trl", "verl", "easyr1")


class GroundTruth(BaseModel):
    """What a reward needs of an item: its references, protocol (and version), options,
    family and the training rule its run decided it under."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    references: list[str]
    protocol: str
    options: dict[str, str] | None = None
    training_rule: str
    family: str
    protocol_version: str | None = None

    @model_validator(mode="after")
    def _rule_applies(self) -> GroundTruth:
        # An unknown protocol is a reference without a form (no reward), but an unknown or
        # misapplied rule is a broken export: better an error at load than a wrong reward.
        rule = TRAINING_RULES.get(self.training_rule)
        if rule is None:
            raise ValueError(
                f"unknown training rule {self.training_rule!r}; known: {sorted(TRAINING_RULES)}"
            )
        if rule.protocols is not None and self.protocol not in rule.protocols:
            raise ValueError(
                f"the training rule {self.training_rule!r} judges only {list(rule.protocols)}, "
                f"not {self.protocol!r}"
            )
        return self


def encode(gt: GroundTruth) -> str:
    """The `ground_truth` column's string: compact JSON, keys sorted, so equal ground
    truths are equal strings."""
    return json.dumps(
        gt.model_dump(mode="json"), sort_keys=True, separators=(",", ":"), ensure_ascii=False
    )


def _from_mapping(value: Mapping[str, Any]) -> dict[str, Any]:
    """A mapping as verl's parquet rows hand it: sequences may be arrays, and a struct
    column fills every row's options with every row's keys, absent ones as None."""
    data = dict(value)
    refs = data.get("references")
    if refs is not None and not isinstance(refs, str | list):
        data["references"] = list(refs.tolist() if hasattr(refs, "tolist") else refs)
    options = data.get("options")
    if isinstance(options, Mapping):
        data["options"] = {str(k): v for k, v in options.items() if v is not None} or None
    return data


@functools.lru_cache(maxsize=1 << 14)
def _decode_str(value: str) -> GroundTruth:
    try:
        data = json.loads(value)
    except json.JSONDecodeError as exc:
        raise ValueError(f"ground_truth is not JSON ({exc}): {value[:80]!r}") from exc
    if not isinstance(data, dict):
        raise ValueError(f"ground_truth is not a JSON object: {value[:80]!r}")
    return _validated(data, value)


def _validated(data: Mapping[str, Any], shown: object) -> GroundTruth:
    try:
        return GroundTruth.model_validate(_from_mapping(data))
    except ValidationError as exc:
        raise ValueError(
            f"ground_truth is no rsieve ground truth ({exc.error_count()} errors: "
            f"{exc.errors()[0]['loc']} {exc.errors()[0]['msg']}): {str(shown)[:80]!r}"
        ) from exc


def decode(value: str | Mapping[str, Any] | GroundTruth) -> GroundTruth:
    """A ground truth from `encode`'s string, a mapping (a parquet row's struct) or itself;
    ValueError for anything else."""
    if isinstance(value, GroundTruth):
        return value
    if isinstance(value, bytes):
        value = value.decode("utf-8")
    if isinstance(value, str):
        return _decode_str(value)
    if isinstance(value, Mapping):
        return _validated(value, value)
    raise ValueError(f"ground_truth must be a JSON string or a mapping, not {type(value).__name__}")


def ground_truth_of(item: Item, training_rule: str) -> GroundTruth:
    """An item's ground truth under its run's training rule (the policy's `rule_for`)."""
    proto = PROTOCOLS.get(item.protocol)
    return GroundTruth(
        references=list(item.references),
        protocol=item.protocol,
        options=dict(item.options) if item.options else None,
        training_rule=training_rule,
        family=item.family,
        protocol_version=proto.version if proto is not None else None,
    )


def _math_parses(ref: str) -> bool:
    # The gold exactly as rsieve.verify.math parses it.
    from math_verify import parse

    return bool(parse(ref if "$" in ref else f"${ref}$", parsing_timeout=None))


def _mc_letter(ref: str, options: dict[str, str] | None) -> bool:
    # rsieve.verify.mc compares the extracted letter with this form of the reference.
    letter = ref.strip().strip("().").upper()
    if options:
        return letter in {k.strip().upper() for k in options}
    return len(letter) == 1 and "A" <= letter <= "Z"


@functools.lru_cache(maxsize=1 << 14)
def _parseable(protocol: str, refs: tuple[str, ...], options: tuple[tuple[str, str], ...]) -> bool:
    usable = [r for r in refs if r.strip()]
    if not usable or protocol not in PROTOCOLS:
        return False
    opts = dict(options) or None
    if protocol == "math":
        return any(_math_parses(r) for r in usable)
    if protocol == "mc":
        return any(_mc_letter(r, opts) for r in usable)
    return any(canonical(protocol, r, opts) for r in usable)


def reference_parseable(gt: GroundTruth | str | Mapping[str, Any]) -> bool:
    """Whether some reference has a form under the protocol: one an answer can match."""
    gt = decode(gt)
    return _parseable(gt.protocol, tuple(gt.references), tuple(sorted((gt.options or {}).items())))


@dataclass(frozen=True)
class Score:
    # None: the reference has no form under its protocol (reference_parseable).
    accuracy: float | None
    format: float
    answer: str | None
    failure: str | None


def score(
    completion: str,
    gt: GroundTruth | str | Mapping[str, Any],
    *,
    finish_reason: str = "stop",
    partial: bool = False,
) -> Score:
    """One completion's reward. `partial`: the benchmark's own score (ANLS, VQA's
    agreement) instead of training acceptance's 1.0/0.0, where an answer was parsed."""
    gt = decode(gt)
    proto = PROTOCOLS.get(gt.protocol)
    if proto is not None and gt.protocol_version not in (None, proto.version):
        raise ValueError(
            f"the ground truth was verified under {gt.protocol} version {gt.protocol_version}; "
            f"this rsieve has version {proto.version}: re-export the data with this rsieve, "
            "or train with the rsieve that made it"
        )
    parsed = parse_output(completion, finish_reason)
    fmt = 1.0 if parsed.failure is None else 0.0
    failure = parsed.failure if parsed.answer is not None else parsed.failure or "empty_answer"
    if not reference_parseable(gt):
        return Score(None, fmt, parsed.answer, failure)
    if failure is not None or parsed.answer is None:
        return Score(0.0, fmt, parsed.answer, failure)
    options = {"options": gt.options} if gt.options else {}
    decision = verify(
        gt.protocol, parsed.answer, gt.references, training=gt.training_rule, **options
    )
    if partial:
        return Score(float(decision.score), fmt, parsed.answer, None)
    accepted = decision.accepted and not decision.near_miss
    return Score(1.0 if accepted else 0.0, fmt, parsed.answer, None)


def factory_accepts(outcome: Outcome) -> bool:
    """The factory's verifier decision on a stored sample (a judge promotion is not one)."""
    gen, decision = outcome.generation, outcome.decision
    return (
        gen.failure is None
        and gen.answer is not None
        and decision is not None
        and decision.accepted
        and not decision.near_miss
    )


@dataclass
class InterfaceCounts:
    scored: int = 0
    agreed: int = 0
    unparseable: int = 0


@dataclass(frozen=True)
class Disagreement:
    id: str
    sample: int | None
    interface: str
    reward: float | None
    factory: bool


@dataclass
class Parity:
    """`disagreements`' result. `stop_sensitive`: the stored samples (reference parseable)
    whose reward changes when the trainer cannot say a completion was cut at the length
    limit and it is scored as stopped."""

    counts: dict[str, InterfaceCounts] = field(
        default_factory=lambda: {name: InterfaceCounts() for name in INTERFACES}
    )
    differing: list[Disagreement] = field(default_factory=list)
    stop_sensitive: int = 0

    @property
    def ok(self) -> bool:
        return not self.differing


def _samples(outcomes: Iterable[Outcome]) -> Iterator[Outcome]:
    for outcome in outcomes:
        yield outcome
        if outcome.samples is not None:
            yield from outcome.samples.others


def _rewards(raw: str, encoded: str, family: str, finish_reason: str) -> dict[str, float | None]:
    # Imported here: the interfaces import this package.
    from rsieve.rewards import easyr1, trl, verl

    from_verl = verl.compute_score(
        f"rsieve/{family}", raw, encoded, extra_info={"finish_reason": finish_reason}
    )
    from_easyr1 = easyr1.compute_score(
        [
            {
                "response": raw,
                "response_length": 0,
                "ground_truth": encoded,
                "finish_reason": finish_reason,
            }
        ]
    )
    return {
        "trl": trl.accuracy_reward([raw], ground_truth=[encoded], finish_reason=[finish_reason])[0],
        "verl": from_verl["score"] if from_verl["valid"] else None,
        "easyr1": from_easyr1[0]["accuracy"],
    }


def disagreements(outcomes: Iterable[Outcome], training_rule_of: Callable[[Item], str]) -> Parity:
    """Re-score every stored sample (and every other sample of a best-of-n outcome) through
    each interface, with its stored finish reason, against `factory_accepts`."""
    parity = Parity()
    for outcome in _samples(outcomes):
        gen = outcome.generation
        gt = ground_truth_of(gen.item, training_rule_of(gen.item))
        if not reference_parseable(gt):
            for counts in parity.counts.values():
                counts.unparseable += 1
            continue
        encoded = encode(gt)
        factory = factory_accepts(outcome)
        rewards = _rewards(gen.raw_output, encoded, gen.item.family, gen.finish_reason)
        for name, reward in rewards.items():
            counts = parity.counts[name]
            counts.scored += 1
            if reward in (0.0, 1.0) and (reward == 1.0) == factory:
                counts.agreed += 1
            else:
                parity.differing.append(
                    Disagreement(gen.item.id, gen.sample, name, reward, factory)
                )
        if gen.finish_reason != "stop":
            stopped = score(gen.raw_output, gt, finish_reason="stop").accuracy
            parity.stop_sensitive += (
                stopped != score(gen.raw_output, gt, finish_reason=gen.finish_reason).accuracy
            )
    return parity
