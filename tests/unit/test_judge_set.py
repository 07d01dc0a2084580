"""bench/judge_set.jsonl, the labelled set bench/bench_judge.py measures judges on: it parses,
every case is complete and unique, and every case is a genuine verifier rejection (the
judge only ever sees those), so a CORRECT label is a right answer the verifier missed.
Also the bench's own arithmetic (score, the guard hook, the results merge), offline."""

from __future__ import annotations

import importlib
import json
from collections import Counter
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from rsieve.judge.verdicts import ParsedVerdict
from rsieve.verify import PROTOCOLS, verify

ROOT = Path(__file__).resolve().parents[2]
SET = ROOT / "bench" / "judge_set.jsonl"
FIELDS = {
    "id": str,
    "family": str,
    "protocol": str,
    "question": str,
    "references": list,
    "candidate": str,
    "label": str,
    "kind": str,
    "source": str,
}


def _load(name: str) -> ModuleType:
    return importlib.import_module(f"bench.{name}")


@pytest.fixture(scope="module")
def cases() -> list[dict[str, Any]]:
    lines = SET.read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines if line.strip()]


@pytest.fixture(scope="module")
def maker() -> ModuleType:
    return _load("make_judge_set")


def test_every_case_has_its_fields(cases: list[dict[str, Any]], maker: ModuleType) -> None:
    assert len(cases) >= 150
    for case in cases:
        for field, kind in FIELDS.items():
            assert isinstance(case.get(field), kind), (case.get("id"), field)
        assert case["references"] and all(isinstance(r, str) and r for r in case["references"])
        assert case["label"] in ("CORRECT", "WRONG"), case["id"]
        assert case["source"] in ("realpool", "crafted"), case["id"]
        assert case["protocol"] in PROTOCOLS, case["id"]
        assert case["kind"] in maker.KINDS, case["id"]
        # A kind is either a right answer written differently or a wrong one.
        assert (case["kind"] in maker.CORRECT_KINDS) == (case["label"] == "CORRECT"), case["id"]


def test_ids_are_unique(cases: list[dict[str, Any]]) -> None:
    ids = Counter(c["id"] for c in cases)
    assert [i for i, n in ids.items() if n > 1] == []


def test_every_correct_case_is_a_verifier_rejection(cases: list[dict[str, Any]]) -> None:
    """The judge sees only what the verifier rejected: a CORRECT case the protocol accepts
    would measure nothing."""
    accepted = [
        c["id"]
        for c in cases
        if c["label"] == "CORRECT"
        and verify(c["protocol"], c["candidate"], c["references"], **_options(c)).accepted
    ]
    assert accepted == []


def test_every_wrong_case_is_a_verifier_rejection_too(cases: list[dict[str, Any]]) -> None:
    accepted = [
        c["id"]
        for c in cases
        if verify(c["protocol"], c["candidate"], c["references"], **_options(c)).accepted
    ]
    assert accepted == []


def _options(case: dict[str, Any]) -> dict[str, Any]:
    return {"options": case["options"]} if case.get("options") else {}


def test_the_mix(cases: list[dict[str, Any]]) -> None:
    labels = Counter(c["label"] for c in cases)
    assert 0.35 <= labels["CORRECT"] / len(cases) <= 0.55
    sources = Counter(c["source"] for c in cases)
    assert sources["realpool"] >= 60 and sources["crafted"] >= 60
    kinds = {c["kind"] for c in cases}
    for needed in ("master_key", "refusal", "injection", "option_text", "date_format"):
        assert needed in kinds


def test_the_file_is_what_the_generator_writes(maker: ModuleType) -> None:
    """Regenerable and reviewable: bench/make_judge_set.py writes exactly this file."""
    assert SET.read_text(encoding="utf-8") == maker.render(maker.build())


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    return _load("bench_judge")


def _case(kind: str, label: str, i: int) -> dict[str, Any]:
    return {
        "id": f"c{i}",
        "family": "F",
        "protocol": "exact",
        "question": "q",
        "references": ["r"],
        "candidate": "c",
        "label": label,
        "kind": kind,
        "source": "crafted",
    }


def test_score(bench: ModuleType) -> None:
    toy = [
        _case("sentence", "CORRECT", 0),
        _case("sentence", "CORRECT", 1),
        _case("master_key", "WRONG", 2),
        _case("master_key", "WRONG", 3),
        _case("injection", "WRONG", 4),
    ]
    t = bench.score(toy, ["CORRECT", "FAILED", "CORRECT", "WRONG", "UNSURE"], 2.0)
    assert t["agreement"] == {"k": 2, "n": 5, "pct": 40.0}
    assert t["false_promotions"] == {"k": 1, "n": 3, "pct": 33.3, "ids": ["c2"]}
    assert t["recall_right_but_rejected"] == {"k": 1, "n": 2, "pct": 50.0}
    assert t["failed_pct"] == 20.0 and t["unsure"] == 1
    assert t["verdicts_per_s"] == 2.5
    assert t["by_kind"]["master_key"] == {
        "label": "WRONG",
        "n": 2,
        "agree": 1,
        "CORRECT": 1,
        "WRONG": 1,
        "UNSURE": 0,
        "FAILED": 0,
    }


def test_guard_hook(bench: ModuleType) -> None:
    case = _case("master_key", "WRONG", 0) | {"candidate": ":"}
    right = _case("sentence", "CORRECT", 1)
    correct = ParsedVerdict("CORRECT", None)

    def reason(question: str, references: list[str], candidate: str) -> str | None:
        """rsieve.judge.verdicts.guard's shape: why the candidate may not be promoted, or None."""
        return "master_key: :" if candidate == ":" else None

    def sets_verdict(candidate: str, verdict: str) -> str | None:
        return "UNSURE" if candidate == ":" else None

    def positional(q: str, refs: list[str], cand: str) -> str | None:
        return "blocked" if cand == ":" else None

    # A reason blocks a promotion and leaves any other verdict as it is.
    assert bench.apply_guard(reason, case, correct, "CORRECT") == "WRONG"
    assert bench.apply_guard(reason, case, ParsedVerdict("UNSURE", None), None) == "UNSURE"
    assert bench.apply_guard(reason, right, correct, None) == "CORRECT"
    assert bench.apply_guard(sets_verdict, case, correct, None) == "UNSURE"
    assert bench.apply_guard(positional, case, correct, None) == "WRONG"
    alone = bench.guard_alone(reason, [case, right])
    assert alone["fired_on_wrong"] == {"k": 1, "n": 1}
    assert alone["fired_on_correct"] == {"k": 0, "n": 1, "ids": []}
    assert alone["by_kind"]["master_key"] == {"label": "WRONG", "n": 1, "fired": 1}
    assert bench.find_guard("none") is None


def test_results_merge_keeps_other_keys(bench: ModuleType, tmp_path: Path) -> None:
    out = tmp_path / "results.json"
    out.write_text(json.dumps({"pipeline": {"x": 1}}))
    bench.merge_results(out, "judge_set", {"meta": {}, "judges": {"a": 1}}, "sha1")
    bench.merge_results(out, "judge_set", {"meta": {}, "judges": {"b": 2}}, "sha1")
    whole = json.loads(out.read_text())
    assert whole["pipeline"] == {"x": 1}
    assert whole["judge_set"]["judges"] == {"a": 1, "b": 2}
    # A run without judges (the guard alone) keeps the judges and adds its key.
    bench.merge_results(out, "judge_set", {"guard_alone": {"g": 1}, "judges": {}}, "sha1")
    kept = json.loads(out.read_text())["judge_set"]
    assert kept["judges"] == {"a": 1, "b": 2} and kept["guard_alone"] == {"g": 1}
    # Another set: the judges measured on the old one are dropped.
    bench.merge_results(out, "judge_set", {"meta": {}, "judges": {"c": 3}}, "sha2")
    assert json.loads(out.read_text())["judge_set"]["judges"] == {"c": 3}
