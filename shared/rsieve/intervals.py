"""Binomial confidence intervals, one place for every stage that bounds a rate: the judge's
calibration (its false-promotion rate), the dataset's recheck, and adaptive best-of-n
(an item's pass rate, rsieve.generate.adaptive). Pure."""

from __future__ import annotations

import math

__all__ = ["Z95", "wilson"]

Z95 = 1.959963984540054  # two-sided 95% normal quantile


def wilson(k: int, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval of k successes in n trials (n = 0: the whole [0, 1])."""
    if n == 0:
        return 0.0, 1.0
    p = k / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)
