"""Splitting a model's raw output into reasoning and answer.

The answer is what follows the reasoning. Reasoning that opens and never closes means the
output was cut off before any answer: a failure with its own reason, never scored.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["OPEN", "CLOSE", "Parsed", "parse_output"]

OPEN, CLOSE = "<think>", "</think>"


@dataclass(frozen=True)
class Parsed:
    reasoning: str | None
    answer: str | None
    failure: str | None


def parse_output(raw: str, finish_reason: str = "stop") -> Parsed:
    text = raw or ""
    if CLOSE in text:
        head, _, tail = text.rpartition(CLOSE)
        reasoning = head.split(OPEN, 1)[1] if OPEN in head else head
        answer = tail.strip()
        if not answer:
            failure = "truncated_answer" if finish_reason == "length" else "empty_answer"
            return Parsed(reasoning.strip(), None, failure)
        return Parsed(reasoning.strip(), answer, None)
    if OPEN in text:
        # Chat templates that open <think> for the assistant make the opening tag
        # optional in the output; an open tag without a close is always a cut-off.
        return Parsed(text.split(OPEN, 1)[1].strip(), None, "truncated_reasoning")
    if finish_reason == "length":
        return Parsed(None, None, "truncated_reasoning")
    answer = text.strip()
    return Parsed(None, answer or None, None if answer else "empty_answer")
