"""Sequential calibration (docs/judge.md, "Calibration that decides"), as pure functions.

A family's judge may promote once the Wilson 95% upper bound of its false-promotion rate
(known-wrong probes judged CORRECT, over those judged CORRECT or WRONG) lies under the
bound. Zero false promotions clear 5% only from 73 verdicts, so a fixed small sample can
never decide, and a fixed large one pays for probes after the question is settled. So the
probes of a family are asked in a fixed order, in rounds, and asking stops as soon as the
family is decided:

- **cleared**: the upper bound lies under the bound (the judge may promote);
- **false_promotions**: the judge called known-wrong probes CORRECT, and even if every
  probe left were judged WRONG the upper bound would stay at or above the bound;
- **too_small**: the family's sample cannot give the verdicts the bound needs at all, so
  no probe is spent on it (the card says how many it could have had and how many the
  bound needs);
- **exhausted**: probes were asked, none of the above, and none are left (UNSURE or
  FAILED verdicts, which never count, used them up);
- **open**: undecided with probes left: only while asking (a shard that holds part of a
  family asks its whole part, and the run decides over every shard's probes, so a run
  whose shards all finished never ends there).

Each round asks exactly the known-wrong verdicts the family still needs to clear the bound
were every one of them WRONG (`needed`): asking fewer cannot decide, so a clean judge is
decided in one round, one batch on the judge server.

The order: items by their calibration rank (`sample_rank`, a uniform order fixed by the
id), and within an item its agreement probe first, then its known-wrong probes in
`KIND_ORDER`, the shortest and most often decided first (a master key, the reference cut
in half, a letter or a digit changed, before another item's reference and the near
misses). Item-major, not kind-major: asking every item's master key first would decide
the bound on the easiest probes alone, and measure the judge on what it is least likely
to get wrong.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Literal

from pydantic import BaseModel, ConfigDict

from rsieve.intervals import wilson
from rsieve.judge.probes import WRONG_KINDS, Probe

__all__ = [
    "KIND_ORDER",
    "SEQUENTIAL_VERSION",
    "FamilyStop",
    "Stop",
    "decide",
    "decided_here",
    "family_stops",
    "merge_stops",
    "needed",
    "next_round",
    "order_probes",
    "stop_reason",
    "whole_families",
]

SEQUENTIAL_VERSION = "calibration/2"
KIND_ORDER = (
    "agreement",
    "master_key",
    "truncated",
    "option_swapped",
    "digit_changed",
    "letter_changed",
    "other_reference",
    "digits_swapped",
    "number_off",
)
# Beyond this many verdicts the bound is taken as unreachable (a bound of 0, say).
_MOST = 10_000_000

Stop = Literal["cleared", "false_promotions", "too_small", "exhausted", "open"]
# Held back unless cleared: only a cleared family's judge promotes.
STOPS: tuple[Stop, ...] = ("cleared", "false_promotions", "too_small", "exhausted", "open")


class FamilyStop(BaseModel):
    """Where a family's calibration stopped in one shard (or, merged, in the run):
    `capacity` known-wrong probes its sample could give, `asked` of them asked, `k` of
    the `n` judged CORRECT or WRONG were CORRECT, and why asking stopped."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    stop: Stop
    items: int = 0  # accepted items in the sample
    capacity: int
    asked: int
    k: int
    n: int
    needed: int
    # Whether the shard held every item of the family (only then is `too_small` final).
    complete: bool = True


def whole_families(in_shard: Mapping[str, int], planned: Mapping[str, int]) -> list[str]:
    """The families a shard holds every item of (`in_shard` against the pool's plan)."""
    return [f for f, n in in_shard.items() if f in planned and n >= planned[f]]


def decided_here(
    in_shard: Mapping[str, int], planned: Mapping[str, int], bound: float
) -> list[str]:
    """The families a shard decides on its own probes: those it holds whole, and those
    whose planned items could never clear `bound` whatever their other shards hold (every
    probe kind for every item, all judged WRONG). A part of any other family asks its
    whole part of the sample (`next_round`)."""
    small = [f for f in in_shard if f in planned and planned[f] * len(WRONG_KINDS) < needed(bound)]
    return sorted(set(whole_families(in_shard, planned)) | set(small))


def upper(k: int, n: int) -> float:
    return wilson(k, n)[1]


def needed(bound: float, k: int = 0) -> int:
    """The fewest CORRECT/WRONG verdicts on known-wrong probes, `k` of them CORRECT, whose
    Wilson upper bound lies under `bound` (73 for 0 at 0.05, 110 for 1); 0 when the bound
    is off (1); `_MOST` when no count reaches it."""
    if bound >= 1.0:
        return 0
    if upper(k, _MOST) >= bound:
        return _MOST
    lo, hi = max(k, 1), _MOST  # upper(k, n) falls as n grows: the least n under the bound
    while lo < hi:
        mid = (lo + hi) // 2
        if upper(k, mid) < bound:
            hi = mid
        else:
            lo = mid + 1
    return lo


def decide(k: int, n: int, asked: int, remaining: int, bound: float) -> Stop:
    """The stop of a family with `k` false promotions in `n` CORRECT/WRONG verdicts,
    `asked` known-wrong probes asked and `remaining` not yet asked."""
    if bound >= 1.0 or (n and upper(k, n) < bound):
        return "cleared"
    if n + remaining < needed(bound, k):  # even all WRONG, the rest cannot clear it
        if k:
            return "false_promotions"
        return "too_small" if not asked else "exhausted"
    return "open"


def _item_key(p: Probe) -> tuple[float, str]:
    return p.rank, p.item_id


def order_probes(probes: Iterable[Probe]) -> list[Probe]:
    """The probes in asking order: family, then item rank, then `KIND_ORDER`."""
    return sorted(probes, key=lambda p: (p.family, *_item_key(p), KIND_ORDER.index(p.kind)))


def _verdicts(asked: Iterable[tuple[Probe, str]]) -> dict[str, tuple[int, int, int]]:
    """Per family (k, n, known-wrong asked) of (probe, verdict state) pairs."""
    out: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])
    for probe, verdict in asked:
        if probe.expected != "WRONG":
            continue
        t = out[probe.family]
        t[2] += 1
        if verdict in ("CORRECT", "WRONG"):
            t[1] += 1
            t[0] += verdict == "CORRECT"
    return {f: (k, n, a) for f, (k, n, a) in out.items()}


def next_round(
    ordered: Sequence[Probe],
    answered: Mapping[int, str],
    bound: float,
    *,
    complete: Iterable[str] = (),
    stop: Literal["decided", "sample"] = "decided",
) -> list[int]:
    """The indices into `ordered` (`order_probes`) to ask next: for every family of
    `complete` (every item of it in hand) still open, the next probes in order up to the
    known-wrong verdicts it still `needed` to clear the bound (the agreement probes of the
    items they reach come with them). A family held only in part asks its whole part of
    the sample, in one round: the run decides over every shard's probes, and a part that
    stopped on its own tally would leave the run's undecided whenever another part holds
    a false promotion (measured on the real pool: IIIT5K cleared 0 of 71 in one shard, and
    the run held 1 of 95, upper bound 5.7%, with 74 probes never asked). `answered`: index
    -> verdict state. `stop="sample"`: every probe not yet asked, in one round."""
    if stop == "sample":
        return [i for i in range(len(ordered)) if i not in answered]
    whole = set(complete)
    by_family: dict[str, list[int]] = defaultdict(list)
    for i, p in enumerate(ordered):
        by_family[p.family].append(i)
    tallies = _verdicts((ordered[i], v) for i, v in answered.items())
    out: list[int] = []
    for family, idx in by_family.items():
        k, n, asked = tallies.get(family, (0, 0, 0))
        left = [i for i in idx if i not in answered]
        if family not in whole:
            out += left
            continue
        remaining = sum(ordered[i].expected == "WRONG" for i in left)
        if decide(k, n, asked, remaining, bound) != "open":
            continue
        want = max(1, needed(bound, k) - n)
        for i in left:
            if want <= 0:
                # An item's agreement probe goes with its first known-wrong one, not alone.
                break
            out.append(i)
            want -= ordered[i].expected == "WRONG"
    return sorted(out)


def family_stops(
    ordered: Sequence[Probe],
    answered: Mapping[int, str],
    bound: float,
    *,
    complete: Iterable[str] = (),
) -> dict[str, FamilyStop]:
    """Per family of `ordered`, where its calibration stopped once `next_round` asks
    nothing more."""
    whole = set(complete)
    capacity: dict[str, int] = defaultdict(int)
    items: dict[str, set[str]] = defaultdict(set)
    for p in ordered:
        capacity[p.family] += p.expected == "WRONG"
        items[p.family].add(p.item_id)
    tallies = _verdicts((ordered[i], v) for i, v in answered.items())
    out = {}
    for family in sorted(capacity):
        k, n, asked = tallies.get(family, (0, 0, 0))
        out[family] = FamilyStop(
            stop=decide(k, n, asked, capacity[family] - asked, bound),
            items=len(items[family]),
            capacity=capacity[family],
            asked=asked,
            k=k,
            n=n,
            needed=needed(bound, k),
            complete=family in whole,
        )
    return out


def merge_stops(
    parts: Iterable[Mapping[str, FamilyStop]],
    tallies: Mapping[str, tuple[int, int]],
    bound: float,
) -> dict[str, FamilyStop]:
    """The run's stop per family, from every shard's: capacities and probes asked summed,
    decided again on the run-wide `tallies` (family -> (k, n), the summary's counts)."""
    capacity: dict[str, int] = defaultdict(int)
    asked: dict[str, int] = defaultdict(int)
    items: dict[str, int] = defaultdict(int)
    for part in parts:
        for family, s in part.items():
            capacity[family] += s.capacity
            asked[family] += s.asked
            items[family] += s.items
    out = {}
    for family in sorted(capacity):
        k, n = tallies.get(family, (0, 0))
        left = max(0, capacity[family] - asked[family])
        out[family] = FamilyStop(
            stop=decide(k, n, asked[family], left, bound),
            items=items[family],
            capacity=capacity[family],
            asked=asked[family],
            k=k,
            n=n,
            needed=needed(bound, k),
        )
    return out


def stop_reason(s: FamilyStop, bound: float) -> str:
    """Why a family's promotions are or are not trusted, in a sentence for the card."""
    hi = upper(s.k, s.n)
    verdicts = f"{s.k} of {s.n} known-wrong probes judged CORRECT"
    if s.stop == "cleared":
        if bound >= 1.0:
            return "trusted: hold-back is off (bound 1)"
        return (
            f"trusted: {verdicts}, upper bound {100 * hi:.3f}% < {100 * bound:g}% after "
            f"{s.asked} of {s.capacity} probes"
        )
    if s.stop == "too_small":
        return (
            f"held back, too small to calibrate: {s.items} accepted "
            f"item{'' if s.items == 1 else 's'} could give at "
            f"most {s.capacity} known-wrong probes, and {100 * bound:g}% needs {s.needed} "
            "judged without a false promotion; none was asked"
        )
    if s.stop == "false_promotions":
        return (
            f"held back: {verdicts} (upper bound {100 * hi:.3f}%); the {s.capacity - s.asked} "
            f"probes left could not bring it under {100 * bound:g}% (that needs {s.needed} "
            "verdicts)"
        )
    if s.stop == "exhausted":
        return (
            f"held back: every one of its {s.capacity} probes asked, {s.n} judged CORRECT or "
            f"WRONG (the rest UNSURE or failed), upper bound {100 * hi:.3f}% >= "
            f"{100 * bound:g}%"
        )
    return (
        f"held back, undecided: {verdicts} (upper bound {100 * hi:.3f}%), {s.asked} of "
        f"{s.capacity} probes asked"
    )
