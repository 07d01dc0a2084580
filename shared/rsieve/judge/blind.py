"""The blind pass (docs/traces.md, "The blind pass"): every item the verifier accepted is
asked again without its image, by the same model with the same sampling, its question
byte for byte. An item the model still answers right does not need its image, and a set
full of such items teaches a VLM to answer from the text alone (MMStar; Vision-SR1's
language-shortcut rate). Pure: the generator's shell sends the requests.

- `blind_asks`: what is asked: for each item with a sample the verifier accepted, its first
  accepted sample's question and seed; under circular sampling, every rotation the run
  asked (each sample's question and seed), so a lucky letter does not count.
- `blind_passes`: each item's `BlindPass` from the replies: answerable when every blind
  answer passes the item's protocol and training rule, as the verifier reads answers.
- `with_blind`: every sample of an item with its `BlindPass`.

What an answerable item does is the run's `blind_policy`, recorded in each BlindPass:
`keep` (flagged), `nothink` (rsieve.compact.splits.split_kinds keeps it out of `_RS_think`)
or `drop` (rsieve.judge.cascade.verify_generation rejects it, `answerable_without_image`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rsieve.generate.generation import ModelReply
from rsieve.generate.think import parse_output
from rsieve.judge.cascade import verify_generation
from rsieve.schemas import BlindPass, BlindPolicy, Generation
from rsieve.verify import TrainingPolicy

__all__ = ["BlindAsk", "blind_asks", "blind_passes", "with_blind"]


@dataclass(frozen=True)
class BlindAsk:
    """One blind request: the sample whose question (as sent) and seed are asked again."""

    generation: Generation

    @property
    def line(self) -> int:
        return self.generation.item.line


def blind_asks(
    generations: Sequence[Generation], policy: TrainingPolicy, circular: bool
) -> list[BlindAsk]:
    """The blind requests of a shard's generations, items in their order."""
    by_line: dict[int, list[Generation]] = {}
    for g in generations:
        by_line.setdefault(g.item.line, []).append(g)
    asks: list[BlindAsk] = []
    for samples in by_line.values():
        accepted = [g for g in samples if verify_generation(g, policy).place == "accepted"]
        if accepted:
            asks += [BlindAsk(g) for g in (samples if circular else accepted[:1])]
    return asks


def blind_passes(
    asks: Sequence[BlindAsk],
    replies: Sequence[ModelReply | Exception],
    policy: TrainingPolicy,
    blind_policy: BlindPolicy,
) -> dict[int, BlindPass]:
    """Each asked item's BlindPass, by pool line. A failed request leaves `answerable`
    None (not known), never False."""
    grouped: dict[int, list[tuple[BlindAsk, ModelReply | Exception]]] = {}
    for ask, reply in zip(asks, replies, strict=True):
        grouped.setdefault(ask.line, []).append((ask, reply))
    passes: dict[int, BlindPass] = {}
    for line, pairs in grouped.items():
        answers: list[str | None] = []
        raws: list[str] = []
        inputs: list[int | None] = []
        outputs: list[int | None] = []
        passed: list[bool] = []
        error: str | None = None
        for ask, reply in pairs:
            if isinstance(reply, Exception):
                error = error or f"{type(reply).__name__}: {reply}"[:500]
                continue
            parsed = parse_output(reply.text, reply.finish_reason)
            blind = ask.generation.model_copy(
                update={
                    "raw_output": reply.text,
                    "finish_reason": reply.finish_reason,
                    "reasoning": parsed.reasoning,
                    "answer": parsed.answer,
                    "failure": parsed.failure,
                }
            )
            answers.append(parsed.answer)
            raws.append(reply.text)
            inputs.append(reply.input_tokens)
            outputs.append(reply.output_tokens)
            passed.append(verify_generation(blind, policy).place == "accepted")
        passes[line] = BlindPass(
            answerable=None if error else all(passed),
            answers=answers,
            raw_outputs=raws,
            policy=blind_policy,
            error=error,
            input_tokens=inputs,
            output_tokens=outputs,
        )
    return passes


def with_blind(generations: Sequence[Generation], passes: dict[int, BlindPass]) -> list[Generation]:
    """`generations`, every sample of an asked item with its BlindPass."""
    return [
        g.model_copy(update={"blind": passes[g.item.line]}) if g.item.line in passes else g
        for g in generations
    ]
