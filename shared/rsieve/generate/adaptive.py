"""Adaptive best-of-n (docs/sampling.md, "Adaptive sampling"): which samples of a shard's
items to ask next, from what the samples asked so far gave. Pure.

`samples` (N) stays the most an item may get. Samples go out in rounds of `Adaptive.round`
per item, in sample order, and after each whole round an item stops when:

- `enough` (K) of its samples passed (DART-Math's "until k answers pass"; with `keep
  first` K is 1 by default: one accepted answer is all the item can give);
- or, with a pass-rate window, the Wilson interval of its pass rate over the samples
  answered lies wholly inside the window (it will be kept) or wholly outside it (it will
  not: quarantined `pass_rate_window`, or rejected), as verl's dynamic sampling stops an
  item once it has given its signal;
- or it has had N.

So an easy item stops after its first round and the budget goes to the items still
undecided. "Passed" is the verifier's verdict under the run's training rule, taken in the
generator as the verifier will take it; a rejected sample the judge would promote later
counts as not passed here, so an item is never stopped on a promotion that may not come.

Decisions are taken only at round boundaries, from the samples of whole rounds, so a
shard resumed from its stored replies (rsieve.generate.progress) asks exactly what an
uninterrupted one would have. A sample whose call failed counts as drawn, not answered.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from rsieve.intervals import wilson
from rsieve.settings import Settings

__all__ = ["Adaptive", "Stop", "adaptive_of", "next_round", "rule", "stopped"]

# Why an item gets no more samples.
Stop = Literal["enough", "inside_window", "outside_window", "all_drawn"]


@dataclass(frozen=True)
class Adaptive:
    """The stopping rule: `samples` the most per item; `enough` passes that stop an item (0:
    off); `window` the pass-rate window the interval is tested against (None: off);
    `round` samples asked per item per round."""

    samples: int
    enough: int = 0
    window: tuple[float, float] | None = None
    round: int = 0

    @property
    def on(self) -> bool:
        return self.samples > 1 and (self.enough > 0 or self.window is not None)

    @property
    def step(self) -> int:
        return self.round if self.on and self.round > 0 else self.samples


def adaptive_of(s: Settings) -> Adaptive:
    """The run's rule (`rule`, from its settings)."""
    return rule(
        s.samples,
        enough=s.enough,
        keep=s.keep,
        window=s.pass_rate_window,
        circular=s.circular,
        sample_round=s.sample_round,
    )


def rule(
    samples: int,
    *,
    enough: int | None = None,
    keep: str = "first",
    window: Sequence[float] = (),
    circular: bool = False,
    sample_round: int = 0,
) -> Adaptive:
    """`enough` as set, else 1 with `keep first` and no pass-rate window (else 0: every
    sample drawn); rounds of `sample_round`, else max(K, N/4 rounded up). Circular sampling
    draws every sample (an item is accepted only when every rotation passes)."""
    if samples <= 1 or circular:
        return Adaptive(samples=samples)
    bounds = (window[0], window[1]) if window else None
    if enough is None:
        enough = 1 if keep == "first" and bounds is None else 0
    step = sample_round or max(enough, math.ceil(samples / 4))
    return Adaptive(samples=samples, enough=enough, window=bounds, round=min(step, samples))


def stopped(passed: int, answered: int, drawn: int, rule: Adaptive) -> Stop | None:
    """Why an item with `drawn` samples (a whole number of rounds), `answered` of them
    answered and `passed` of those passing, gets no more; None: it gets another round."""
    if drawn >= rule.samples:
        return "all_drawn"
    if not rule.on:
        return None
    if rule.enough and passed >= rule.enough:
        return "enough"
    if rule.window is not None and answered:
        lo, hi = wilson(passed, answered)
        low, high = rule.window
        if low <= lo and hi <= high:
            return "inside_window"
        if hi < low or lo > high:
            return "outside_window"
    return None


def next_round(
    counts: Sequence[int],
    done: Mapping[int, bool | None],
    rule: Adaptive,
) -> list[int]:
    """The positions to ask next. Items are laid out one after the other, item i's samples
    at positions offset(i) .. offset(i) + counts[i] - 1 (`rsieve.generate.generation.sampled`);
    `done`: every position asked so far, True when its sample passed, False when it was
    answered and did not, None when its call failed. An item whose samples so far end
    mid-round (a resumed shard) completes that round first."""
    step = rule.step
    todo: list[int] = []
    offset = 0
    for count in counts:
        drawn = 0
        while drawn < count and offset + drawn in done:
            drawn += 1
        if drawn % step and drawn < count:
            target = min(count, (drawn // step + 1) * step)
        else:
            verdicts = [done[offset + k] for k in range(drawn)]
            answered = sum(v is not None for v in verdicts)
            why = stopped(sum(v is True for v in verdicts), answered, drawn, rule)
            target = drawn if why or drawn >= count else min(count, drawn + step)
        todo.extend(range(offset + drawn, offset + target))
        offset += count
    return todo
