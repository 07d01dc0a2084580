"""What one compaction commits, composed from a run's stored outputs (no I/O): the outcomes
after the calibration hold-back, the ones the dataset does not hold yet, the run report,
and the files of the commit (the run report, the quarantine listing, the card).

The compactor (services/compactor) reads the outputs, writes the Parquet splits and the
example images, and stores what `commit_files` returns, the manifest last."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from rsieve import __version__
from rsieve.calibration import (
    CalibrationRecord,
    hold_back,
    promotions_listing,
    render_calibration_markdown,
    summarise,
)
from rsieve.card import render_card
from rsieve.cleaning import render_cleaning
from rsieve.compaction import dedupe, qa_key
from rsieve.decontam import answer_key, dataset_keys, question_key
from rsieve.report import run_report
from rsieve.rows import split_name
from rsieve.schemas import Outcome, Quarantined, RunSpec

__all__ = [
    "CompactionPlan",
    "near_keys",
    "commit_files",
    "plan_compaction",
    "qa_entries",
    "run_spec",
    "split_families",
]

Examples = dict[str, list[tuple[dict[str, Any], str]]]  # split -> (first qa, image path)


@dataclass(frozen=True)
class CompactionPlan:
    outcomes: list[Outcome]  # every judged outcome, after the calibration hold-back
    added: list[Outcome]  # those the dataset does not hold yet
    quarantined: list[Quarantined]
    report: dict[str, Any]
    calibration: dict[str, Any]
    cleaning: dict[str, Any] | None
    bound: float


def plan_compaction(
    *,
    run: str,
    index: dict[str, Any],
    outcomes: list[Outcome],
    quarantined: list[Quarantined],
    calibration_records: list[CalibrationRecord],
    existing_keys: set[str],
    cleaning: dict[str, Any] | None,
    calibration_size: int,
    bound: float,
) -> CompactionPlan:
    summary = summarise(calibration_records, size=calibration_size, bound=bound)
    outcomes = hold_back(outcomes, summary, bound)
    report = run_report(
        run=run,
        lines=index["lines"],
        outcomes=outcomes,
        quarantined=quarantined,
        blank_lines=index["blank_lines"],
        calibration=calibration_records,
    )
    report["calibration"] = summary
    report["judge_false_promotion_bound"] = bound  # what `rsieve recheck DIR` holds back by
    report["judge_promotions"] = promotions_listing(outcomes)
    added, skipped = dedupe(outcomes, existing_keys)
    report["already_in_dataset"] = skipped
    if cleaning is not None:
        report["cleaning"] = cleaning
    return CompactionPlan(outcomes, added, quarantined, report, summary, cleaning, bound)


def near_keys(added: Iterable[Outcome]) -> bytes:
    """keys/<run>.near.json: the (image hash, question key, answer key) of every item a run
    adds, which later runs' ingest screens against (rsieve.decontam), before any model call.
    The answer key is the pool's own answer (the references before any rewrite)."""
    keys = []
    for o in added:
        item = o.generation.item
        mcq = item.clean_meta.get("mcq") or {}
        answer = mcq.get("original_answer", item.references)
        keys.append(
            (
                item.image_at.phash if item.image_at else None,
                question_key(item.pool_question),
                answer_key(answer),
            )
        )
    return dataset_keys(keys)


def qa_entries(outcomes: Iterable[Outcome]) -> list[tuple[str, str]]:
    """(image sha256, qa key) of each outcome: what the dataset's key index (rsieve.keyindex)
    is looked up and grown by."""
    return [
        (
            o.generation.item.image_sha256,
            qa_key(o.generation.item.image_sha256, o.generation.item.question),
        )
        for o in outcomes
    ]


def split_families(manifest: dict[str, Any], families: set[str]) -> dict[str, str]:
    """Each split of the manifest -> its family (families of earlier runs by name)."""
    known = {split_name(f, k): f for f in families for k in ("RS_think", "RS_nothink", "rejected")}
    return {
        s: known.get(s, s.rsplit("_RS_", 1)[0].removesuffix("_rejected"))
        for s in manifest["splits"]
    }


def human_review(reviews: Iterable[dict[str, Any]]) -> tuple[dict[str, dict[str, int]], str]:
    """People's calls on judge promotions (the review page) for every run in the dataset,
    counted at compaction time (a review made later counts at the next compaction): the
    counts per family and their markdown."""
    counts: dict[str, dict[str, int]] = {}
    for review in reviews:
        fam = counts.setdefault(review.get("family") or "(unknown)", {"confirmed": 0, "wrong": 0})
        if review.get("verdict") in fam:
            fam[review["verdict"]] += 1
    if not counts:
        return counts, "\n\nNo judge promotion has been reviewed by a person yet."
    rows = [f"| {f} | {c['confirmed']} | {c['wrong']} |" for f, c in sorted(counts.items())]
    return counts, (
        "\n\n### Reviewed by a person\n\n| family | confirmed | wrong |\n|---|---|---|\n"
        + "\n".join(rows)
    )


def run_spec(spec: RunSpec, outcomes: Iterable[Outcome], bound: float) -> dict[str, Any]:
    """run_spec.json, beside the card: how every row of the run was made. The run's
    specification (every DECIDING setting, rsieve.settings; the pool's digest; the protocol
    versions), the rsieve version, the hold-back bound, and each model that answered or
    judged with its versions, kinds, interfaces and chat template hashes, as the outputs
    recorded them."""
    generators: dict[str, dict[str, set[str]]] = {}
    judges: dict[str, dict[str, set[str]]] = {}
    for o in outcomes:
        g = o.generation
        seen = generators.setdefault(g.model, {})
        for key, value in (
            ("versions", g.model_version),
            ("kinds", g.model_kind),
            ("interfaces", g.interface),
            ("chat_templates", g.chat_template),
            ("chat_template_sha256", g.chat_template_sha256),
            ("thinking_modes", g.thinking_mode),
        ):
            if value is not None:
                seen.setdefault(key, set()).add(value)
        if o.verdict is not None:
            seen = judges.setdefault(o.verdict.model, {})
            seen.setdefault("template_sha256", set()).add(o.verdict.template_sha256)
            if o.verdict.model_kind is not None:
                seen.setdefault("kinds", set()).add(o.verdict.model_kind)

    def listed(models: dict[str, dict[str, set[str]]]) -> dict[str, dict[str, list[str]]]:
        return {m: {k: sorted(v) for k, v in sorted(f.items())} for m, f in sorted(models.items())}

    return {
        "rsieve_version": __version__,
        **spec.model_dump(),
        "judge_false_promotion_bound": bound,
        "models": {"generator": listed(generators), "judge": listed(judges)},
    }


def commit_files(
    plan: CompactionPlan,
    *,
    spec: RunSpec,
    manifest: dict[str, Any],
    examples: Examples,
    reviews: Iterable[dict[str, Any]],
) -> dict[str, bytes]:
    """The commit's files by name: run_report.json, quarantine.jsonl, run_spec.json and
    README.md (the card)."""
    report = plan.report
    counts, review_md = human_review(reviews)
    report["human_review"] = counts
    card = render_card(
        dataset=spec.dataset,
        spec=spec.model_dump()
        | {
            "protocols_used": sorted({o.generation.item.protocol for o in plan.outcomes}),
            "rsieve_version": __version__,
        },
        report=report,
        manifest=manifest,
        split_families=split_families(manifest, {o.generation.item.family for o in plan.outcomes}),
        examples=examples,
        cleaning_md="\n".join(render_cleaning(plan.cleaning)) if plan.cleaning else "",
        calibration_md=render_calibration_markdown(plan.calibration, bound=plan.bound) + review_md,
    )
    quarantine = "".join(
        json.dumps(q.model_dump(), ensure_ascii=False) + "\n"
        for q in sorted(plan.quarantined, key=lambda q: q.line)
    )
    return {
        "run_report.json": json.dumps(report, indent=1).encode(),
        "quarantine.jsonl": quarantine.encode(),
        "run_spec.json": json.dumps(run_spec(spec, plan.outcomes, plan.bound), indent=1).encode(),
        "README.md": card.encode(),
    }
