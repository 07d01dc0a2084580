"""Prompt building: the exact text the model receives, which is also what is stored."""

from __future__ import annotations

from rsieve.families import INSTRUCTIONS

__all__ = ["build_question"]


def build_question(question: str, protocol: str) -> str:
    """The pool question with the protocol's instruction appended once (idempotent)."""
    instruction = INSTRUCTIONS.get(protocol, "")
    text = question.strip()
    if not instruction or instruction in text:
        return text
    return f"{text}\n{instruction}"
