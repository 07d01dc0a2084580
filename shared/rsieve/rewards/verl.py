"""rsieve's reward for verl: `custom_reward_function.path` is this file,
`custom_reward_function.name=compute_score`. verl imports the file by its path, so it
imports absolutely (rsieve must be installed where the reward workers run).

Each row's `data_source` is `rsieve/<family>` and its `reward_model.ground_truth` is
`rsieve.rewards.encode`'s string (or the same as a struct). `extra_info` may carry the
completion's `finish_reason`; without it a completion cut at the length limit is scored as
stopped (verl does not pass one).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rsieve.rewards import score

__all__ = ["DATA_SOURCE_PREFIX", "compute_score"]

DATA_SOURCE_PREFIX = "rsieve/"


def compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: str | Mapping[str, Any],
    extra_info: Mapping[str, Any] | None = None,
    **kwargs: Any,
) -> dict[str, float]:
    """`score` (verl's reward) and `acc`: 1.0 where the factory would keep the answer, else
    0.0; `format`: the generator's parse found an answer; `valid`: 0.0 where the reference
    has no form under its protocol (its score is then 0.0: filter on `valid`)."""
    if not str(data_source).startswith(DATA_SOURCE_PREFIX):
        raise ValueError(
            f"data_source {data_source!r} is not rsieve's (it starts with "
            f"{DATA_SOURCE_PREFIX!r}): this reward scores only rows exported by rsieve; "
            "route other data sources to their own reward function"
        )
    finish_reason = str((extra_info or {}).get("finish_reason") or "stop")
    result = score(solution_str, ground_truth, finish_reason=finish_reason)
    accuracy = result.accuracy if result.accuracy is not None else 0.0
    return {
        "score": accuracy,
        "acc": accuracy,
        "format": result.format,
        "valid": 0.0 if result.accuracy is None else 1.0,
    }
