"""Run accounting: every line ends in exactly one place, and the report proves it."""

from __future__ import annotations

from typing import Any

import pytest

from rsieve.compact.rows import assemble_rows
from rsieve.dataset.report import UNKNOWN_FAMILY, reasoning_form, run_report
from rsieve.judge.cascade import apply_verdict, verify_generation
from rsieve.run.shards import split_pool
from rsieve.schemas import Outcome, Quarantined
from tests.unit._records import accepted, failed, judged, make_generation, make_item


def _q(
    line: int,
    reason: str,
    item_id: str | None = None,
    family: str | None = "SynthWords",
    stage: str = "clean",
) -> Quarantined:
    return Quarantined(
        id=item_id,
        line=line,
        family=family,
        stage=stage,  # type: ignore[arg-type]
        reason=reason,
    )


def _consistent() -> tuple[list[Outcome], list[Quarantined]]:
    outcomes = [
        accepted(make_item("a", line=1)),
        judged(make_item("b", line=2, references=["TEA"]), "the word TEA", "CORRECT"),
        judged(make_item("c", line=3, references=["TEA"]), "COFFEE", "WRONG"),
        judged(make_item("d", line=4, references=["TEA"]), "COFFEE", None),
        failed(make_item("e", line=5), "<think>cut"),
        accepted(make_item("f", line=6, family="DocVQA", protocol="anls", references=["x"])),
    ]
    quarantined = [
        _q(7, "invalid_json", family=None),
        _q(8, "duplicate_id", item_id="a"),
        _q(9, "unknown_protocol", item_id="g", family="NoSuchBench"),
        _q(10, "model_error", item_id="h", stage="generate"),
    ]
    return outcomes, quarantined


def test_consistent_run_adds_up() -> None:
    outcomes, quarantined = _consistent()
    report = run_report(run="r1", lines=10, outcomes=outcomes, quarantined=quarantined)
    assert report["adds_up"] is True
    assert (report["run"], report["lines"], report["placed"]) == ("r1", 10, 10)
    assert report["duplicate_ids"] == []
    assert report["lines_placed_twice"] == []
    assert report["lines_missing"] == []
    fams = report["families"]
    assert list(fams) == sorted(fams)
    assert set(fams) == {"SynthWords", "DocVQA", "NoSuchBench", UNKNOWN_FAMILY}
    synth = fams["SynthWords"]
    assert synth["in"] == 7
    assert (synth["accepted"], synth["accepted_by_verifier"], synth["promoted_by_judge"]) == (
        2,
        1,
        1,
    )
    assert synth["rejected"] == 3
    assert synth["rejected_by_reason"] == {
        "judge_failed": 1,
        "truncated_reasoning": 1,
        "wrong_answer": 1,
    }
    assert synth["judge_verdicts"] == {"CORRECT": 1, "WRONG": 1, "UNSURE": 0, "FAILED": 1}
    assert synth["judge_failure_causes"] == {"call_failed": 1}
    assert synth["reasoning"] == {"closed": 4, "absent": 0, "unclosed": 1}
    assert synth["accepted_without_reasoning"] == 0
    assert synth["quarantined"] == 2
    assert synth["quarantined_by_reason"] == {"duplicate_id": 1, "model_error": 1}
    assert all(f["adds_up"] for f in fams.values())
    assert fams[UNKNOWN_FAMILY]["quarantined_by_reason"] == {"invalid_json": 1}
    assert fams["DocVQA"] == {
        "in": 1,
        "accepted": 1,
        "accepted_by_verifier": 1,
        "promoted_by_judge": 0,
        "rejected": 0,
        "rejected_by_reason": {},
        "quarantined": 0,
        "quarantined_by_reason": {},
        "adds_up": True,
        "judge_verdicts": {"CORRECT": 0, "WRONG": 0, "UNSURE": 0, "FAILED": 0},
        "judge_failure_causes": {},
        "judge_reused": 0,
        "reasoning": {"closed": 1, "absent": 0, "unclosed": 0},
        "accepted_without_reasoning": 0,
        "trace_checked": 0,
        "trace_gated": 0,
        "trace_failures": {},
        "trace_examples": [],
        "blind_asked": 0,
        "blind_answerable": 0,
        "blind_failed": 0,
        "blind_examples": [],
        "near_misses": 0,
        "near_misses_promoted": 0,
        "near_miss_examples": [],
        "repetition_loops": 0,
        "loop_tokens_generated": 0,
        "loop_tokens_saved": 0,
    }
    # Records written before the thinking mode and model kinds were stored.
    assert report["thinking_modes"] == {"unrecorded": 6}
    assert report["models"] == {
        "generators": [{"model": "test-vlm", "kind": None, "outputs": 6}],
        "judges": [{"model": "test-judge", "kind": None, "verdicts": 3}],
    }


def test_empty_run_adds_up() -> None:
    report = run_report(run="r", lines=0, outcomes=[], quarantined=[])
    assert report["adds_up"] is True and report["families"] == {}


def test_line_placed_twice() -> None:
    outcomes, quarantined = _consistent()
    quarantined.append(_q(3, "model_error", item_id="c2", stage="generate"))
    report = run_report(run="r", lines=10, outcomes=outcomes, quarantined=quarantined)
    assert report["adds_up"] is False
    assert report["lines_placed_twice"] == [3]
    assert report["placed"] == 11


def test_same_outcome_twice_is_line_and_id_twice() -> None:
    outcomes, quarantined = _consistent()
    outcomes.append(outcomes[0])
    report = run_report(run="r", lines=10, outcomes=outcomes, quarantined=quarantined)
    assert report["adds_up"] is False
    assert report["lines_placed_twice"] == [1]
    assert report["duplicate_ids"] == ["a"]


def test_line_missing() -> None:
    outcomes, quarantined = _consistent()
    outcomes = [o for o in outcomes if o.generation.item.line != 4]
    report = run_report(run="r", lines=10, outcomes=outcomes, quarantined=quarantined)
    assert report["adds_up"] is False
    assert report["lines_missing"] == [4]
    assert report["placed"] == 9


def test_line_beyond_the_pool_does_not_add_up() -> None:
    outcomes, quarantined = _consistent()
    quarantined.append(_q(11, "invalid_json", family=None))
    report = run_report(run="r", lines=10, outcomes=outcomes, quarantined=quarantined)
    assert report["adds_up"] is False


def test_id_twice() -> None:
    outcomes, quarantined = _consistent()
    # Line 9's item reuses id "b" without being marked a duplicate.
    quarantined[2] = _q(9, "unknown_protocol", item_id="b", family="NoSuchBench")
    report = run_report(run="r", lines=10, outcomes=outcomes, quarantined=quarantined)
    assert report["adds_up"] is False
    assert report["duplicate_ids"] == ["b"]
    assert report["lines_placed_twice"] == [] and report["lines_missing"] == []


def test_duplicate_id_quarantine_does_not_count_as_id_twice() -> None:
    outcomes, quarantined = _consistent()
    assert any(q.reason == "duplicate_id" and q.id == "a" for q in quarantined)
    report = run_report(run="r", lines=10, outcomes=outcomes, quarantined=quarantined)
    assert report["duplicate_ids"] == []


def test_lines_missing_is_capped() -> None:
    report = run_report(run="r", lines=500, outcomes=[], quarantined=[])
    assert report["adds_up"] is False
    assert report["lines_missing"] == list(range(1, 101))


def _report_for_pool(data: bytes) -> dict[str, object]:
    """What the cleaner and compactor do: split, quarantine every line, count lines."""
    shards, blank = split_pool(data, 10)
    pool_lines = [p for shard in shards for p in shard]
    quarantined = [_q(p.line, "invalid_json", family=None) for p in pool_lines]
    return run_report(
        run="r",
        lines=sum(map(len, shards)),
        outcomes=[],
        quarantined=quarantined,
        blank_lines=blank,
    )


def test_pool_with_trailing_blank_lines_adds_up() -> None:
    assert _report_for_pool(b"x\ny\n\n\n")["adds_up"] is True


def test_pool_with_an_interior_blank_line_adds_up_by_numbers() -> None:
    report = _report_for_pool(b"x\n\ny\n")
    assert report["placed"] == report["lines"] == 2


# The cleaner stores lines = sum(len(shard)) (non-blank lines) while split_pool keeps the
# pool's 1-based numbering across blank lines; run_report then expects lines 1..lines, so the
# blank line's number is reported missing and the run never adds up.
def test_pool_with_an_interior_blank_line_adds_up() -> None:
    report = _report_for_pool(b"x\n\ny\n")
    assert report["lines_missing"] == []
    assert report["adds_up"] is True


# --- judge verdicts, reasoning forms, thinking modes and model kinds ----------------------


def _gen_kind(out: Outcome, **update: object) -> Outcome:
    return out.model_copy(update={"generation": out.generation.model_copy(update=update)})


def _verdict_kind(out: Outcome, kind: str) -> Outcome:
    assert out.verdict is not None
    return out.model_copy(update={"verdict": out.verdict.model_copy(update={"model_kind": kind})})


def test_judge_verdicts_per_family_with_failure_causes() -> None:
    ref: dict[str, Any] = {"references": ["TEA"]}
    raws: list[tuple[str, str | None, str]] = [
        ("SynthWords", "CORRECT", "stop"),
        ("SynthWords", "WRONG", "stop"),
        ("SynthWords", "UNSURE", "stop"),
        ("SynthWords", "UNSURE", "stop"),
        ("SynthWords", None, "stop"),
        ("SynthWords", "", "stop"),
        ("SynthWords", "maybe", "stop"),
        ("SynthWords", "CORRECT", "length"),
        ("DocVQA", None, "stop"),
        ("DocVQA", None, "stop"),
        ("DocVQA", "WRONG", "stop"),
    ]
    outcomes = []
    for i, (family, raw, finish) in enumerate(raws):
        pending = verify_generation(
            make_generation(make_item(f"j{i}", line=i + 1, family=family, **ref), "the word TEA")
        )
        outcomes.append(
            apply_verdict(
                pending,
                model="judge-smollm2",
                prompt="P",
                raw_output=raw,
                finish_reason=finish,
                failure="UNAVAILABLE",
                model_kind="llm",
            )
        )
    report = run_report(run="r", lines=len(raws), outcomes=outcomes, quarantined=[])
    words, doc = report["families"]["SynthWords"], report["families"]["DocVQA"]
    assert words["judge_verdicts"] == {"CORRECT": 1, "WRONG": 1, "UNSURE": 2, "FAILED": 4}
    assert words["judge_failure_causes"] == {
        "call_failed": 1,
        "judge_empty": 1,
        "judge_truncated": 1,
        "judge_unparsable": 1,
    }
    assert words["rejected_by_reason"] == {"judge_failed": 4, "judge_unsure": 2, "wrong_answer": 1}
    assert words["promoted_by_judge"] == 1
    assert doc["judge_verdicts"] == {"CORRECT": 0, "WRONG": 1, "UNSURE": 0, "FAILED": 2}
    assert doc["judge_failure_causes"] == {"call_failed": 2}
    assert report["models"]["judges"] == [
        {"model": "judge-smollm2", "kind": "llm", "verdicts": len(raws)}
    ]
    assert report["adds_up"] is True


def test_old_unsure_failures_count_as_failed() -> None:
    out = judged(make_item("o", references=["TEA"]), "COFFEE", "UNSURE")
    assert out.verdict is not None
    old = out.model_copy(
        update={
            "reason": "judge_unsure",
            "verdict": out.verdict.model_copy(update={"cause": "judge_failed: timeout"}),
        }
    )
    fam = run_report(run="r", lines=1, outcomes=[old], quarantined=[])["families"]["SynthWords"]
    assert fam["judge_verdicts"]["FAILED"] == 1 and fam["judge_verdicts"]["UNSURE"] == 0
    assert fam["judge_failure_causes"] == {"call_failed": 1}


@pytest.mark.parametrize(
    ("reasoning", "failure", "form"),
    [
        ("I read C, O, F, F, E, E.", None, "closed"),
        (None, None, "absent"),
        ("", None, "absent"),
        ("   ", None, "absent"),
        ("the letters are C, O", "truncated_reasoning", "unclosed"),
        (None, "truncated_reasoning", "unclosed"),  # cut off with no think tags at all
        ("done", "empty_answer", "closed"),
    ],
)
def test_reasoning_form(reasoning: str | None, failure: str | None, form: str) -> None:
    gen = make_generation(
        make_item(),
        None if failure else "COFFEE",
        reasoning=reasoning,
        failure=failure,
        raw_output="x",
    )
    assert reasoning_form(gen) == form


def test_reasoning_counts_and_accepted_without_reasoning() -> None:
    think = accepted(make_item("a", line=1))
    plain = _gen_kind(accepted(make_item("b", line=2)), reasoning=None, raw_output="COFFEE")
    empty = _gen_kind(accepted(make_item("c", line=3)), reasoning="")
    promoted = _gen_kind(
        judged(make_item("d", line=4, references=["TEA"]), "the word TEA", "CORRECT"),
        reasoning=None,
    )
    cut = failed(make_item("e", line=5), "<think>cut")
    wrong = _gen_kind(
        judged(make_item("f", line=6, references=["TEA"]), "COFFEE", "WRONG"), reasoning=None
    )
    other = accepted(make_item("g", line=7, family="DocVQA", protocol="anls", references=["x"]))
    outcomes = [think, plain, empty, promoted, cut, wrong, other]
    report = run_report(run="r", lines=7, outcomes=outcomes, quarantined=[])
    words = report["families"]["SynthWords"]
    assert words["reasoning"] == {"closed": 1, "absent": 4, "unclosed": 1}
    assert words["accepted_without_reasoning"] == 3  # plain, empty, promoted
    assert report["families"]["DocVQA"]["reasoning"] == {"closed": 1, "absent": 0, "unclosed": 0}
    assert report["families"]["DocVQA"]["accepted_without_reasoning"] == 0
    # The same items the rows put in _RS_nothink only.
    splits = assemble_rows(outcomes)
    think_ids = {qa["id"] for row in splits["SynthWords_RS_think"] for qa in row["qa"]}
    nothink_ids = {qa["id"] for row in splits["SynthWords_RS_nothink"] for qa in row["qa"]}
    assert len(nothink_ids - think_ids) == words["accepted_without_reasoning"]


def test_thinking_modes_and_model_kinds() -> None:
    outs = [
        _gen_kind(
            accepted(make_item(f"i{i}", line=i + 1)),
            thinking_mode=mode,
            model="rapidocr",
            model_kind="ocr-engine",
        )
        for i, mode in enumerate(["none", "none", "switch", None])
    ]
    outs.append(
        _verdict_kind(
            _gen_kind(
                judged(make_item("j", line=5, references=["TEA"]), "COFFEE", "UNSURE"),
                thinking_mode="none",
                model="rapidocr",
                model_kind="ocr-engine",
            ),
            "stand-in",
        )
    )
    report = run_report(run="r", lines=5, outcomes=outs, quarantined=[])
    assert report["thinking_modes"] == {"none": 3, "switch": 1, "unrecorded": 1}
    assert report["models"] == {
        "generators": [{"model": "rapidocr", "kind": "ocr-engine", "outputs": 5}],
        "judges": [{"model": "test-judge", "kind": "stand-in", "verdicts": 1}],
    }
