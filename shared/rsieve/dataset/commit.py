"""What one compaction commits, composed from a run's stored outputs (no I/O): per
partition (rsieve.run.partitions), the outcomes after the calibration hold-back and the ones
the dataset does not hold yet (`settle`) and what the commit needs of them
(`partition_summary`); then, from every partition's summary, the run report and the files
of the commit (the run report, the quarantine listing, the run spec, the card).

The compactor (services/compactor) reads the outputs, writes the Parquet splits, the key
index and the example images, and stores what `commit_files` returns, the manifest last."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from rsieve import __version__
from rsieve.clean.cleaning import render_cleaning
from rsieve.clean.decontam import answer_key, dataset_keys, question_key
from rsieve.clean.profiles import (
    PROFILES_FILE,
    FamilyProfile,
    merge_profiles,
    profiles_json,
    profiles_of,
)
from rsieve.compact.compaction import dedupe, qa_key
from rsieve.compact.settle import samples_saved
from rsieve.compact.splits import split_name
from rsieve.compact.traces import LengthBand, TraceLimits, gate_outcome
from rsieve.dataset.card import render_card
from rsieve.dataset.report import finish_report, report_part
from rsieve.judge.calibration import (
    hold_back,
    promotions_listing,
    render_calibration_markdown,
    review_tally,
)
from rsieve.schemas import Outcome, Quarantined, RunSpec

__all__ = [
    "Settled",
    "commit_files",
    "compose_report",
    "near_keys",
    "partition_summary",
    "qa_entries",
    "quarantine_listing",
    "run_models",
    "run_spec",
    "settle",
    "split_families",
]

Examples = dict[str, list[tuple[dict[str, Any], str]]]  # split -> (first qa, image path)


@dataclass(frozen=True)
class Settled:
    """One partition's outcomes (all of a run's, or one compaction partition's) settled
    against the dataset: every outcome after the calibration hold-back, those the dataset
    does not hold yet, and the (line, id) of those it holds."""

    outcomes: list[Outcome]
    added: list[Outcome]
    skipped: list[tuple[int, str]]


def settle(
    outcomes: Iterable[Outcome],
    *,
    calibration: dict[str, Any],
    bound: float,
    existing_keys: set[str],
    traces: TraceLimits | None = None,
    bands: Mapping[str, LengthBand] | None = None,
) -> Settled:
    """`traces`: the run's trace gate (rsieve.compact.traces), applied to what the
    hold-back leaves accepted, with each family's length band (`bands`); None: no gate."""
    outcomes = hold_back(outcomes, calibration, bound)
    if traces is not None:
        outcomes = [gate_outcome(o, traces, bands or {}) for o in outcomes]
    added, skipped = dedupe(outcomes, existing_keys)
    line_of = {o.generation.item.id: o.generation.item.line for o in outcomes}
    return Settled(outcomes, added, [(line_of[i], i) for i in skipped])


def run_models(outcomes: Iterable[Outcome]) -> dict[str, dict[str, dict[str, list[str]]]]:
    """Each model that answered or judged, with the versions, kinds, interfaces and chat
    template hashes the outputs recorded (run_spec.json's `models`)."""
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

    return {"generator": listed(generators), "judge": listed(judges)}


def partition_summary(
    settled: Settled, quarantined: list[Quarantined], **stored: Any
) -> dict[str, Any]:
    """What the commit needs of one partition (rsieve.run.partitions.merge_summaries): its
    report part, judge promotions, ids already in the dataset, models, protocols and
    families seen, and what the compactor `stored` (shards, key index files, examples,
    what the key index read)."""
    return {
        "report": report_part(settled.outcomes, quarantined),
        "promotions": promotions_listing(settled.outcomes),
        "already_in_dataset": settled.skipped,
        "models": run_models(settled.outcomes),
        "protocols": sorted({o.generation.item.protocol for o in settled.outcomes}),
        "families": sorted({o.generation.item.family for o in settled.outcomes}),
        **stored,
    }


def compose_report(
    merged: dict[str, Any],
    *,
    run: str,
    index: dict[str, Any],
    calibration_tokens: dict[str, Any],
    calibration: dict[str, Any],
    bound: float,
    cleaning: dict[str, Any] | None,
    trace_gate: dict[str, Any] | None = None,
    samples: int = 1,
) -> dict[str, Any]:
    """The run report from the partitions' merged summaries (rsieve.run.partitions);
    `trace_gate`: rsieve.compact.traces.gate_summary of the run's gate."""
    report = finish_report(
        merged["report_parts"],
        run=run,
        lines=index["lines"],
        blank_lines=index["blank_lines"],
        calibration_tokens=calibration_tokens,
    )
    report["calibration"] = calibration
    for family, figures in (report.get("sampling") or {}).items():
        report["sampling"][family] = samples_saved(figures, samples)
    report["judge_false_promotion_bound"] = bound  # what `rsieve recheck DIR` holds back by
    report["judge_promotions"] = merged["promotions"]
    report["already_in_dataset"] = merged["already_in_dataset"]
    if cleaning is not None:
        report["cleaning"] = cleaning
    report["dataset_keys"] = merged["dataset_keys"]
    if trace_gate is not None:
        report["trace_gate"] = trace_gate
    return report


def quarantine_listing(quarantined: Iterable[Quarantined]) -> str:
    """quarantine.jsonl: one JSON line per item, in line order."""
    return "".join(
        json.dumps(q.model_dump(), ensure_ascii=False) + "\n"
        for q in sorted(quarantined, key=lambda q: q.line)
    )


def near_keys(added: Iterable[Outcome]) -> bytes:
    """keys/<run>.near.json: the (image hash, question key, answer key, crop hashes) of
    every item a run adds, which later runs' ingest screens against (rsieve.clean.decontam),
    before any model call. The answer key is the pool's own answer (the references before
    any rewrite)."""
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
                item.image_at.crop_phashes if item.image_at else (),
            )
        )
    return dataset_keys(keys)


def qa_entries(outcomes: Iterable[Outcome]) -> list[tuple[str, str]]:
    """(image sha256, qa key) of each outcome: what the dataset's key index
    (rsieve.compact.keyindex) is looked up and grown by."""
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
    counts per family (`review_tally`) and their markdown."""
    counts = review_tally(reviews)
    if not counts:
        return counts, "\n\nNo judge promotion has been reviewed by a person yet."
    rows = [f"| {f} | {c['confirmed']} | {c['wrong']} |" for f, c in sorted(counts.items())]
    return counts, (
        "\n\n### Reviewed by a person\n\n| family | confirmed | wrong |\n|---|---|---|\n"
        + "\n".join(rows)
    )


def run_spec(
    spec: RunSpec,
    models: dict[str, Any],
    bound: float,
    profiles: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """run_spec.json, beside the card: how every row of the run was made. The run's
    specification (every DECIDING setting, rsieve.settings; the pool's digest; the protocol
    versions), the rsieve version, the hold-back bound, and each model that answered or
    judged with its versions, kinds, interfaces and chat template hashes, as the outputs
    recorded them (`run_models`). `profiles`: per family, the dataset's profile its task
    purity was judged with (`judged_with`)."""
    return {
        "rsieve_version": __version__,
        **spec.model_dump(),
        "judge_false_promotion_bound": bound,
        "models": models,
        "dataset_profiles": profiles or {},
    }


def commit_files(
    *,
    report: dict[str, Any],
    quarantine: str,
    spec: RunSpec,
    manifest: dict[str, Any],
    examples: Examples,
    reviews: Iterable[dict[str, Any]],
    merged: dict[str, Any],
    calibration: dict[str, Any],
    cleaning: dict[str, Any] | None,
    bound: float,
    profiles: Mapping[str, FamilyProfile] | None = None,
) -> dict[str, bytes]:
    """The commit's files by name: run_report.json, quarantine.jsonl, run_spec.json,
    README.md (the card) and profiles.json: the dataset's family profiles before this run
    (`profiles`) with this run's on-task items added (cleaning.json's per-family `profile`).
    `merged`: the partitions' summaries (rsieve.run.partitions)."""
    counts, review_md = human_review(reviews)
    report["human_review"] = counts
    card = render_card(
        dataset=spec.dataset,
        spec=spec.model_dump()
        | {"protocols_used": merged["protocols"], "rsieve_version": __version__},
        report=report,
        manifest=manifest,
        split_families=split_families(manifest, set(merged["families"])),
        examples=examples,
        cleaning_md="\n".join(render_cleaning(cleaning)) if cleaning else "",
        calibration_md=render_calibration_markdown(calibration, bound=bound) + review_md,
    )
    return {
        "run_report.json": json.dumps(report, indent=1).encode(),
        "quarantine.jsonl": quarantine.encode(),
        "run_spec.json": json.dumps(
            run_spec(spec, merged["models"], bound, judged_with(cleaning)), indent=1
        ).encode(),
        "README.md": card.encode(),
        PROFILES_FILE: profiles_json(merge_profiles(profiles or {}, run_profiles(cleaning))),
    }


def run_profiles(cleaning: Mapping[str, Any] | None) -> dict[str, FamilyProfile]:
    """The profiles of a run's on-task items, by family (cleaning.json's `profile`)."""
    families = (cleaning or {}).get("families") or {}
    return profiles_of({f: fam["profile"] for f, fam in families.items() if fam.get("profile")})


def judged_with(cleaning: Mapping[str, Any] | None) -> dict[str, Any]:
    """Per family, the dataset profile the run's task purity was judged with (its items
    and runs; null for a family new to the dataset)."""
    families = (cleaning or {}).get("families") or {}
    return {
        f: (fam.get("purity") or {}).get("dataset_profile") for f, fam in sorted(families.items())
    }
