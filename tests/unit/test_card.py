"""The dataset card says what each model is (by its declared kind), never claims reasoning
for a model that has none, states the thinking modes and the reasoning counts, and counts
the judge's verdicts with failures apart from UNSURE."""

from __future__ import annotations

from typing import Any

import pytest

from rsieve.dataset.card import THINKING_MEANINGS, render_card
from rsieve.dataset.report import run_report
from rsieve.judge.calibration import (
    calibration_record,
    hold_back,
    render_calibration_markdown,
    summarise,
)
from rsieve.judge.probes import calibration_probes, probe_prompt
from rsieve.schemas import MODEL_KINDS, THINKING_MODES, Outcome
from tests.unit._records import accepted, failed, judged, make_item

BOUND = 0.05


def _gen(out: Outcome, **update: Any) -> Outcome:
    return out.model_copy(update={"generation": out.generation.model_copy(update=update)})


def _judge(out: Outcome, model: str, kind: str | None) -> Outcome:
    if out.verdict is None:
        return out
    return out.model_copy(
        update={"verdict": out.verdict.model_copy(update={"model": model, "model_kind": kind})}
    )


def _run(
    *,
    generator: str,
    generator_kind: str | None,
    mode: str | list[str | None] | None,
    judge: str,
    judge_kind: str | None,
    judge_raw: list[str | None],
    probe_raw: str | None,
    reasoning: str | None = "I read the letters.",
    settings: dict[str, Any] | None = None,
    report_models: bool = True,
) -> str:
    """A small run through report, calibration and card, as the compactor does it."""
    outs = [accepted(make_item(f"a{i}", line=i + 1)) for i in range(3)]
    outs += [
        judged(make_item(f"j{i}", line=4 + i, references=["TEA"]), "COFFEE", raw)
        for i, raw in enumerate(judge_raw)
    ]
    outs.append(failed(make_item("cut", line=4 + len(judge_raw)), "<think>the letters"))
    modes = mode if isinstance(mode, list) else [mode]
    outs = [
        _judge(
            _gen(
                o,
                model=generator,
                model_kind=generator_kind,
                thinking_mode=modes[i % len(modes)],
                **({} if o.generation.failure else {"reasoning": reasoning}),
            ),
            judge,
            judge_kind,
        )
        for i, o in enumerate(outs)
    ]
    records = [
        calibration_record(
            p,
            model=judge,
            prompt=probe_prompt(p),
            raw_output=probe_raw,
            failure="UNAVAILABLE",
            model_kind=judge_kind,
        )
        for p in calibration_probes(outs, size=10)
    ]
    summary = summarise(records, size=10, bound=BOUND)
    outs = hold_back(outs, summary, BOUND)
    report = run_report(run="r1", lines=len(outs), outcomes=outs, quarantined=[])
    report["calibration"] = summary
    if not report_models:  # a report written before models and thinking modes were counted
        del report["models"], report["thinking_modes"]
    splits = {"SynthWords_RS_nothink": 3, "SynthWords_rejected": len(outs) - 3}
    manifest = {
        "shards": [{"path": f"data/{s}.parquet", "split": s, "rows": n} for s, n in splits.items()],
        "splits": splits,
        "runs": ["r1"],
    }
    spec = {
        "settings": {
            "generator_model": generator,
            "judge_model": judge,
            "temperature": 0.0,
            "reasoning": True,
            **(settings or {}),
        }
    }
    return render_card(
        dataset="d",
        spec=spec,
        report=report,
        manifest=manifest,
        split_families={s: "SynthWords" for s in splits},
        examples={},
        calibration_md=render_calibration_markdown(summary, bound=BOUND),
    )


def _first_paragraph(card: str) -> str:
    return card.split("\n# d\n\n", 1)[1].split("\n\n", 1)[0]


def _section(card: str, heading: str) -> str:
    return card.split(heading + "\n", 1)[1].split("\n#", 1)[0]


def test_ocr_engine_and_stand_in_judge_are_named_for_what_they_are() -> None:
    card = _run(
        generator="rapidocr",
        generator_kind="ocr-engine",
        mode="none",
        judge="judge-abstain",
        judge_kind="stand-in",
        judge_raw=["UNSURE", "UNSURE"],
        probe_raw="UNSURE",
        reasoning="det 0.98 rec COFFEE",
    )
    first = _first_paragraph(card)
    assert "`rapidocr`, an OCR engine, not a language model" in first
    assert "ignores the prompt" in first and "recognition trace" in first
    assert "`judge-abstain`, a stand-in, not a judge model" in first
    assert "CORRECT 0, WRONG 0, UNSURE 2, failed 0" in first
    assert "vision-language model" not in first.split("made by rsieve.", 1)[1]
    produced = _section(card, "## How the data was produced")
    assert "reasoning requested" not in card and "answered every question" not in produced
    assert "OCR engine `rapidocr` read every image; it ignores the question" in produced
    assert (
        "`rapidocr` is an OCR engine: what the reasoning columns count is its "
        "recognition trace" in card
    )
    # Its calibration gave no CORRECT/WRONG verdict: n/a, never 0/0 shown as a rate.
    row = next(
        x
        for x in _section(card, "## Judge calibration").splitlines()
        if x.startswith("| SynthWords")
    )
    assert row.startswith("| SynthWords | 3 | n/a | n/a |") and row.endswith("| yes |")


def test_llm_judge_is_a_language_model_whose_calibration_decides() -> None:
    card = _run(
        generator="qwen3-vl",
        generator_kind="vlm",
        mode="switch",
        judge="judge-smollm2",
        judge_kind="llm",
        judge_raw=["CORRECT", "WRONG"],
        probe_raw="WRONG",
    )
    first = _first_paragraph(card)
    assert "`qwen3-vl`, a vision-language model" in first
    assert (
        "`judge-smollm2`, a text-only language model; its calibration below decides "
        "whether its promotions count"
    ) in first
    assert "stand-in" not in first and "OCR" not in first
    assert (
        "Model `qwen3-vl` answered every question at temperature 0.0; thinking mode "
        "`switch`: reasoning turned on through the chat template's thinking switch."
    ) in card
    assert "(`judge-smollm2`: a text-only language model; prompt template" in card


def test_switch_with_reasoning_off_says_so() -> None:
    card = _run(
        generator="qwen3-vl",
        generator_kind="vlm",
        mode="switch",
        judge="judge-smollm2",
        judge_kind="llm",
        judge_raw=["WRONG"],
        probe_raw="WRONG",
        reasoning=None,
        settings={"reasoning": False},
    )
    produced = _section(card, "## How the data was produced")
    assert "reasoning turned off through the chat template's thinking switch" in produced
    assert "reasoning turned on" not in card


def test_no_thinking_mode_claims_no_reasoning() -> None:
    card = _run(
        generator="smolvlm",
        generator_kind="vlm",
        mode="none",
        judge="judge-smollm2",
        judge_kind="llm",
        judge_raw=["WRONG"],
        probe_raw="WRONG",
        reasoning=None,
    )
    produced = _section(card, "## How the data was produced")
    assert "reasoning requested" not in card and "reasoning turned on" not in card
    assert (
        "thinking mode `none`: the checkpoint has no thinking mode, so reasoning is "
        "whatever the model wrote unprompted"
    ) in produced
    table = _section(card, "### Thinking mode and reasoning")
    assert "- `none` (5):" in table
    # 3 accepted without reasoning, 1 rejected by the judge without it, 1 cut off.
    assert "| SynthWords | 0 | 4 | 1 | 3 |" in table
    assert "Accepted items without reasoning are in `<Family>_RS_nothink` only." in table


def test_opens_mode_and_closed_reasoning() -> None:
    card = _run(
        generator="qwen3-vl",
        generator_kind="vlm",
        mode="opens",
        judge="judge-smollm2",
        judge_kind="llm",
        judge_raw=["WRONG"],
        probe_raw="WRONG",
    )
    assert "thinking mode `opens`: the chat template opens `<think>` itself" in card
    assert "| SynthWords | 4 | 0 | 1 | 0 |" in card  # closed, absent, unclosed, accepted w/o
    assert set(THINKING_MEANINGS) >= set(THINKING_MODES)


def test_mixed_thinking_modes_are_listed_with_counts_and_meanings() -> None:
    card = _run(
        generator="qwen3-vl",
        generator_kind="vlm",
        mode=["switch", "none", None],
        judge="judge-smollm2",
        judge_kind="llm",
        judge_raw=["WRONG", "WRONG"],
        probe_raw="WRONG",
    )
    produced = _section(card, "## How the data was produced")
    assert "in thinking modes `none` (2), `switch` (2), `unrecorded` (2) (below)." in produced
    listed = _section(card, "### Thinking mode and reasoning")
    assert f"- `switch` (2): {THINKING_MEANINGS['switch']}." in listed
    assert f"- `none` (2): {THINKING_MEANINGS['none']}." in listed
    assert "- `unrecorded` (2): not recorded" in listed


def test_judge_verdicts_counted_per_family_with_failure_causes() -> None:
    card = _run(
        generator="qwen3-vl",
        generator_kind="vlm",
        mode="server",
        judge="judge-smollm2",
        judge_kind="llm",
        judge_raw=["CORRECT", "WRONG", "UNSURE", None, "", "maybe"],
        probe_raw="WRONG",
    )
    verdicts = _section(card, "### Judge verdicts")
    assert "| family | judged | CORRECT | WRONG | UNSURE | failed | failure causes |" in verdicts
    assert (
        "| SynthWords | 6 | 1 | 1 | 1 | 3 | `call_failed` 1, `judge_empty` 1, "
        "`judge_unparsable` 1 |"
    ) in verdicts
    assert "thinking mode `server`: the model server rendered the prompt" in card
    assert "- `judge_failed`: " in card and "- `judge_unsure`: " in card


def test_failed_calibration_probes_are_shown_beside_the_rates() -> None:
    card = _run(
        generator="qwen3-vl",
        generator_kind="vlm",
        mode="switch",
        judge="judge-smollm2",
        judge_kind="llm",
        judge_raw=["WRONG"],
        probe_raw=None,
    )
    calibration = _section(card, "## Judge calibration")
    row = next(x for x in calibration.splitlines() if x.startswith("| SynthWords"))
    assert "| n/a | n/a |" in row and "| 0 / 0 | 3 /" in row
    assert "- SynthWords: `call_failed` " in calibration


def test_undeclared_kinds_and_old_reports_claim_nothing() -> None:
    card = _run(
        generator="vlm-x",
        generator_kind=None,
        mode=None,
        judge="judge-x",
        judge_kind=None,
        judge_raw=["WRONG"],
        probe_raw="WRONG",
        report_models=False,
    )
    first = _first_paragraph(card)
    assert "`vlm-x`, its kind was not declared" in first
    assert "`judge-x`, its kind was not declared" in first
    assert "reasoning requested" not in card
    assert "its thinking mode was not recorded" in card


@pytest.mark.parametrize("kind", sorted(MODEL_KINDS))
def test_every_model_kind_is_described(kind: str) -> None:
    card = _run(
        generator="g",
        generator_kind=kind,
        mode="switch",
        judge="j",
        judge_kind=kind,
        judge_raw=["WRONG"],
        probe_raw="WRONG",
    )
    first = _first_paragraph(card)
    assert "not declared" not in first and "`g`, " in first and "`j`, " in first


def test_loop_watching_says_what_it_cut_saved_and_cost_on_the_runs_figures() -> None:
    from rsieve.generate.loops import STREAMED_TOKEN_CPU_US

    on = _section(
        _run(
            generator="vlm",
            generator_kind="vlm",
            mode=None,
            judge="judge",
            judge_kind="llm",
            judge_raw=["WRONG"],
            probe_raw="WRONG",
        ),
        "## Loops cut short",
    )
    assert "Loop watching was on (`loop_window_chars` 2048)" in on  # the default
    assert f"about {STREAMED_TOKEN_CPU_US:g} us per streamed token" in on
    assert "`loop_window_chars` 0 turns it off" in on
    off = _section(
        _run(
            generator="vlm",
            generator_kind="vlm",
            mode=None,
            judge="judge",
            judge_kind="llm",
            judge_raw=["WRONG"],
            probe_raw="WRONG",
            settings={"loop_window_chars": 0},
        ),
        "## Loops cut short",
    )
    assert "Loop watching was off" in off and "us per streamed token" not in off


def test_a_tokenizers_path_is_shown_by_its_name_not_the_machines_path() -> None:
    card = _run(
        generator="vlm",
        generator_kind="vlm",
        mode=None,
        judge="judge",
        judge_kind="llm",
        judge_raw=["WRONG"],
        probe_raw="WRONG",
        settings={"judge_tokenizer": "/work/main/var/models/qwen-judge-tokenizer/"},
    )
    assert '| `judge_tokenizer` | "qwen-judge-tokenizer" |' in card
    assert "/work/main/var" not in card
