"""rsieve's reward for EasyR1: `worker.reward.reward_function=<this file>:compute_score`
(a batch reward: EasyR1 reads `REWARD_TYPE`). EasyR1 imports the file by its path, so it
imports absolutely (rsieve must be installed where the reward workers run).

Each input carries `response`, `response_length` and `ground_truth` (the dataset's answer
column: `rsieve.rewards.encode`'s string). EasyR1 does not say whether a response was cut at
the length limit: pass `max_response_length` through `worker.reward.reward_function_kwargs`
(the rollout's own limit) and a response that long is scored as cut, as the factory scores
it; an input's own `finish_reason`, where given, wins.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rsieve.rewards import score

__all__ = ["REWARD_NAME", "REWARD_TYPE", "compute_score"]

REWARD_NAME = "rsieve"
REWARD_TYPE = "batch"


def _finish_reason(reward_input: Mapping[str, Any], max_response_length: int | None) -> str:
    given = reward_input.get("finish_reason")
    if given:
        return str(given)
    length = int(reward_input.get("response_length") or 0)
    return "length" if max_response_length and length >= max_response_length else "stop"


def compute_score(
    reward_inputs: Sequence[Mapping[str, Any]],
    format_weight: float = 0.0,
    max_response_length: int | None = None,
) -> list[dict[str, float]]:
    """Per input: `accuracy` (1.0 where the factory would keep the answer, else 0.0, and 0.0
    where the reference has no form under its protocol), `format` and `overall`:
    (1 - format_weight) * accuracy + format_weight * format."""
    if not isinstance(reward_inputs, Sequence) or isinstance(reward_inputs, str | Mapping):
        raise ValueError("rsieve's EasyR1 reward is a batch reward: REWARD_TYPE = 'batch'")
    if not 0.0 <= format_weight <= 1.0:
        raise ValueError(f"format_weight must be in [0, 1], not {format_weight}")
    scores = []
    for reward_input in reward_inputs:
        result = score(
            str(reward_input["response"]),
            reward_input["ground_truth"],
            finish_reason=_finish_reason(reward_input, max_response_length),
        )
        accuracy = result.accuracy if result.accuracy is not None else 0.0
        scores.append(
            {
                "overall": (1 - format_weight) * accuracy + format_weight * result.format,
                "accuracy": accuracy,
                "format": result.format,
            }
        )
    return scores
