"""Training acceptance (rsieve.verify.TRAINING_RULES): near misses the benchmark's scorer
passes (ANLS "Jane Smith" for "John Smith", relaxed "105" for "100") are refused as
training targets, while the benchmark's own decision stays exactly its scorer's; through
the cascade (`near_miss`), calibration probes, the run report, rows and recheck."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from rsieve.compact.rows import assemble_rows
from rsieve.compact.splits import target_variant
from rsieve.dataset.recheck import recheck_entries
from rsieve.dataset.report import finish_report, report_part
from rsieve.judge.cascade import (
    apply_verdict,
    judge_prompt,
    needs_judge,
    skip_judge,
    verify_generation,
)
from rsieve.judge.probes import NEAR_MISS_KINDS, known_wrong
from rsieve.schemas import REJECT_REASONS, Outcome
from rsieve.settings import Settings
from rsieve.verify import DEFAULT_TRAINING_RULES, TrainingPolicy, verify
from tests.unit._records import accepted, make_generation, make_item

CASES = Path(__file__).parent / "cases"
RULE = DEFAULT_TRAINING_RULES  # anls -> anls_exact, relaxed -> relaxed_precision


def _corpus(protocol: str) -> list[dict[str, Any]]:
    path = CASES / f"conformance_{protocol}.jsonl"
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]


def _benchmark(decision: Any) -> tuple[Any, ...]:
    d = decision
    return (d.protocol, d.version, d.constants, d.accepted, d.score, d.variant, d.threshold)


# --- 1. per protocol -------------------------------------------------------------------

NEAR_MISSES = [
    ("anls", "Jane Smith", "John Smith"),
    ("anls", "2012-03-04", "2021-03-04"),
    ("relaxed", "105", "100"),
    ("relaxed", "2015", "2020"),
    ("relaxed", "10.6", "10.5"),
]


@pytest.mark.parametrize(("protocol", "pred", "ref"), NEAR_MISSES)
def test_near_miss_benchmark_passes_training_refuses(protocol: str, pred: str, ref: str) -> None:
    plain = verify(protocol, pred, [ref])
    d = verify(protocol, pred, [ref], training=RULE[protocol])
    assert plain.accepted and plain.training is None and not plain.near_miss
    assert _benchmark(d) == _benchmark(plain)
    assert d.training is not None and d.training.rule == RULE[protocol]
    assert (d.training.accepted, d.training.variant) == (False, None)
    assert d.near_miss


@pytest.mark.parametrize(
    ("protocol", "pred", "ref", "variant"),
    [
        ("anls", "  john   SMITH ", "John Smith", "whole"),
        ("anls", "John Smith\nbecause the sign on the door says so", "John Smith", "first_line"),
        ("relaxed", "10.50", "10.5", "whole"),
        ("relaxed", "12%", "0.12", "whole"),
        ("relaxed", "Yes", "yes", "whole"),
        ("relaxed", "100\n\nas the tallest bar shows", "100", "first_line"),
    ],
)
def test_exact_forms_accepted(protocol: str, pred: str, ref: str, variant: str) -> None:
    d = verify(protocol, pred, [ref], training=RULE[protocol])
    assert d.accepted and d.training is not None
    assert (d.training.accepted, d.training.variant) == (True, variant)
    assert not d.near_miss
    assert d.training.constants  # recorded, so the decision can be recomputed


def test_training_takes_the_first_form_it_accepts_not_the_benchmarks() -> None:
    # The whole answer is a near miss (ANLS 0.83); its first line equals the reference.
    d = verify("anls", "John Smith\nx", ["John Smith"], training="anls_exact")
    assert (d.accepted, d.variant) == (True, "whole")
    assert d.training is not None and d.training.variant == "first_line"
    assert target_variant(d) == "first_line"
    assert target_variant(d.model_copy(update={"training": None})) == "whole"


# --- 2. the benchmark decision is unchanged by training ---------------------------------


@pytest.mark.parametrize("protocol", ["anls", "relaxed", "vqa"])
def test_conformance_benchmark_decision_unchanged_by_training(protocol: str) -> None:
    rule = RULE.get(protocol, "benchmark")
    cases = _corpus(protocol)
    assert len(cases) >= 200
    for case in cases:
        pred, refs = case["prediction"], case["references"]
        plain = verify(protocol, pred, refs)
        for name in {rule, "benchmark"}:
            d = verify(protocol, pred, refs, training=name)
            assert _benchmark(d) == _benchmark(plain), (case, name)
            assert d.training is not None
            # Training acceptance never accepts what the benchmark refuses.
            assert not d.training.accepted or d.accepted, (case, name)
            assert (d.training.variant is not None) == d.training.accepted, (case, name)


# --- 3. protocols whose pass is already exact ------------------------------------------


@pytest.mark.parametrize("protocol", ["alnum", "exact", "number", "mc", "vqa", "math"])
def test_benchmark_rule_on_exact_protocols_is_the_benchmarks_pass(protocol: str) -> None:
    assert TrainingPolicy().rule_for("AnyFamily", protocol) == "benchmark"
    cases = [c for c in _corpus(protocol) if protocol != "vqa" or len(c["references"]) == 10]
    assert len(cases) >= 5
    seen = set()
    for case in cases:
        options = {"options": case["options"]} if "options" in case else {}
        d = verify(
            protocol, case["prediction"], case["references"], training="benchmark", **options
        )
        assert d.training is not None
        assert (d.training.accepted, d.training.variant) == (d.accepted, d.variant), case
        assert not d.near_miss
        seen.add(d.accepted)
    assert seen == {True, False}  # the corpus holds both passes and failures


# --- 4. policy and settings ------------------------------------------------------------


def test_policy_family_overrides_protocol() -> None:
    policy = TrainingPolicy(by_protocol={"anls": "anls_exact"}, by_family={"Docs": "benchmark"})
    assert policy.rule_for("Docs", "anls") == "benchmark"
    assert policy.rule_for("Other", "anls") == "anls_exact"
    assert policy.rule_for("Other", "alnum") == "benchmark"  # not named: benchmark


def test_policy_refuses_unknown_rules_and_rules_for_other_protocols() -> None:
    with pytest.raises(ValueError, match="unknown training rule"):
        TrainingPolicy(by_protocol={"anls": "nope"}).rule_for("F", "anls")
    with pytest.raises(ValueError, match="judges only"):
        TrainingPolicy(by_family={"F": "anls_exact"}).rule_for("F", "relaxed")
    with pytest.raises(ValueError, match="judges only"):
        TrainingPolicy(by_protocol={"mc": "relaxed_precision"}).rule_for("F", "mc")


@pytest.mark.parametrize(
    "fields",
    [
        {"training_rules": {"anls": "nope"}},
        {"training_rules": {"mc": "anls_exact"}},
        {"training_rules": {"no_such_protocol": "benchmark"}},
        {"family_training_rules": {"Docs": "nope"}},
    ],
)
def test_settings_refuse_bad_training_rules(fields: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        Settings(**fields)


def test_settings_default_policy() -> None:
    policy = Settings().training_policy()
    assert policy.rule_for("X", "anls") == "anls_exact"
    assert policy.rule_for("X", "relaxed") == "relaxed_precision"
    assert policy.rule_for("X", "vqa") == "benchmark"
    custom = Settings(family_training_rules={"Docs": "benchmark"}).training_policy()
    assert custom.rule_for("Docs", "anls") == "benchmark"


# --- 5. the cascade --------------------------------------------------------------------


def _pending(
    protocol: str = "anls", answer: str = "Jane Smith", ref: str = "John Smith"
) -> Outcome:
    item = make_item("nm-1", family="Names", protocol=protocol, references=[ref])
    item = item.model_copy(update={"question": "Who signed the letter?"})
    return verify_generation(make_generation(item, answer))


def test_verifier_rejects_a_near_miss_for_the_judge() -> None:
    out = _pending()
    assert (out.place, out.reason, out.promoted_by) == ("rejected", "near_miss", None)
    assert needs_judge(out)
    assert out.decision is not None and out.decision.accepted and out.decision.near_miss
    assert "near_miss" in REJECT_REASONS


@pytest.mark.parametrize(
    ("raw", "verdict"),
    [("<think>another name</think>\nWRONG", "WRONG"), ("UNSURE", "UNSURE"), (None, "FAILED")],
)
def test_near_miss_not_promoted_keeps_its_reason(raw: str | None, verdict: str) -> None:
    pending = _pending()
    out = apply_verdict(pending, model="j", prompt=judge_prompt(pending), raw_output=raw)
    assert (out.place, out.reason, out.promoted_by) == ("rejected", "near_miss", None)
    assert out.verdict is not None and out.verdict.verdict == verdict
    assert skip_judge(pending).reason == "near_miss"


def test_a_correct_verdict_promotes_a_near_miss() -> None:
    pending = _pending()
    out = apply_verdict(pending, model="j", prompt=judge_prompt(pending), raw_output="CORRECT")
    assert (out.place, out.reason, out.promoted_by) == ("accepted", None, "judge")
    assert out.verdict is not None and out.verdict.guard is None


def test_a_guarded_correct_on_a_near_miss_keeps_near_miss() -> None:
    pending = _pending("relaxed", "105", "100")  # the guard: no reference number in it
    assert pending.reason == "near_miss"
    out = apply_verdict(pending, model="j", prompt=judge_prompt(pending), raw_output="CORRECT")
    assert (out.place, out.reason, out.promoted_by) == ("rejected", "near_miss", None)
    assert out.verdict is not None and out.verdict.verdict == "CORRECT" and out.verdict.guard


def test_benchmark_policy_accepts_the_near_miss() -> None:
    item = make_item("nm-1", family="Names", protocol="anls", references=["John Smith"])
    gen = make_generation(item, "Jane Smith")
    for policy in (
        TrainingPolicy(by_protocol={"anls": "benchmark"}),
        TrainingPolicy(by_family={"Names": "benchmark"}),
    ):
        out = verify_generation(gen, policy)
        assert (out.place, out.reason, out.promoted_by) == ("accepted", None, "verifier")
        assert out.decision is not None and out.decision.training is not None
        assert out.decision.training.rule == "benchmark" and not out.decision.near_miss


# --- 6. calibration --------------------------------------------------------------------


def _refused_by_training(out: Outcome, candidate: str, policy: TrainingPolicy) -> bool:
    item = out.generation.item
    rule = policy.rule_for(item.family, item.protocol)
    d = verify(item.protocol, candidate, item.references, training=rule)
    return d.training is not None and not d.training.accepted


def _probes(protocol: str, ref: str, policy: TrainingPolicy | None = None) -> list[Any]:
    out = accepted(
        make_item(f"c-{protocol}-{ref}", family="F", protocol=protocol, references=[ref])
    )
    probes = known_wrong(out, (), policy)
    assert probes and all(p.expected == "WRONG" for p in probes)
    assert all(_refused_by_training(out, p.candidate, policy or TrainingPolicy()) for p in probes)
    return probes


@pytest.mark.parametrize(
    ("protocol", "ref", "kind"),
    [("anls", "John Smith", "letter_changed"), ("anls", "2021-03-04", "digits_swapped")],
)
def test_near_miss_probes_are_near_misses(protocol: str, ref: str, kind: str) -> None:
    probe = next(p for p in _probes(protocol, ref) if p.kind == kind)
    d = verify(protocol, probe.candidate, [ref], training=RULE[protocol])
    assert d.near_miss and probe.candidate != ref and len(probe.candidate) == len(ref)
    if kind == "digits_swapped":
        diff = [i for i, (a, b) in enumerate(zip(probe.candidate, ref, strict=True)) if a != b]
        assert len(diff) == 2 and diff[1] == diff[0] + 1
        assert probe.candidate[diff[0]] == ref[diff[1]] and probe.candidate[diff[1]] == ref[diff[0]]


def test_number_off_probe_on_relaxed() -> None:
    probes = {p.kind: p.candidate for p in _probes("relaxed", "100")}
    assert probes["number_off"] == "103"
    assert verify("relaxed", "103", ["100"], training="relaxed_precision").near_miss


@pytest.mark.parametrize(
    ("protocol", "ref", "policy"),
    [("alnum", "COFFEE", None), ("anls", "John Smith", TrainingPolicy(by_protocol={}))],
)
def test_no_near_miss_probes_under_benchmark(protocol: str, ref: str, policy: Any) -> None:
    kinds = {p.kind for p in _probes(protocol, ref, policy)}
    assert kinds and not kinds & set(NEAR_MISS_KINDS)


def test_every_known_wrong_probe_is_refused_by_training_with_peers() -> None:
    refs = ["John Smith", "John Smyth", "Acme Corporation Ltd", "2021-03-04"]
    outs = [
        accepted(make_item(f"p{i}", line=i + 1, family="Docs", protocol="anls", references=[r]))
        for i, r in enumerate(refs)
    ]
    for out in outs:
        probes = known_wrong(out, outs)
        assert probes
        for p in probes:
            assert _refused_by_training(out, p.candidate, TrainingPolicy()), p


# --- 7. the run report -----------------------------------------------------------------


def _names_outcomes(prefix: str, line: int) -> list[Outcome]:
    def item(i: int, ref: str = "John Smith") -> Any:
        return make_item(
            f"{prefix}{i}", line=line + i, family="Names", protocol="anls", references=[ref]
        )

    def pending(i: int, answer: str) -> Outcome:
        return verify_generation(make_generation(item(i), answer))

    def judged(i: int, answer: str, raw: str) -> Outcome:
        p = pending(i, answer)
        return apply_verdict(p, model="j", prompt=judge_prompt(p), raw_output=raw)

    return [
        judged(0, "Jane Smith", "WRONG"),  # near miss, not promoted
        judged(1, "Joan Smith", "CORRECT"),  # near miss, promoted
        accepted(item(2)),  # exact: not a near miss
        judged(3, "Bob Jones", "WRONG"),  # the benchmark refuses it: not a near miss
    ]


def test_report_part_counts_near_misses_per_family() -> None:
    charts = verify_generation(
        make_generation(
            make_item("c0", line=99, family="Charts", protocol="relaxed", references=["100"]), "105"
        )
    )
    part = report_part([*_names_outcomes("n", 1), skip_judge(charts)], [])
    names, chart = part["families"]["Names"], part["families"]["Charts"]
    assert (names["near_misses"], names["near_misses_promoted"]) == (2, 1)
    assert names["rejected_by_reason"] == {"near_miss": 1, "wrong_answer": 1}
    assert [e["id"] for e in names["near_miss_examples"]] == ["n0", "n1"]
    first = names["near_miss_examples"][0]
    assert (first["answer"], first["rule"], first["verdict"]) == (
        "Jane Smith",
        "anls_exact",
        "WRONG",
    )
    assert first["place"] == "rejected"
    assert names["near_miss_examples"][1]["place"] == "accepted"
    assert (chart["near_misses"], chart["near_misses_promoted"]) == (1, 0)
    assert chart["rejected_by_reason"] == {"near_miss": 1}


def test_finish_report_sums_near_misses_and_caps_examples() -> None:
    parts = [report_part(_names_outcomes("a", 1), []), report_part(_names_outcomes("b", 5), [])]
    names = finish_report(parts, run="r", lines=8)["families"]["Names"]
    assert (names["near_misses"], names["near_misses_promoted"]) == (4, 2)
    assert len(names["near_miss_examples"]) == 3


# --- 8. recheck ------------------------------------------------------------------------


def _accepted_entry(answer: str, policy: TrainingPolicy | None = None) -> dict[str, Any]:
    item = make_item("r-1", family="Names", protocol="anls", references=["John Smith"])
    out = verify_generation(make_generation(item, answer), policy)
    assert out.place == "accepted" and out.promoted_by == "verifier"
    rows = assemble_rows([out])
    split = next(name for name in rows if name.endswith("_RS_think"))
    entry: dict[str, Any] = rows[split][0]["qa"][0]
    return entry


def test_rows_train_on_the_training_form_and_recheck_agrees() -> None:
    entry = _accepted_entry("John Smith\nx")
    v = entry["verification"]
    assert (v["accepted"], v["variant"], v["training_rule"]) == (True, "whole", "anls_exact")
    assert (v["training_accepted"], v["training_variant"]) == (True, "first_line")
    assert json.loads(v["training_constants"])["score"] == 1.0
    assert entry["answer"] == "John Smith"
    result = recheck_entries([("RS_think", "Names", entry)], calibration=None, bound=None)
    assert (result.decisions, result.agreed, result.differences) == (1, 1, [])
    entry["answer"] = "John Smith\nx"  # the benchmark's form: not the training target
    result = recheck_entries([("RS_think", "Names", entry)], calibration=None, bound=None)
    assert [d["check"] for d in result.differences] == ["answer"]


def test_recheck_flags_a_near_miss_in_an_accepted_split() -> None:
    entry = _accepted_entry("Jane Smith", TrainingPolicy(by_protocol={"anls": "benchmark"}))
    consistent = recheck_entries([("RS_think", "Names", entry)], calibration=None, bound=None)
    assert consistent.differences == [] and consistent.agreed == 1
    # The stored record claims the anls_exact rule accepted the near miss.
    anls_exact = verify("anls", "John Smith", ["John Smith"], training="anls_exact").training
    assert anls_exact is not None
    entry["verification"] |= {
        "training_rule": "anls_exact",
        "training_constants": json.dumps(anls_exact.constants, sort_keys=True),
        "training_accepted": True,
        "training_variant": "whole",
    }
    result = recheck_entries([("RS_think", "Names", entry)], calibration=None, bound=None)
    checks = {d["check"] for d in result.differences}
    assert {"near_miss_accepted", "decision"} <= checks
    assert result.agreed == 0
