"""Judge calibration, what the judge's answers to the probes say, as pure functions
(docs/judge.md). rsieve.judge.probes builds the probes.

The false-promotion rate (the share of known-wrong probes called CORRECT) is the figure
that matters for training data; sensitivity (the share of verifier-accepted answers called
CORRECT) is reported beside it. Both rates count only the probes the judge answered
CORRECT or WRONG, and come with Wilson 95% intervals and their sample sizes, per family.
UNSURE (the judge's own answer) and FAILED (no verdict: the call failed, or the output was
empty, unparsable or cut off) are counted beside them, each on its own, never mixed into a
rate. A family whose judge gave no CORRECT or WRONG verdict on its known-wrong probes has
no false-promotion figure ("n/a"); it, a family whose false-promotion upper bound exceeds
the configured bound, and a family with no calibration at all have their judge promotions
held back: `hold_back` keeps them rejected with reason `judge_untrusted`, verdict kept for
audit. `summarise` keeps the run-wide bottom-k of the shards' records.
"""

from __future__ import annotations

import hashlib
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, model_validator

from rsieve import keys
from rsieve.envelope import unseal
from rsieve.intervals import Z95, wilson
from rsieve.judge.cascade import rejection_reason, verdict_state
from rsieve.judge.probes import WRONG_KINDS, Probe
from rsieve.judge.sequential import FamilyStop, merge_stops, stop_reason
from rsieve.judge.verdicts import TEMPLATE_SHA256, read_verdict
from rsieve.schemas import Outcome

__all__ = [
    "Z95",
    "CalibrationRecord",
    "CalibrationShard",
    "bottom_k",
    "calibration_key",
    "calibration_record",
    "hold_back",
    "hopeless_families",
    "promotions_listing",
    "record_state",
    "render_calibration_markdown",
    "review_tally",
    "summarise",
    "untrusted_families",
    "wilson",
]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class CalibrationRecord(_Model):
    """A probe with what the judge said, stored like a verdict (auditable, recomputable).
    `failed`: no verdict (FAILED, with its cause); records stored before FAILED existed say
    UNSURE with a cause instead, and `summarise` reads them as FAILED."""

    probe: Probe
    model: str
    # What the judge model is (rsieve.schemas.MODEL_KINDS); None: undeclared.
    model_kind: str | None = None
    template_sha256: str
    prompt_sha256: str
    prompt: str
    raw_output: str
    finish_reason: str | None
    verdict: Literal["CORRECT", "WRONG", "UNSURE", "FAILED"]
    cause: str | None
    failed: bool
    # Token counts when the judge's server returned them (the run report's `tokens`).
    input_tokens: int | None = None
    output_tokens: int | None = None
    # The reply came from the verdict cache (rsieve.judge.judgecache): no call was made.
    reused: bool = False


class CalibrationShard(_Model):
    """What the judge stored for one shard at `calibration_key(run, shard)`. `rates`: the
    eligible rate of each family (`calibration_rates`); a family it does not name (every
    family of a run planned before family counts were recorded) had `rate`."""

    run: str
    shard: str
    size: int
    rate: float
    records: list[CalibrationRecord]
    rates: dict[str, float] = {}
    # Families whose rejections this shard did not judge (`judge_skipped`), with the reason
    # (`hopeless_families`).
    skipped: dict[str, str] = {}
    # Where each family's sequential calibration stopped in this shard
    # (rsieve.judge.sequential); empty on shards calibrated before it existed.
    stops: dict[str, FamilyStop] = {}

    @model_validator(mode="before")
    @classmethod
    def _unseal(cls, data: Any) -> Any:
        return unseal(data)  # stored sealed (rsieve.envelope): the seal is not a field


calibration_key = keys.calibration  # where a shard's CalibrationShard is stored


def hopeless_families(
    records: Iterable[CalibrationRecord],
    complete: Iterable[str],
    *,
    size: int,
    bound: float,
) -> dict[str, str]:
    """The families whose judging can stop (`judge_skipped`), each with its reason: their
    calibration is complete (`complete`: every item of the family is in hand, so no later
    probe can change it) and it already shows the judge promoting known-wrong answers (at
    least one false promotion) with a Wilson upper bound above `bound`, so every promotion
    it could give would be held back. A calibration that is merely too small to clear the
    bound, with no false promotion, shows nothing against the judge: the family is judged,
    its promotions held back (`judge_untrusted`) and listed for review."""
    done = set(complete)
    summary = summarise([r for r in records if r.probe.family in done], size=size)
    out: dict[str, str] = {}
    for family, entry in summary.items():
        fp = entry["false_promotion"]
        if bound < 1.0 and fp["k"] >= 1 and fp["hi"] > bound:
            out[family] = (
                f"calibration: {fp['k']}/{fp['n']} known-wrong probes judged CORRECT, upper "
                f"bound {fp['hi']:.3f} > {bound}"
            )
    return out


def calibration_record(
    probe: Probe,
    *,
    model: str,
    prompt: str,
    raw_output: str | None,
    finish_reason: str | None = "stop",
    failure: str | None = None,
    model_kind: str | None = None,
    input_tokens: int | None = None,
    output_tokens: int | None = None,
    reused: bool = False,
) -> CalibrationRecord:
    """What the judge said on a probe, read exactly as a real verdict (`read_verdict`),
    with the call's token counts when its server returned them; `reused`: the reply came
    from the verdict cache (rsieve.judge.judgecache)."""
    parsed = read_verdict(raw_output, finish_reason or "stop", failure)
    return CalibrationRecord(
        probe=probe,
        model=model,
        model_kind=model_kind,
        template_sha256=TEMPLATE_SHA256,
        prompt_sha256=hashlib.sha256(prompt.encode()).hexdigest(),
        prompt=prompt,
        raw_output=raw_output or "",
        finish_reason=finish_reason if raw_output is not None else None,
        verdict=parsed.verdict,
        cause=parsed.cause,
        failed=parsed.failed,
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        reused=reused,
    )


def record_state(record: CalibrationRecord) -> tuple[str, str | None]:
    """(verdict, failure cause kind) of a record, old records included (`verdict_state`)."""
    if record.failed and record.verdict != "FAILED":  # stored before FAILED existed
        return "FAILED", verdict_state("FAILED", record.cause or "call_failed")[1]
    return verdict_state(record.verdict, record.cause)


def _rate(k: int, n: int) -> dict[str, Any]:
    lo, hi = wilson(k, n)
    return {
        "k": k,
        "n": n,
        "rate": round(k / n, 6) if n else None,
        "lo": round(lo, 6),
        "hi": round(hi, 6),
    }


def bottom_k(records: Iterable[CalibrationRecord], size: int) -> list[CalibrationRecord]:
    """The records of the `size` lowest-ranked items per family: all `summarise` counts of
    them, so a run-wide summary may be made from each part's bottom-k alone."""
    recs = list(records)
    items: dict[str, set[tuple[float, str]]] = defaultdict(set)
    for r in recs:
        items[r.probe.family].add((r.probe.rank, r.probe.item_id))
    kept = {(f, i) for f, ids in items.items() for _, i in sorted(ids)[:size]}
    return [r for r in recs if (r.probe.family, r.probe.item_id) in kept]


def summarise(
    records: Iterable[CalibrationRecord | dict[str, Any]],
    *,
    size: int | None = None,
    bound: float | None = None,
    stops: Iterable[Mapping[str, FamilyStop]] | None = None,
) -> dict[str, dict[str, Any]]:
    """Per family: sensitivity (CORRECT on verifier-accepted answers) and false promotion
    (CORRECT on known-wrong candidates), each `{k, n, rate, lo, hi}` (Wilson 95%) over the
    probes the judge answered CORRECT or WRONG only (n = 0: rate None, shown "n/a"); the
    false promotions by kind; beside them, never mixed in, `unsure` and `failed_by_probe`
    (`{agreement, known_wrong}`), `failed` (their total), `failure_causes` (cause -> count)
    and `probes` (all probes, `{agreement, known_wrong}`); `calibrated` (the false-promotion
    rate has at least one CORRECT/WRONG verdict); `reused` (the probes whose reply came
    from the verdict cache); the judge models and their kinds.
    `size`: count only the run-wide `size` lowest-ranked items per family (the bottom-k
    sample; None counts every record). `bound`: also say per family whether its judge
    promotions are held back (uncalibrated, or upper bound above `bound`). `stops`: every
    shard's `CalibrationShard.stops`; with `bound`, each family also gets the run's
    sequential `stop` (rsieve.judge.sequential) and the `reason` its promotions are or
    are not trusted, and a family the shards found too small to probe is listed too."""
    recs = [
        r if isinstance(r, CalibrationRecord) else CalibrationRecord.model_validate(r)
        for r in records
    ]
    items: dict[str, set[tuple[float, str]]] = defaultdict(set)
    for r in recs:
        items[r.probe.family].add((r.probe.rank, r.probe.item_id))
    kept = {
        fam: {i for _, i in sorted(ids)[:size]} if size is not None else {i for _, i in ids}
        for fam, ids in items.items()
    }
    parts = list(stops or [])
    out: dict[str, dict[str, Any]] = {}
    for family in sorted(set(items) | {f for part in parts for f in part}):
        ids = kept.get(family, set())
        entry = _family_summary(
            [
                (r, *record_state(r))
                for r in recs
                if r.probe.family == family and r.probe.item_id in ids
            ],
            items=len(ids),
        )
        if bound is not None:
            entry["bound"] = bound
            entry["held_back"] = _untrusted(entry, bound)
        out[family] = entry
    if bound is not None and parts:
        tallies = {
            f: (e["false_promotion"]["k"], e["false_promotion"]["n"]) for f, e in out.items()
        }
        for family, stop in merge_stops(parts, tallies, bound).items():
            out[family]["stop"] = stop.model_dump()
            out[family]["reason"] = stop_reason(stop, bound)
            out[family]["held_back"] = out[family]["held_back"] or stop.stop != "cleared"
    return out


def _family_summary(
    fam: list[tuple[CalibrationRecord, str, str | None]], *, items: int
) -> dict[str, Any]:
    """One family's figures (`summarise`) from its counted records, each with its verdict
    and failure cause (`record_state`); `items`: how many items they probe."""
    sides = {
        "agreement": [x for x in fam if x[0].probe.expected == "CORRECT"],
        "known_wrong": [x for x in fam if x[0].probe.expected == "WRONG"],
    }
    decided = {
        side: [r for r, v, _ in xs if v in ("CORRECT", "WRONG")] for side, xs in sides.items()
    }
    states = {side: [v for _, v, _ in xs] for side, xs in sides.items()}
    by_kind: dict[str, dict[str, int]] = {}
    for kind in WRONG_KINDS:
        of_kind = [r for r in decided["known_wrong"] if r.probe.kind == kind]
        if of_kind:
            by_kind[kind] = {
                "k": sum(r.verdict == "CORRECT" for r in of_kind),
                "n": len(of_kind),
            }
    causes = Counter(c for _, v, c in fam if v == "FAILED")
    kinds: dict[str, str | None] = {}
    for r, _, _ in fam:
        kinds[r.model] = kinds.get(r.model) or r.model_kind
    false_promotion = _rate(
        sum(r.verdict == "CORRECT" for r in decided["known_wrong"]), len(decided["known_wrong"])
    )
    return {
        "items": items,
        "sensitivity": _rate(
            sum(r.verdict == "CORRECT" for r in decided["agreement"]), len(decided["agreement"])
        ),
        "false_promotion": false_promotion,
        "false_promotion_by_kind": by_kind,
        "probes": {side: len(xs) for side, xs in sides.items()},
        "unsure": {side: vs.count("UNSURE") for side, vs in states.items()},
        "failed": sum(vs.count("FAILED") for vs in states.values()),
        "failed_by_probe": {side: vs.count("FAILED") for side, vs in states.items()},
        "failure_causes": dict(sorted(causes.items())),
        # Probes whose reply came from the verdict cache (no call made this run).
        "reused": sum(r.reused for r, _, _ in fam),
        "calibrated": false_promotion["n"] > 0,
        "models": sorted({r.model for r, _, _ in fam}),
        "model_kinds": dict(sorted(kinds.items())),
        "template_sha256": sorted({r.template_sha256 for r, _, _ in fam}),
    }


def _untrusted(entry: dict[str, Any], bound: float) -> bool:
    """No false-promotion figure (no CORRECT/WRONG verdict on known-wrong probes), or its
    Wilson 95% upper bound above `bound`. A bound of 1 turns hold-back off: every rate,
    measured or not, is within it."""
    fp = entry["false_promotion"]
    if bound >= 1.0:
        return False
    return not fp["n"] or fp["hi"] > bound


def untrusted_families(
    summary: dict[str, dict[str, Any]], bound: float, families: Iterable[str] = ()
) -> set[str]:
    """Families whose judge may not promote: no false-promotion figure (the judge never
    said CORRECT or WRONG on the family's known-wrong probes), or its Wilson 95% upper
    bound exceeds `bound`, or (for the `families` named) no calibration."""
    held = {f for f, s in summary.items() if _untrusted(s, bound)}
    return held | {f for f in families if f not in summary}


def hold_back(
    outcomes: Iterable[Outcome], summary: dict[str, dict[str, Any]], bound: float
) -> list[Outcome]:
    """Judge promotions of untrusted families (and of families with no calibration) go
    back to the rejected split with reason `judge_untrusted`; the CORRECT verdict stays
    recorded for audit. Everything else is returned unchanged, in order. The refused
    samples of a verifier-accepted item that the judge promoted (judge_pair_rejections)
    are held back the same way, and leave the item's `samples.passed`."""
    outcomes = list(outcomes)
    promoted = {
        o.generation.item.family
        for o in outcomes
        if o.promoted_by == "judge" or _pair_promotions(o)
    }
    held = untrusted_families(summary, bound, promoted)
    out = []
    for o in outcomes:
        if o.generation.item.family in held and o.promoted_by == "judge":
            o = _held(o)
        elif o.generation.item.family in held and _pair_promotions(o):
            assert o.samples is not None
            back = {s.generation.sample or 0 for s in o.samples.others if s.promoted_by == "judge"}
            others = [_held(s) if s.promoted_by == "judge" else s for s in o.samples.others]
            passed = [k for k in o.samples.passed if k not in back]
            o = o.model_copy(
                update={
                    "samples": o.samples.model_copy(update={"others": others, "passed": passed})
                }
            )
        out.append(o)
    return out


def _held(o: Outcome) -> Outcome:
    return o.model_copy(
        update={
            "place": "rejected",
            "reason": rejection_reason(o, "judge_untrusted"),
            "promoted_by": None,
        }
    )


def _pair_promotions(o: Outcome) -> bool:
    """Whether an item the verifier accepted has refused samples the judge promoted."""
    return (
        o.promoted_by == "verifier"
        and o.samples is not None
        and any(s.promoted_by == "judge" for s in o.samples.others)
    )


def promotions_listing(outcomes: Iterable[Outcome]) -> list[dict[str, Any]]:
    """Every judge CORRECT (promoted, or held back as judge_untrusted), for a person to
    spot-check: question, reference, candidate and what the judge said."""
    rows = []
    for o in outcomes:
        v = o.verdict
        if v is None or v.verdict != "CORRECT":
            continue
        item = o.generation.item
        rows.append(
            {
                "id": item.id,
                "family": item.family,
                "line": item.line,
                "question": item.question,
                "reference": " | ".join(item.references),
                "candidate": o.generation.answer,
                "held_back": o.promoted_by != "judge",
                "judge_model": v.model,
                "prompt_sha256": v.prompt_sha256,
                "raw_output": v.raw_output,
            }
        )
    return sorted(rows, key=lambda r: (r["family"], r["line"]))


def _interval(r: dict[str, Any]) -> str:
    if not r["n"]:
        return "n/a"
    return (
        f"{r['k']}/{r['n']} = {100 * r['k'] / r['n']:.1f}% [{100 * r['lo']:.1f}%, "
        f"{100 * r['hi']:.1f}%]"
    )


def _sides(counts: dict[str, int]) -> str:
    return f"{counts['agreement']} / {counts['known_wrong']}"


def render_calibration_markdown(
    summary: dict[str, dict[str, Any]], *, bound: float | None = None
) -> str:
    """The card's calibration section: per family, agreement on verifier-accepted answers
    and false promotions on known-wrong candidates, with Wilson 95% intervals, over the
    CORRECT/WRONG verdicts only; UNSURE and failed counts beside them ("n/a" where the
    judge gave no CORRECT or WRONG verdict)."""
    out = [
        "## Judge calibration",
        "",
        "Sensitivity: the judge's CORRECT rate on answers the string verifier accepted. "
        "False promotion: its CORRECT rate on known-wrong candidates built from the same "
        "items (another item's reference, one digit changed, a swapped option letter, a "
        'truncated reference, a "master key" such as ":"), each rejected by the family\'s '
        "protocol. Both count only the probes the judge answered CORRECT or WRONG, with "
        'Wilson 95% intervals; "n/a" means it answered none of them CORRECT or WRONG. '
        "UNSURE (the judge's own answer) and failed (no verdict: the call failed, or the "
        "output was empty, unparsable or cut off at its token budget) are counted beside "
        "them, as agreement / known-wrong probes, and never mixed into a rate.",
        "",
    ]
    if bound is not None:
        out += [
            f"A family's judge promotions count only once the Wilson 95% upper bound of its "
            f"false-promotion rate lies under {bound:g}. Its probes are asked in a fixed "
            "order (items by a hash of their id), in rounds of the verdicts it still needs, "
            "and asking stops as soon as that is decided: cleared, or false promotions no "
            "probe left could outweigh; a family whose accepted items could never give the "
            "verdicts the bound needs is not probed at all. A family not cleared, with no "
            "false-promotion figure (n/a), or with no calibration has its judge promotions "
            "held back in the rejected split with reason `judge_untrusted`.",
            "",
        ]
    if not summary:
        return "\n".join([*out, "No calibration sample was judged.", ""])
    out += [
        "| family | items | sensitivity | false promotion | by kind (k/n) | "
        "UNSURE (agreement / known-wrong) | failed (agreement / known-wrong) |"
        + (" known-wrong asked / available | held back |" if bound is not None else ""),
        "|---|---|---|---|---|---|---|" + ("---|---|" if bound is not None else ""),
    ]
    causes: list[str] = []
    reasons: list[str] = []
    for family, s in summary.items():
        kinds = ", ".join(f"{k} {v['k']}/{v['n']}" for k, v in s["false_promotion_by_kind"].items())
        row = (
            f"| {family} | {s['items']} | {_interval(s['sensitivity'])} | "
            f"{_interval(s['false_promotion'])} | {kinds or '-'} | "
            f"{_sides(s['unsure'])} | {_sides(s['failed_by_probe'])} |"
        )
        if bound is not None:
            stop = s.get("stop")
            asked = f"{stop['asked']} / {stop['capacity']}" if stop else "-"
            row += f" {asked} | {'yes' if s.get('held_back', _untrusted(s, bound)) else 'no'} |"
            if s.get("reason"):
                reasons.append(f"- {family}: {s['reason']}.")
        out.append(row)
        if s.get("failure_causes"):
            causes.append(
                f"- {family}: " + ", ".join(f"`{c}` {n}" for c, n in s["failure_causes"].items())
            )
    if reasons:
        out += ["", "Why each family's judge promotions are or are not trusted:", "", *reasons]
    if causes:
        out += ["", "Causes of the failed calibration verdicts:", "", *causes]
    reused = {f: s["reused"] for f, s in summary.items() if s.get("reused")}
    if reused:
        probes = sum(sum(s["probes"].values()) for s in summary.values())
        out += [
            "",
            f"{sum(reused.values())} of these {probes} probes were judged before (the same "
            "judge, template, budget and byte-identical prompt) and their replies reused from "
            "the verdict cache, without a call: "
            + ", ".join(f"{family} {n}" for family, n in reused.items())
            + ".",
        ]
    return "\n".join([*out, ""])


def review_tally(reviews: Iterable[dict[str, Any]]) -> dict[str, dict[str, int]]:
    """People's calls on judge promotions (the review page) per family: how many they
    confirmed and how many they called wrong. A review with any other verdict is skipped
    (its family still listed), so one stored by another version never stops the count:
    the card (`human_review`) and the API's calibration both count with this."""
    counts: dict[str, dict[str, int]] = {}
    for review in reviews:
        fam = counts.setdefault(review.get("family") or "(unknown)", {"confirmed": 0, "wrong": 0})
        if review.get("verdict") in fam:
            fam[review["verdict"]] += 1
    return counts
