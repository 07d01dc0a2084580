"""A pool through the whole pipeline over real Redis, SeaweedFS and Triton, with the
replay model answering, so every item's place is asserted exactly: nothing lost, nothing
twice, nothing in the wrong split; a second submission changes nothing."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import datasets
import pytest

from rsieve.adapters.exports import export_dataset
from rsieve.adapters.pools import upload_pool
from rsieve.adapters.storage import S3Store
from rsieve.settings import DECIDING
from rsieve_cli.client import submit, wait_for_run
from rsieve_cli.local.stack import Stack
from tests.conftest import stack_settings
from tests.e2e.scenario import Scenario, build


@pytest.fixture(scope="module")
def scenario(tmp_path_factory: pytest.TempPathFactory) -> Scenario:
    return build(tmp_path_factory.mktemp("pool") / "replay-pool")


# One stack with test_review_page (tests/e2e/conftest.py, scenario_stack).
SHARED_STACK = "scenario"


@pytest.fixture(scope="module")
def stack(scenario_stack: Stack) -> Stack:
    return scenario_stack


def _run(stack: Stack, scenario: Scenario, out: Path) -> tuple[str, Path]:
    settings = stack_settings(stack)
    store = S3Store(settings)
    uri = upload_pool(store, scenario.folder)
    run = submit(settings, uri, "replay-test")
    wait_for_run(settings, run, timeout=300)
    return run, export_dataset(store, "replay-test", out)


@pytest.fixture(scope="module")
def export(
    stack: Stack, scenario: Scenario, tmp_path_factory: pytest.TempPathFactory
) -> tuple[str, Path]:
    return _run(stack, scenario, tmp_path_factory.mktemp("out"))


def _places(path: Path) -> dict[int, tuple[str | None, str, str]]:
    """pool line -> (id, place, detail) as found in the export; fails on any line twice."""
    ds = datasets.load_dataset(str(path))
    quarantine = [json.loads(x) for x in (path / "quarantine.jsonl").read_text().splitlines()]
    found: list[tuple[int, tuple[str | None, str, str]]] = [
        (q["line"], (q["id"], "quarantined", q["reason"])) for q in quarantine
    ]
    for split, rows in ds.items():
        for row in rows:
            line_of = {p["id"]: p["line"] for p in row["clean_meta"]["provenance"]}
            for qa in row["qa"]:
                if split.endswith("_rejected"):
                    found.append((line_of[qa["id"]], (qa["id"], "rejected", qa["reason"])))
                elif split.endswith("_RS_think"):
                    found.append((line_of[qa["id"]], (qa["id"], "accepted", qa["promoted_by"])))
    counts = Counter(line for line, _ in found)
    assert [line for line, n in counts.items() if n > 1] == [], "an item is in two places"
    return dict(found)


def test_every_item_ends_where_expected(export: tuple[str, Path], scenario: Scenario) -> None:
    _, path = export
    assert _places(path) == scenario.expected


def test_report_adds_up(export: tuple[str, Path], scenario: Scenario) -> None:
    _, path = export
    report = json.loads((path / "run_report.json").read_text())
    assert report["adds_up"] is True
    assert report["lines"] == len(scenario.lines)
    for counts in report["families"].values():
        assert counts["in"] == counts["accepted"] + counts["rejected"] + counts["quarantined"]
    expected_by_place = Counter(place for _, place, _ in scenario.expected.values())
    assert sum(f["accepted"] for f in report["families"].values()) == expected_by_place["accepted"]
    assert (
        sum(f["quarantined"] for f in report["families"].values())
        == (expected_by_place["quarantined"])
    )
    words = report["families"]["SynthWords"]
    assert words["promoted_by_judge"] == 1
    # The judge's "Final verdict: CORRECT, probably" is no verdict: judge_failed, not UNSURE.
    assert words["rejected_by_reason"] == {"judge_unsure": 1, "judge_failed": 1, "wrong_answer": 1}


def test_rows_answers_and_think_split(export: tuple[str, Path]) -> None:
    _, path = export
    ds = datasets.load_dataset(str(path))
    assert set(ds) == {
        "SynthWords_RS_think",
        "SynthWords_RS_nothink",
        "SynthWords_rejected",
        "SynthAmounts_RS_think",
        "SynthAmounts_RS_nothink",
        "SynthAmounts_rejected",
    }
    think = {qa["id"]: (row, qa) for row in ds["SynthWords_RS_think"] for qa in row["qa"]}
    row, qa = think["w-ok"]
    assert [q["id"] for q in row["qa"]] == ["w-ok", "w-ok-2"], "one row per image"
    assert qa["answer"] == "HELLO" and qa["org_answer"] == "hello"
    assert qa["reasoning"] == "I read H E L L O."
    assert qa["verification"]["protocol"] == "alnum"
    ok2 = think["w-ok-2"][1]
    assert ok2["verification"]["variant"] == "first_line"
    # The training target is the line that passed; the explanation stays in full_answer.
    assert ok2["answer"] == "Hello." and ok2["full_answer"] == "Hello.\nIt is a greeting."
    vqa = think["w-vqa"][1]
    assert vqa["org_answer"] == "world" and vqa["references"].count("Word") == 4
    assert len(vqa["references"]) == 10 and vqa["protocol"] == "vqa"
    assert think["w-promoted"][1]["judge"]["verdict"] == "CORRECT"
    assert row["image"].size == (160, 48)
    nothink = [qa for r in ds["SynthWords_RS_nothink"] for qa in r["qa"]]
    assert {q["id"] for q in nothink} == set(think) and all(q["reasoning"] is None for q in nothink)
    rejected = {qa["id"]: qa for r in ds["SynthWords_rejected"] for qa in r["qa"]}
    assert rejected["w-wrong"]["answer"] == "WORLD" and rejected["w-wrong"]["wrong_vlm"] == "WORD"
    assert rejected["w-garbled"]["judge"]["cause"] == "judge_unparsable"
    truncated = ds["SynthAmounts_rejected"][0]["qa"][0]
    assert truncated["reason"] == "truncated_reasoning" and truncated["answer"] == "11850"


def test_the_export_rechecks_from_its_files_alone(export: tuple[str, Path]) -> None:
    """`rsieve recheck DIR` on the exported folder, no stack: every decision agrees; a
    copy with one tampered decision is reported (exit 1)."""
    import shutil
    import subprocess
    import sys

    import pyarrow as pa
    import pyarrow.parquet as pq

    _, path = export

    def recheck(folder: Path) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "rsieve_cli.app", "recheck", str(folder), "--json"],
            capture_output=True,
            text=True,
            timeout=120,
            env={"PATH": "/usr/bin:/bin", "RSIEVE_STACK_DIR": str(folder / "no-stack")},
        )

    done = recheck(path)
    assert done.returncode == 0, done.stderr[-2000:]
    summary = json.loads(done.stdout)
    assert summary["agreement"] == 1.0 and summary["decisions"] >= 8
    spec = json.loads((path / "run_spec.json").read_text())
    assert set(spec["settings"]) == DECIDING and spec["settings"]["generator_model"] == "replay"
    assert spec["models"]["generator"]["replay"]["interfaces"]
    assert summary["differences"] == [] and summary["hold_back_checked"] >= 1

    tampered = path.parent / "tampered"
    shutil.copytree(path, tampered)
    (shard,) = sorted((tampered / "data").glob("SynthWords_RS_think-*.parquet"))
    rows = pq.read_table(shard).to_pylist()
    rows[0]["qa"][0]["verification"]["accepted"] = False
    pq.write_table(pa.Table.from_pylist(rows, schema=pq.read_schema(shard)), shard)
    done = recheck(tampered)
    assert done.returncode == 1
    (diff,) = json.loads(done.stdout)["differences"]
    assert diff["check"] == "decision" and diff["id"] == rows[0]["qa"][0]["id"]


def test_second_submission_reuses_the_run(
    stack: Stack, scenario: Scenario, export: tuple[str, Path], tmp_path: Path
) -> None:
    run, first = export
    run_again, second = _run(stack, scenario, tmp_path)
    assert run_again == run
    a, b = datasets.load_dataset(str(first)), datasets.load_dataset(str(second))
    for split in a:
        assert a[split]["image_sha256"] == b[split]["image_sha256"]
        assert a[split]["qa"] == b[split]["qa"]
