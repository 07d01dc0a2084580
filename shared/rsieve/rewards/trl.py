"""rsieve's rewards for TRL's GRPOTrainer: `reward_funcs=[accuracy_reward, format_reward]`,
the dataset's `ground_truth` column holding `rsieve.rewards.encode`'s strings.

GRPOTrainer calls a reward function with `prompts`, `completions`, `completion_ids`,
`trainer_state` (and a few loggers) and every dataset column, each column repeated per
completion, all as keyword arguments. A completion is a string, or (conversational) a list
of messages whose last assistant message holds the text, as a string or as `text` parts.

TRL cannot tell a reward function that a completion was cut at the length limit; a
`finish_reason` column, or `truncation_aware(eos_token_ids)`, which reads it off the ids
the way TRL's own `clipped_ratio` does, scores such a completion as the factory does.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from typing import Any

from rsieve.generate.think import CLOSE, OPEN, parse_output
from rsieve.rewards import score

__all__ = ["accuracy_reward", "completion_text", "format_reward", "truncation_aware"]

# Where a chat template's response parser puts the reasoning it split off the content.
_REASONING_KEYS = ("reasoning_content", "reasoning", "thinking")


def _text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(
        str(part.get("text") or "")
        for part in content
        if isinstance(part, dict) and part.get("type", "text") == "text"
    )


def completion_text(completion: str | Sequence[dict[str, Any]]) -> str:
    """The completion as the generator's raw output: the last assistant message's text, its
    reasoning put back in its think block where a response parser split it off."""
    if isinstance(completion, str):
        return completion
    assistant = [m for m in completion if m.get("role", "assistant") == "assistant"]
    if not assistant:
        return ""
    message = assistant[-1]
    content = _text(message.get("content"))
    reasoning = next((message[k] for k in _REASONING_KEYS if message.get(k)), None)
    if reasoning is not None:
        return f"{OPEN}{_text(reasoning)}{CLOSE}{content}"
    return content


def _finish_reasons(finish_reason: Sequence[str] | None, n: int) -> Sequence[str]:
    if finish_reason is None:
        return ["stop"] * n
    if len(finish_reason) != n:
        raise ValueError(f"{len(finish_reason)} finish reasons for {n} completions")
    return finish_reason


def accuracy_reward(
    completions: Sequence[str | Sequence[dict[str, Any]]],
    ground_truth: Sequence[str],
    finish_reason: Sequence[str] | None = None,
    **kwargs: Any,
) -> list[float | None]:
    """1.0 where the factory would keep the answer as training data, else 0.0; None where
    the reference has no form under its protocol (GRPOTrainer leaves None out)."""
    if len(ground_truth) != len(completions):
        raise ValueError(f"{len(ground_truth)} ground truths for {len(completions)} completions")
    reasons = _finish_reasons(finish_reason, len(completions))
    return [
        score(completion_text(c), gt, finish_reason=fr).accuracy
        for c, gt, fr in zip(completions, ground_truth, reasons, strict=True)
    ]


def format_reward(
    completions: Sequence[str | Sequence[dict[str, Any]]],
    finish_reason: Sequence[str] | None = None,
    **kwargs: Any,
) -> list[float]:
    """1.0 where the generator's parse finds an answer (the think block closed if opened,
    no refusal), else 0.0."""
    reasons = _finish_reasons(finish_reason, len(completions))
    return [
        1.0 if parse_output(completion_text(c), fr).failure is None else 0.0
        for c, fr in zip(completions, reasons, strict=True)
    ]


def truncation_aware(
    eos_token_ids: Collection[int], reward: Callable[..., list[Any]] = accuracy_reward
) -> Callable[..., list[Any]]:
    """`reward` with each completion's finish reason read off its ids: "length" where the
    last id is no end of sequence (pass the tokenizer's EOS ids and its pad id, as TRL's
    `eos_and_pad`). A `finish_reason` column, if any, is ignored."""
    ends = frozenset(eos_token_ids)

    def wrapped(
        completions: Sequence[Any], completion_ids: Sequence[Sequence[int]], **kwargs: Any
    ) -> list[Any]:
        kwargs.pop("finish_reason", None)
        reasons = ["stop" if ids and ids[-1] in ends else "length" for ids in completion_ids]
        return reward(completions, finish_reason=reasons, completion_ids=completion_ids, **kwargs)

    wrapped.__name__ = getattr(reward, "__name__", "reward")
    return wrapped
