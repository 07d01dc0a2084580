"""Token usage in the run report and the card: summed per model and per family, the judge's
calibration calls apart, calls without usage counted as such (never as 0 tokens), failed
calls not counted; the verdict's token counts stay out of the dataset rows."""

from __future__ import annotations

from typing import Any

from rsieve.compact.rows import assemble_rows
from rsieve.dataset.card import render_card
from rsieve.dataset.commit import compose_report, partition_summary, settle
from rsieve.dataset.report import run_report, token_usage
from rsieve.judge.calibration import CalibrationRecord, calibration_record, summarise
from rsieve.judge.probes import calibration_probes, probe_prompt
from rsieve.run.partitions import merge_summaries
from rsieve.schemas import Outcome
from tests.unit._records import accepted, judged, make_item


def _tokens(out: Outcome, model: str, n_in: int | None, n_out: int | None) -> Outcome:
    gen = out.generation.model_copy(
        update={"model": model, "input_tokens": n_in, "output_tokens": n_out}
    )
    return out.model_copy(update={"generation": gen})


def _judge_tokens(out: Outcome, n_in: int | None, n_out: int | None) -> Outcome:
    assert out.verdict is not None
    verdict = out.verdict.model_copy(update={"input_tokens": n_in, "output_tokens": n_out})
    return out.model_copy(update={"verdict": verdict})


def _usage(calls: int, prompt: int, completion: int, without: int = 0) -> dict[str, int]:
    return {
        "calls": calls,
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "calls_without_usage": without,
    }


def _judge(
    calls: dict[str, int], calibration: dict[str, int], reused: int = 0, reused_probes: int = 0
) -> dict[str, Any]:
    """A judge's usage: its calls and the replies reused from the verdict cache (no call),
    with its calibration's the same way."""
    return calls | {"reused": reused, "calibration": calibration | {"reused": reused_probes}}


NONE = _usage(0, 0, 0)


def _run() -> tuple[list[Outcome], list[CalibrationRecord]]:
    """SynthWords: two answers by vlm-a (one verifier-accepted, one judged WRONG), one by
    vlm-b whose server returned no usage, judged CORRECT by a judge that returned none
    either; DocVQA: one answer by vlm-a, judged with a failed call (not counted).
    Calibration: the SynthWords accepted answer's probes, 7 + 2 tokens each."""
    synth_ok = _tokens(accepted(make_item("s1", line=1)), "vlm-a", 100, 10)
    synth_wrong = _tokens(
        judged(make_item("s2", line=2, references=["TEA"]), "COFFEE", "WRONG"), "vlm-a", 200, 20
    )
    synth_promoted = _tokens(
        judged(make_item("s3", line=3, references=["TEA"]), "the word TEA", "CORRECT"),
        "vlm-b",
        None,
        5,
    )
    doc_failed = _tokens(
        judged(
            make_item("d1", line=4, family="DocVQA", protocol="anls", references=["x"]),
            "zzz",
            None,
        ),
        "vlm-a",
        1000,
        100,
    )
    outcomes = [
        synth_ok,
        _judge_tokens(synth_wrong, 50, 3),
        _judge_tokens(synth_promoted, None, None),
        _judge_tokens(doc_failed, 70, 7),  # a failed call's counts would be the adapter's bug
    ]
    probes = calibration_probes([synth_ok], size=10)
    assert len(probes) >= 3
    records = [
        calibration_record(
            p,
            model="test-judge",
            prompt=probe_prompt(p),
            raw_output="WRONG",
            input_tokens=7,
            output_tokens=2,
        )
        for p in probes
    ]
    # A calibration call that failed: not counted, whatever it says.
    records.append(
        calibration_record(
            probes[0],
            model="test-judge",
            prompt=probe_prompt(probes[0]),
            raw_output=None,
            failure="UNAVAILABLE",
            input_tokens=999,
            output_tokens=999,
        )
    )
    return outcomes, records


def test_sums_per_model_per_family_and_calibration_apart() -> None:
    outcomes, records = _run()
    n = len(records) - 1  # the answered calibration calls
    tokens = token_usage(outcomes, records)
    calibration = _usage(n, 7 * n, 2 * n)
    assert tokens["by_model"] == [
        {"model": "vlm-a", "role": "generator", **_usage(3, 1300, 130)},
        {"model": "vlm-b", "role": "generator", **_usage(1, 0, 5, without=1)},
        {"model": "test-judge", "role": "judge", **_judge(_usage(2, 50, 3, 1), calibration)},
    ]
    assert tokens["by_family"] == {
        "DocVQA": {"generator": _usage(1, 1000, 100), "judge": _judge(NONE, NONE)},
        "SynthWords": {
            "generator": _usage(3, 300, 35, without=1),
            "judge": _judge(_usage(2, 50, 3, without=1), calibration),
        },
    }
    assert tokens["total"] == {
        "generator": _usage(4, 1300, 135, without=1),
        "judge": _judge(_usage(2, 50, 3, without=1), calibration),
        "all": _usage(6 + n, 1350 + 7 * n, 138 + 2 * n, without=2),
    }


def test_missing_usage_is_counted_never_as_zero_tokens() -> None:
    item = make_item("s1")
    half = [_tokens(accepted(item), "vlm-a", 12, None)]
    usage = token_usage(half)["total"]["generator"]
    assert usage == _usage(1, 12, 0, without=1)
    old = [accepted(item)]  # a record stored before token counts (None, None)
    assert token_usage(old)["total"]["all"] == _usage(1, 0, 0, without=1)
    assert token_usage([])["total"] == {
        "generator": NONE,
        "judge": _judge(NONE, NONE),
        "all": NONE,
    }


def test_the_report_and_the_compaction_plan_carry_the_usage() -> None:
    outcomes, records = _run()
    report = run_report(run="r1", lines=4, outcomes=outcomes, quarantined=[], calibration=records)
    assert report["tokens"] == token_usage(outcomes, records)
    summary = summarise(records, size=10, bound=1.0)
    settled = settle(outcomes, calibration=summary, bound=1.0, existing_keys=set())
    stored: dict[str, Any] = {"shards": [], "qa_keys": {}, "examples": {}, "dataset_keys": {}}
    merged = merge_summaries([partition_summary(settled, [], **stored)])
    committed = compose_report(
        merged,
        run="r1",
        index={"lines": 4, "blank_lines": []},
        calibration_tokens=token_usage((), records),
        calibration=summary,
        bound=1.0,
        cleaning=None,
    )
    assert committed["tokens"] == token_usage(outcomes, records)


def _card(report: dict[str, Any]) -> str:
    splits = {"SynthWords_rejected": 1}
    manifest = {
        "shards": [{"path": "data/x.parquet", "split": "SynthWords_rejected", "rows": 1}],
        "splits": splits,
        "runs": ["r1"],
    }
    spec = {"settings": {"generator_model": "vlm-a", "judge_model": "j", "temperature": 0.0}}
    card = render_card(
        dataset="d",
        spec=spec,
        report=report,
        manifest=manifest,
        split_families={"SynthWords_rejected": "SynthWords"},
        examples={},
    )
    return card.split("## Cost\n", 1)[1].split("\n## ", 1)[0]


def test_card_cost_table_per_model_and_family_with_calibration_apart() -> None:
    outcomes, records = _run()
    n = len(records) - 1
    report = run_report(run="r1", lines=4, outcomes=outcomes, quarantined=[], calibration=records)
    cost = _card(report)
    lines = cost.splitlines()
    assert "| `vlm-a` | generator | 3 | 1,300 | 130 | 0 |" in lines
    assert "| `vlm-b` | generator | 1 | 0 | 5 | 1 |" in lines
    assert "| `test-judge` | judge | 2 | 50 | 3 | 1 |" in lines
    assert f"| `test-judge` | judge calibration | {n} | {7 * n} | {2 * n} | 0 |" in lines
    assert f"| all | | {6 + n} | {1350 + 7 * n:,} | {138 + 2 * n} | 2 |" in lines
    assert "| DocVQA | 1 | 1,000 | 100 | 0 | 0 | 0 | 0 | 0 | 0 |" in lines
    assert f"| SynthWords | 3 | 300 | 35 | 2 | 50 | 3 | {n} | {7 * n} | {2 * n} |" in lines
    assert f"2 of {6 + n} calls came back without token usage" in cost
    assert "lower bounds" in cost


def test_card_says_nothing_of_missing_usage_when_every_call_reported_it() -> None:
    out = _tokens(accepted(make_item("s1")), "vlm-a", 100, 10)
    cost = _card(run_report(run="r1", lines=1, outcomes=[out], quarantined=[]))
    assert "| `vlm-a` | generator | 1 | 100 | 10 | 0 |" in cost.splitlines()
    assert "without token usage" not in cost
    old = run_report(run="r1", lines=1, outcomes=[out], quarantined=[])
    del old["tokens"]  # a report written before token usage was counted
    assert "Token usage was not recorded for this run." in _card(old)


def test_verdict_tokens_stay_out_of_the_rows() -> None:
    out = _judge_tokens(
        judged(make_item(references=["COFFEE"]), "the word COFFEE", "CORRECT"), 50, 3
    )
    bare = judged(make_item(references=["COFFEE"]), "the word COFFEE", "CORRECT")
    assert assemble_rows([out]) == assemble_rows([bare])
