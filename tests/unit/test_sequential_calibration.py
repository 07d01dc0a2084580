"""Sequential calibration (rsieve.judge.sequential): a family is probed in rounds of the
verdicts it still needs, and asking stops as soon as its bound is decided."""

from __future__ import annotations

from collections.abc import Callable

from rsieve.intervals import wilson
from rsieve.judge.calibration import render_calibration_markdown, summarise
from rsieve.judge.probes import Probe, ProbeKind, sample_rank
from rsieve.judge.sequential import (
    FamilyStop,
    decide,
    decided_here,
    family_stops,
    merge_stops,
    needed,
    next_round,
    order_probes,
    whole_families,
)

BOUND = 0.05
WRONG_KINDS_OF_A_WORD: tuple[ProbeKind, ...] = ("other_reference", "truncated", "master_key")


def _probes(family: str, items: int) -> list[Probe]:
    """Per item, an agreement probe and three known-wrong ones (a word reference's)."""
    out = []
    for n in range(items):
        item = f"{family}-{n}"
        for kind in ("agreement", *WRONG_KINDS_OF_A_WORD):
            out.append(
                Probe(
                    kind=kind,
                    expected="CORRECT" if kind == "agreement" else "WRONG",
                    item_id=item,
                    family=family,
                    protocol="alnum",
                    rank=sample_rank(item),
                    question="What word is shown?",
                    references=["HILL"],
                    candidate=f"{kind}-{n}",
                )
            )
    return out


def _run(
    ordered: list[Probe], judge: Callable[[Probe, int], str], complete: list[str]
) -> tuple[dict[int, str], int]:
    """Ask round after round as the judge task does; the answers and the rounds."""
    answered: dict[int, str] = {}
    rounds = 0
    while batch := next_round(ordered, answered, BOUND, complete=complete):
        assert not set(batch) & set(answered)  # nothing asked twice
        rounds += 1
        for i in batch:
            answered[i] = judge(ordered[i], len(answered))
    return answered, rounds


def _wrong_count(ordered: list[Probe], answered: dict[int, str]) -> int:
    return sum(ordered[i].expected == "WRONG" for i in answered)


def test_needed_is_the_least_count_whose_upper_bound_clears() -> None:
    for bound, k in ((0.05, 0), (0.05, 1), (0.05, 3), (0.01, 0), (0.2, 2)):
        n = needed(bound, k)
        assert wilson(k, n)[1] < bound <= wilson(k, n - 1)[1]
    assert needed(0.05) == 73
    assert needed(1.0) == 0


def test_a_clean_judge_is_decided_in_one_round_of_exactly_the_verdicts_needed() -> None:
    ordered = order_probes(_probes("IC13", 50))  # 150 known-wrong probes available
    answered, rounds = _run(
        ordered, lambda p, _: "CORRECT" if p.expected == "CORRECT" else "WRONG", ["IC13"]
    )
    assert rounds == 1 and _wrong_count(ordered, answered) == 73
    stop = family_stops(ordered, answered, BOUND, complete=["IC13"])["IC13"]
    assert (stop.stop, stop.asked, stop.capacity, stop.k, stop.n) == ("cleared", 73, 150, 0, 73)
    # The asked probes are a prefix of the order: item-major, agreement first per item.
    assert sorted(answered) == list(range(len(answered)))
    assert ordered[0].kind == "agreement" and ordered[1].kind == "master_key"
    ranks = [p.rank for p in ordered]
    assert ranks == sorted(ranks)


def test_a_family_that_cannot_give_the_needed_verdicts_is_not_probed() -> None:
    ordered = order_probes(_probes("ABINet", 20))  # 60 known-wrong < 73
    answered, rounds = _run(ordered, lambda p, _: "WRONG", ["ABINet"])
    assert rounds == 0 and not answered
    stop = family_stops(ordered, answered, BOUND, complete=["ABINet"])["ABINet"]
    assert (stop.stop, stop.items, stop.capacity, stop.needed) == ("too_small", 20, 60, 73)
    summary = summarise([], bound=BOUND, stops=[{"ABINet": stop}])
    assert summary["ABINet"]["held_back"] is True
    assert (
        "20 accepted items could give at most 60 known-wrong probes"
        in (summary["ABINet"]["reason"])
    )
    assert "needs 73" in summary["ABINet"]["reason"]
    md = render_calibration_markdown(summary, bound=BOUND)
    assert "| 0 / 60 | yes |" in md and "- ABINet: held back, too small" in md


def test_false_promotions_stop_asking_once_no_probe_left_could_outweigh_them() -> None:
    ordered = order_probes(_probes("SVT", 50))  # 150 available
    # Every tenth known-wrong probe judged CORRECT: 10% false promotions.
    answered, rounds = _run(
        ordered, lambda p, n: "CORRECT" if p.expected == "WRONG" and n % 10 == 0 else "WRONG", []
    )
    # Not complete in the shard: a part asks its whole sample (other shards count too).
    assert _wrong_count(ordered, answered) == 150
    answered, rounds = _run(
        ordered,
        lambda p, n: "CORRECT" if p.expected == "WRONG" and n % 10 == 0 else "WRONG",
        ["SVT"],
    )
    stop = family_stops(ordered, answered, BOUND, complete=["SVT"])["SVT"]
    assert stop.stop == "false_promotions" and stop.k >= 1
    assert stop.asked < stop.capacity  # stopped before the sample ran out
    # At the stop, even all the rest judged WRONG would not clear the bound ...
    assert wilson(stop.k, stop.n + stop.capacity - stop.asked)[1] >= BOUND
    # One round of the 73 verdicts a clean judge would need showed it.
    assert rounds == 1 and stop.asked == 73


def test_unsure_verdicts_never_count_and_are_made_up_in_later_rounds() -> None:
    ordered = order_probes(_probes("IIIT5K", 60))  # 180 available
    answered, rounds = _run(
        ordered,
        lambda p, n: "UNSURE" if p.expected == "WRONG" and n % 4 == 1 else "WRONG",
        ["IIIT5K"],
    )
    stop = family_stops(ordered, answered, BOUND, complete=["IIIT5K"])["IIIT5K"]
    assert stop.stop == "cleared" and stop.n == 73 and stop.asked > 73 and rounds >= 2
    # A judge that is UNSURE of everything uses its sample up and stays held back.
    answered, _ = _run(ordered, lambda p, _: "UNSURE", ["IIIT5K"])
    stop = family_stops(ordered, answered, BOUND, complete=["IIIT5K"])["IIIT5K"]
    assert stop.stop == "exhausted" and stop.n == 0
    # It stopped once the probes left (fewer than 73) could no longer clear the bound.
    assert stop.capacity - stop.asked < 73 <= stop.capacity - stop.asked + 73


def test_the_run_decides_over_every_shards_probes() -> None:
    # IC13 split over two shards, 40 known-wrong probes each: neither part clears 5%,
    # the run's 80 clean verdicts do.
    part = FamilyStop(stop="exhausted", items=14, capacity=40, asked=40, k=0, n=40, needed=73)
    merged = merge_stops([{"IC13": part}, {"IC13": part}], {"IC13": (0, 80)}, BOUND)["IC13"]
    assert (merged.stop, merged.items, merged.capacity, merged.asked) == ("cleared", 28, 80, 80)
    assert decide(0, 40, 40, 0, BOUND) == "exhausted"
    assert decide(1, 40, 40, 200, BOUND) == "open"
    assert decide(1, 40, 40, 20, BOUND) == "false_promotions"
    assert decide(0, 0, 0, 72, BOUND) == "too_small"
    assert decide(9, 9, 9, 0, 1.0) == "cleared"  # a bound of 1 turns hold-back off


def test_a_shard_decides_the_families_it_holds_whole_and_those_too_small_anywhere() -> None:
    in_shard = {"IC13": 36, "SVT": 40, "Tiny": 3, "Unplanned": 5}
    planned = {"IC13": 40, "SVT": 40, "Tiny": 9}
    assert whole_families(in_shard, planned) == ["SVT"]
    # Tiny: 9 items x 8 probe kinds < 73, too small whatever its other shards hold.
    assert decided_here(in_shard, planned, BOUND) == ["SVT", "Tiny"]
