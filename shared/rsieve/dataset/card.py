"""The dataset card (README.md): YAML `configs` and `dataset_info` for every split, then how
the data was produced, the rules with their constants, the judge and its calibration, the
cleaning, the counts, the tokens the run used, and example rows with their images."""

from __future__ import annotations

import json
from typing import Any

import datasets
import yaml

from rsieve.compact.rows import features
from rsieve.dataset.report import REASONING_FORMS, UNRECORDED
from rsieve.generate.adaptive import rule
from rsieve.generate.loops import STREAMED_TOKEN_CPU_US
from rsieve.judge.calibration import wilson
from rsieve.judge.verdicts import TEMPLATE_SHA256, VERDICTS
from rsieve.schemas import QUARANTINE_REASONS, REJECT_REASONS
from rsieve.settings import Settings
from rsieve.verify import PROTOCOLS, training_rules_view

__all__ = ["THINKING_MEANINGS", "card_front_matter", "describe_models", "render_card"]

# One line per thinking mode (rsieve.schemas.THINKING_MODES): what it means for the
# reasoning in the rows.
THINKING_MEANINGS = {
    "switch": "reasoning turned on through the chat template's thinking switch",
    "opens": "the chat template opens `<think>` itself, so the model starts inside its reasoning",
    "none": "the checkpoint has no thinking mode, so reasoning is whatever the model wrote "
    "unprompted",
    "server": "the model server rendered the prompt, so whether reasoning was requested "
    "was up to the server",
    UNRECORDED: "not recorded (outputs generated before the thinking mode was stored)",
}
_SWITCH_OFF = "reasoning turned off through the chat template's thinking switch"

# What each kind of model is (rsieve.schemas.MODEL_KINDS), as the card says it.
_GENERATOR_KIND = {
    "vlm": "a vision-language model",
    "llm": "a text-only language model (it never saw the images)",
    "ocr-engine": "an OCR engine, not a language model: it ignores the prompt (it reads the "
    "image, never the question), and the reasoning recorded for it is its "
    "recognition trace, not reasoning",
    "stand-in": "a stand-in, not a model (named for what it does)",
}
_JUDGE_KIND = {
    "llm": "a text-only language model; its calibration below decides whether its promotions count",
    "vlm": "a vision-language model used text-only; its calibration below decides whether "
    "its promotions count",
    "ocr-engine": "an OCR engine, not a judge model",
    "stand-in": "a stand-in, not a judge model (named for what it does)",
}
_UNDECLARED = "its kind was not declared (Triton config parameter `rsieve_kind`)"
_JUDGE_SHORT = {
    "llm": "a text-only language model",
    "vlm": "a vision-language model",
    "ocr-engine": "an OCR engine, not a judge model",
    "stand-in": "a stand-in, not a judge model",
}


def _cell(value: object) -> str:
    """Markdown table cell text: pipes and backticks would break the table."""
    return str(value).replace("|", "\\|").replace("`", "'").replace("\n", " ")


def card_front_matter(manifest: dict[str, Any]) -> dict[str, Any]:
    files: dict[str, list[str]] = {}
    for shard in manifest["shards"]:
        files.setdefault(shard["split"], []).append(shard["path"])
    info = datasets.DatasetInfo(features=features(bool(manifest.get("sampled"))))._to_yaml_dict()
    info["splits"] = [
        {"name": split, "num_examples": rows} for split, rows in manifest["splits"].items()
    ]
    return {
        "configs": [
            {
                "config_name": "default",
                "data_files": [{"split": s, "path": paths} for s, paths in sorted(files.items())],
            }
        ],
        "dataset_info": info,
        "tags": ["rejection-sampling", "vision-language", "sft"],
    }


def _verdicts(report: dict[str, Any]) -> dict[str, int]:
    """The run's judge verdicts, all families together."""
    total = dict.fromkeys(VERDICTS, 0)
    for fam in report.get("families", {}).values():
        for verdict, n in (fam.get("judge_verdicts") or {}).items():
            total[verdict] = total.get(verdict, 0) + n
    return total


def _counts(verdicts: dict[str, int]) -> str:
    return ", ".join(f"{'failed' if v == 'FAILED' else v} {n}" for v, n in verdicts.items())


def _models_of(
    report: dict[str, Any], settings: dict[str, Any]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The generators and judges of the run with their kinds: from the report's records,
    else the models the settings name (a judge's kind then from its calibration records)."""
    models = report.get("models") or {}
    generators = list(models.get("generators") or [])
    judges = list(models.get("judges") or [])
    if not generators and settings.get("generator_model"):
        generators = [{"model": settings["generator_model"], "kind": None}]
    if not judges and settings.get("judge_model"):
        kinds = {
            k
            for s in (report.get("calibration") or {}).values()
            for m, k in (s.get("model_kinds") or {}).items()
            if m == settings["judge_model"] and k
        }
        judges = [
            {
                "model": settings["judge_model"],
                "kind": next(iter(kinds)) if len(kinds) == 1 else None,
            }
        ]
    return generators, judges


def describe_models(report: dict[str, Any], settings: dict[str, Any]) -> str:
    """The card's first words on the models: what each one that answered or judged is, by
    its declared kind (rsieve.schemas.MODEL_KINDS)."""
    generators, judges = _models_of(report, settings)
    parts = []
    for g in generators:
        what = _GENERATOR_KIND.get(g.get("kind") or "", _UNDECLARED)
        parts.append(f"The answers come from `{g['model']}`, {what}.")
    for j in judges:
        kind = j.get("kind") or ""
        what = _JUDGE_KIND.get(
            kind, _UNDECLARED + "; its calibration below decides whether its promotions count"
        )
        text = f"The judge step was `{j['model']}`, {what}"
        if kind == "stand-in" and len(judges) == 1:
            text += f"; its verdicts in this run: {_counts(_verdicts(report))}"
        parts.append(text + ".")
    return " ".join(parts)


def _production(settings: dict[str, Any], report: dict[str, Any]) -> str:
    """Who answered, how: never reasoning claimed for a model that has none."""
    generators, _ = _models_of(report, settings)
    names = ", ".join(f"`{g['model']}`" for g in generators) or "`(unknown)`"
    if generators and all(g.get("kind") == "ocr-engine" for g in generators):
        return (
            f"OCR engine {names} read every image; it ignores the question and the "
            "sampling settings, and the reasoning recorded for it is its recognition "
            "trace."
        )
    modes = report.get("thinking_modes") or {}
    text = f"Model {names} answered every question at temperature {settings['temperature']}"
    if settings.get("samples", 1) > 1:
        adaptive = rule(
            settings["samples"],
            enough=settings.get("enough"),
            keep=settings.get("keep", "first"),
            window=settings.get("pass_rate_window") or (),
            circular=bool(settings.get("circular")),
            sample_round=settings.get("sample_round", 0),
        )
        asked = (
            f"each question up to {adaptive.samples} times in rounds of {adaptive.round} "
            "(adaptive best-of-n: an item got no more once "
            + (
                f"{adaptive.enough} of its samples passed"
                if adaptive.enough
                else "its pass-rate interval lay wholly inside or outside the window"
            )
            + ")"
            if adaptive.on
            else f"every question {settings['samples']} times (best-of-n)"
        )
        text = (
            f"Model {names} answered {asked} "
            f"at temperature {settings['temperature']}, top_p {settings.get('top_p', 1.0)}, "
            f"each sample with its own seed from base seed {settings.get('seed', 0)}; "
            f"accepted answers kept: `{settings.get('keep', 'first')}`"
            + (
                f", at most {settings.get('max_kept', 1)} per question"
                if settings.get("keep") == "distinct"
                else ""
            )
        )
    if len(modes) == 1:
        mode = next(iter(modes))
        meaning = (
            _SWITCH_OFF
            if mode == "switch" and settings.get("reasoning") is False
            else THINKING_MEANINGS.get(mode, f"thinking mode `{mode}`")
        )
        return f"{text}; thinking mode `{mode}`: {meaning}."
    if modes:
        return (
            f"{text}, in thinking modes "
            + ", ".join(f"`{m}` ({n})" for m, n in modes.items())
            + " (below)."
        )
    return f"{text}; its thinking mode was not recorded."


def _reasoning_md(settings: dict[str, Any], report: dict[str, Any]) -> list[str]:
    """The thinking modes with what each means, and the outputs by reasoning form."""
    modes = report.get("thinking_modes") or {}
    out = ["### Thinking mode and reasoning", ""]
    if modes:
        out += ["Thinking mode of the prompts (outputs):", ""]
        for mode, n in modes.items():
            meaning = (
                _SWITCH_OFF
                if mode == "switch" and settings.get("reasoning") is False
                else THINKING_MEANINGS.get(mode, "not a known thinking mode")
            )
            out.append(f"- `{_cell(mode)}` ({n}): {meaning}.")
        out.append("")
    generators, _ = _models_of(report, settings)
    ocr = [g["model"] for g in generators if g.get("kind") == "ocr-engine"]
    if ocr:
        out += [
            ", ".join(f"`{m}`" for m in ocr) + " is an OCR engine: what the reasoning "
            "columns count is its recognition trace, not reasoning.",
            "",
        ]
    out += [
        "Outputs by reasoning form: closed (a think block closed, with reasoning in it), "
        "absent (no reasoning), unclosed (cut off inside the reasoning: no answer). "
        "Accepted items without reasoning are in `<Family>_RS_nothink` only.",
        "",
        "| family | closed | absent | unclosed | accepted without reasoning |",
        "|---|---|---|---|---|",
    ]
    for fam, r in report.get("families", {}).items():
        forms = r.get("reasoning")
        if not forms or not sum(forms.values()):
            continue
        out.append(
            f"| {_cell(fam)} | "
            + " | ".join(str(forms.get(f, 0)) for f in REASONING_FORMS)
            + f" | {r.get('accepted_without_reasoning', 0)} |"
        )
    return out


def _verdicts_md(report: dict[str, Any]) -> list[str]:
    """The judge's verdicts per family, failures apart from UNSURE, with their causes."""
    out = [
        "### Judge verdicts",
        "",
        "Per family, on the answers the verifier rejected. CORRECT counts promotions, "
        "including those held back as `judge_untrusted`; failed is no verdict (reason "
        "`judge_failed`), by cause: `call_failed` (the call failed), `judge_empty`, "
        "`judge_unparsable`, `judge_truncated` (cut off at the token budget).",
        "",
    ]
    rows = []
    for fam, r in report.get("families", {}).items():
        v = r.get("judge_verdicts") or {}
        if not sum(v.values()):
            continue
        causes = ", ".join(f"`{c}` {n}" for c, n in (r.get("judge_failure_causes") or {}).items())
        rows.append(
            f"| {_cell(fam)} | {sum(v.values())} | {v.get('CORRECT', 0)} | "
            f"{v.get('WRONG', 0)} | {v.get('UNSURE', 0)} | {v.get('FAILED', 0)} | "
            f"{causes or '-'} |"
        )
    if not rows:
        return [*out, "No answer reached the judge in this run."]
    return [
        *out,
        "| family | judged | CORRECT | WRONG | UNSURE | failed | failure causes |",
        "|---|---|---|---|---|---|---|",
        *rows,
        *_reused_md(report),
    ]


def _reused_md(report: dict[str, Any]) -> list[str]:
    """The verdicts (per family and for the run) and calibration probes whose reply was
    reused from the verdict cache: nothing when none was."""
    families = {
        f: r.get("judge_reused", 0)
        for f, r in report.get("families", {}).items()
        if r.get("judge_reused")
    }
    reused = report.get("judge_reused") or {}
    verdicts, probes = sum(families.values()), reused.get("calibration", 0)
    if not verdicts and not probes:
        return []
    judged = sum(_verdicts(report).values())
    text = (
        f"Reused: {verdicts} of the {judged} verdicts"
        + (
            " (" + ", ".join(f"{_cell(f)} {n}" for f, n in families.items()) + ")"
            if verdicts
            else ""
        )
        + f" and {probes} calibration probes were judged before by the same judge (model, "
        "weights, template, token budget) on the byte-identical prompt: their replies came "
        "from the verdict cache, read as fresh ones, and no call was made for them."
    )
    return ["", text]


def _tokens(usage: dict[str, Any]) -> str:
    return f"{usage['calls']:,} | {usage['prompt_tokens']:,} | {usage['completion_tokens']:,}"


def _sampling_md(report: dict[str, Any]) -> list[str]:
    """Best-of-n runs: per family, the pass rates and the yield at n against one sample,
    the samples drawn per item and what adaptive stopping saved."""
    sampling = report.get("sampling") or {}
    if not sampling:
        return []
    out = [
        "## Best-of-n",
        "",
        "Every sample was verified; the judge saw an item's rejected samples only when none "
        "passed the verifier. An item's pass rate is its accepted samples over those "
        "answered. Yield at 1 counts the items whose first sample was accepted: the judge "
        "saw the first sample only when no sample passed, so it is a lower bound of what "
        "one sample per question would have given. Samples were drawn in rounds, and an "
        "item got no more once it had given its signal (adaptive best-of-n): enough "
        "samples passed, or its pass-rate interval lay wholly inside or outside the "
        "pass-rate window. Tokens saved are estimated at the family's mean output tokens "
        "per drawn sample.",
        "",
        "| family | items | samples | accepted at n | accepted at 1 | pass rates (k/n: items) "
        "| drawn per item (n: items) | samples not drawn | tokens saved (est.) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for family, s in sampling.items():
        histogram = ", ".join(f"{k}: {v}" for k, v in s["pass_histogram"].items())
        drawn = ", ".join(f"{k}: {v}" for k, v in (s.get("drawn_histogram") or {}).items())
        saved = s.get("tokens_saved_estimate")
        out.append(
            f"| {_cell(family)} | {s['items']} | {s['samples']} | {s['accepted_at_n']} "
            f"| {s['accepted_at_1']} | {histogram} | {drawn} | {s.get('samples_not_drawn', '')} "
            f"| {'' if saved is None else f'{saved:,}'} |"
        )
    pairs = _pair_rejections_md(report)
    return [*out, "", *pairs] if pairs else out


def _pair_rejections_md(report: dict[str, Any]) -> list[str]:
    """One sentence on the judge calls judge_pair_rejections made (none: nothing)."""
    counts: dict[str, int] = {}
    for r in report.get("families", {}).values():
        for k, n in (r.get("pair_rejections") or {}).items():
            counts[k] = counts.get(k, 0) + n
    if not counts:
        return []
    usage = ((report.get("tokens") or {}).get("total", {}).get("judge") or {}).get(
        "pair_rejections"
    ) or dict.fromkeys(("calls", "prompt_tokens", "completion_tokens"), 0)
    judged = counts["asked"] + counts["reused"]
    return [
        f"The judge was also asked about the refused samples of accepted items, once per "
        f"distinct answer: {judged} samples, {counts['asked']} asked and {counts['reused']} "
        f"sharing an earlier reply ({_counts({v: counts[v] for v in VERDICTS})}), costing "
        f"{usage['calls']:,} calls, {usage['prompt_tokens']:,} prompt and "
        f"{usage['completion_tokens']:,} completion tokens, counted in the Cost section's "
        "`all` only, not in the judge's verdicts or calls; a CORRECT counts in the item's "
        "pass rate and never changes its kept answer.",
    ]


def _loops_md(report: dict[str, Any], settings: dict[str, Any]) -> list[str]:
    """Loop watching: what it cut and saved on this run, and what it cost in client CPU
    (the run's generated tokens at the streaming client's measured cost per token)."""
    # A run spec leaves out settings recorded after its release at their defaults.
    window = settings.get("loop_window_chars", Settings.model_fields["loop_window_chars"].default)
    if not window:
        return [
            "## Loops cut short",
            "",
            "Loop watching was off (`loop_window_chars` 0): no sample was streamed, and a "
            "generation that fell into a repetition loop ran to its token budget.",
        ]
    looped = {f: c for f, c in report["families"].items() if c.get("repetition_loops")}
    generated = ((report.get("tokens") or {}).get("total") or {}).get("generator") or {}
    completion = int(generated.get("completion_tokens") or 0)
    saved = sum(c["loop_tokens_saved"] for c in looped.values())
    out = [
        "## Loops cut short",
        "",
        f"Loop watching was on (`loop_window_chars` {window}): on a streaming interface "
        "(Triton's vLLM backend, an OpenAI-compatible server; the rsieve interface never "
        "streams) every sample streamed, and a generation whose text came to repeat one "
        "stretch word for word was cancelled and recorded `repetition_loop`, a failure like "
        "`truncated_reasoning`; the tokens of its budget it never generated were saved: "
        f"{saved:,} on this run. The price is the generator's CPU: about "
        f"{STREAMED_TOKEN_CPU_US:g} us per streamed token against an engine that sends a "
        "response per token (docs/performance.md, measured on 2 cores), so about "
        f"{completion * STREAMED_TOKEN_CPU_US / 1e6:,.0f} CPU seconds for the "
        f"{completion:,} tokens generated here. `loop_window_chars` 0 turns it off.",
    ]
    if not looped:
        return out
    out += [
        "",
        "| family | samples cut | tokens generated | tokens saved |",
        "|---|---|---|---|",
    ]
    for family, c in sorted(looped.items()):
        out.append(
            f"| {_cell(family)} | {c['repetition_loops']} | {c['loop_tokens_generated']:,} "
            f"| {c['loop_tokens_saved']:,} |"
        )
    return out


def _cost_md(report: dict[str, Any]) -> list[str]:
    """The latest run's token usage per model and per family, calibration apart, and a
    sentence when calls came back without usage."""
    out = ["## Cost", ""]
    tokens = report.get("tokens")
    if not tokens:  # a report written before token usage was counted
        return [*out, "Token usage was not recorded for this run."]
    out += [
        f"Tokens used by the latest run `{report['run']}`, as the model servers reported "
        "them: one call per answer and per judge verdict, and the judge's calibration "
        "probes counted apart; calls that failed are not counted.",
        "",
        "| model | role | calls | prompt tokens | completion tokens | calls without usage |",
        "|---|---|---|---|---|---|",
    ]
    for m in tokens["by_model"]:
        parts = [(m["role"], m)]
        if m["role"] == "judge" and m["calibration"]["calls"]:
            parts.append(("judge calibration", m["calibration"]))
        out += [
            f"| `{_cell(m['model'])}` | {role} | {_tokens(u)} | {u['calls_without_usage']:,} |"
            for role, u in parts
        ]
    every = tokens["total"]["all"]
    out += [
        f"| all | | {_tokens(every)} | {every['calls_without_usage']:,} |",
        "",
        "| family | generator calls | generator prompt tokens | generator completion tokens "
        "| judge calls | judge prompt tokens | judge completion tokens | calibration calls | "
        "calibration prompt tokens | calibration completion tokens |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for fam, u in tokens["by_family"].items():
        out.append(
            f"| {_cell(fam)} | {_tokens(u['generator'])} | {_tokens(u['judge'])} | "
            f"{_tokens(u['judge']['calibration'])} |"
        )
    judge_total = tokens["total"].get("judge") or {}
    reused = judge_total.get("reused", 0) + (judge_total.get("calibration") or {}).get("reused", 0)
    if reused:
        out += [
            "",
            f"{reused:,} judge replies (verdicts and calibration probes) were reused from the "
            "verdict cache: no call was made for them, and neither they nor their tokens "
            "are counted above.",
        ]
    if every["calls_without_usage"]:
        out += [
            "",
            f"{every['calls_without_usage']:,} of {every['calls']:,} calls came back without "
            "token usage (their server returned no prompt or no completion token count): the "
            "sums hold only the counts returned, so they are lower bounds.",
        ]
    return out


def _training_md(settings: dict[str, Any], report: dict[str, Any], used: list[str]) -> list[str]:
    """The training acceptance of each protocol used, its rule's constants, the families'
    own rules, and per family the near misses (benchmark pass, training refused)."""
    by_protocol = settings.get("training_rules") or {}
    by_family = settings.get("family_training_rules") or {}
    rules = training_rules_view()
    out = [
        "## Training acceptance",
        "",
        "Two numbers per decision: the benchmark's score and pass (its reference scorer's, "
        "exactly: `verification.accepted`) and training acceptance "
        "(`verification.training_accepted`), the stricter bar a training target must also "
        "meet. An answer the benchmark passes and training refuses is a near miss: "
        "rejected with reason `near_miss` and sent to the judge, which may promote it "
        "with a calibrated CORRECT only.",
        "",
        "| protocol | training rule | constants |",
        "|---|---|---|",
    ]
    for name in used:
        rule = by_protocol.get(name, "benchmark")
        constants = rules.get(rule, {}).get("constants", {})
        out.append(f"| `{name}` | `{rule}` | {_cell(json.dumps(constants, ensure_ascii=False))} |")
    if by_family:
        out += ["", "Families with a rule of their own:", ""]
        out += [f"- {_cell(f)}: `{r}`" for f, r in sorted(by_family.items())]
    families = {f: r for f, r in report.get("families", {}).items() if r.get("near_misses")}
    if not families:
        return [*out, "", "No near miss in the latest run."]
    out += [
        "",
        "| family | near misses | promoted by the judge |",
        "|---|---|---|",
        *[
            f"| {_cell(f)} | {r['near_misses']} | {r.get('near_misses_promoted', 0)} |"
            for f, r in families.items()
        ],
        "",
        "Examples:",
        "",
        "| family | id | answer | reference | score | judge | place |",
        "|---|---|---|---|---|---|---|",
    ]
    for f, r in families.items():
        for e in r.get("near_miss_examples") or []:
            out.append(
                f"| {_cell(f)} | {_cell(e['id'])} | {_cell(e['answer'])} | "
                f"{_cell(' / '.join(e['references']))} | {e['score']} | "
                f"{_cell(e['verdict'] or 'not asked')} | {e['place']} |"
            )
    return out


def _trace_gate_md(report: dict[str, Any]) -> list[str]:
    """The trace gate's checks and constants, and per family how many accepted traces each
    check kept out of `_RS_think`, with one example each (rsieve.compact.traces)."""
    gate = report.get("trace_gate")
    out = ["## Trace gate", ""]
    if gate is None:
        return [*out, "The latest run was compacted before the trace gate existed."]
    if not gate["checks"]:
        return [*out, "Turned off for the latest run (`trace_checks` is empty)."]
    out += [
        "Every accepted answer with reasoning had its trace checked before it could enter "
        "`_RS_think`: "
        + ", ".join(f"`{c}`" for c in gate["checks"])
        + f" (checks version {gate['version']}). A trace that fails any keeps its answer "
        "in `_RS_nothink` only; the qa entry records `trace_checks` (true: passed, null: not "
        "run) and `trace_reasons`. Constants: "
        + ", ".join(f"`{k}` = {v}" for k, v in gate["constants"].items())
        + ".",
        "",
    ]
    families = {f: r for f, r in report.get("families", {}).items() if r.get("trace_checked")}
    if not families:
        return [*out, "No accepted trace in the latest run."]
    checks = list(gate["checks"])
    out += [
        "| family | traces checked | kept out of think | " + " | ".join(checks) + " |",
        "|---|---|---|" + "---|" * len(checks),
    ]
    for f, r in families.items():
        failures = r.get("trace_failures") or {}
        out.append(
            f"| {_cell(f)} | {r['trace_checked']} | {r['trace_gated']} | "
            + " | ".join(str(failures.get(c, 0)) for c in checks)
            + " |"
        )
    bands = gate.get("length_bands") or {}
    if bands:
        out += [
            "",
            "Length bands (characters): "
            + "; ".join(
                f"{_cell(f)} {b['low']:.0f}-{b['high']:.0f} (median {b['median']:.0f} of "
                f"{b['traces']})"
                for f, b in bands.items()
            )
            + ".",
        ]
    examples = [(f, e) for f, r in families.items() for e in r.get("trace_examples") or []]
    if examples:
        out += ["", "One example per check:", "", "| family | check | id | why | trace begins |"]
        out += ["|---|---|---|---|---|"]
        out += [
            f"| {_cell(f)} | `{e['check']}` | {_cell(e['id'])} | {_cell(e['reason'])} | "
            f"{_cell(e['reasoning'])} |"
            for f, e in examples
        ]
    return out


def _blind_md(settings: dict[str, Any], report: dict[str, Any]) -> list[str]:
    """The blind pass: per family, accepted items asked again without their image, those
    still answered right, and the language-shortcut rate with its Wilson interval."""
    out = ["## Blind pass", ""]
    if not settings.get("blind_pass"):
        return [
            *out,
            "Not run for the latest run (`blind_pass` off): no item was asked without its "
            "image, and `answerable_without_image` is null throughout.",
        ]
    policy = settings.get("blind_policy", "keep")
    out += [
        "Every item the verifier accepted was asked again without its image (the same "
        "model and sampling, the question byte for byte; under circular sampling once per "
        "rotation, all of which must pass). `answerable_without_image` is true when the "
        "blind answer also passed the item's protocol. Policy `"
        + policy
        + "`: "
        + {
            "keep": "such items are only flagged.",
            "nothink": "such items are kept out of `_RS_think` (in `_RS_nothink` only).",
            "drop": "such items are rejected with reason `answerable_without_image`.",
        }[policy],
        "",
    ]
    families = {
        f: r
        for f, r in report.get("families", {}).items()
        if r.get("blind_asked") or r.get("blind_failed")
    }
    if not families:
        return [*out, "No accepted item in the latest run."]
    out += [
        "| family | asked blind | answerable without image | language-shortcut rate "
        "(95% Wilson) | blind request failed |",
        "|---|---|---|---|---|",
    ]
    for f, r in families.items():
        k, n = r["blind_answerable"], r["blind_asked"]
        if n:
            low, high = wilson(k, n)
            rate = f"{k / n:.1%} ({low:.1%}-{high:.1%})"
        else:
            rate = "-"
        out.append(f"| {_cell(f)} | {n} | {k} | {rate} | {r.get('blind_failed', 0)} |")
    examples = [(f, e) for f, r in families.items() for e in r.get("blind_examples") or []]
    if examples:
        out += [
            "",
            "Answered right without the image:",
            "",
            "| family | id | question | blind answer | references |",
            "|---|---|---|---|---|",
        ]
        out += [
            f"| {_cell(f)} | {_cell(e['id'])} | {_cell(e['question'])} | "
            f"{_cell(e['blind_answer'])} | {_cell(' / '.join(e['references']))} |"
            for f, e in examples
        ]
    return out


def _shown(key: str, value: Any) -> Any:
    """A setting as the card shows it: a tokenizer's checkpoint by its folder or file name,
    not the absolute path of the machine that made the run (run_spec.json keeps that)."""
    if key.endswith("_tokenizer") and isinstance(value, str) and value.startswith("/"):
        return value.rstrip("/").rsplit("/", 1)[-1]
    return value


def _front_md(manifest: dict[str, Any]) -> list[str]:
    front = yaml.safe_dump(card_front_matter(manifest), sort_keys=False, allow_unicode=True)
    return ["---", front.strip(), "---"]


def _title_md(dataset: str, settings: dict[str, Any], report: dict[str, Any]) -> list[str]:
    """The title, what the data is for, and how to load it."""
    return [
        f"# {dataset}",
        "",
        "Rejection-sampled supervised fine-tuning data for vision-language models, made "
        f"by rsieve. {describe_models(report, settings)} Train on `answer` in the "
        "`_RS_think` / `_RS_nothink` splits; the `_rejected` splits are training data too: "
        "`answer` is the official reference and `wrong_vlm` what the model said instead.",
        "",
        "```python",
        "import datasets",
        f'ds = datasets.load_dataset("{dataset}")',
        "```",
    ]


def _produced_md(settings: dict[str, Any], report: dict[str, Any]) -> list[str]:
    """How every answer was made, checked and placed, and what the fields of an entry hold."""
    _, judges = _models_of(report, settings)
    judge_names = (
        "; ".join(
            f"`{j['model']}`: {_JUDGE_SHORT.get(j.get('kind') or '', 'kind not declared')}"
            for j in judges
        )
        or f"`{settings.get('judge_model')}`"
    )
    return [
        "## How the data was produced",
        "",
        f"{_production(settings, report)} The `question` field is "
        "byte-identical to the prompt the model received, appended instruction included. "
        "Each answer (the text after the reasoning) was compared with the reference by the "
        "family's protocol, tried whole, as its first line and as its first paragraph. "
        "Matches with reasoning go to `<Family>_RS_think` (with the reasoning) and "
        "`<Family>_RS_nothink`; matches without reasoning to `<Family>_RS_nothink` only. "
        f"Every rejection went to the text-only judge step ({judge_names}; prompt "
        f"template sha256 `{TEMPLATE_SHA256[:16]}`) "
        "that sees question, reference and candidate, never the image, and answers CORRECT, "
        "WRONG or UNSURE. Only CORRECT promotes; WRONG and UNSURE stay in "
        "`<Family>_rejected`, and so does a judgement that gave no verdict (the call failed, "
        "or the output was empty, unparsable or cut off: reason `judge_failed`, counted "
        "apart from UNSURE).",
        "",
        "In accepted splits `answer` is the model's own verified output: the form of "
        "its answer that passed (the whole text, its first line or its first paragraph, "
        "as `verification.variant` says; the whole text for a judge promotion), with the "
        "whole post-reasoning text in `full_answer`. `org_answer` (accepted) and `answer` "
        "(rejected) hold one reference, the most frequent of the item's references (ties "
        "to the first listed); `references` holds them all. Each entry records the "
        "verifier decision (protocol, version, constants, variant, score) with the "
        "multiple-choice `options`, or the judge verdict that promoted it: `rsieve "
        "recheck <export folder>` recomputes every decision and the judge hold-back from "
        "the published files alone.",
    ]


def _run_spec_md(spec: dict[str, Any]) -> list[str]:
    """What run_spec.json records, and every deciding setting with its value."""
    return [
        "## Run specification",
        "",
        "`run_spec.json` beside this card records how every row was made: "
        f"rsieve {spec.get('rsieve_version', '')}, the pool's sha256 "
        f"`{str(spec.get('pool_sha256', ''))[:16]}`, every setting that decides what a run "
        "keeps (below), the protocol versions, and each model with its versions and chat "
        "template hashes.",
        "",
        "| setting | value |",
        "|---|---|",
        *[
            f"| `{k}` | {_cell(json.dumps(_shown(k, v), ensure_ascii=False))} |"
            for k, v in sorted(spec["settings"].items())
        ],
    ]


def _protocols_md(used: list[str]) -> list[str]:
    """The verification protocols the run used, with their versions, thresholds and constants."""
    return [
        "## Verification protocols",
        "",
        "| protocol | version | accept at score | constants |",
        "|---|---|---|---|",
        *[
            f"| `{name}` | {PROTOCOLS[name].version} | >= {PROTOCOLS[name].threshold} | "
            f"{_cell(json.dumps(PROTOCOLS[name].constants, ensure_ascii=False))} |"
            for name in used
        ],
    ]


def _calibration_md(calibration_md: str) -> list[str]:
    """The judge's calibration (rsieve.judge.calibration.render_calibration_markdown), under
    a heading of its own when the text brings none."""
    if calibration_md.strip().startswith("## "):
        return [calibration_md.strip()]
    return [
        "## Judge calibration",
        "",
        calibration_md.strip() or "No calibration was recorded for this run.",
    ]


def _cleaning_md(settings: dict[str, Any], cleaning_md: str) -> list[str]:
    """Why items are quarantined, the run's cleaning measurements
    (rsieve.clean.cleaning.render_cleaning) and why answers are rejected."""
    out = [
        "## Cleaning applied",
        "",
        "Items are quarantined (listed in `quarantine.jsonl` with id, pool line, family, "
        "stage and reason) and never reach a split when:",
        "",
        *[f"- `{k}`: {v}" for k, v in QUARANTINE_REASONS.items()],
        "",
        f"Provenance policy: `{settings.get('provenance_policy', 'strict')}`.",
    ]
    if cleaning_md.strip():
        out += ["", cleaning_md.strip()]
    return [
        *out,
        "",
        "Rejected-split reasons:",
        "",
        *[f"- `{k}`: {v}" for k, v in REJECT_REASONS.items()],
    ]


def _counts_md(
    report: dict[str, Any], manifest: dict[str, Any], split_families: dict[str, str]
) -> list[str]:
    """The rows of every split, the latest run's accounting per family, and how split names
    are made from family names."""
    return [
        "## Counts",
        "",
        "| split | family | rows (images) |",
        "|---|---|---|",
        *[
            f"| `{s}` | {_cell(split_families.get(s, ''))} | {n} |"
            for s, n in manifest["splits"].items()
        ],
        "",
        f"Latest run `{report['run']}`:",
        "",
        "| family | items in | accepted (by judge) | rejected | quarantined |",
        "|---|---|---|---|---|",
        *[
            f"| {_cell(fam)} | {r['in']} | {r['accepted']} ({r['promoted_by_judge']}) | "
            f"{r['rejected']} {_cell(json.dumps(r['rejected_by_reason']))} | "
            f"{r['quarantined']} {_cell(json.dumps(r['quarantined_by_reason']))} |"
            for fam, r in report["families"].items()
        ],
        "",
        f"Accounting of the latest run adds up: **{report['adds_up']}** "
        f"({report['lines']} pool items). Runs in this dataset: "
        + ", ".join(f"`{r}`" for r in manifest["runs"])
        + ".",
        "",
        "Split names are the family name with every character outside `[0-9A-Za-z_]` "
        "replaced by `_`: "
        + ", ".join(f"`{s}` ← {_cell(f)}" for s, f in sorted(split_families.items())),
    ]


# The fields an example shows, in this order (those that are None are left out).
_EXAMPLE_FIELDS = ("id", "question", "answer", "org_answer", "wrong_vlm", "reason", "promoted_by")


def _examples_md(examples: dict[str, list[tuple[dict[str, Any], str]]]) -> list[str]:
    """Example rows per split, each its image and a table of its fields. Every example, and
    the heading when there is none, is followed by a blank line: the card ends with one."""
    out = ["## Examples", ""]
    for split, rows in sorted(examples.items()):
        out += [f"### {split}", ""]
        for qa, image_path in rows:
            out += [f"![{qa['id']}]({image_path})", "", "| field | value |", "|---|---|"]
            out += [f"| `{k}` | {_cell(qa[k])} |" for k in _EXAMPLE_FIELDS if qa.get(k) is not None]
            out.append("")
    return out


def render_card(
    *,
    dataset: str,
    spec: dict[str, Any],
    report: dict[str, Any],
    manifest: dict[str, Any],
    split_families: dict[str, str],
    examples: dict[str, list[tuple[dict[str, Any], str]]],
    calibration_md: str = "",
    cleaning_md: str = "",
) -> str:
    """The card: its sections in order, one blank line between two (a section with nothing
    to say, such as best-of-n on a run of one sample, is left out)."""
    settings = spec["settings"]
    used = sorted(spec.get("protocols_used") or PROTOCOLS)
    sections = [
        _front_md(manifest),
        _title_md(dataset, settings, report),
        _produced_md(settings, report),
        _run_spec_md(spec),
        _reasoning_md(settings, report),
        _verdicts_md(report),
        _protocols_md(used),
        _training_md(settings, report, used),
        _trace_gate_md(report),
        _blind_md(settings, report),
        _calibration_md(calibration_md),
        _cleaning_md(settings, cleaning_md),
        _counts_md(report, manifest, split_families),
        _sampling_md(report),
        _loops_md(report, settings),
        _cost_md(report),
        _examples_md(examples),
    ]
    return "\n\n".join("\n".join(lines) for lines in sections if lines) + "\n"
