"""The cards of the training-loop exports (`rsieve export RUN --format dpo|kto|rl`): the
YAML `datasets` reads the splits from, how the rows were made, and the counts per family.
Pure."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import datasets
import yaml

from rsieve.dataset.preference import EXCLUDED, PairCounts, PairRules
from rsieve.dataset.rlsets import Band, RlCounts

__all__ = ["render_pairs_card", "render_rl_card", "sampling_note", "split_front_matter"]


def split_front_matter(
    features: datasets.Features,
    files: Mapping[str, list[str]],
    rows: Mapping[str, int],
    *,
    tags: list[str],
) -> dict[str, Any]:
    """README YAML: one config whose splits are `files` (split -> data files), with the
    features and split sizes, as `datasets` and the Hub read them."""
    info = datasets.DatasetInfo(features=features)._to_yaml_dict()
    info["splits"] = [{"name": s, "num_examples": rows[s]} for s in files]
    return {
        "configs": [
            {
                "config_name": "default",
                "data_files": [{"split": s, "path": p} for s, p in files.items()],
            }
        ],
        "dataset_info": info,
        "tags": ["rejection-sampling", "vision-language", *tags],
    }


def sampling_note(sampling: Mapping[str, Any]) -> str:
    """What the run's sampling means for pass rates (the run spec's settings)."""
    n = int(sampling.get("samples") or 1)
    if n <= 1:
        return (
            "The run asked one sample per question: every pass rate is 0 or 1, and no item "
            "has both an accepted and a refused sample. Preference pairs and RL prompt sets "
            "need best-of-n (`rsieve run --samples N --temperature T`)."
        )
    enough = sampling.get("enough")
    if enough is None:
        # Settings' default: 1 with keep first and no pass-rate window, else 0 (off).
        first = sampling.get("keep", "first") == "first"
        enough = 1 if first and not sampling.get("pass_rate_window") else 0
    text = f"The run asked up to {n} samples per question"
    if enough:
        return text + (
            f" adaptively: an item stopped drawing once {enough} of its samples passed, so "
            "its pass rate says when it passed, not how often. For pass rates that measure "
            "difficulty, run with `--enough 0` (every sample drawn)."
        )
    return text + ", without stopping at a pass: pass rates are over every sample drawn."


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _front(front_matter: Mapping[str, Any] | None) -> list[str]:
    if front_matter is None:
        return []
    return ["---", yaml.safe_dump(dict(front_matter), sort_keys=False).rstrip(), "---", ""]


def _made_md(rules: PairRules) -> list[str]:
    """What makes a sample chosen, rejected or format, and how a side is written."""
    rejected = (
        "refused by the verifier under the training rule, and called WRONG by the judge"
        if rules.rejected_requires == "judge_wrong"
        else "refused by the verifier under the training rule, and not called CORRECT or "
        "UNSURE by the judge (WRONG, no verdict, or not asked)"
    )
    chosen = "accepted by the verifier under the run's training rule" + (
        ", or promoted by the judge in a family whose judge cleared calibration"
        if rules.chosen_include_judged
        else " (judge promotions left out)"
    )
    return [
        "## How the rows were made",
        "",
        f"- chosen: {chosen}"
        + ("; its reasoning passed the run's trace gate." if rules.mode == "think" else "."),
        f"- rejected: {rejected}.",
        "- format: no scorable answer (truncated, empty, a refusal, a repetition loop).",
        f"- mode `{rules.mode}`: "
        + (
            "`<think>\\n{reasoning}\\n</think>\\n\\n{answer}` on both sides."
            if rules.mode == "think"
            else "the answer alone on both sides."
        ),
    ]


def _dpo_md(
    rules: PairRules, counts: Mapping[str, PairCounts], rows: Mapping[str, int]
) -> list[str]:
    """How pairs are drawn, how to load them, and the pairs per family."""
    return [
        "- pairs: every chosen x rejected sample of an item, less those whose answers "
        "are the same under the item's protocol; at most "
        f"{rules.max_pairs_per_item} per item (drawn with seed {rules.seed}). Chosen x "
        "format samples go to `<Family>_format_pairs`.",
        "",
        "```python",
        "import datasets",
        "",
        'pairs = datasets.load_dataset("path/to/this/folder")  # splits: ' + ", ".join(rows),
        "```",
        "",
        "## Counts",
        "",
        "| family | items | with pairs | pairs | format pairs | same answer (dropped) "
        "| over the cap (dropped) | no chosen | no rejected |",
        "|---|---|---|---|---|---|---|---|---|",
        *[
            f"| {_cell(family)} | {c.items} | {c.items_with_pairs} | {c.pairs} | "
            f"{c.format_pairs} | {c.dropped_same_answer} | {c.dropped_over_cap} | "
            f"{c.no_chosen} | {c.no_rejected} |"
            for family, c in sorted(counts.items())
        ],
    ]


def _kto_md(counts: Mapping[str, PairCounts]) -> list[str]:
    """What a row is, and the rows per family."""
    lines = [
        "- one row per chosen (label true), rejected or format (label false) sample.",
        "",
        "## Counts",
        "",
        "| family | items | rows | no chosen | no rejected |",
        "|---|---|---|---|---|",
    ]
    for family, c in sorted(counts.items()):
        n = sum(v for k, v in c.samples.items() if k in ("chosen", "refused", "format"))
        lines.append(f"| {_cell(family)} | {c.items} | {n} | {c.no_chosen} | {c.no_rejected} |")
    return lines


def _roles_md(counts: Mapping[str, PairCounts]) -> list[str]:
    """The samples per family and role, and what each excluded role means."""
    lines = [
        "## Samples by role",
        "",
        "| family | role | samples |",
        "|---|---|---|",
        *[
            f"| {_cell(family)} | {role} | {n} |"
            for family, c in sorted(counts.items())
            for role, n in sorted(c.samples.items())
        ],
    ]
    used = sorted({r for c in counts.values() for r in c.samples} & set(EXCLUDED))
    if used:
        lines += ["", "Excluded samples (on neither side):", ""]
        lines += [f"- `{r}`: {EXCLUDED[r]}" for r in used]
    return lines


def render_pairs_card(
    dataset: str,
    run: str,
    fmt: str,
    rules: PairRules,
    counts: Mapping[str, PairCounts],
    rows: Mapping[str, int],
    sampling: Mapping[str, Any],
    *,
    front_matter: Mapping[str, Any],
) -> str:
    """The dpo/kto export's README.md."""
    lines = [
        *_front(front_matter),
        f"# {dataset}: {fmt} export of run `{run}`",
        "",
        sampling_note(sampling),
        "",
        *_made_md(rules),
        *(_dpo_md(rules, counts, rows) if fmt == "dpo" else _kto_md(counts)),
        "",
        *_roles_md(counts),
    ]
    return "\n".join(lines) + "\n"


def render_rl_card(
    dataset: str,
    run: str,
    layout: str,
    band: Band,
    counts: Mapping[str, RlCounts],
    sampling: Mapping[str, Any],
    *,
    front_matter: Mapping[str, Any] | None,
) -> str:
    """The rl export's README.md."""
    reward = {
        "trl": "`from rsieve.rewards.trl import accuracy_reward` as a GRPOTrainer reward "
        "function (it reads the `ground_truth` column)",
        "verl": "`reward.custom_reward_function.path` = the file of `rsieve.rewards.verl`, "
        "`reward.custom_reward_function.name=compute_score`",
        "easyr1": "`rsieve.rewards.easyr1`'s `compute_score` (batch)",
    }[layout]
    lines = [
        *_front(front_matter),
        f"# {dataset}: RL prompt set of run `{run}` ({layout} layout)",
        "",
        sampling_note(sampling),
        "",
        f"One row per item whose pass rate lies strictly between {band.low} and {band.high}: "
        "the share of its samples the verifier accepted under the training rule, which is "
        "what the reward scores 1.0. The ground truth (references, protocol, options, "
        "training rule) is one JSON string the reward decodes.",
        "",
        f"Reward: {reward}. It scores a completion exactly as rsieve scored the run's samples.",
        "",
        "| family | items | kept | too easy | too hard | unparseable reference "
        "| `<image>` in question |",
        "|---|---|---|---|---|---|---|",
    ]
    for family, c in sorted(counts.items()):
        lines.append(
            f"| {_cell(family)} | {c.items} | {c.kept} | {c.too_easy} | {c.too_hard} | "
            f"{c.unparseable_reference} | {c.image_token_in_question} |"
        )
    return "\n".join(lines) + "\n"
