"""Issue 19's rules on the FakeStack (tests/fakestack.py), moved from the real stack
(tests/e2e/test_decontamination.py; see docs/testing.md): an evaluation set registered as
`rsieve evalset add` registers it quarantines modified copies of its images as
`contaminated` before any model call; with no set registered nothing is; the card lists
the set; a second run of an overlapping pool into the same dataset spends no model call on
the overlap (counted by the replay stand-in, per request, as Triton's counters count).
tests/e2e/test_capabilities.py keeps one real-stack run against a set added by the CLI."""

from __future__ import annotations

from pathlib import Path

from rsieve import keys
from rsieve.adapters.pools import read_pool
from rsieve.clean.decontam import build_evalset
from tests.fakestack import FakeStack, ReplayModel
from tests.rule_pools import COUNT, copies, originals, originals_replay, picture_pool


def _add_evalset(stack: FakeStack, name: str, pool: Path) -> dict[str, int]:
    """What `rsieve evalset add NAME POOL` does (rsieve_cli.commands.evalset.evalset_add);
    its figures."""
    files = read_pool(pool)
    evalset, figures = build_evalset(
        name, files.items, lambda path: files.read(path) if path in files.files else None
    )
    stack.store.put(keys.evalset(name), evalset.to_json())
    return dict(figures)


def _quarantined(stack: FakeStack, run: str) -> dict[str, str]:
    return {q["id"]: q["reason"] for q in stack.clean_outputs(run)[1]}


def test_evaluation_sets_and_overlapping_runs(tmp_path: Path) -> None:
    model = ReplayModel(originals_replay())
    stack = FakeStack(generator=model, judge=model, shard_size=8, model_retries=0)
    first = picture_pool(tmp_path / "originals", originals(), "orig")
    copied = picture_pool(tmp_path / "copies", copies(), "copy")

    # No evaluation set: the copies are not contaminated.
    run = stack.run(copied, "free")
    assert "contaminated" not in _quarantined(stack, run).values()

    # The originals as an evaluation set.
    figures = _add_evalset(stack, "pictures-test", first)
    assert (figures["hashed"], figures["lines"]) == (COUNT, COUNT)
    before = model.asked
    run = stack.run(copied, "free")  # the same pool: a new run, the set is new
    found = _quarantined(stack, run)
    contaminated = [i for i, reason in found.items() if reason == "contaminated"]
    assert len(contaminated) >= 0.95 * COUNT, found
    # At most a generation and a judgement per item that went on; none for the rest.
    assert model.asked - before <= 2 * (COUNT - len(contaminated))
    export = stack.export("free", tmp_path / "export")
    assert "| pictures-test |" in (export / "README.md").read_text()

    stack.store.delete(keys.evalset("pictures-test"))  # `rsieve evalset remove`

    # Two runs into one dataset: the second pool holds copies of the first's images.
    run = stack.run(first, "grown")
    report = stack.json("datasets/grown/run_report.json")
    assert report["families"]["SynthWords"]["accepted"] == COUNT  # all in the dataset
    before = model.asked
    run = stack.run(copied, "grown")
    found = _quarantined(stack, run)
    overlap = [i for i, reason in found.items() if reason == "duplicate_item"]
    # A pool keeps one hash per image: every re-encoded, resized or brightened copy is
    # found; a cropped one (every fourth) only when the crop moved its hash little.
    assert {f"copy-{n}" for n in range(COUNT) if n % 4 != 1} <= set(overlap), found
    assert model.asked - before <= 2 * (COUNT - len(overlap))
