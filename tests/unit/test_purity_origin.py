"""Task purity decided by origin first (the card's case: an image-matched slice pulled
general-VQA items into benchmark families), then by a family's one exact question; the
per-rule figures in cleaning.json and the card; a purity rule for every assessed line.
The pools go through the ingest rounds in process (rsieve.clean.ingestion.ingest_in_process),
the one implementation of the whole-pool decisions."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import pytest

from rsieve.clean.cleaning import line_image_path, render_cleaning
from rsieve.clean.ingestion import ingest_in_process, range_lines
from rsieve.clean.provenance import verify_source
from rsieve.clean.purity import (
    PURITY_RULES,
    PurityQuestion,
    benchmark_origins,
    measure_purity,
    origin_of,
    origins_for,
)
from rsieve.run.shards import ShardInput
from rsieve.schemas import ImageRef

TEXTVQA = [
    "what brand is this camera?",
    "what number is on the jersey?",
    "what does the sign say?",
    "what is the title of the book?",
    "what colour is the sign?",  # genuine TextVQA: its origin keeps it
    "what time does the clock show?",
]
GENERAL_VQA = [
    "What colour is the car?",
    "How many people are in the picture?",
    "Is this photo taken indoors?",
    "What is the man doing?",
    "What is written on the sign?",  # on-task in form, another dataset in origin
    "Where was this photo taken?",
]
WRITTEN = "What is written in the image?"
NEAR_TASK = "Is the text handwritten or printed?"


def _sha(image: str) -> str:
    return hashlib.sha256(image.encode()).hexdigest()


def _rec(n: int, family: str, image: str, question: str, dataset: str | None) -> dict[str, Any]:
    source: dict[str, Any] = {"sha256": _sha(image)}
    if dataset is not None:
        source["dataset"] = dataset
    return {
        "id": f"i{n}",
        "family": family,
        "image": image,
        "question": question,
        "answer": "a",
        "source": source,
    }


class Assessed(NamedTuple):
    """A pool ingested in process, by line: the whole-pool verdicts (reason, detail), the
    purity rules, cleaning.json and the clean stage's inputs."""

    verdicts: dict[int, tuple[str, str]]
    rules: dict[int, str]
    report: dict[str, Any]
    inputs: list[ShardInput]


def ingest_pool(
    data: bytes,
    *,
    image_sha256: Callable[[str], str] = _sha,
    refused: Mapping[str, str | Mapping[str, str]] | None = None,
    shard_size: int = 16,
    purity_threshold: float = 0.05,
    purity_min_items: int = 20,
    purity_origins: Mapping[str, Sequence[str]] | None = None,
) -> Assessed:
    """items.jsonl through the ingest rounds in process: every image a line names is in
    the pack index (`image_sha256(path)`) but those the upload refused; provenance is the
    strict policy without resolvers."""
    refused = refused or {}
    paths = {p for pl, _ in range_lines(data, 1) if (p := line_image_path(pl))}
    refs = {
        p: ImageRef(pack="_packs/0.pack", offset=0, length=1, sha256=image_sha256(p))
        for p in sorted(paths - set(refused))
    }
    got = ingest_in_process(
        "run",
        data,
        refs,
        shard_size=shard_size,
        refused=refused,
        provenance=lambda source, sha: verify_source(source, sha, "strict", None),
        provenance_policy="strict",
        text_max_chars=1000,
        purity_threshold=purity_threshold,
        purity_min_items=purity_min_items,
        purity_origins=purity_origins,
        embed=None,
        screen=None,
    )
    lines = [pl for shard in got.inputs for pl in shard.lines]
    return Assessed(
        verdicts={pl.line: pl.verdict for pl in lines if pl.verdict is not None},
        rules={pl.line: pl.purity for pl in lines if pl.purity is not None},
        report=got.report,
        inputs=got.inputs,
    )


def _assess(recs: list[dict[str, Any]], **kw: Any) -> Assessed:
    data = "\n".join(json.dumps(r) for r in recs).encode() + b"\n"
    return ingest_pool(data, **kw)


def _card_pool() -> tuple[list[dict[str, Any]], list[int], list[int]]:
    """TextVQA items (source dataset textvqa) and, on the same images, VQAv2 items
    (source dataset vqav2) mixed into the family, as the card describes; a VQAv2 family of
    its own without origins. Returns the records, the genuine lines and the foreign ones."""
    recs: list[dict[str, Any]] = []
    genuine, foreign = [], []
    for k in range(30):
        image = f"tv/{k}.jpg"
        recs.append(_rec(len(recs) + 1, "TextVQA", image, TEXTVQA[k % 6], "textvqa"))
        genuine.append(len(recs))
        if k < 12:  # the image-matched general-VQA slice, interleaved
            recs.append(_rec(len(recs) + 1, "TextVQA", image, GENERAL_VQA[k % 6], "VQAv2 "))
            foreign.append(len(recs))
    for k in range(3):
        recs.append(_rec(len(recs) + 1, "VQAv2", f"v/{k}.jpg", GENERAL_VQA[k], None))
    return recs, genuine, foreign


def test_card_case_foreign_origin_is_off_task_and_no_genuine_item_dropped() -> None:
    recs, genuine, foreign = _card_pool()
    got = _assess(recs)
    off = {line for line, (reason, _) in got.verdicts.items() if reason == "off_task"}
    assert off == set(foreign) and not set(genuine) & set(got.verdicts)
    assert all(got.rules[line] == "origin_off" for line in foreign)
    assert all(got.rules[line] == "origin_on" for line in genuine)
    detail = got.verdicts[foreign[0]][1]
    assert "'vqav2'" in detail and "textvqa; dominant" in detail and detail.endswith("origin_off")
    # every assessed line has a rule, a documented one; the VQAv2 family is not measured
    assert set(got.rules) == set(range(1, len(recs) + 1))
    assert set(got.rules.values()) <= set(PURITY_RULES)
    assert [got.rules[n] for n in (43, 44, 45)] == ["unmeasured"] * 3
    p = got.report["families"]["TextVQA"]["purity"]
    assert p["by_rule"] == {"origin_off": 12, "origin_on": 30}
    assert (p["off_task"], p["kept"], p["dropped"], p["measured"]) == (12, 30, 12, False)
    assert p["origin"] == {
        "by": "dominant",
        "benchmark": ["textvqa"],
        "with_origin": 42,
        "distinct": 2,
        "top": {"textvqa": 30, "vqav2": 12},
    }
    assert p["examples"][0] == {
        "line": 2,
        "question": GENERAL_VQA[0],
        "rule": "origin_off",
        "origin": "vqav2",
    }
    assert got.report["families"]["VQAv2"]["purity"]["by_rule"] == {"unmeasured": 3}
    text = "\n".join(render_cleaning(got.report))
    assert "| TextVQA | 42 | 12 | 28.6% | 5% | 30 | 12 | textvqa (dominant) | " in text
    assert "origin_off 12, origin_on 30 |" in text
    assert "| VQAv2 | 3 | 0 | not measured | 5% | 3 | 0 | - | unmeasured 3 |" in text
    # JSON-serialisable and deterministic
    assert json.loads(json.dumps(got.report)) == got.report
    assert json.dumps(_assess(recs).report) == json.dumps(got.report)
    assert _assess(recs).rules == got.rules


def test_origin_protects_a_genuine_item_the_form_rules_would_drop() -> None:
    """IIIT5K (text recognition): a genuine "what colour is the text?" is template_off by
    form; its origin keeps it, while the foreign items go whatever they ask."""
    qs = [PurityQuestion(n, "Read the word.", origin="iiit5k") for n in range(1, 25)]
    qs.append(PurityQuestion(25, "What colour is the text?", origin="iiit5k"))
    qs += [PurityQuestion(26 + i, "Read the sign.", origin="vqav2") for i in range(3)]
    got = measure_purity("IIIT5K", "alnum", qs, threshold=0.05, min_items=20, embed=None)
    assert got.rule_of_line[25] == "origin_on" and 25 not in got.dropped_lines
    assert got.dropped_lines == [26, 27, 28]
    assert got.by_rule == {"origin_off": 3, "origin_on": 25}


def test_the_setting_overrides_the_dominant_origin() -> None:
    # the general-VQA slice outnumbers the benchmark: dominance would keep the wrong items
    qs = [PurityQuestion(n, TEXTVQA[n % 6], origin="textvqa") for n in range(1, 11)]
    qs += [PurityQuestion(n, GENERAL_VQA[n % 6], origin="vqav2") for n in range(11, 31)]
    dominant = measure_purity("TextVQA", "vqa", qs, threshold=0.05, min_items=20, embed=None)
    assert dominant.benchmark_origins == ["vqav2"] and dominant.dropped_lines == list(range(1, 11))
    accepted = origins_for("TextVQA", {"textvqa": [" TextVQA "], "Other": ["x"]})
    assert accepted == ["textvqa"]  # family matched with case folded, names normalised
    got = measure_purity(
        "TextVQA", "vqa", qs, threshold=0.05, min_items=20, embed=None, origins=accepted
    )
    assert (got.origin_by, got.benchmark_origins) == ("setting", ["textvqa"])
    assert got.dropped_lines == list(range(11, 31))
    assert got.by_rule == {"origin_off": 20, "origin_on": 10}
    # a family accepting two benchmarks keeps both; a third dataset still goes
    two = [PurityQuestion(n, "What is it?", origin="st-vqa") for n in range(31, 36)]
    got = measure_purity(
        "TextVQA",
        "vqa",
        qs + two,
        threshold=0.05,
        min_items=20,
        embed=None,
        origins=origins_for("TextVQA", {"TextVQA": ["textvqa", "ST-VQA"]}),
    )
    assert got.dropped_lines == list(range(11, 31))


def test_the_setting_reaches_the_ingest_and_the_report() -> None:
    recs, genuine, _foreign = _card_pool()
    got = _assess(recs, purity_origins={"TextVQA": ["VQAv2"]})
    assert {ln for ln, (r, _) in got.verdicts.items() if r == "off_task"} == set(genuine)
    assert got.report["policy"]["purity_origins"] == {"TextVQA": ["vqav2"]}
    assert got.report["families"]["TextVQA"]["purity"]["origin"]["by"] == "setting"
    assert "| vqav2 (setting) |" in "\n".join(render_cleaning(got.report))


@pytest.mark.parametrize(
    ("source", "origin"),
    [
        ({"dataset": " TextVQA ", "row": 3}, "textvqa"),
        ({"dataset": "lmms-lab/TextVQA", "split": "train"}, "lmms-lab/textvqa"),
        ("textvqa", "textvqa"),  # a bare dataset name
        ({"dataset": "data/train-00000-of-00002.parquet", "row": 0}, None),  # read_pool's file
        ({"dataset": "s3://bucket/textvqa"}, None),
        ({"dataset": "/data/textvqa"}, None),
        ("https://huggingface.co/datasets/textvqa", None),
        ("/pools/a/img.png", None),
        ("a photo of a sign", None),  # free text is no dataset name
        (hashlib.sha256(b"x").hexdigest(), None),
        ({"sha256": hashlib.sha256(b"x").hexdigest()}, None),
        ({"dataset": 3}, None),
        (None, None),
    ],
)
def test_origin_of(source: Any, origin: str | None) -> None:
    assert origin_of(source) == origin


def test_items_without_origin_fall_back_to_the_form_rules() -> None:
    qs = [PurityQuestion(n, "Read the word.", origin="iiit5k") for n in range(1, 25)]
    qs += [PurityQuestion(n, "Read the sign.", origin="vqav2") for n in range(25, 31)]
    qs += [PurityQuestion(n, "Transcribe the word.") for n in range(31, 34)]
    qs += [PurityQuestion(n, "What colour is the car?") for n in range(34, 37)]
    got = measure_purity("IIIT5K", "alnum", qs, threshold=0.05, min_items=20, embed=None)
    assert [got.rule_of_line[n] for n in (31, 34)] == ["template_on", "template_off"]
    assert got.by_rule == {
        "origin_off": 6,
        "origin_on": 24,
        "template_off": 3,
        "template_on": 3,
    }
    assert got.exceeded and got.dropped_lines == [*list(range(25, 31)), 34, 35, 36]
    # under the threshold the form rules only measure; origin still drops
    got = measure_purity("IIIT5K", "alnum", qs, threshold=0.5, min_items=20, embed=None)
    assert not got.exceeded and got.dropped_lines == list(range(25, 31))


def test_origin_decides_nothing_without_a_dominant_origin() -> None:
    # one origin only (a collection's name): nothing to tell apart
    qs = [PurityQuestion(n, "Read the word.", origin="infinitymm") for n in range(1, 25)]
    qs += [PurityQuestion(n, "What colour is the car?", origin="infinitymm") for n in (25, 26)]
    got = measure_purity("IIIT5K", "alnum", qs, threshold=0.05, min_items=20, embed=None)
    assert got.origin_by is None and got.by_rule == {"template_off": 2, "template_on": 24}
    assert got.dropped_lines == [25, 26]  # by the form rules: share 7.7% > 5%
    # no clear majority (50% is not more than half)
    assert benchmark_origins(["a", "a", "b", "b"]) == ([], None)
    assert benchmark_origins(["a", "a", "a", "b"]) == (["a"], "dominant")
    # a few items with an origin among many without prove nothing
    assert benchmark_origins(["a", "a", "b", None, None, None, None]) == ([], None)
    assert benchmark_origins(["a", "a", "b", None, None, None]) == (["a"], "dominant")


def test_one_exact_question_catches_the_near_task_question() -> None:
    qs = [PurityQuestion(n, WRITTEN) for n in range(1, 31)]
    qs.append(PurityQuestion(31, NEAR_TASK))
    qs.append(PurityQuestion(32, "What word is shown?"))  # a benchmark form of the task
    got = measure_purity("SynthWords", "alnum", qs, threshold=0.05, min_items=20, embed=None)
    assert got.single_template == WRITTEN
    assert got.rule_of_line[31] == "single_template_off"
    assert got.rule_of_line[32] == "template_on"
    assert got.by_rule == {"dominant_form": 30, "single_template_off": 1, "template_on": 1}
    # dropped although the share (3.1%) is under the threshold
    assert not got.exceeded and got.dropped_lines == [31]
    assert got.summary()["kept"] == 31 and got.summary()["single_template"] == WRITTEN
    # fewer than min_items ask it: no single template, the near-task question stays open
    small = measure_purity(
        "SynthWords", "alnum", qs[-12:], threshold=0.05, min_items=20, embed=None
    )
    assert small.single_template is None and small.rule_of_line[31] == "unsettled"
    assert small.dropped_lines == []


def test_both_rules_in_one_family_and_their_counts_in_the_report() -> None:
    recs = [_rec(n, "IIIT5K", f"w/{n}.png", WRITTEN, "iiit5k") for n in range(1, 25)]
    recs += [_rec(n, "IIIT5K", f"w/{n - 24}.png", GENERAL_VQA[n % 6], "vqav2") for n in (25, 26)]
    recs += [_rec(27, "IIIT5K", "w/27.png", NEAR_TASK, None)]
    got = _assess(recs)
    assert got.rules[27] == "single_template_off"
    assert got.verdicts[27] == (
        "off_task",
        "the family asks one question ('What is written in the image?'), this item "
        "another; single_template_off",
    )
    assert sorted(got.verdicts) == [25, 26, 27]
    p = got.report["families"]["IIIT5K"]["purity"]
    assert p["by_rule"] == {"origin_off": 2, "origin_on": 24, "single_template_off": 1}
    assert p["single_template"] == WRITTEN and p["dropped"] == 3
    text = "\n".join(render_cleaning(got.report))
    assert "| iiit5k (dominant) | origin_off 2, origin_on 24, single_template_off 1 |" in text
