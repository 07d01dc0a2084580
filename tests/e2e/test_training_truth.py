"""Training acceptance on the real stack (Redis, SeaweedFS, Triton, the workers): the
generator and the judge are a crafted OpenAI-compatible server (tests/e2e/crafted_server.py)
that answers what each item needs. DocVQA (ANLS) and ChartQA (relaxed accuracy) answers
that the benchmark passes but are wrong ("Jane Smith" for "John Smith", a swapped date,
"105" for "100", "2015" for "2020") reach the judge as `near_miss` and never a training
split: the judge says WRONG to three, CORRECT to one, which calibration holds back.

The same server and stack then run the trace gate (rsieve.compact.traces) on a second pool:
answers the protocol accepts, with a sound trace, a looping one, one that switches to
Chinese, one that concludes another answer and one that says it guesses. Only the sound
one reaches `_RS_think`; every one keeps its answer in `_RS_nothink`.

A third pool runs with the blind pass (`blind_pass`, policy `nothink`): the server answers
one question right without its image, another not, and a third wrong with it. Only the
two accepted items are asked again, each once and without an image; the one answered
right blind is flagged `answerable_without_image` and kept out of `_RS_think`."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import datasets
import pytest

from rsieve.adapters.exports import export_dataset
from rsieve.adapters.pools import upload_pool
from rsieve.adapters.storage import S3Store
from rsieve.judge.calibration import CalibrationShard, calibration_key
from rsieve.judge.probes import NEAR_MISS_KINDS
from rsieve.schemas import ShardOutput
from rsieve_cli.client import submit, wait_for_run
from rsieve_cli.local.stack import Stack
from tests.conftest import stack_settings
from tests.e2e.cli import run_cli
from tests.e2e.crafted_server import CraftedServer
from tests.e2e.scenario import Scenario

GENERATOR, JUDGE = "crafted-vlm", "crafted-judge"
# id, family, question, reference, the generator's answer, place, reason or promoted_by
ITEMS = [
    ("d-name", "DocVQA", "Who signed the letter?", "John Smith", "Jane Smith"),
    ("d-date", "DocVQA", "When was the letter dated?", "2021-03-04", "2012-03-04"),
    ("d-exact", "DocVQA", "What is the company name?", "Acme Corporation", "ACME  corporation"),
    ("c-105", "ChartQA", "What is the value of the blue bar?", "100", "105"),
    ("c-year", "ChartQA", "In which year did sales peak?", "2020", "2015"),
    ("c-exact", "ChartQA", "What is the value of the red bar?", "10.5", "10.50"),
]
NEAR_MISSES = {"d-name", "d-date", "c-105", "c-year"}
# The judge calls one near miss CORRECT; everything else (the probes too) WRONG.
JUDGED_CORRECT = "c-105"

# id, question, reference (= the answer), the trace, the check it fails (None: sound)
TRACES = [
    (
        "t-sound",
        "What is the title of the form?",
        "INVOICE",
        "The header at the top of the form reads INVOICE in bold capitals. "
        "So the answer is INVOICE.",
        None,
    ),
    (
        "t-loop",
        "What is printed in the header?",
        "RECEIPT",
        # Near-repeats (the pass number changes): not the exact loop the generator cuts
        # while it streams (rsieve.generate.loops), but one span over most of the trace,
        # which the trace gate's repetition check catches.
        "The header holds one word. "
        + "".join(f"Wait, let me check the header again, pass {k}. " for k in range(40))
        + "It is RECEIPT.",
        "repetition",
    ),
    (
        "t-mixed",
        "What does the stamp say?",
        "PAID",
        "The stamp in the corner is red. 印章上写着已付款。 So the answer is PAID.",
        "language_mixing",
    ),
    (
        "t-contra",
        "What is the word on the shop sign?",
        "STOP",
        "The sign looks like it says SHOP. So the answer is SHOP.",
        "inconsistent",
    ),
    (
        "t-guess",
        "What is the name on the badge?",
        "ALICE",
        "I cannot see the image clearly, so this is my best guess: ALICE.",
        "guessing",
    ),
]

# id, question, reference, the answer with the image, the answer without it (None: never
# asked blind), whether it is answerable without the image
BLIND = [
    ("b-shortcut", "What colour is the stop sign?", "red", "red", "red", True),
    ("b-needs", "What is the serial number on the plate?", "X7-42", "X7-42", "unknown", False),
    ("b-wrong", "What is the code on the ticket?", "A1", "B2", None, None),
]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CraftedServer]:
    question = {i: q for i, _, q, _, _ in ITEMS}
    rules = {
        GENERATOR: {
            "rules": [[q, f"<think>I read the image.</think>{a}"] for _, _, q, _, a in ITEMS]
            + [[q, f"<think>{trace}</think>{a}"] for _, q, a, trace, _ in TRACES]
            + [[q, f"<think>I read the image.</think>{a}"] for _, q, _, a, _, _ in BLIND],
            "blind_rules": [
                [q, f"<think>There is no image; I answer from the question.</think>{b}"]
                for _, q, _, _, b, _ in BLIND
                if b is not None
            ],
            "default": "<think>?</think>unreadable",
        },
        JUDGE: {
            "rules": [[question[JUDGED_CORRECT], "The value matches.\nCORRECT"]],
            "default": "It differs from the reference.\nWRONG",
        },
    }
    with CraftedServer.serving(tmp_path_factory.mktemp("crafted"), rules) as srv:
        yield srv


@pytest.fixture(scope="module")
def stack(start_stack: Callable[..., Stack], server: CraftedServer) -> Stack:
    return start_stack(
        ["judge-abstain"],  # loaded, unused: both roles are on the crafted server
        settings_env={
            "RSIEVE_MODEL_INTERFACE": "openai",
            "RSIEVE_JUDGE_INTERFACE": "openai",
            "RSIEVE_GENERATOR_OPENAI_URL": server.url,
            "RSIEVE_GENERATOR_MODEL": GENERATOR,
            "RSIEVE_JUDGE_MODEL": JUDGE,
            "RSIEVE_JUDGE_CALIBRATION_SIZE": "2",
            "RSIEVE_JUDGE_CALIBRATION_STOP": "sample",  # every near miss asked (none decides)
            "RSIEVE_MODEL_RETRIES": "0",
        },
    )


def _run_pool(
    stack: Stack,
    tmp_path_factory: pytest.TempPathFactory,
    dataset: str,
    items: list[tuple[str, str, str, str]],
    sampling: dict[str, Any] | None = None,
) -> tuple[str, Path]:
    """A pool of `items` (id, family, question, reference), each on an image of its own,
    submitted as `dataset`; its run id and export."""
    folder = tmp_path_factory.mktemp("pool") / dataset
    folder.mkdir()
    s = Scenario(folder)
    for item_id, family, question, reference in items:
        data = s.image(f"{item_id}.png", item_id.upper())
        s.item(
            item_id,
            family,
            f"{item_id}.png",
            data,
            answer=reference,
            output=None,
            expect=("-", "-"),
            question=question,
        )
    s.write()
    settings = stack_settings(stack)
    store = S3Store(settings)
    run = submit(settings, upload_pool(store, folder), dataset, sampling=sampling)
    wait_for_run(settings, run, timeout=300)
    return run, export_dataset(store, dataset, tmp_path_factory.mktemp("out"))


@pytest.fixture(scope="module")
def run(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    items = [(i, family, q, ref) for i, family, q, ref, _ in ITEMS]
    return _run_pool(stack, tmp_path_factory, "truth", items)


@pytest.fixture(scope="module")
def trace_run(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> Path:
    items = [(i, "DocVQA", q, ref) for i, q, ref, _, _ in TRACES]
    return _run_pool(stack, tmp_path_factory, "traces", items)[1]


@pytest.fixture(scope="module")
def blind_run(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> Path:
    items = [(i, "DocVQA", q, ref) for i, q, ref, *_ in BLIND]
    sampling = {"blind_pass": True, "blind_policy": "nothink"}
    return _run_pool(stack, tmp_path_factory, "blind", items, sampling)[1]


def _outputs(stack: Stack, run: str, stage: str) -> list[ShardOutput]:
    store = S3Store(stack_settings(stack))
    return [
        ShardOutput.model_validate_json(store.get(k)) for k in store.list(f"runs/{run}/{stage}/")
    ]


def test_near_misses_reach_the_judge_and_no_training_split(
    stack: Stack, server: CraftedServer, run: tuple[str, Path]
) -> None:
    run_id, path = run
    verified = {
        o.generation.item.id: o for out in _outputs(stack, run_id, "verify") for o in out.verified
    }
    assert set(verified) == {i[0] for i in ITEMS}
    for item_id, o in verified.items():
        assert o.decision is not None and o.decision.accepted, item_id  # the benchmark passes all
        assert o.decision.training is not None
        if item_id in NEAR_MISSES:
            assert (o.place, o.reason, o.decision.training.accepted) == (
                "rejected",
                "near_miss",
                False,
            )
            assert o.decision.near_miss
            # ANLS credits a near miss with part of a point; relaxed accuracy with all of it.
            assert (o.decision.score < 1.0) == (o.generation.item.family == "DocVQA")
        else:
            assert (o.place, o.promoted_by, o.decision.training.accepted) == (
                "accepted",
                "verifier",
                True,
            )
    # Every near miss, and nothing else of the pool, was put to the judge (beside the
    # calibration probes): the server received each verdict's prompt.
    judged = {
        o.generation.item.id: o for out in _outputs(stack, run_id, "judge") for o in out.outcomes
    }
    assert {i for i, o in judged.items() if o.verdict is not None} == NEAR_MISSES
    asked = {r["user"] for r in server.requests(JUDGE)}
    for item_id in NEAR_MISSES:
        o = judged[item_id]
        assert o.verdict is not None and o.place == "rejected" and o.reason == "near_miss"
        assert o.verdict.prompt in asked
        assert o.verdict.verdict == ("CORRECT" if item_id == JUDGED_CORRECT else "WRONG")
    # The export: no near miss in a training split; each in its family's rejected split
    # with both numbers recorded.
    ds = datasets.load_dataset(str(path))
    placed = {
        qa["id"]: (split, qa) for split, rows in ds.items() for row in rows for qa in row["qa"]
    }
    for item_id, family, _, reference, answer in ITEMS:
        split, qa = placed[item_id]
        v = qa["verification"]
        if item_id in NEAR_MISSES:
            assert split == f"{family}_rejected" and qa["reason"] == "near_miss"
            assert (qa["answer"], qa["wrong_vlm"]) == (reference, answer)
            assert v["accepted"] is True and v["training_accepted"] is False
            assert (
                v["training_rule"]
                == {"DocVQA": "anls_exact", "ChartQA": "relaxed_precision"}[family]
            )
        else:
            assert split.startswith(f"{family}_RS_") and qa["promoted_by"] == "verifier"
            assert v["training_accepted"] is True and json.loads(v["training_constants"])
    # The run report and the card count the near misses per family.
    report = json.loads((path / "run_report.json").read_text())
    assert report["adds_up"]
    fams = report["families"]
    assert (fams["DocVQA"]["near_misses"], fams["ChartQA"]["near_misses"]) == (2, 2)
    assert fams["DocVQA"]["near_misses_promoted"] == fams["ChartQA"]["near_misses_promoted"] == 0
    assert fams["ChartQA"]["rejected_by_reason"] == {"near_miss": 2}
    card = (path / "README.md").read_text()
    assert "## Training acceptance" in card
    assert "| `anls` | `anls_exact` |" in card and "| `relaxed` | `relaxed_precision` |" in card
    assert "| DocVQA | 2 | 0 |" in card and "Jane Smith" in card
    # `rsieve recheck` recomputes both numbers from the published files alone.
    rechecked = run_cli(stack, "recheck", str(path), "--json")
    assert rechecked.returncode == 0, rechecked.stdout[-3000:] + rechecked.stderr[-2000:]
    summary = json.loads(rechecked.stdout)
    # One decision per qa entry: an accepted item has two, in _RS_think and _RS_nothink.
    entries = len(NEAR_MISSES) + 2 * (len(ITEMS) - len(NEAR_MISSES))
    assert summary["agreement"] == 1.0 and summary["decisions"] == entries, summary


def test_calibration_probes_the_protocols_near_misses(stack: Stack, run: tuple[str, Path]) -> None:
    run_id, _ = run
    store = S3Store(stack_settings(stack))
    shards = json.loads(store.get(f"runs/{run_id}/shards.json"))["shards"]
    records = [
        r
        for shard in shards
        for r in CalibrationShard.model_validate_json(
            store.get(calibration_key(run_id, shard))
        ).records
    ]
    kinds = {(r.probe.family, r.probe.kind): r.probe.candidate for r in records}
    assert ("DocVQA", "letter_changed") in kinds
    assert kinds.get(("ChartQA", "number_off")) == "10.8"
    near = [r for r in records if r.probe.kind in NEAR_MISS_KINDS]
    assert near and all(r.probe.expected == "WRONG" and r.verdict == "WRONG" for r in near)


def test_the_trace_gate_keeps_unfit_reasoning_out_of_think(stack: Stack, trace_run: Path) -> None:
    ds = datasets.load_dataset(str(trace_run))
    assert set(ds) == {"DocVQA_RS_think", "DocVQA_RS_nothink"}
    think = {qa["id"]: qa for row in ds["DocVQA_RS_think"] for qa in row["qa"]}
    nothink = {qa["id"]: qa for row in ds["DocVQA_RS_nothink"] for qa in row["qa"]}
    assert set(think) == {"t-sound"}
    assert set(nothink) == {t[0] for t in TRACES}  # every answer kept for training
    assert think["t-sound"]["reasoning"] == TRACES[0][3]
    for item_id, _, reference, _, check in TRACES:
        qa = nothink[item_id]
        assert qa["answer"] == reference and qa["promoted_by"] == "verifier"
        assert qa["trace_checks"]["length"] is None  # five traces: no family band
        failed = {c for c, passed in qa["trace_checks"].items() if passed is False}
        assert failed == ({check} if check else set()), (item_id, qa["trace_reasons"])
        assert [r.split(":")[0] for r in qa["trace_reasons"]] == ([check] if check else [])
    report = json.loads((trace_run / "run_report.json").read_text())
    assert report["adds_up"]
    docvqa = report["families"]["DocVQA"]
    assert (docvqa["accepted"], docvqa["trace_checked"], docvqa["trace_gated"]) == (5, 5, 4)
    assert docvqa["trace_failures"] == {
        "guessing": 1,
        "inconsistent": 1,
        "language_mixing": 1,
        "repetition": 1,
    }
    assert {e["check"]: e["id"] for e in docvqa["trace_examples"]} == {
        check: item_id for item_id, _, _, _, check in TRACES if check
    }
    gate = report["trace_gate"]
    assert gate["constants"]["repetition_span"] == 8 and gate["length_bands"] == {}
    card = (trace_run / "README.md").read_text()
    assert "## Trace gate" in card
    assert "| DocVQA | 5 | 4 | 1 | 1 | 1 | 1 | 0 |" in card
    assert "Wait, let me check the header again, pass 1." in card  # the repetition excerpt
    # `rsieve recheck` checks the think split's reasoning again from the published files.
    rechecked = run_cli(stack, "recheck", str(trace_run), "--json")
    assert rechecked.returncode == 0, rechecked.stdout[-3000:] + rechecked.stderr[-2000:]
    summary = json.loads(rechecked.stdout)
    assert summary["agreement"] == 1.0 and summary["traces_checked"] == 1, summary
    assert summary["differences"] == []


def test_the_blind_pass_asks_accepted_items_without_their_image(
    stack: Stack, server: CraftedServer, blind_run: Path
) -> None:
    # The server saw one request without an image for each accepted item, and none for
    # the rejected one, each with the user text the item was asked with, byte for byte.
    questions = {q: i for i, q, *_ in BLIND}
    asked = [r for r in server.requests(GENERATOR) if r["user"].split("\n")[0] in questions]
    seeing = {questions[r["user"].split("\n")[0]]: r["user"] for r in asked if r["image"]}
    blind = [(questions[r["user"].split("\n")[0]], r["user"]) for r in asked if not r["image"]]
    assert sorted(seeing) == sorted(questions.values())
    assert sorted(blind) == sorted((i, seeing[i]) for i in ("b-needs", "b-shortcut"))
    ds = datasets.load_dataset(str(blind_run))
    entries = {
        split: {qa["id"]: qa for row in rows for qa in row["qa"]} for split, rows in ds.items()
    }
    # Policy nothink: the item answerable without its image is in _RS_nothink only.
    assert set(entries["DocVQA_RS_think"]) == {"b-needs"}
    assert set(entries["DocVQA_RS_nothink"]) == {"b-shortcut", "b-needs"}
    assert set(entries["DocVQA_rejected"]) == {"b-wrong"}
    for item_id, *_, answerable in BLIND:
        for split in entries.values():
            if item_id in split:
                assert split[item_id]["answerable_without_image"] is answerable, item_id
    report = json.loads((blind_run / "run_report.json").read_text())
    assert report["adds_up"]
    docvqa = report["families"]["DocVQA"]
    assert (docvqa["accepted"], docvqa["rejected"]) == (2, 1)
    assert (docvqa["blind_asked"], docvqa["blind_answerable"], docvqa["blind_failed"]) == (2, 1, 0)
    assert [e["id"] for e in docvqa["blind_examples"]] == ["b-shortcut"]
    # The blind requests count with the generator's: three items asked, two again blind.
    assert report["tokens"]["total"]["generator"]["calls"] == 5
    card = (blind_run / "README.md").read_text()
    assert "## Blind pass" in card and "Policy `nothink`" in card
    # 1 of 2, with its 95% Wilson interval.
    assert "| DocVQA | 2 | 1 | 50.0% (9.5%-90.5%) | 0 |" in card
    # `rsieve recheck`: the decisions agree, and no entry answerable without its image is
    # in _RS_think (the run's policy, from run_spec.json).
    rechecked = run_cli(stack, "recheck", str(blind_run), "--json")
    assert rechecked.returncode == 0, rechecked.stdout[-3000:] + rechecked.stderr[-2000:]
    summary = json.loads(rechecked.stdout)
    assert summary["agreement"] == 1.0 and summary["differences"] == [], summary
