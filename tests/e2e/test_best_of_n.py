"""Best-of-n through the real stack: `rsieve run --samples 4 --temperature 0.7` (adaptive,
the default: an item stops at its first pass) on Triton's
stochastic stand-in (tests/triton_models/stochastic-standin: not a model; right with
probability 0.3 per sample, decided by the sample's seed, which the client sends as the
model's optional `seed` input). The same pool once with one sample: the yield grows as
1 - (1 - p)^n says, every qa entry carries its pass rate, the card shows it, and
`rsieve audit` counts items and samples."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import datasets
import pytest

from rsieve_cli.local.stack import Stack
from tests.e2e.cli import run_cli, run_script
from tests.unit.test_best_of_n import make_pool

ITEMS = 60


@pytest.fixture(scope="module")
def stack(start_stack: Callable[..., Stack]) -> Stack:
    return start_stack(
        ["stochastic-standin", "judge-abstain"],
        settings_env={
            "RSIEVE_GENERATOR_MODEL": "stochastic-standin",
            "RSIEVE_JUDGE_MODEL": "judge-abstain",
            "RSIEVE_PURITY_EMBEDDING": "false",
        },
    )


def test_four_samples_per_question_through_the_stack(stack: Stack, tmp_path: Path) -> None:
    pool = make_pool(tmp_path / "pool", count=ITEMS)
    one = run_cli(stack, "run", str(pool), "--out", str(tmp_path / "one"), "--dataset", "one")
    assert one.returncode == 0, one.stderr[-3000:]
    four = run_cli(
        stack,
        "run",
        str(pool),
        "--out",
        str(tmp_path / "four"),
        "--dataset",
        "four",
        "--samples",
        "4",
        "--temperature",
        "0.7",
    )
    assert four.returncode == 0, four.stderr[-3000:]
    reports = {
        n: json.loads((tmp_path / n / n / "run_report.json").read_text()) for n in ("one", "four")
    }
    accepted = {n: r["families"]["SynthWords"]["accepted"] for n, r in reports.items()}
    assert accepted["one"] < accepted["four"]
    sampling = reports["four"]["sampling"]["SynthWords"]
    # Adaptive by default (keep first): rounds of one sample, an item stops at its first
    # pass, and what it did not draw is counted.
    assert sampling["items"] == ITEMS and sampling["samples"] < 4 * ITEMS
    assert sampling["samples"] + sampling["samples_not_drawn"] == 4 * ITEMS
    assert sum(sampling["drawn_histogram"].values()) == ITEMS
    assert sampling["accepted_at_n"] == accepted["four"]
    assert "sampling" not in reports["one"]
    # Every accepted qa entry carries its item's pass rate over the samples it drew: its
    # one pass, the last of them; the rejected its wrong answers, after all four.
    ds = datasets.load_dataset(str(tmp_path / "four" / "four"))
    for row in ds["SynthWords_RS_nothink"]:
        for qa in row["qa"]:
            assert qa["passed"] == 1 and 1 <= qa["samples"] <= 4
            assert qa["pass_rate"] == 1 / qa["samples"]
            assert qa["seed"] is not None and qa["sample"] == qa["samples"] - 1
    for row in ds["SynthWords_rejected"]:
        for qa in row["qa"]:
            assert qa["passed"] == 0 and qa["samples"] == 4 and len(qa["wrong_answers"]) >= 1
    card = (tmp_path / "four" / "four" / "README.md").read_text()
    assert "## Best-of-n" in card and "answered each question up to 4 times" in card
    run = reports["four"]["run"]
    audit = run_cli(stack, "audit", run, "--json")
    assert audit.returncode == 0, audit.stdout[-3000:]
    result = json.loads(audit.stdout)
    assert result["ok"] and result["samples"] == sampling["samples"]
    _training_exports(stack, run, tmp_path / "exports")
    # A dataset of single-sample runs refuses a best-of-n run, saying why.
    mixed = run_cli(
        stack, "submit", str(pool), "--dataset", "one", "--samples", "4", "--temperature", "0.7"
    )
    assert mixed.returncode != 0 and "best-of-n" in mixed.stdout + mixed.stderr


def _training_exports(stack: Stack, run: str, to: Path) -> None:
    """The run's samples for the training loop, through the command line: DPO pairs for
    exactly the items with an accepted and a refused sample, KTO rows, the RL prompt set in
    every layout, and the rewards agreeing with the factory on every stored sample."""
    exported = {}
    for fmt, *extra in (("dpo",), ("kto",), ("rl",), ("rl", "verl"), ("rl", "easyr1")):
        layout = ["--layout", extra[0]] if extra else []
        result = run_cli(stack, "export", run, "--to", str(to), "--format", fmt, *layout)
        assert result.returncode == 0, result.stderr[-3000:]
        exported[(fmt, *extra)] = Path(result.stdout.strip().splitlines()[-1])
    pairs = datasets.load_dataset(str(exported[("dpo",)]))["SynthWords_pairs"]
    # Adaptive keep-first: an item with pairs passed at its last sample drawn, every
    # earlier one refused.
    assert len(pairs) > 0
    for row in pairs:
        assert row["rejected_sample"] < row["chosen_sample"] == row["samples"] - 1
        assert row["chosen_answer"] != row["rejected_answer"]
    with_pairs = set(pairs["id"])
    kto = datasets.load_dataset(str(exported[("kto",)]))["SynthWords"]
    labelled = {(r["id"], r["sample"]): r["label"] for r in kto}
    passed_late = {i for (i, k), label in labelled.items() if label and k > 0}
    assert with_pairs == passed_late
    rl = datasets.load_dataset(str(exported[("rl",)]))["train"]
    assert set(rl["id"]) == with_pairs  # pass rate 1/k, k > 1: strictly inside (0, 1)
    verl = exported[("rl", "verl")] / "train.parquet"
    assert verl.is_file() and (exported[("rl", "easyr1")] / "README.md").is_file()
    parity = run_script(stack, "scripts.reward_parity", run)
    assert parity.returncode == 0, parity.stdout[-3000:] + parity.stderr[-3000:]
