"""Builders for stage records (Item, Generation, Outcome) shared by the pure unit tests."""

from __future__ import annotations

import hashlib
from typing import Any

from rsieve.judge.cascade import apply_verdict, judge_prompt, verify_generation
from rsieve.schemas import Generation, Item, Outcome

POOL_URI = "s3://pools/example/"


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def make_item(
    item_id: str = "it-1",
    *,
    line: int = 1,
    family: str = "SynthWords",
    protocol: str = "alnum",
    question: str = "What word is shown?",
    references: list[str] | None = None,
    image: str = "img-a",
    options: dict[str, str] | None = None,
    source: Any = None,
) -> Item:
    return Item(
        id=item_id,
        line=line,
        family=family,
        protocol=protocol,
        question=question,
        pool_question=question,
        references=references if references is not None else ["COFFEE"],
        options=options,
        image_sha256=sha(image),
        clean_meta={
            "pool": POOL_URI,
            "line": line,
            "source": source if source is not None else {"sha256": sha(image)},
            "provenance": "sha256_match",
            "policy": {"version": "clean/1", "provenance": "strict"},
        },
    )


def make_generation(
    item: Item,
    answer: str | None,
    *,
    reasoning: str | None = "I read the letters one by one.",
    raw_output: str | None = None,
    failure: str | None = None,
    finish_reason: str = "stop",
    model: str = "test-vlm",
) -> Generation:
    if raw_output is None:
        raw_output = f"<think>{reasoning or ''}</think>{answer or ''}"
    return Generation(
        item=item,
        model=model,
        raw_output=raw_output,
        finish_reason=finish_reason,
        reasoning=reasoning,
        answer=answer,
        failure=failure,
        image_sent_sha256=item.image_sha256,
    )


def accepted(item: Item, answer: str | None = None) -> Outcome:
    """An outcome the verifier accepts (the answer defaults to the first reference)."""
    out = verify_generation(make_generation(item, answer or item.references[0]))
    assert out.place == "accepted"
    return out


def judged(item: Item, answer: str, raw_verdict: str | None) -> Outcome:
    """A verifier-rejected outcome after the judge said `raw_verdict` (None: call failed)."""
    pending = verify_generation(make_generation(item, answer))
    assert pending.place == "rejected" and pending.reason is None
    return apply_verdict(
        pending,
        model="test-judge",
        prompt=judge_prompt(pending),
        raw_output=raw_verdict,
        failure="timeout",
    )


def failed(item: Item, raw_output: str, failure: str = "truncated_reasoning") -> Outcome:
    out = verify_generation(
        make_generation(
            item,
            None,
            reasoning=raw_output,
            raw_output=raw_output,
            failure=failure,
            finish_reason="length",
        )
    )
    assert out.place == "rejected" and out.reason == failure
    return out
