"""rsieve.rewards: the factory's verifiers as RL rewards (TRL, verl, EasyR1). Golden cases
per interface, and parity with the factory's own decisions on stored records."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rsieve.generate.think import parse_output
from rsieve.judge.cascade import DEFAULT_POLICY, verify_generation
from rsieve.rewards import (
    GroundTruth,
    Score,
    decode,
    disagreements,
    easyr1,
    encode,
    factory_accepts,
    ground_truth_of,
    reference_parseable,
    score,
    trl,
    verl,
)
from rsieve.schemas import Generation, Item, Outcome, Samples
from rsieve.verify import PROTOCOLS, TrainingPolicy
from tests.unit._records import accepted, failed, judged, make_generation, make_item

OPTIONS = {"A": "cat", "B": "dog", "C": "bird"}


def gt(
    references: list[str],
    protocol: str = "alnum",
    *,
    rule: str = "benchmark",
    options: dict[str, str] | None = None,
    family: str = "F",
) -> str:
    return encode(
        GroundTruth(
            references=references,
            protocol=protocol,
            options=options,
            training_rule=rule,
            family=family,
        )
    )


MC = gt(["B"], "mc", options=OPTIONS, family="MMBench")


def rewards(completion: str, truth: str, finish_reason: str = "stop") -> dict[str, Any]:
    """The accuracy through each interface, as each trainer reads it."""
    v = verl.compute_score(
        "rsieve/F", completion, truth, extra_info={"finish_reason": finish_reason}
    )
    e = easyr1.compute_score(
        [
            {
                "response": completion,
                "response_length": 1,
                "ground_truth": truth,
                "finish_reason": finish_reason,
            }
        ]
    )[0]
    return {
        "trl": trl.accuracy_reward(
            [completion], ground_truth=[truth], finish_reason=[finish_reason]
        )[0],
        "verl": v["score"],
        "verl_valid": v["valid"],
        "easyr1": e["accuracy"],
    }


def factory(item: Item, raw: str, finish_reason: str = "stop") -> bool:
    """What the factory decides on `raw`: the generator's parse, then the verifier."""
    parsed = parse_output(raw, finish_reason)
    gen = make_generation(
        item,
        parsed.answer,
        reasoning=parsed.reasoning,
        raw_output=raw,
        failure=parsed.failure,
        finish_reason=finish_reason,
    )
    return factory_accepts(verify_generation(gen))


# --- the ground truth ------------------------------------------------------------------


def test_encode_is_compact_sorted_json_and_decodes_from_string_mapping_and_model() -> None:
    truth = GroundTruth(
        references=["B"], protocol="mc", options=OPTIONS, training_rule="benchmark", family="M"
    )
    text = encode(truth)
    assert " " not in text.replace("cat", "").replace("dog", "").replace("bird", "")
    assert list(json.loads(text)) == sorted(json.loads(text))
    assert decode(text) == truth
    assert decode(json.loads(text)) == truth
    assert decode(truth) is truth


def test_decode_takes_a_parquet_struct_with_arrays_and_null_filled_options() -> None:
    class Array(list[str]):
        def tolist(self) -> list[str]:
            return list(self)

    row = json.loads(MC)
    row["references"] = tuple(row["references"])
    row["options"] = {**OPTIONS, "D": None, "E": None}
    assert decode(row).options == OPTIONS and decode(row).references == ["B"]
    row["references"] = Array(["B"])
    assert decode(row).references == ["B"]


@pytest.mark.parametrize(
    "garbage",
    ["", "not json", "[1, 2]", '{"references": ["a"]}', 42, None, gt(["a"])[:-1]],
)
def test_decode_refuses_garbage_with_a_value_error(garbage: Any) -> None:
    with pytest.raises(ValueError, match="ground_truth"):
        decode(garbage)


def test_a_training_rule_that_does_not_exist_or_does_not_apply_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown training rule"):
        decode(gt(["a"]).replace('"benchmark"', '"lenient"'))
    with pytest.raises(ValueError, match="judges only"):
        GroundTruth(references=["1"], protocol="number", training_rule="anls_exact", family="F")


def test_ground_truth_of_an_item_carries_its_protocol_version() -> None:
    item = make_item(protocol="mc", references=["B"], options=OPTIONS, family="MMBench")
    truth = ground_truth_of(item, "benchmark")
    assert truth.protocol_version == PROTOCOLS["mc"].version
    assert (truth.references, truth.options, truth.family) == (["B"], OPTIONS, "MMBench")


def test_a_ground_truth_from_another_protocol_version_is_refused() -> None:
    stale = json.loads(gt(["COFFEE"]))
    stale["protocol_version"] = "0"
    with pytest.raises(ValueError, match="version 0"):
        score("COFFEE", json.dumps(stale))


# --- unparseable references --------------------------------------------------------------


@pytest.mark.parametrize(
    "truth",
    [
        gt([], "alnum"),
        gt(["", "  "], "exact"),
        gt(["!!!"], "alnum"),
        gt(["abc"], "number"),
        gt(["E"], "mc", options=OPTIONS),
        gt(["dog"], "mc", options=OPTIONS),  # option text, not its letter: mc never matches it
        gt(["\\text{}"], "math"),
        gt(["COFFEE"], "no_such_protocol"),
    ],
)
def test_an_unparseable_reference_never_rewards(truth: str) -> None:
    assert not reference_parseable(truth)
    got = rewards(decode(truth).references[0] if decode(truth).references else "x", truth)
    assert got == {"trl": None, "verl": 0.0, "verl_valid": 0.0, "easyr1": 0.0}


def test_an_empty_reference_against_an_empty_normal_form_gives_no_one() -> None:
    # alnum normalises "!!!" and "???" both to "": the benchmark would call them equal.
    assert PROTOCOLS["alnum"]("???", ["!!!"]) == 1.0
    assert score("???", gt(["!!!"])).accuracy is None


PARSEABLE: list[tuple[list[str], str, dict[str, str] | None]] = [
    (["COFFEE"], "alnum", None),
    (["Paris"], "exact", None),
    (["1,234"], "number", None),
    (["John Smith"], "anls", None),
    (["12.5%"], "relaxed", None),
    (["two"] * 10, "vqa", None),
    (["(B)"], "mc", OPTIONS),
    (["C"], "mc", None),
    (["\\frac{1}{2}"], "math", None),
    (["???"], "math", None),  # Math-Verify matches it as a string: "$???$" is accepted
]


@pytest.mark.parametrize(("references", "protocol", "options"), PARSEABLE)
def test_a_reference_with_a_form_is_parseable(
    references: list[str], protocol: str, options: dict[str, str] | None
) -> None:
    assert reference_parseable(gt(references, protocol, options=options))


def test_every_protocol_has_a_parseable_case_above() -> None:
    # A new protocol needs its own look at what "no form" means for its references.
    assert {protocol for _, protocol, _ in PARSEABLE} == set(PROTOCOLS)


# --- golden cases through every interface -------------------------------------------------


@pytest.mark.parametrize(
    ("completion", "truth", "expected"),
    [
        ("<think>I read it.</think><answer>COFFEE</answer>", gt(["COFFEE"]), 1.0),
        ("I read it.<answer>coffee</answer>", gt(["COFFEE"]), 1.0),
        ("<think>I read it.</think><answer>TEA</answer>", gt(["COFFEE"]), 0.0),
        ("<think>I read it.</think>COFFEE", gt(["COFFEE"]), 1.0),
        ("<think>Options…</think>B", MC, 1.0),
        ("<think>Options…</think>(B) dog", MC, 1.0),
        ("<think>Options…</think>dog", MC, 1.0),
        ("<think>Options…</think>cat", MC, 0.0),
        ("<think>Options…</think>B. cat", MC, 0.0),  # letter and another option's text
        ("<think>Options…</think>\\boxed{B}", MC, 1.0),
        ("<think>Options…</think>The answer is B.", MC, 1.0),
        # alnum reads no \boxed{}: neither does the factory
        ("<think>I read it.</think>\\boxed{COFFEE}", gt(["COFFEE"]), 0.0),
        ("<think>Half is</think>\\boxed{\\frac{1}{2}}", gt(["0.5"], "math"), 1.0),
    ],
)
def test_golden_answers_score_alike_everywhere_and_as_the_factory(
    completion: str, truth: str, expected: float
) -> None:
    got = rewards(completion, truth)
    assert got == {"trl": expected, "verl": expected, "verl_valid": 1.0, "easyr1": expected}
    g = decode(truth)
    item = make_item(protocol=g.protocol, references=g.references, options=g.options)
    assert factory(item, completion) is (expected == 1.0)


@pytest.mark.parametrize(
    ("completion", "finish_reason", "failure"),
    [
        ("<think>I was reading the lett", "stop", "truncated_reasoning"),
        ("<think>I was reading the lett", "length", "truncated_reasoning"),
        ("<think>Done.</think>COFF", "length", None),  # cut after the reasoning: an answer
        ("<think>Done.</think>", "stop", "empty_answer"),
        ("<think>Done.</think>   ", "length", "truncated_answer"),
        ("<think>Done.</think><answer>COFFEE", "length", "truncated_answer"),
        ("I'm sorry, but I can't help with that.", "stop", "refusal"),
        ("COFFEE COFFEE COFFEE", "repetition_loop", "repetition_loop"),
        ("COFFEE", "length", "truncated_reasoning"),
    ],
)
def test_failures_score_zero_with_no_format(
    completion: str, finish_reason: str, failure: str | None
) -> None:
    truth = gt(["COFFEE"])
    result = score(completion, truth, finish_reason=finish_reason)
    assert result.failure == failure
    if failure is None:
        return
    assert (result.accuracy, result.format) == (0.0, 0.0)
    assert rewards(completion, truth, finish_reason) == {
        "trl": 0.0,
        "verl": 0.0,
        "verl_valid": 1.0,
        "easyr1": 0.0,
    }
    assert trl.format_reward([completion], finish_reason=[finish_reason]) == [0.0]
    assert (
        verl.compute_score("rsieve/F", completion, truth, {"finish_reason": finish_reason})[
            "format"
        ]
        == 0.0
    )


def test_a_cut_completion_scored_as_stopped_is_what_the_trainer_must_say() -> None:
    truth = gt(["COFFEE"])
    assert score("COFFEE", truth).accuracy == 1.0
    assert score("COFFEE", truth, finish_reason="length").accuracy == 0.0


def test_format_is_one_for_a_parsed_answer_right_or_wrong() -> None:
    assert trl.format_reward(["<think>r</think>TEA", "TEA", "<think>r"]) == [1.0, 1.0, 0.0]
    assert score("<think>r</think>TEA", gt(["COFFEE"])) == Score(0.0, 1.0, "TEA", None)


def test_a_near_miss_under_the_training_rule_is_no_reward() -> None:
    strict = gt(["John Smith"], "anls", rule="anls_exact")
    lenient = gt(["John Smith"], "anls", rule="benchmark")
    assert rewards("<think>r</think>Jane Smith", strict)["trl"] == 0.0
    assert rewards("<think>r</think>Jane Smith", lenient)["trl"] == 1.0
    assert rewards("<think>r</think>john  smith", strict)["trl"] == 1.0
    relaxed = gt(["100"], "relaxed", rule="relaxed_precision")
    assert score("105", relaxed).accuracy == 0.0
    assert score("105", gt(["100"], "relaxed")).accuracy == 1.0
    item = make_item(protocol="anls", references=["John Smith"], family="DocVQA")
    assert not factory(item, "<think>r</think>Jane Smith")


def test_partial_is_the_benchmark_score() -> None:
    strict = gt(["John Smith"], "anls", rule="anls_exact")
    assert score("Jane Smith", strict, partial=True).accuracy == pytest.approx(0.7)
    assert score("Jane Smith", strict).accuracy == 0.0
    assert score("Nobody", strict, partial=True).accuracy == 0.0
    vqa = gt(["two"] * 3 + ["three"] * 7, "vqa")
    assert score("two", vqa, partial=True).accuracy == pytest.approx(0.9)
    assert score("<think>r", strict, partial=True).accuracy == 0.0


# --- the interfaces' own conventions ---------------------------------------------------


def test_trl_reads_conversational_completions_and_ignores_the_trainers_kwargs() -> None:
    truth = gt(["COFFEE"])
    completions: list[list[dict[str, Any]]] = [
        [{"role": "assistant", "content": "<think>r</think>COFFEE"}],
        [
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": "<think>r</think>"},
                    {"type": "text", "text": "COFFEE"},
                ],
            }
        ],
        [{"role": "assistant", "content": "COFFEE", "reasoning_content": "r"}],
        [{"role": "assistant", "content": "<think>r"}],
        [{"role": "assistant", "content": "<think>r</think>TEA"}],
    ]
    got = trl.accuracy_reward(
        completions,
        ground_truth=[truth] * 5,
        prompts=["q"] * 5,
        completion_ids=[[1]] * 5,
        trainer_state=object(),
        image=["img"] * 5,
    )
    assert got == [1.0, 1.0, 1.0, 0.0, 0.0]


def test_trl_truncation_aware_reads_a_cut_off_the_ids() -> None:
    reward = trl.truncation_aware({0, 2})
    got = reward(
        ["COFFEE", "COFFEE"],
        completion_ids=[[5, 6, 2], [5, 6, 7]],
        ground_truth=[gt(["COFFEE"])] * 2,
    )
    assert got == [1.0, 0.0]
    assert reward.__name__ == "accuracy_reward"


def test_trl_refuses_a_length_mismatch() -> None:
    with pytest.raises(ValueError, match="2 ground truths for 1 completions"):
        trl.accuracy_reward(["COFFEE"], ground_truth=[gt(["COFFEE"])] * 2)


def test_verl_refuses_a_data_source_that_is_not_rsieves() -> None:
    with pytest.raises(ValueError, match="'openai/gsm8k'"):
        verl.compute_score("openai/gsm8k", "COFFEE", gt(["COFFEE"]))
    assert verl.compute_score("rsieve/SynthWords", "COFFEE", gt(["COFFEE"]))["acc"] == 1.0


def test_verl_takes_the_ground_truth_as_a_struct() -> None:
    assert verl.compute_score("rsieve/F", "<think>r</think>dog", json.loads(MC))["score"] == 1.0


def test_easyr1_weights_format_and_reads_a_cut_off_the_length() -> None:
    truth = gt(["COFFEE"])
    inputs = [
        {"response": "<think>r</think>COFFEE", "response_length": 10, "ground_truth": truth},
        {"response": "<think>r</think>TEA", "response_length": 10, "ground_truth": truth},
        {"response": "COFFEE", "response_length": 64, "ground_truth": truth},
    ]
    got = easyr1.compute_score(inputs, format_weight=0.1, max_response_length=64)
    assert [s["overall"] for s in got] == pytest.approx([1.0, 0.1, 0.0])
    assert [s["accuracy"] for s in got] == [1.0, 0.0, 0.0]
    assert easyr1.compute_score(inputs)[2]["accuracy"] == 1.0  # no limit given: as stopped
    assert (easyr1.REWARD_TYPE, easyr1.REWARD_NAME) == ("batch", "rsieve")
    with pytest.raises(ValueError, match="batch"):
        easyr1.compute_score(inputs[0])  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("module", "name"), [(verl, "custom_module"), (easyr1, "custom_reward_fn")]
)
def test_the_trainers_load_the_reward_file_by_its_path(module: Any, name: str) -> None:
    # As verl's and EasyR1's reward managers load a custom reward function.
    spec = importlib.util.spec_from_file_location(name, Path(module.__file__))
    assert spec is not None and spec.loader is not None
    loaded = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(loaded)
    assert loaded.compute_score is not module.compute_score
    if module is verl:
        assert loaded.compute_score("rsieve/F", "COFFEE", gt(["COFFEE"]))["score"] == 1.0
    else:
        inputs = [{"response": "COFFEE", "response_length": 1, "ground_truth": gt(["COFFEE"])}]
        assert loaded.compute_score(inputs)[0]["accuracy"] == 1.0


# --- parity with the factory's stored decisions -----------------------------------------


def _sampled(item: Item, answers: list[str]) -> Outcome:
    """A best-of-n outcome: the first sample settles it, the others ride along."""
    outs = [
        verify_generation(make_generation(item, a).model_copy(update={"sample": i}))
        for i, a in enumerate(answers)
    ]
    return outs[0].model_copy(
        update={
            "samples": Samples(
                n=len(outs),
                passed=[i for i, o in enumerate(outs) if o.place == "accepted"],
                kept=[0],
                wrong=[],
                others=outs[1:],
            )
        }
    )


def _cut(item: Item, raw: str) -> Outcome:
    parsed = parse_output(raw, "length")
    gen = make_generation(
        item,
        parsed.answer,
        reasoning=parsed.reasoning,
        raw_output=raw,
        failure=parsed.failure,
        finish_reason="length",
    )
    return verify_generation(gen)


def stored_outcomes() -> list[Outcome]:
    words = make_item("w", protocol="alnum", references=["COFFEE"])
    exact = make_item("e", protocol="exact", references=["Paris"], family="SynthExact")
    docs = make_item("d", protocol="anls", references=["John Smith"], family="DocVQA")
    number = make_item("n", protocol="number", references=["1,234"], family="SynthCount")
    chart = make_item("c", protocol="relaxed", references=["100"], family="ChartQA")
    vqa = make_item("v", protocol="vqa", references=["two"] * 3 + ["three"] * 7, family="VQAv2")
    mc = make_item("m", protocol="mc", references=["B"], options=OPTIONS, family="MMBench")
    math = make_item("x", protocol="math", references=["\\frac{1}{2}"], family="MathVista")
    broken = make_item("b", protocol="number", references=["abc"], family="SynthCount")
    return [
        accepted(words),
        accepted(words, "coffee"),
        judged(words, "the word coffee", "CORRECT"),  # a judge promotion: not the verifier's
        judged(words, "TEA", "WRONG"),
        failed(words, "<think>I was reading"),
        _cut(words, "COFFEE"),  # no think tags and cut: never scored
        _cut(words, "<think>r</think>COFFEE"),  # cut after the answer began: scored
        accepted(exact, "paris."),
        judged(exact, "London", None),
        accepted(docs),
        verify_generation(make_generation(docs, "Jane Smith")),  # a near miss
        accepted(number, "1234"),
        judged(number, "1235", "WRONG"),
        verify_generation(make_generation(chart, "105")),  # a near miss
        accepted(chart, "100.0"),
        accepted(vqa, "two"),
        judged(vqa, "four", "WRONG"),
        accepted(mc, "\\boxed{B}"),
        accepted(mc, "dog"),
        judged(mc, "cat", "WRONG"),
        accepted(math, "\\boxed{0.5}"),
        judged(math, "\\boxed{2}", "WRONG"),
        _sampled(mc, ["B", "A", "dog", "C"]),
        verify_generation(make_generation(broken, "abc")),
    ]


def test_the_rewards_agree_with_every_stored_decision() -> None:
    outcomes = stored_outcomes()
    parity = disagreements(
        outcomes, lambda item: DEFAULT_POLICY.rule_for(item.family, item.protocol)
    )
    assert parity.differing == [] and parity.ok
    samples = len(outcomes) + 3  # the best-of-n outcome's three others
    for name in ("trl", "verl", "easyr1"):
        counts = parity.counts[name]
        assert counts.unparseable == 1
        assert counts.scored == counts.agreed == samples - 1
    # Of the three cut completions only the bare "COFFEE" would score had it stopped.
    assert parity.stop_sensitive == 1
    accepted_n = sum(factory_accepts(o) for o in outcomes)
    assert 0 < accepted_n < len(outcomes)


def test_parity_sees_a_reward_that_differs_from_the_factory() -> None:
    # Decided under `benchmark`, scored under `anls_exact`: the near miss differs.
    docs = make_item("d", protocol="anls", references=["John Smith"], family="DocVQA")
    lenient = TrainingPolicy(by_protocol={})
    outcome = verify_generation(make_generation(docs, "Jane Smith"), lenient)
    assert factory_accepts(outcome)
    parity = disagreements([outcome], lambda item: "anls_exact")
    assert {(d.id, d.interface, d.reward, d.factory) for d in parity.differing} == {
        ("d", name, 0.0, True) for name in ("trl", "verl", "easyr1")
    }
    assert not parity.ok and parity.counts["trl"].agreed == 0


def test_factory_accepts_is_the_verifiers_decision_not_the_judges() -> None:
    words = make_item(references=["COFFEE"])
    assert factory_accepts(accepted(words))
    promoted = judged(words, "the word coffee", "CORRECT")
    assert promoted.place == "accepted" and not factory_accepts(promoted)
    assert not factory_accepts(failed(words, "<think>cut"))


# --- property: reward == factory on random short answers -------------------------------

PROPERTY_ITEMS = {
    "alnum": make_item(protocol="alnum", references=["COFFEE"]),
    "exact": make_item(protocol="exact", references=["ab c"], family="SynthExact"),
    "number": make_item(protocol="number", references=["12"], family="SynthCount"),
    "anls": make_item(protocol="anls", references=["abc d"], family="DocVQA"),
    "mc": make_item(protocol="mc", references=["B"], options=OPTIONS, family="MMBench"),
}
ANSWERS = st.one_of(
    st.text(alphabet="abcdBCOFE 12.,()\\{}<>/\n", max_size=12),
    st.sampled_from(
        ["COFFEE", "coffee!", "12", "12.0", "ab c", "abc d", "abd d", "B", "(B)", "dog"]
    ),
)


@settings(max_examples=200, deadline=None, derandomize=True, database=None)
@given(
    protocol=st.sampled_from(sorted(PROPERTY_ITEMS)),
    answer=ANSWERS,
    think=st.sampled_from(["<think>r</think>", "", "r<answer>", "<think>r"]),
    finish_reason=st.sampled_from(["stop", "length"]),
)
def test_the_reward_is_the_factorys_decision(
    protocol: str, answer: str, think: str, finish_reason: str
) -> None:
    item = PROPERTY_ITEMS[protocol]
    raw = think + answer + ("</answer>" if think.endswith("<answer>") else "")
    truth = encode(ground_truth_of(item, DEFAULT_POLICY.rule_for(item.family, protocol)))
    expected = 1.0 if factory(item, raw, finish_reason) else 0.0
    got = rewards(raw, truth, finish_reason)
    assert (got["trl"], got["verl"], got["easyr1"]) == (expected,) * 3


def test_stored_generations_are_what_the_factory_stored() -> None:
    # The parity tests build generations through the generator's parse: a check that
    # make_generation keeps it (a changed helper would make parity vacuous).
    item = make_item(references=["COFFEE"])
    gen: Generation = make_generation(item, "COFFEE")
    assert parse_output(gen.raw_output, gen.finish_reason).answer == gen.answer


# --- scripts/reward_parity.py ----------------------------------------------------------


class _Ctx:
    """The two reads the script makes of the stack, over outcomes held here."""

    def __init__(self, outcomes: list[Outcome], policy: TrainingPolicy) -> None:
        self.outcomes, self.policy = outcomes, policy

    def run_settings(self, run: str) -> Any:
        return type("S", (), {"training_policy": lambda _self: self.policy})()

    def stored_shards(self, run: str, stage: str) -> set[str]:
        assert stage == "judge"
        return {"00000"}

    def load(self, run: str, stage: str, shard: str) -> Any:
        return type("Out", (), {"outcomes": self.outcomes})()


def test_the_parity_script_prints_figures_and_fails_on_a_disagreement(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from scripts import reward_parity

    docs = make_item("d", protocol="anls", references=["John Smith"], family="DocVQA")
    lenient = TrainingPolicy(by_protocol={})
    near = verify_generation(make_generation(docs, "Jane Smith"), lenient)
    monkeypatch.setattr(reward_parity, "context", lambda: _Ctx([near], lenient))
    assert reward_parity.main(["run-1"]) == 0
    assert "run-1" in capsys.readouterr().out
    monkeypatch.setattr(reward_parity, "context", lambda: _Ctx([near], DEFAULT_POLICY))
    assert reward_parity.main(["run-1"]) == 1
    out = capsys.readouterr().out
    assert "differs: d sample None trl: reward 0.0, factory accepts" in out
