"""Judge calibration as pure functions: the bottom-k sample, known-wrong candidates,
Wilson intervals, per-family summary, hold-back and the promotions listing."""

from __future__ import annotations

from typing import Any

import pytest

from rsieve.judge.calibration import (
    CalibrationRecord,
    calibration_record,
    hold_back,
    promotions_listing,
    render_calibration_markdown,
    summarise,
    untrusted_families,
    wilson,
)
from rsieve.judge.probes import (
    calibration_probes,
    known_wrong,
    probe_prompt,
    sample_for_calibration,
    sample_rank,
)
from rsieve.schemas import Outcome
from rsieve.verify import verify
from tests.unit._records import accepted, judged, make_item


def _accepted(n: int, family: str = "SynthWords", **kw: Any) -> list[Outcome]:
    words = ["COFFEE", "TEA", "BREAD", "Water 12", "MILK 305", "SUGAR", "SALT 7", "OIL"]
    return [
        accepted(
            make_item(
                f"{family}-{i}",
                line=i + 1,
                family=family,
                references=[words[i % len(words)] + str(i)],
                **kw,
            )
        )
        for i in range(n)
    ]


@pytest.mark.parametrize(
    ("k", "n", "lo", "hi"),
    [
        (59, 60, 0.9114, 0.9971),
        (0, 60, 0.0, 0.0602),
        (0, 0, 0.0, 1.0),
        (5, 10, 0.2366, 0.7634),
    ],
)
def test_wilson(k: int, n: int, lo: float, hi: float) -> None:
    got = wilson(k, n)
    assert got == pytest.approx((lo, hi), abs=1e-4)


def test_sample_is_bottom_k_by_hash_and_shard_independent() -> None:
    outs = _accepted(20) + _accepted(5, family="SynthAmounts")
    whole = sample_for_calibration(outs, size=6)
    ranks = sorted(
        (sample_rank(o.generation.item.id), o.generation.item.id)
        for o in outs
        if o.generation.item.family == "SynthWords"
    )
    words = [o.generation.item.id for o in whole if o.generation.item.family == "SynthWords"]
    assert words == [i for _, i in ranks[:6]]
    assert sum(o.generation.item.family == "SynthAmounts" for o in whole) == 5
    # Per shard then run-wide bottom-k == the bottom-k of the whole run.
    records = []
    for shard in (outs[:7], outs[7:15], outs[15:]):
        records += [
            calibration_record(p, model="m", prompt=probe_prompt(p), raw_output="CORRECT")
            for p in calibration_probes(shard, size=6)
        ]
    summary = summarise(records, size=6)
    assert summary["SynthWords"]["items"] == 6 and summary["SynthAmounts"]["items"] == 5
    assert sample_for_calibration(outs, size=6, rate=0.0) == []


def test_only_verifier_acceptances_are_sampled() -> None:
    item = make_item("x", references=["COFFEE"])
    assert sample_for_calibration([judged(item, "TOFFEE", "CORRECT")], size=5) == []


def test_known_wrong_candidates_are_rejected_by_the_protocol() -> None:
    outs = _accepted(8)
    probes = known_wrong(outs[4], outs)
    kinds = {p.kind: p.candidate for p in probes}
    assert set(kinds) == {"other_reference", "digit_changed", "truncated", "master_key"}
    ref = outs[4].generation.item.references[0]
    changed = kinds["digit_changed"]
    assert len(changed) == len(ref) and sum(a != b for a, b in zip(changed, ref, strict=True)) == 1
    assert ref.startswith(kinds["truncated"]) and kinds["truncated"] != ref
    for p in probes:
        assert p.expected == "WRONG"
        assert not verify("alnum", p.candidate, p.references).accepted


def test_option_letter_swapped() -> None:
    item = make_item(
        "mc",
        family="SynthChoice",
        protocol="mc",
        references=["B"],
        options={"A": "cat", "B": "dog", "C": "cow"},
    )
    probes = {p.kind: p.candidate for p in known_wrong(accepted(item, "B"))}
    assert probes["option_swapped"] == "C"


def _rec(out: Outcome, kind: str, expected: str, raw: str | None) -> CalibrationRecord:
    probes = calibration_probes([out], size=1)
    probe = next(p for p in probes if p.kind == kind)
    assert probe.expected == expected
    return calibration_record(
        probe, model="judge-m", prompt=probe_prompt(probe), raw_output=raw, failure="UNAVAILABLE"
    )


def test_rates_count_only_correct_and_wrong_and_show_the_rest_apart() -> None:
    outs = _accepted(4)
    records = [
        _rec(outs[0], "agreement", "CORRECT", "CORRECT"),
        _rec(outs[1], "agreement", "CORRECT", "UNSURE"),
        _rec(outs[2], "agreement", "CORRECT", None),
        _rec(outs[0], "digit_changed", "WRONG", "WRONG"),
        _rec(outs[1], "truncated", "WRONG", "CORRECT"),
        _rec(outs[3], "master_key", "WRONG", "garbage"),
    ]
    assert [r.verdict for r in records] == [
        "CORRECT",
        "UNSURE",
        "FAILED",
        "WRONG",
        "CORRECT",
        "FAILED",
    ]
    assert [r.failed for r in records] == [False, False, True, False, False, True]
    s = summarise([r.model_dump() for r in records], bound=0.05)["SynthWords"]
    # UNSURE and FAILED are in neither n.
    assert (s["sensitivity"]["k"], s["sensitivity"]["n"]) == (1, 1)
    assert (s["false_promotion"]["k"], s["false_promotion"]["n"]) == (1, 2)
    assert s["false_promotion_by_kind"] == {
        "digit_changed": {"k": 0, "n": 1},
        "truncated": {"k": 1, "n": 1},
    }
    assert s["probes"] == {"agreement": 3, "known_wrong": 3}
    assert s["unsure"] == {"agreement": 1, "known_wrong": 0}
    assert s["failed"] == 2 and s["failed_by_probe"] == {"agreement": 1, "known_wrong": 1}
    assert s["failure_causes"] == {"call_failed": 1, "judge_unparsable": 1}
    assert s["calibrated"] is True
    assert s["held_back"] is True and s["models"] == ["judge-m"]
    assert s["model_kinds"] == {"judge-m": None}
    md = render_calibration_markdown({"SynthWords": s}, bound=0.05)
    assert "| SynthWords | 4 | 1/1 = 100.0%" in md
    assert "| 1 / 0 | 1 / 1 | - | yes |" in md  # UNSURE, failed (agreement / known-wrong), no stop
    assert "- SynthWords: `call_failed` 1, `judge_unparsable` 1" in md


@pytest.mark.parametrize("raws", [["UNSURE"], [None], ["", "UNSURE", None, "maybe"]])
def test_no_correct_or_wrong_verdict_is_na_and_held_back(raws: list[str | None]) -> None:
    outs = _accepted(6)
    probes = calibration_probes(outs, size=6)
    records = [
        calibration_record(
            p,
            model="judge-abstain",
            prompt=probe_prompt(p),
            raw_output=raws[i % len(raws)],
            failure="UNAVAILABLE",
            model_kind="stand-in",
        )
        for i, p in enumerate(probes)
    ]
    summary = summarise(records, bound=0.05)
    s = summary["SynthWords"]
    assert s["sensitivity"]["n"] == s["false_promotion"]["n"] == 0
    assert s["sensitivity"]["rate"] is None and s["false_promotion"]["rate"] is None
    assert s["calibrated"] is False and s["held_back"] is True
    assert s["model_kinds"] == {"judge-abstain": "stand-in"}
    unsure = sum(s["unsure"].values())
    assert unsure + s["failed"] == len(records) == sum(s["probes"].values())
    md = render_calibration_markdown(summary, bound=0.05)
    row = next(line for line in md.splitlines() if line.startswith("| SynthWords"))
    assert row.startswith("| SynthWords | 6 | n/a | n/a |")
    assert "0/0" not in md and "0.0%" not in row
    assert row.endswith(" yes |")
    # The family's judge promotions are held back, as with no calibration at all.
    promoted = judged(
        make_item("p", family="SynthWords", references=["COLOUR"]), "it reads COLOUR", "CORRECT"
    )
    assert untrusted_families(summary, 0.05) == {"SynthWords"}
    held = hold_back([promoted], summary, 0.05)[0]
    assert (held.place, held.reason, held.promoted_by) == ("rejected", "judge_untrusted", None)


def test_no_false_promotion_figure_holds_back_even_with_agreement() -> None:
    outs = _accepted(3)
    probes = calibration_probes(outs, size=3)
    records = [
        calibration_record(
            p,
            model="j",
            prompt=probe_prompt(p),
            raw_output="CORRECT" if p.kind == "agreement" else "UNSURE",
        )
        for p in probes
    ]
    s = summarise(records, bound=0.05)["SynthWords"]
    assert (s["sensitivity"]["k"], s["sensitivity"]["n"]) == (3, 3)
    assert s["false_promotion"]["n"] == 0 and s["held_back"] is True


def test_records_stored_before_failed_existed_read_as_failed() -> None:
    outs = _accepted(2)
    agreement = next(p for p in calibration_probes(outs[:1], size=1) if p.kind == "agreement")
    wrong = next(p for p in calibration_probes(outs[1:], size=1) if p.kind != "agreement")
    old = [
        # A failed call, then an unparsable output, as the old code stored them.
        calibration_record(agreement, model="j", prompt="P", raw_output="CORRECT").model_dump()
        | {"verdict": "UNSURE", "cause": "judge_failed: timeout", "failed": True, "raw_output": ""},
        calibration_record(wrong, model="j", prompt="P", raw_output="WRONG").model_dump()
        | {"verdict": "UNSURE", "cause": "judge_unparsable", "failed": False},
    ]
    for r in old:
        del r["model_kind"]
    s = summarise(old)["SynthWords"]
    assert s["unsure"] == {"agreement": 0, "known_wrong": 0}
    assert s["failed_by_probe"] == {"agreement": 1, "known_wrong": 1}
    assert s["failure_causes"] == {"call_failed": 1, "judge_unparsable": 1}
    assert s["model_kinds"] == {"j": None}


def test_hold_back_demotes_judge_promotions_of_untrusted_families() -> None:
    words = make_item("w", family="SynthWords", references=["COLOUR"])
    amounts = make_item("a", line=2, family="SynthAmounts", references=["11850"])
    other = make_item("o", line=3, family="SynthOther", references=["TREE"])
    outs = [
        judged(words, "it reads COLOUR", "CORRECT"),
        judged(amounts, "11,850 pesos", "CORRECT"),
        judged(other, "BUSH", "WRONG"),
        accepted(make_item("v", line=4)),
    ]
    trusted = {"false_promotion": {"k": 0, "n": 200, "lo": 0.0, "hi": 0.0188}}
    untrusted = {"false_promotion": {"k": 2, "n": 60, "lo": 0.009, "hi": 0.114}}
    held = hold_back(outs, {"SynthWords": trusted, "SynthAmounts": untrusted}, 0.05)
    assert [(o.place, o.reason, o.promoted_by) for o in held] == [
        ("accepted", None, "judge"),
        ("rejected", "judge_untrusted", None),
        ("rejected", "wrong_answer", None),
        ("accepted", None, "verifier"),
    ]
    assert held[1].verdict is not None and held[1].verdict.verdict == "CORRECT"
    # No calibration for a family with promotions: held back.
    assert hold_back(outs[:1], {}, 0.05)[0].reason == "judge_untrusted"
    listing = promotions_listing(held)
    assert [(r["id"], r["held_back"]) for r in listing] == [("a", True), ("w", False)]
    assert (listing[1]["question"], listing[1]["reference"], listing[1]["candidate"]) == (
        words.question,
        "COLOUR",
        "it reads COLOUR",
    )


def test_a_bound_of_one_turns_hold_back_off() -> None:
    from rsieve.judge.calibration import _untrusted

    unmeasured = {"false_promotion": {"k": 0, "n": 0, "hi": 1.0}}
    measured = {"false_promotion": {"k": 3, "n": 10, "hi": 0.6}}
    assert _untrusted(unmeasured, 0.05) and _untrusted(measured, 0.05)
    assert not _untrusted(unmeasured, 1.0) and not _untrusted(measured, 1.0)
