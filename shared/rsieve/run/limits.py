"""A shard task's time limit from its model's observed pace (issue 37, "Nothing stalls"):
seconds per item, an exponentially weighted mean of what shards observed (recorded per
batch by the workers, services/progress.py), times the shard's items, times a safety
factor; never under the floor (settings.task_time_limit_s, the limit of every other task)
and never over the ceiling, which stays below the broker's visibility timeout (a message
held longer would be restored while its task still runs)."""

from __future__ import annotations

import math

__all__ = ["ewma", "limit_ceiling", "shard_time_limit"]


def ewma(previous: float | None, sample: float, alpha: float) -> float:
    """The mean after one more sample (the sample alone when there was none)."""
    if previous is None or not math.isfinite(previous):
        return sample
    return alpha * sample + (1 - alpha) * previous


def limit_ceiling(max_s: float, visibility_timeout_s: float, restore_interval_s: float) -> int:
    """The longest limit a shard task may get: `max_s`, and below the visibility timeout by
    one restore sweep."""
    return int(min(max_s, visibility_timeout_s - restore_interval_s))


def shard_time_limit(
    per_item_s: float | None, items: int, *, factor: float, floor_s: int, ceiling_s: int
) -> int:
    """Seconds a shard of `items` may run: factor x per_item_s x items, between the floor and
    the ceiling; the floor when nothing was observed. The floor wins over a lower ceiling:
    a derived limit never shortens a task's limit."""
    if per_item_s is None or not math.isfinite(per_item_s) or per_item_s <= 0:
        return floor_s
    wanted = math.ceil(factor * per_item_s * max(0, items))
    return max(floor_s, min(wanted, ceiling_s))
