"""The training-loop exports (`rsieve export RUN --format dpo|kto|rl`, docs/training.md):
what each sample is to a pair (rsieve.dataset.preference), the pairs of one item, and a
best-of-n run on the FakeStack exported in every format and layout, read back with
`datasets`, with the rsieve rewards agreeing with the factory on every stored sample."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import datasets
import pyarrow.parquet as pq
import pytest

from rsieve.compact.settle import settle
from rsieve.dataset.preference import (
    Gate,
    PairRules,
    item_pairs,
    item_samples,
    kto_rows,
    sample_role,
)
from rsieve.rewards import decode, disagreements, factory_accepts
from rsieve.rewards.verl import compute_score
from rsieve.schemas import Outcome
from rsieve_cli.commands.runs import _export_training
from services.context import Context
from tests.unit._records import accepted, failed, judged, make_item
from tests.unit.test_best_of_n import StochasticStandIn, make_pool, pipeline

ITEMS = 40
IMAGE = {"bytes": b"png", "path": "sha"}
NOTHING_GATED = Gate(None, {})


def _sampled(*samples: Outcome) -> Outcome:
    """Samples of one item, numbered in order, settled as the judge stage settles them."""
    numbered = [
        s.model_copy(update={"generation": s.generation.model_copy(update={"sample": k})})
        for k, s in enumerate(samples)
    ]
    return settle(numbered)


def _trusted(family: str) -> bool:
    return True


def _untrusted(family: str) -> bool:
    return False


ITEM = make_item("w-1", references=["COFFEE"])


# --------------------------------------------------------------------------- roles


@pytest.mark.parametrize(
    ("sample", "role", "why"),
    [
        (accepted(ITEM), "chosen", None),
        (judged(ITEM, "COFEE", "WRONG"), "refused", "wrong_answer"),
        (judged(ITEM, "COFEE", None), "refused", "judge_failed"),
        (judged(ITEM, "coffee beans", "CORRECT"), "excluded", "judge_correct"),
        (judged(ITEM, "COFEE", "UNSURE"), "excluded", "judge_unsure"),
        (failed(ITEM, "I keep reading"), "format", "truncated_reasoning"),
    ],
)
def test_each_sample_has_one_role(sample: Outcome, role: str, why: str | None) -> None:
    assert sample_role(sample, PairRules(), trusted=True) == (role, why)


def test_judge_promotions_are_chosen_only_when_asked_and_calibrated() -> None:
    promoted = judged(ITEM, "coffee beans", "CORRECT")
    assert promoted.promoted_by == "judge"
    asked = PairRules(chosen_include_judged=True)
    assert sample_role(promoted, asked, trusted=True) == ("chosen", None)
    assert sample_role(promoted, asked, trusted=False) == ("excluded", "judge_correct")
    assert sample_role(promoted, PairRules(), trusted=True) == ("excluded", "judge_correct")


def test_judge_wrong_rule_keeps_only_answers_the_judge_called_wrong() -> None:
    rules = PairRules(rejected_requires="judge_wrong")
    assert sample_role(judged(ITEM, "COFEE", "WRONG"), rules, trusted=True)[0] == "refused"
    not_asked = judged(ITEM, "COFEE", "WRONG").model_copy(
        update={"verdict": None, "reason": "judge_skipped"}
    )
    assert sample_role(not_asked, rules, trusted=True) == ("excluded", "not_judged_wrong")
    assert sample_role(not_asked, PairRules(), trusted=True) == ("refused", "judge_skipped")


def test_think_mode_needs_a_gated_trace_nothink_does_not() -> None:
    bare = accepted(ITEM).model_copy(
        update={"generation": accepted(ITEM).generation.model_copy(update={"reasoning": None})}
    )
    assert sample_role(bare, PairRules(), trusted=True) == ("excluded", "trace_gate")
    assert sample_role(bare, PairRules(mode="nothink"), trusted=True) == ("chosen", None)
    # A cut-off think block has no answer text to put on a nothink pair's rejected side.
    cut = failed(ITEM, "I keep reading")
    assert sample_role(cut, PairRules(mode="nothink"), trusted=True) == ("excluded", "no_text")


def test_a_trace_the_gate_fails_is_not_a_think_target() -> None:
    guess = accepted(ITEM).generation.model_copy(
        update={"reasoning": "I cannot read it, so I will just guess COFFEE."}
    )
    head = _sampled(accepted(ITEM).model_copy(update={"generation": guess}))
    gate = Gate.of_report(
        {
            "checks": ["guessing"],
            "constants": {
                "repetition_span": 40,
                "repetition_max_share": 0.5,
                "mixing_min_chars": 40,
                "length_mads": 5.0,
                "length_floor_chars": 0,
                "length_min_traces": 20,
            },
        }
    )
    rows, _, counts = item_pairs(head, IMAGE, PairRules(), trusted=_trusted, gate=gate)
    assert counts.samples == {"trace_gate": 1} and counts.no_chosen == 1 and rows == []


# --------------------------------------------------------------------------- pairs


def test_pairs_cross_chosen_with_refused_and_drop_the_same_answer() -> None:
    head = _sampled(
        judged(ITEM, "COFEE", "WRONG"),
        accepted(ITEM),
        # training refuses it, but it normalises to the chosen answer: no pair
        judged(ITEM, "TEA", "WRONG"),
        accepted(ITEM, "coffee"),
        failed(ITEM, "I keep"),
        judged(ITEM, "coffee beans", "CORRECT"),
    )
    rows, format_rows, counts = item_pairs(
        head, IMAGE, PairRules(), trusted=_trusted, gate=NOTHING_GATED, run="r"
    )
    assert [(r["chosen_sample"], r["rejected_sample"]) for r in rows] == [
        (1, 0),
        (1, 2),
        (3, 0),
        (3, 2),
    ]
    assert [(r["chosen_sample"], r["rejected_sample"]) for r in format_rows] == [(1, 4), (3, 4)]
    first = rows[0]
    assert first["prompt"] == [
        {
            "role": "user",
            "content": [
                {"type": "image", "text": None},
                {"type": "text", "text": "What word is shown?"},
            ],
        }
    ]
    assert first["chosen"][0]["content"][0]["text"] == (
        "<think>\nI read the letters one by one.\n</think>\n\nCOFFEE"
    )
    assert first["rejected"][0]["content"][0]["text"].endswith("</think>\n\nCOFEE")
    assert first["chosen_answer"] == "COFFEE" and first["rejected_answer"] == "COFEE"
    assert first["pass_rate"] == 2 / 6 and first["samples"] == 6 and first["images"] == [IMAGE]
    assert counts.pairs == 4 and counts.format_pairs == 2 and counts.items_with_pairs == 1
    assert counts.samples == {"chosen": 2, "refused": 2, "format": 1, "judge_correct": 1}


def test_same_answer_pairs_are_dropped_and_counted() -> None:
    item = make_item("n-1", protocol="number", references=["12"])
    # 12.0 is refused only by a training rule stricter than the benchmark would be; here
    # the verifier accepts both forms, so build the refused side by hand.
    right = accepted(item, "12")
    same = judged(item, "13", "WRONG")
    same = same.model_copy(
        update={"generation": same.generation.model_copy(update={"answer": "12.0"})}
    )
    rows, _, counts = item_pairs(
        _sampled(right, same), IMAGE, PairRules(), trusted=_trusted, gate=NOTHING_GATED
    )
    assert rows == [] and counts.dropped_same_answer == 1 and counts.no_rejected == 0


def test_pairs_are_capped_by_a_seeded_draw() -> None:
    samples = [accepted(ITEM)] * 4 + [judged(ITEM, f"WRONG{i}", "WRONG") for i in range(5)]
    head = _sampled(*samples)
    rules = PairRules(max_pairs_per_item=7, seed=3)
    rows, _, counts = item_pairs(head, IMAGE, rules, trusted=_trusted, gate=NOTHING_GATED)
    again, _, _ = item_pairs(head, IMAGE, rules, trusted=_trusted, gate=NOTHING_GATED)
    other, _, _ = item_pairs(
        head, IMAGE, PairRules(max_pairs_per_item=7, seed=4), trusted=_trusted, gate=NOTHING_GATED
    )

    def picked(rs: list[dict[str, Any]]) -> list[tuple[int, int]]:
        return [(r["chosen_sample"], r["rejected_sample"]) for r in rs]

    assert len(rows) == 7 and counts.dropped_over_cap == 20 - 7
    assert picked(rows) == picked(again) and picked(rows) != picked(other)


def test_nothink_pairs_hold_the_answers_alone() -> None:
    head = _sampled(accepted(ITEM), judged(ITEM, "COFEE", "WRONG"))
    rows, _, _ = item_pairs(
        head, IMAGE, PairRules(mode="nothink"), trusted=_untrusted, gate=NOTHING_GATED
    )
    assert rows[0]["chosen"][0]["content"][0]["text"] == "COFFEE"
    assert rows[0]["rejected"][0]["content"][0]["text"] == "COFEE"


def test_kto_rows_label_every_sample_on_a_side() -> None:
    head = _sampled(
        accepted(ITEM),
        judged(ITEM, "COFEE", "WRONG"),
        judged(ITEM, "COFEE", "UNSURE"),
        failed(ITEM, "I keep"),
    )
    rows, counts = kto_rows(head, IMAGE, PairRules(), trusted=_trusted, gate=NOTHING_GATED)
    assert [(r["sample"], r["label"], r["kind"]) for r in rows] == [
        (0, True, "chosen"),
        (1, False, "refused"),
        (3, False, "format"),
    ]
    assert rows[0]["completion"][0]["role"] == "assistant"
    assert counts.samples["judge_unsure"] == 1


# --------------------------------------------------------------------------- a run


def best_of_n_run(root: Path, items: int = ITEMS) -> tuple[Context, str]:
    """A pool of `items` through the FakeStack with 4 samples each, every one drawn, on a
    stochastic stand-in right half the time (not a model); the context and the run id."""
    pool = make_pool(root / "pool", count=items)
    ctx, _, run_id, _ = pipeline(
        pool,
        StochasticStandIn(0.5, forms=_forms),
        dataset="loop",
        sampling={"samples": 4, "temperature": 0.7, "enough": 0},
    )
    return ctx, run_id


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Context, str]]:
    yield best_of_n_run(tmp_path_factory.mktemp("training"))


def _forms(reference: str, rng: random.Random) -> str:
    # Right answers in a form the protocol reads the same (alnum: case and spacing).
    return rng.choice([reference, reference.lower(), f" {reference} "])


def _heads(ctx: Context, run_id: str) -> list[Outcome]:
    return [
        o
        for s in sorted(ctx.stored_shards(run_id, "judge"))
        for o in ctx.load(run_id, "judge", s).outcomes
    ]


def export(ctx: Context, run_id: str, to: Path, fmt: str, **kw: Any) -> Path:
    """`rsieve export RUN --to TO --format FMT` (the command's own code), options as `kw`."""
    options: dict[str, Any] = {
        "mode": "think",
        "chosen_include_judged": False,
        "rejected_requires": "not_promoted",
        "max_pairs_per_item": 15,
        "pair_seed": 0,
        "band": None,
        "layout": "trl",
    } | kw
    return _export_training(ctx, ctx.spec(run_id), to, fmt, **options)


def test_dpo_export_pairs_every_item_with_both_sides(
    run: tuple[Context, str], tmp_path: Path
) -> None:
    ctx, run_id = run
    folder = export(ctx, run_id, tmp_path, "dpo")
    assert folder.name == f"{run_id}-dpo" and run_id.startswith("loop-")
    ds = datasets.load_dataset(str(folder))
    pairs = ds["SynthWords_pairs"]
    by_item: dict[str, set[tuple[int, int]]] = {}
    for row in pairs:
        by_item.setdefault(row["id"], set()).add((row["chosen_sample"], row["rejected_sample"]))
        assert row["chosen"][0]["content"][0]["text"].startswith("<think>\nseed ")
        assert row["images"][0].size == (96, 64)  # the item's own picture, decoded
    expected: dict[str, set[tuple[int, int]]] = {}
    for head in _heads(ctx, run_id):
        samples = item_samples(head)
        right = [s.generation.sample or 0 for s in samples if factory_accepts(s)]
        wrong = [s.generation.sample or 0 for s in samples if s.place == "rejected"]
        if right and wrong:
            expected[head.generation.item.id] = {(c, r) for c in right for r in wrong}
    assert expected and len(expected) < ITEMS  # some items had both sides, some not
    assert by_item == expected
    card = (folder / "README.md").read_text()
    assert "| SynthWords | 40 |" in card and "without stopping at a pass" in card


def test_kto_and_rl_exports_in_every_layout(run: tuple[Context, str], tmp_path: Path) -> None:
    ctx, run_id = run
    heads = _heads(ctx, run_id)
    kto = datasets.load_dataset(str(export(ctx, run_id, tmp_path, "kto")))["SynthWords"]
    # Every sample is on a side but those the (abstaining) judge called UNSURE.
    unsure = [s for h in heads for s in item_samples(h) if s.reason == "judge_unsure"]
    assert unsure and len(kto) == 4 * ITEMS - len(unsure)
    assert sum(kto["label"]) == sum(factory_accepts(s) for h in heads for s in item_samples(h))
    rates = {h.generation.item.id: sum(map(factory_accepts, item_samples(h))) / 4 for h in heads}
    inside = {i for i, r in rates.items() if 0 < r < 1}
    trl = datasets.load_dataset(str(export(ctx, run_id, tmp_path, "rl")))["train"]
    assert set(trl["id"]) == inside
    assert all(rates[r["id"]] == r["pass_rate"] for r in trl)
    assert decode(trl[0]["ground_truth"]).references == trl[0]["references"]
    verl = pq.read_table(export(ctx, run_id, tmp_path, "rl", layout="verl") / "train.parquet")
    first = verl.to_pylist()[0]
    assert first["data_source"] == "rsieve/SynthWords"
    assert first["prompt"][0]["content"].count("<image>") == len(first["images"]) == 1
    assert first["reward_model"]["style"] == "rule"
    truth = first["reward_model"]["ground_truth"]
    right = compute_score(
        "rsieve/SynthWords", "<think>ok</think>" + decode(truth).references[0], truth
    )
    assert right["score"] == 1.0
    easy = datasets.load_dataset(str(export(ctx, run_id, tmp_path, "rl", layout="easyr1")))
    row = easy["train"][0]
    assert row["problem"].startswith("<image>") and decode(row["answer"]).protocol == "alnum"
    narrow = export(ctx, run_id, tmp_path / "narrow", "rl", band=(0.3, 0.6))
    kept = datasets.load_dataset(str(narrow))["train"]
    assert set(kept["id"]) == {i for i, r in rates.items() if 0.3 < r < 0.6}
    card = (narrow / "README.md").read_text()
    assert "too easy" in card and "strictly between 0.3 and 0.6" in card


def test_rewards_agree_with_the_factory_on_every_stored_sample(run: tuple[Context, str]) -> None:
    ctx, run_id = run
    policy = ctx.run_settings(run_id).training_policy()
    result = disagreements(_heads(ctx, run_id), lambda i: policy.rule_for(i.family, i.protocol))
    assert result.differing == [] and result.counts["verl"].scored == 4 * ITEMS
    assert result.counts["trl"].agreed == result.counts["easyr1"].agreed == 4 * ITEMS
