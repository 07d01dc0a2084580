"""Run accounting: every item that entered ends in exactly one place, and the report
proves it per family (in = accepted + rejected + quarantined).

Beside the accounting, per family: the judge's verdicts (CORRECT / WRONG / UNSURE /
FAILED, with the failure causes, and how many were reused from the verdict cache), the
model outputs by reasoning form (`closed`, `absent`, `unclosed`) and the accepted items
without reasoning; with judge_pair_rejections, the verdicts on the refused samples of
items the verifier accepted (`pair_rejections`, apart); for the run: the thinking modes
the prompts were rendered with, the models that answered and judged, with their kinds,
and the tokens they used (`token_usage`)."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from typing import Any

from rsieve.compact.settle import sampling_summary
from rsieve.generate.think import LOOP_FINISH
from rsieve.judge.calibration import CalibrationRecord, record_state
from rsieve.judge.cascade import verdict_state
from rsieve.judge.verdicts import VERDICTS
from rsieve.schemas import Generation, Outcome, Quarantined

__all__ = [
    "REASONING_FORMS",
    "TOKEN_ROLES",
    "UNRECORDED",
    "finish_report",
    "reasoning_form",
    "report_part",
    "run_report",
    "token_usage",
    "tokens_summed",
    "verifier_passed",
]

UNKNOWN_FAMILY = "(unknown)"
# A generation's thinking mode when its record has none (written before it was recorded).
UNRECORDED = "unrecorded"
REASONING_FORMS = ("closed", "absent", "unclosed")


def reasoning_form(gen: Generation) -> str:
    """`unclosed`: cut off inside the reasoning (failure `truncated_reasoning`); `closed`:
    a think block closed, with reasoning in it; `absent`: no reasoning (no think tags, or
    an empty block)."""
    if gen.failure == "truncated_reasoning":
        return "unclosed"
    return "closed" if (gen.reasoning or "").strip() else "absent"


def _family() -> dict[str, Any]:
    return {
        "in": 0,
        "accepted": 0,
        "accepted_by_verifier": 0,
        "promoted_by_judge": 0,
        "rejected": 0,
        "rejected_by_reason": Counter(),
        "quarantined": 0,
        "quarantined_by_reason": Counter(),
        "judge_verdicts": dict.fromkeys(VERDICTS, 0),
        "judge_failure_causes": Counter(),
        # Verdicts whose reply came from the verdict cache (rsieve.judge.judgecache): no call.
        "judge_reused": 0,
        "reasoning": dict.fromkeys(REASONING_FORMS, 0),
        "accepted_without_reasoning": 0,
        # The trace gate (rsieve.compact.traces): accepted items whose reasoning it checked,
        # those it kept out of `_RS_think` (in `_RS_nothink` only), how many failed each
        # check (an item may fail several), one example per check for the card, and the
        # family's length band when `length` had one.
        "trace_checked": 0,
        "trace_gated": 0,
        "trace_failures": Counter(),
        "trace_examples": [],
        # The blind pass (rsieve.judge.blind): accepted items asked again without their
        # image (a failed request not counted), those the model still answered right
        # (the language-shortcut rate is their ratio), those whose blind request failed,
        # and a few answerable ones for the card.
        "blind_asked": 0,
        "blind_answerable": 0,
        "blind_failed": 0,
        "blind_examples": [],
        # Answers the benchmark passes and training acceptance refuses (rsieve.verify), how
        # many of them the judge promoted, and a few for the card.
        "near_misses": 0,
        "near_misses_promoted": 0,
        "near_miss_examples": [],
        # Samples cut in a repetition loop while they streamed (rsieve.generate.loops):
        # how many, the tokens they generated, and those of their budget never spent.
        "repetition_loops": 0,
        "loop_tokens_generated": 0,
        "loop_tokens_saved": 0,
    }


# Near misses a report part keeps as examples per family (the card shows them).
NEAR_MISS_EXAMPLES = 3
# Items answerable without their image a report part keeps as examples per family.
BLIND_EXAMPLES = 3
# The start of a gated trace an example shows (the card quotes it).
TRACE_EXCERPT_CHARS = 300


def _models(seen: Counter[tuple[str, str | None]], count: str) -> list[dict[str, Any]]:
    kinds: dict[str, str | None] = {}
    totals: Counter[str] = Counter()
    for (model, kind), n in seen.items():
        kinds[model] = kinds.get(model) or kind
        totals[model] += n
    return [{"model": m, "kind": kinds[m], count: totals[m]} for m in sorted(totals)]


TOKEN_ROLES = ("generator", "judge")
_USAGE = ("calls", "prompt_tokens", "completion_tokens", "calls_without_usage")


def _usage(role: str) -> dict[str, Any]:
    usage: dict[str, Any] = dict.fromkeys(_USAGE, 0)
    if role != "judge":
        return usage
    # A judge's `reused`: replies taken from the verdict cache, which made no call.
    return usage | {"reused": 0, "calibration": dict.fromkeys(_USAGE, 0) | {"reused": 0}}


def _count(
    usage: dict[str, Any], prompt: int | None, completion: int | None, reused: bool = False
) -> None:
    if reused:  # no call made this run: counted apart, its tokens not at all
        usage["reused"] = usage.get("reused", 0) + 1
        return
    usage["calls"] += 1
    usage["prompt_tokens"] += prompt or 0
    usage["completion_tokens"] += completion or 0
    if prompt is None or completion is None:
        usage["calls_without_usage"] += 1


def token_usage(
    outcomes: Iterable[Outcome], calibration: Iterable[CalibrationRecord] = ()
) -> dict[str, Any]:
    """The tokens the run's answered calls used, as the model servers reported them: one
    generator call per outcome, and one per blind request answered (the blind pass); one
    judge call per verdict; one per calibration record, counted apart (`calibration`
    inside every judge entry), and one per verdict on a refused sample of an item the
    verifier accepted (judge_pair_rejections), counted apart too (`pair_rejections` inside
    the judge entries that have some). A judge call that failed (no reply: cause `call_failed`)
    is not counted, nor is an item quarantined as
    `model_error` (it has no outcome). A verdict or calibration record whose reply was
    reused from the verdict cache made no call: it is counted in the judge's `reused`
    (and its calibration's), never in `calls` or the token sums, nor in `all`. A usage is
    `{calls, prompt_tokens, completion_tokens, calls_without_usage}` (a judge's also
    `reused`): a call whose server returned no prompt or no completion token count is
    counted in `calls_without_usage`, and the sums hold only the counts returned (lower
    bounds when `calls_without_usage` is not 0).

    `by_model`: `[{model, role, **usage}]` (judges with `calibration`), generators first;
    `by_family`: family -> `{generator: usage, judge: usage}`; `total`: the same per role,
    and `all`, every call of the run, calibration included."""
    return _tallied(_token_calls(outcomes, calibration))


# A model call the token usage counts: (role, model, family, part, prompt tokens, completion
# tokens, reused); part: the judge usage's sub-usage it counts in (calibration,
# pair_rejections), None for its own.
_Call = tuple[str, str, str, str | None, int | None, int | None, bool]


def _token_calls(
    outcomes: Iterable[Outcome], calibration: Iterable[CalibrationRecord]
) -> list[_Call]:
    """Every answered call of the run, in `token_usage`'s terms."""
    calls: list[_Call] = []
    # Best-of-n: every sample's calls, not only the settled one's.
    heads = list(outcomes)
    sampled = [
        (s, "pair_rejections" if verifier_passed(o) else None)
        for o in heads
        for s in (o, *(o.samples.others if o.samples else ()))
    ]
    for o in heads:
        # The blind pass's calls (rsieve.judge.blind): the generator's, once per item (every
        # sample of the item carries the same record).
        blind = o.generation.blind
        if blind is not None:
            g = o.generation
            for prompt, completion in zip(blind.input_tokens, blind.output_tokens, strict=True):
                calls.append(("generator", g.model, g.item.family, None, prompt, completion, False))
    for o, part in sampled:
        g, v = o.generation, o.verdict
        calls.append(
            ("generator", g.model, g.item.family, None, g.input_tokens, g.output_tokens, False)
        )
        if v is not None and verdict_state(v.verdict, v.cause)[1] != "call_failed":
            calls.append(
                ("judge", v.model, g.item.family, part, v.input_tokens, v.output_tokens, v.reused)
            )
    for r in calibration:
        if record_state(r)[1] != "call_failed":
            calls.append(
                (
                    "judge",
                    r.model,
                    r.probe.family,
                    "calibration",
                    r.input_tokens,
                    r.output_tokens,
                    r.reused,
                )
            )
    return calls


def _tallied(calls: Iterable[_Call]) -> dict[str, Any]:
    """The calls summed per model, per family, per role and in all (`token_usage`)."""
    by_model: dict[tuple[int, str], dict[str, Any]] = {}
    by_family: dict[str, dict[str, dict[str, Any]]] = {}
    total: dict[str, dict[str, Any]] = {role: _usage(role) for role in TOKEN_ROLES}
    every = dict.fromkeys(_USAGE, 0)
    for role, model, family, part, prompt, completion, reused in calls:
        entry = by_model.setdefault(
            (TOKEN_ROLES.index(role), model), {"model": model, "role": role} | _usage(role)
        )
        fam = by_family.setdefault(family, {r: _usage(r) for r in TOKEN_ROLES})
        for usage in (entry, fam[role], total[role]):
            if part is not None:
                # pair_rejections only where there were some: a report without is as before.
                usage = usage.setdefault(part, dict.fromkeys(_USAGE, 0) | {"reused": 0})
            _count(usage, prompt, completion, reused)
        if not reused:
            _count(every, prompt, completion)
    return {
        "by_model": [by_model[k] for k in sorted(by_model)],
        "by_family": dict(sorted(by_family.items())),
        "total": total | {"all": every},
    }


def _count_trace(fam: dict[str, Any], outcome: Outcome) -> None:
    trace = outcome.trace
    assert trace is not None
    fam["trace_checked"] += 1
    fam["trace_gated"] += not trace.passed
    shown = {e["check"] for e in fam["trace_examples"]}
    for check, passed in trace.checks.items():
        if passed:
            continue
        fam["trace_failures"][check] += 1
        if check not in shown:
            reason = next((r for r in trace.reasons if r.startswith(f"{check}:")), "")
            fam["trace_examples"].append(
                {
                    "check": check,
                    "id": outcome.generation.item.id,
                    "reason": reason[:200],
                    "reasoning": (outcome.generation.reasoning or "")[:TRACE_EXCERPT_CHARS],
                }
            )


def _count_blind(fam: dict[str, Any], outcome: Outcome) -> None:
    gen = outcome.generation
    blind = gen.blind
    assert blind is not None
    if blind.answerable is None:
        fam["blind_failed"] += 1
        return
    fam["blind_asked"] += 1
    if blind.answerable:
        fam["blind_answerable"] += 1
        if len(fam["blind_examples"]) < BLIND_EXAMPLES:
            fam["blind_examples"].append(
                {
                    "id": gen.item.id,
                    "question": gen.item.question[:200],
                    "blind_answer": (blind.answers[0] or "")[:200] if blind.answers else "",
                    "references": list(gen.item.references[:3]),
                }
            )


def _count_loop(fam: dict[str, Any], gen: Generation) -> None:
    """A sample cut in a repetition loop (rsieve.generate.loops): the tokens it generated
    and those of its budget it never spent (unknown budget or tokens: not counted)."""
    fam["repetition_loops"] += 1
    budget = gen.sampling.get("max_tokens") or gen.sampling.get("max_new_tokens")
    if gen.output_tokens is not None:
        fam["loop_tokens_generated"] += gen.output_tokens
        if isinstance(budget, int):
            fam["loop_tokens_saved"] += max(0, budget - gen.output_tokens)


def verifier_passed(outcome: Outcome) -> bool:
    """Whether a settled best-of-n item had a sample the verifier accepted: every verdict on
    its samples is then one judge_pair_rejections asked for (without it, such an item's
    samples are never judged: rsieve.compact.settle.to_judge)."""
    if outcome.samples is None:
        return False
    return any(s.promoted_by == "verifier" for s in (outcome, *outcome.samples.others))


def _count_pair_rejections(fam: dict[str, Any], outcome: Outcome) -> None:
    """The verdicts on the refused samples of an item the verifier accepted, apart from
    `judge_verdicts`: `asked` made a call, `reused` took an earlier reply (the verdict cache,
    or the sample of the same answer that was asked)."""
    assert outcome.samples is not None
    for sample in (outcome, *outcome.samples.others):
        v = sample.verdict
        if v is None:
            continue
        counts = fam.setdefault(
            "pair_rejections", {"asked": 0, "reused": 0} | dict.fromkeys(VERDICTS, 0)
        )
        counts["reused" if v.reused else "asked"] += 1
        counts[verdict_state(v.verdict, v.cause)[0]] += 1


def _near_miss_example(outcome: Outcome) -> dict[str, Any]:
    gen, decision = outcome.generation, outcome.decision
    assert decision is not None and decision.training is not None
    return {
        "id": gen.item.id,
        "answer": gen.answer,
        "references": list(gen.item.references[:3]),
        "protocol": decision.protocol,
        "score": round(decision.score, 4),
        "rule": decision.training.rule,
        "verdict": outcome.verdict.verdict if outcome.verdict else None,
        "place": outcome.place,
    }


def report_part(outcomes: Sequence[Outcome], quarantined: Iterable[Quarantined]) -> dict[str, Any]:
    """The figures of one part of a run (all of it, or one compaction partition), in a form
    `finish_report` sums: counters, the lines placed and the ids seen (JSON-able)."""
    families: dict[str, dict[str, Any]] = defaultdict(_family)
    ids: list[str] = []
    lines: list[int] = []
    modes: Counter[str] = Counter()
    generators: Counter[tuple[str, str | None]] = Counter()
    judges: Counter[tuple[str, str | None]] = Counter()
    for outcome in outcomes:
        gen = outcome.generation
        item = gen.item
        fam = families[item.family]
        fam["in"] += 1
        ids.append(item.id)
        lines.append(item.line)
        form = reasoning_form(gen)
        fam["reasoning"][form] += 1
        modes[gen.thinking_mode or UNRECORDED] += 1
        generators[(gen.model, gen.model_kind)] += 1
        if outcome.place == "accepted":
            fam["accepted"] += 1
            key = "promoted_by_judge" if outcome.promoted_by == "judge" else "accepted_by_verifier"
            fam[key] += 1
            if not (gen.reasoning or "").strip():  # in _RS_nothink only
                fam["accepted_without_reasoning"] += 1
            if outcome.trace is not None:
                _count_trace(fam, outcome)
        else:
            fam["rejected"] += 1
            fam["rejected_by_reason"][outcome.reason or "unknown"] += 1
        if gen.blind is not None:
            _count_blind(fam, outcome)
        for sample in (outcome, *(outcome.samples.others if outcome.samples else ())):
            if sample.generation.failure == LOOP_FINISH:
                _count_loop(fam, sample.generation)
        if outcome.decision is not None and outcome.decision.near_miss:
            fam["near_misses"] += 1
            fam["near_misses_promoted"] += outcome.promoted_by == "judge"
            if len(fam["near_miss_examples"]) < NEAR_MISS_EXAMPLES:
                fam["near_miss_examples"].append(_near_miss_example(outcome))
        if verifier_passed(outcome):
            _count_pair_rejections(fam, outcome)
        elif outcome.verdict is not None:
            verdict, cause = verdict_state(outcome.verdict.verdict, outcome.verdict.cause)
            fam["judge_verdicts"][verdict] += 1
            if cause is not None:
                fam["judge_failure_causes"][cause] += 1
            fam["judge_reused"] += outcome.verdict.reused
            judges[(outcome.verdict.model, outcome.verdict.model_kind)] += 1
    for q in quarantined:
        fam = families[q.family or UNKNOWN_FAMILY]
        fam["in"] += 1
        fam["quarantined"] += 1
        fam["quarantined_by_reason"][q.reason] += 1
        lines.append(q.line)
        if q.id is not None and q.reason != "duplicate_id":
            ids.append(q.id)
    return {
        "families": {
            f: {k: dict(v) if isinstance(v, dict) else v for k, v in c.items()}
            for f, c in families.items()
        },
        "thinking_modes": dict(modes),
        "generators": [[m, k, n] for (m, k), n in generators.items()],
        "judges": [[m, k, n] for (m, k), n in judges.items()],
        "tokens": token_usage(outcomes),
        "sampling": sampling_summary(outcomes),
        "lines": lines,
        "ids": ids,
    }


def _summed(a: Any, b: Any) -> Any:
    """Counters summed key by key, at any depth; names (strings) kept."""
    if isinstance(a, str):
        return a
    if isinstance(a, dict):
        return {k: _summed(a[k], b[k]) if k in a and k in b else a.get(k, b.get(k)) for k in a | b}
    return a + b


def tokens_summed(parts: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """Token usages (`token_usage`) of parts of a run, summed."""
    by_model: dict[tuple[int, str], dict[str, Any]] = {}
    by_family: dict[str, Any] = {}
    total: dict[str, Any] | None = None
    for t in parts:
        for entry in t["by_model"]:
            key = (TOKEN_ROLES.index(entry["role"]), entry["model"])
            by_model[key] = _summed(by_model[key], entry) if key in by_model else entry
        for fam, usage in t["by_family"].items():
            by_family[fam] = _summed(by_family[fam], usage) if fam in by_family else usage
        total = t["total"] if total is None else _summed(total, t["total"])
    return {
        "by_model": [by_model[k] for k in sorted(by_model)],
        "by_family": dict(sorted(by_family.items())),
        "total": total if total is not None else token_usage(())["total"],
    }


class _Sums:
    """The parts of a run summed (`finish_report`): family counters, thinking modes, models,
    ids and lines placed, token usages and best-of-n figures."""

    def __init__(self) -> None:
        self.families: dict[str, dict[str, Any]] = {}
        self.modes: Counter[str] = Counter()
        self.generators: Counter[tuple[str, str | None]] = Counter()
        self.judges: Counter[tuple[str, str | None]] = Counter()
        self.ids: Counter[str] = Counter()
        self.placed_lines: Counter[int] = Counter()
        self.tokens: list[dict[str, Any]] = []
        self.sampling: dict[str, Any] = {}

    def add(self, part: dict[str, Any]) -> None:
        for fam, counts in part["families"].items():
            self.families[fam] = (
                _summed(self.families[fam], counts) if fam in self.families else counts
            )
        self.modes.update(part["thinking_modes"])
        self.generators.update({(m, k): n for m, k, n in part["generators"]})
        self.judges.update({(m, k): n for m, k, n in part["judges"]})
        self.ids.update(part["ids"])
        self.placed_lines.update(part["lines"])
        self.tokens.append(part["tokens"])
        for fam, figures in part["sampling"].items():
            self.sampling[fam] = (
                _summed(self.sampling[fam], figures) if fam in self.sampling else figures
            )


def _finish_family(fam: dict[str, Any]) -> None:
    """A family's summed counters made final, in place: reasons sorted, whether it adds up,
    its examples cut to the card's number."""
    for key in (
        "rejected_by_reason",
        "quarantined_by_reason",
        "judge_failure_causes",
        "trace_failures",
    ):
        fam[key] = dict(sorted(fam[key].items()))
    fam["adds_up"] = fam["in"] == fam["accepted"] + fam["rejected"] + fam["quarantined"]
    fam["near_miss_examples"] = (fam.get("near_miss_examples") or [])[:NEAR_MISS_EXAMPLES]
    fam["blind_examples"] = (fam.get("blind_examples") or [])[:BLIND_EXAMPLES]
    # One example per check, the first line's partition's: a merge concatenates them.
    firsts: dict[str, Any] = {}
    for e in fam.get("trace_examples") or []:
        firsts.setdefault(e["check"], e)
    fam["trace_examples"] = list(firsts.values())


def _finish_sampling(figures: dict[str, Any]) -> None:
    """A family's summed best-of-n histograms in numeric order, in place."""
    figures["drawn_histogram"] = dict(
        sorted(figures.get("drawn_histogram", {}).items(), key=lambda kv: int(kv[0]))
    )
    figures["pass_histogram"] = dict(
        sorted(figures["pass_histogram"].items(), key=lambda kv: tuple(map(int, kv[0].split("/"))))
    )


def _placement(
    placed_lines: Counter[int], ids: Counter[str], lines: int, blank_lines: list[int] | None
) -> dict[str, Any]:
    """Whether every non-blank line from 1 to the pool's last was placed exactly once, under
    an id of its own: what went wrong (the first 100 lines of each kind), and `adds_up`."""
    placed = sum(placed_lines.values())
    duplicate_ids = sorted(i for i, n in ids.items() if n > 1)
    lines_twice = sorted(ln for ln, n in placed_lines.items() if n > 1)
    blanks = set(blank_lines or ())
    expected = set(range(1, lines + len(blanks) + 1)) - blanks
    missing = sorted(expected - set(placed_lines))
    outside = sorted(set(placed_lines) - expected)
    return {
        "duplicate_ids": duplicate_ids,
        "lines_placed_twice": lines_twice,
        "lines_missing": missing[:100],
        "lines_outside_pool": outside[:100],
        "blank_lines": len(blanks),
        "adds_up": placed == lines
        and not lines_twice
        and not missing
        and not outside
        and not duplicate_ids,
    }


def finish_report(
    parts: Iterable[dict[str, Any]],
    *,
    run: str,
    lines: int,
    blank_lines: list[int] | None = None,
    calibration: Iterable[CalibrationRecord] = (),
    calibration_tokens: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The run report from its parts (`report_part`): `lines` items entered (non-blank
    lines); `blank_lines` are the pool's blank line numbers, which hold no item. Every other
    line from 1 on must be placed exactly once. `calibration`: the judge's calibration
    records, for the token usage (`tokens`), or `calibration_tokens`, their usage already
    summed."""
    sums = _Sums()
    for part in parts:
        sums.add(part)
    sums.tokens.append(calibration_tokens or token_usage((), calibration))
    for fam in sums.families.values():
        _finish_family(fam)
    for figures in sums.sampling.values():
        _finish_sampling(figures)
    summed_tokens = tokens_summed(sums.tokens)
    judge_tokens = summed_tokens["total"]["judge"]
    return {
        "run": run,
        "lines": lines,
        "placed": sum(sums.placed_lines.values()),
        "families": dict(sorted(sums.families.items())),
        "thinking_modes": dict(sorted(sums.modes.items())),
        "models": {
            "generators": _models(sums.generators, "outputs"),
            "judges": _models(sums.judges, "verdicts"),
        },
        "tokens": summed_tokens,
        # Judge replies taken from the verdict cache (no call made by this run): the
        # verdicts of the families, and the calibration probes (every shard's).
        "judge_reused": {
            "verdicts": sum(f.get("judge_reused", 0) for f in sums.families.values()),
            "calibration": judge_tokens.get("calibration", {}).get("reused", 0),
        },
        # Best-of-n runs only: per family, pass rates and the yield at n against 1.
        **({"sampling": dict(sorted(sums.sampling.items()))} if sums.sampling else {}),
        **_placement(sums.placed_lines, sums.ids, lines, blank_lines),
    }


def run_report(
    *,
    run: str,
    lines: int,
    outcomes: list[Outcome],
    quarantined: list[Quarantined],
    blank_lines: list[int] | None = None,
    calibration: Iterable[CalibrationRecord] = (),
) -> dict[str, Any]:
    """The report of a whole run in one part (`finish_report`)."""
    return finish_report(
        [report_part(outcomes, quarantined)],
        run=run,
        lines=lines,
        blank_lines=blank_lines,
        calibration=calibration,
    )
