"""Families remember their task across runs (rsieve.clean.profiles): a dataset keeps, per
family, the profile of its on-task items; a later pool's task purity is judged against it
with the pool's own items, so a pool of only off-task questions is not judged against
itself. Profiles merge run by run in bounded size."""

from __future__ import annotations

import json
from pathlib import Path

from rsieve.clean.profiles import (
    PROFILE_ENTRIES,
    PROFILES_FILE,
    FamilyProfile,
    merge,
    merge_profiles,
    profiles_json,
    profiles_of,
)
from rsieve.clean.purity import PurityQuestion, measure_purity
from tests.fakestack import FakeStack
from tests.rule_pools import CHEQUE_GENERAL as GENERAL
from tests.rule_pools import CHEQUE_QUESTION as GENUINE
from tests.rule_pools import cheque_pools


def _questions(first: int, count: int, question: str | None = None) -> list[PurityQuestion]:
    return [
        PurityQuestion(
            first + k, question or GENERAL[k % len(GENERAL)], reference=str(1000 + 37 * k)
        )
        for k in range(count)
    ]


def test_a_pool_of_only_off_task_questions_is_judged_against_the_datasets_profile() -> None:
    genuine = measure_purity(
        "OrandCar", "alnum", _questions(1, 12, GENUINE), threshold=0.05, min_items=20, embed=None
    )
    assert genuine.profile is not None and genuine.profile.items == 12
    later = _questions(101, 8)
    alone = measure_purity("OrandCar", "alnum", later, threshold=0.05, min_items=20, embed=None)
    # Judged against itself (8 items, under min_items): measured off-task, kept.
    assert alone.off_task >= 6 and not alone.dropped_lines
    judged = measure_purity(
        "OrandCar",
        "alnum",
        later,
        threshold=0.05,
        min_items=20,
        embed=None,
        profile=genuine.profile,
    )
    # With the dataset's 12: the family has 20 items, the pool's share is far over 5%.
    assert judged.exceeded and len(judged.dropped_lines) == judged.off_task >= 6
    assert judged.summary()["dataset_profile"] == {"items": 12, "runs": 1}
    # Nothing of the pool is on-task: its own profile is empty, and the task has not drifted.
    assert judged.profile is not None and judged.profile.items == 8 - judged.off_task
    assert judged.drift is None


def test_the_profile_tells_a_small_pool_its_familys_single_question() -> None:
    """A dataset whose family asks one exact question: a pool of 3 items, one asking
    something else, has no single template of its own; with the profile it does."""
    held = measure_purity(
        "OrandCar", "alnum", _questions(1, 30, GENUINE), threshold=0.05, min_items=20, embed=None
    ).profile
    pool = [*_questions(101, 2, GENUINE), PurityQuestion(103, "Is the text handwritten?")]
    alone = measure_purity("OrandCar", "alnum", pool, threshold=0.05, min_items=20, embed=None)
    assert alone.rule_of_line[103] == "unsettled"
    judged = measure_purity(
        "OrandCar", "alnum", pool, threshold=0.05, min_items=20, embed=None, profile=held
    )
    assert judged.rule_of_line[103] == "single_template_off" and judged.dropped_lines == [103]


def test_a_pool_that_would_change_the_familys_task_is_reported() -> None:
    held = measure_purity(
        "OrandCar", "alnum", _questions(1, 12, GENUINE), threshold=0.05, min_items=20, embed=None
    ).profile
    other = "What is the cheque number?"
    judged = measure_purity(
        "OrandCar",
        "alnum",
        _questions(101, 40, other),
        threshold=0.05,
        min_items=20,
        embed=None,
        profile=held,
    )
    assert judged.drift is not None
    assert judged.drift["dominant_form"] == GENUINE.lower()
    assert judged.drift["becomes"] == other.lower() and judged.drift["pool_items"] == 40
    assert judged.summary()["drift"] == judged.drift


def test_profiles_merge_in_bounded_size() -> None:
    """Ten runs of 1,000 items, each with 300 forms of its own and a shared one: the merged
    profile counts every item and keeps PROFILE_ENTRIES entries per counter, so its size
    after ten runs is its size after two."""
    runs = [
        FamilyProfile.counted(
            "F",
            "alnum",
            forms=["shared"] * 700 + [f"run {r} form {k}" for k in range(300)],
            exact=["what is written?"] * 1000,
            origins=[f"source-{k % 3}" for k in range(1000)],
            answered=1000,
            describing=r,
        )
        for r in range(10)
    ]
    merged = runs[0]
    sizes = []
    for r in runs[1:]:
        merged = merge(merged, r)
        sizes.append(len(profiles_json({"F": merged})))
    assert merged.items == 10_000 and merged.runs == 10 and merged.describing == 45
    assert merged.forms["shared"] == 7000 and len(merged.forms) == PROFILE_ENTRIES
    assert merged.origins == {"source-0": 3340, "source-1": 3330, "source-2": 3330}
    assert max(sizes) - min(sizes) < 200, sizes  # bytes: bounded, whatever the runs
    # The file round-trips, and merging by family keeps the others.
    again = profiles_of(json.loads(profiles_json({"F": merged})))
    assert again == {"F": merged}
    other = FamilyProfile.counted(
        "G", "mc", forms=["a"], exact=["a"], origins=[None], answered=0, describing=0
    )
    assert set(merge_profiles(again, {"G": other})) == {"F", "G"}


def test_a_dataset_remembers_its_familys_task_between_runs(tmp_path: Path) -> None:
    """Through every service on the FakeStack: a pool of 12 genuine items into a dataset
    (its profile committed with it), then a pool of 8 general questions on other images
    into the same dataset: quarantined off_task, judged against the dataset's profile,
    which run_spec.json records."""
    stack = FakeStack(shard_size=16, model_retries=0)
    first, second = cheque_pools(tmp_path)
    stack.run(first, "cheques")
    profiles = profiles_of(stack.json(f"datasets/cheques/commits/{_last(stack)}/{PROFILES_FILE}"))
    assert profiles["OrandCar"].items == 12 and profiles["OrandCar"].runs == 1
    run = stack.run(second, "cheques")
    _, quarantined = stack.clean_outputs(run)
    off_task = [q for q in quarantined if q["reason"] == "off_task"]
    # Every one: the family is 20 items with the dataset's 12, and the pool's share 100%.
    assert len(off_task) == 8, quarantined
    assert all("off-task share 100.0% > 5.0%" in q["detail"] for q in off_task)
    purity = stack.json(f"runs/{run}/cleaning.json")["families"]["OrandCar"]["purity"]
    assert purity["dataset_profile"] == {"items": 12, "runs": 1}
    spec = stack.json(f"datasets/cheques/commits/{run}/run_spec.json")
    assert spec["dataset_profiles"] == {"OrandCar": {"items": 12, "runs": 1}}
    after = profiles_of(stack.json(f"datasets/cheques/commits/{run}/{PROFILES_FILE}"))
    assert after["OrandCar"].runs == 2 and after["OrandCar"].items == 12 + 8 - len(off_task)


def _last(stack: FakeStack) -> str:
    return str(stack.json("datasets/cheques/manifest.json")["run"])


def test_the_card_says_what_the_family_was_judged_with_and_its_drift() -> None:
    from rsieve.clean.cleaning import render_cleaning

    purity = {
        "items": 40, "off_task": 0, "share": 0.0, "measured": True, "threshold": 0.05,
        "kept": 40, "dropped": 0, "by_rule": {}, "examples": [],
        "dataset_profile": {"items": 12, "runs": 1},
        "drift": {"dominant_form": "what is the amount?", "becomes": "what is the number?",
                  "pool_items": 40},
    }  # fmt: skip
    md = "\n".join(render_cleaning({"families": {"OrandCar": {"purity": purity}}}))
    assert "judged with the dataset's profile of 12 on-task items from 1 earlier run" in md
    assert "**Task drift**" in md and "'what is the number?'" in md
