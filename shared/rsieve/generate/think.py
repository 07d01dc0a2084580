"""Splitting a model's raw output into reasoning and answer.

Two styles, as reasoning VLMs write them:

- `<think>reasoning</think>answer` (Qwen3, DeepSeek-R1 style; chat templates that open
  `<think>` for the assistant make the opening tag optional in the output);
- `<think>reasoning</think><answer>answer</answer>` or `reasoning<answer>answer</answer>`
  (R1-style RL recipes): the answer is the tagged span.

The three cases a checkpoint's thinking mode leads to (rsieve.generate.chat, docs/models.md):

- a native `<think>...</think>` block (a template that opens `<think>`, or a switch turned
  on): reasoning is the block, the answer what follows it;
- no think tags at all (a checkpoint without a thinking mode, or one that skipped it): the
  reasoning is None and the whole output is the answer. Such an answer is scored like any
  other; if accepted it goes to `_RS_nothink` only (`rsieve.compact.splits.split_kinds`), and the
  report counts it (`reasoning`, `accepted_without_reasoning`);
- a `<think>` that never closes: `truncated_reasoning`, never scored.

Failures, each a reason in `rsieve.schemas.REJECT_REASONS`, never scored:

- `truncated_reasoning`: cut off inside the reasoning (an opened `<think>` that never
  closes, or a budget hit with no answer at all);
- `truncated_answer`: the budget hit after the reasoning, before any answer text (or
  inside an `<answer>` that never closes);
- `empty_answer`: the model stopped with nothing after its reasoning;
- `refusal`: the answer is a refusal to answer ("I'm sorry, but I can't help with that");
- `repetition_loop`: the generation fell into a repetition loop and was cancelled while it
  streamed (finish reason `repetition_loop`, rsieve.generate.loops); what it wrote before
  is kept as its reasoning.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = [
    "ANSWER_CLOSE",
    "ANSWER_OPEN",
    "CLOSE",
    "LOOP_FINISH",
    "OPEN",
    "Parsed",
    "is_refusal",
    "parse_output",
]

OPEN, CLOSE = "<think>", "</think>"
# The finish reason of a generation cancelled in a loop (rsieve.generate.loops); never an
# engine's own.
LOOP_FINISH = "repetition_loop"
ANSWER_OPEN, ANSWER_CLOSE = "<answer>", "</answer>"

# A refusal opens the answer; it is short. A long answer that merely contains "I cannot"
# is an answer. Lowercased, apostrophes normalised.
_REFUSAL = re.compile(
    r"^(?:i'?m sorry|i am sorry|sorry|i apologi[sz]e|unfortunately)?[,.!]?\s*(?:but\s+)?"
    r"(?:i\s+(?:can ?not|can't|won't|will not|am (?:not able|unable)|'m (?:not able|unable)"
    r"|am not allowed|must decline|decline)"
    r"\s+(?:to\s+)?(?:help|assist|answer|provide|comply|do that|fulfil|identify|respond)"
    r"|as an ai\b)"
)
_REFUSAL_MAX_CHARS = 300


@dataclass(frozen=True)
class Parsed:
    reasoning: str | None
    answer: str | None
    failure: str | None


def is_refusal(answer: str) -> bool:
    text = answer.strip().lower().replace("\u2019", "'")
    return len(text) <= _REFUSAL_MAX_CHARS and _REFUSAL.match(text) is not None


def _answer(reasoning: str | None, answer: str, finish_reason: str, closed: bool = True) -> Parsed:
    if not closed and finish_reason == "length":
        return Parsed(reasoning, None, "truncated_answer")
    answer = answer.strip()
    if not answer:
        failure = "truncated_answer" if finish_reason == "length" else "empty_answer"
        return Parsed(reasoning, None, failure)
    if is_refusal(answer):
        return Parsed(reasoning, answer, "refusal")
    return Parsed(reasoning, answer, None)


def _tagged(reasoning: str | None, tail: str, finish_reason: str) -> Parsed:
    """The answer in `tail`: the `<answer>` span when there is one, else all of it."""
    if ANSWER_OPEN not in tail:
        return _answer(reasoning, tail, finish_reason)
    body = tail.split(ANSWER_OPEN, 1)[1]
    closed = ANSWER_CLOSE in body
    return _answer(reasoning, body.split(ANSWER_CLOSE, 1)[0], finish_reason, closed)


def _strip(text: str) -> str | None:
    return text.strip() or None


def parse_output(raw: str, finish_reason: str = "stop") -> Parsed:
    text = raw or ""
    if finish_reason == LOOP_FINISH:
        return Parsed(_strip(text.split(OPEN, 1)[1] if OPEN in text else text), None, LOOP_FINISH)
    if CLOSE in text:
        head, _, tail = text.rpartition(CLOSE)
        reasoning = head.split(OPEN, 1)[1] if OPEN in head else head
        return _tagged(reasoning.strip(), tail, finish_reason)
    if ANSWER_OPEN in text:
        # reasoning<answer>...</answer>, with or without an opening <think>
        head = text.split(ANSWER_OPEN, 1)[0]
        reasoning = head.split(OPEN, 1)[1] if OPEN in head else head
        return _tagged(_strip(reasoning), text[len(head) :], finish_reason)
    if OPEN in text:
        # An open tag without a close is always a cut-off.
        return Parsed(text.split(OPEN, 1)[1].strip(), None, "truncated_reasoning")
    if finish_reason == "length":
        return Parsed(None, None, "truncated_reasoning")
    return _answer(None, text, finish_reason)
