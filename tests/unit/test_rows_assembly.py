"""Row assembly: outcomes to dataset rows, one row per image per split."""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa
import pytest

from rsieve.compact.rows import FEATURES, assemble_rows
from rsieve.compact.splits import SPLIT_KINDS, canonical_reference, passed_text, split_name
from tests.unit._records import POOL_URI, accepted, failed, judged, make_item, sha


@pytest.mark.parametrize(
    ("family", "kind", "name"),
    [
        ("ORAND-CAR-A", "RS_think", "ORAND_CAR_A_RS_think"),
        ("ORAND-CAR-A", "RS_nothink", "ORAND_CAR_A_RS_nothink"),
        ("ORAND-CAR-A", "rejected", "ORAND_CAR_A_rejected"),
        ("OrandCar", "RS_think", "OrandCar_RS_think"),
        ("MMBench-sample-en", "rejected", "MMBench_sample_en_rejected"),
        ("ST VQA.v2", "RS_nothink", "ST_VQA_v2_RS_nothink"),
        ("IC15", "RS_think", "IC15_RS_think"),
    ],
)
def test_split_name(family: str, kind: str, name: str) -> None:
    assert split_name(family, kind) == name


def _only_qa(rows: list[dict[str, Any]]) -> dict[str, Any]:
    assert len(rows) == 1 and len(rows[0]["qa"]) == 1
    return rows[0]["qa"][0]


def test_accepted_goes_to_think_and_nothink() -> None:
    item = make_item("w-1", line=3, family="OrandCar", references=["1250"], image="img-1")
    out = accepted(item, "1,250")
    assert out.decision is not None
    splits = assemble_rows([out])
    assert set(splits) == {"OrandCar_RS_think", "OrandCar_RS_nothink"}
    think = _only_qa(splits["OrandCar_RS_think"])
    nothink = _only_qa(splits["OrandCar_RS_nothink"])
    for qa in (think, nothink):
        assert qa["id"] == "w-1"
        assert qa["question"] == item.question
        assert qa["answer"] == "1,250"
        assert qa["org_answer"] == "1250"
        assert qa["wrong_vlm"] is None and qa["reason"] is None
        assert qa["promoted_by"] == "verifier"
        assert qa["model"] == "test-vlm"
        assert qa["judge"] is None
        assert qa["verification"]["protocol"] == "alnum"
        assert qa["verification"]["accepted"] is True
        assert json.loads(qa["verification"]["constants"]) == out.decision.constants
        assert qa["references"] == ["1250"] and qa["protocol"] == "alnum"
        assert qa["full_answer"] == "1,250" and qa["options"] is None
    assert think["reasoning"] == out.generation.reasoning
    assert think["reasoning"]
    assert nothink["reasoning"] is None
    for split in splits.values():
        assert split[0]["image_sha256"] == sha("img-1")


def test_judge_promoted_row_carries_the_verdict() -> None:
    out = judged(make_item(references=["COFFEE"]), "the word COFFEE", "CORRECT")
    splits = assemble_rows([out])
    assert set(splits) == {"SynthWords_RS_think", "SynthWords_RS_nothink"}
    qa = _only_qa(splits["SynthWords_RS_think"])
    assert qa["promoted_by"] == "judge"
    assert qa["answer"] == "the word COFFEE"
    assert qa["verification"]["accepted"] is False
    assert qa["judge"]["verdict"] == "CORRECT"
    assert qa["judge"]["model"] == "test-judge"
    assert "prompt" not in qa["judge"]
    assert qa["judge"]["prompt_sha256"] == out.verdict.prompt_sha256  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("raw_verdict", "reason"),
    [
        ("WRONG", "wrong_answer"),
        ("UNSURE", "judge_unsure"),
        (None, "judge_failed"),
        ("I think it is fine", "judge_failed"),
    ],
)
def test_rejected_goes_only_to_rejected(raw_verdict: str | None, reason: str) -> None:
    item = make_item("w-2", references=["COFFEE"])
    splits = assemble_rows([judged(item, "TOFFEE", raw_verdict)])
    assert set(splits) == {"SynthWords_rejected"}
    qa = _only_qa(splits["SynthWords_rejected"])
    assert qa["id"] == "w-2"
    assert qa["answer"] == "COFFEE"
    assert qa["wrong_vlm"] == "TOFFEE"
    assert qa["reason"] == reason
    assert qa["org_answer"] is None and qa["reasoning"] is None
    assert qa["promoted_by"] is None
    assert qa["judge"]["verdict"] == {"WRONG": "WRONG", "UNSURE": "UNSURE"}.get(
        raw_verdict or "", "FAILED"
    )


def test_accepted_without_reasoning_goes_to_nothink_only() -> None:
    """An answer with no think block (a checkpoint without a thinking mode) is accepted
    but never becomes a `_RS_think` row with empty reasoning."""
    item = make_item("plain", references=["COFFEE"])
    out = accepted(item)
    bare = out.model_copy(
        update={
            "generation": out.generation.model_copy(
                update={"reasoning": None, "raw_output": "COFFEE"}
            )
        }
    )
    blank = out.model_copy(
        update={"generation": out.generation.model_copy(update={"reasoning": "  \n"})}
    )
    for outcome in (bare, blank):
        splits = assemble_rows([outcome])
        assert set(splits) == {"SynthWords_RS_nothink"}
        assert _only_qa(splits["SynthWords_RS_nothink"])["answer"] == "COFFEE"
    assert set(assemble_rows([out])) == {"SynthWords_RS_think", "SynthWords_RS_nothink"}


def test_rejected_without_answer_keeps_raw_output() -> None:
    raw = "<think>the letters are C, O, F, F"
    out = failed(make_item(references=["COFFEE"]), raw, "truncated_reasoning")
    qa = _only_qa(assemble_rows([out])["SynthWords_rejected"])
    assert qa["answer"] == "COFFEE"
    assert qa["wrong_vlm"] == raw
    assert qa["reason"] == "truncated_reasoning"
    assert qa["verification"] is None and qa["judge"] is None


def test_multi_reference_rows_show_the_majority_reference_and_keep_the_list() -> None:
    """Ten VQA annotators: `answer` / `org_answer` is the most frequent reference (ties to
    the first listed), `references` the whole list; never a joined string."""
    refs = ["two", "2", "2", "two", "2", "a pair", "2", "two", "2", "two"]
    item = make_item(family="VQAv2", protocol="vqa", references=refs)
    qa = _only_qa(assemble_rows([accepted(item, "2")])["VQAv2_RS_nothink"])
    assert qa["org_answer"] == "2" and qa["references"] == refs
    rejected = _only_qa(assemble_rows([judged(item, "three", "WRONG")])["VQAv2_rejected"])
    assert rejected["answer"] == "2" and rejected["references"] == refs
    tie = make_item(family="DocVQA", protocol="anls", references=["two", "2"])
    assert _only_qa(assemble_rows([accepted(tie, "2")])["DocVQA_RS_nothink"])["org_answer"] == "two"


def test_canonical_reference_rule() -> None:
    assert canonical_reference(["a"]) == "a"
    assert canonical_reference(["b", "a", "a"]) == "a"
    assert canonical_reference(["b", "a", "a", "b"]) == "b"  # a tie: the first listed


def test_an_answer_that_passed_on_its_first_line_is_that_line() -> None:
    """The verifier ignored the explanation after the first line: the training target is
    the line that passed, and the whole text stays in full_answer."""
    item = make_item(family="SynthWords", references=["COFFEE"])
    whole = "COFFEE\nThe sign above the door reads coffee, in capitals."
    out = accepted(item, whole)
    assert out.decision is not None and out.decision.variant == "first_line"
    qa = _only_qa(assemble_rows([out])["SynthWords_RS_nothink"])
    assert qa["answer"] == "COFFEE" and qa["full_answer"] == whole
    assert qa["verification"]["variant"] == "first_line"
    para = "COFFEE, the word\non the sign\n\nIt is painted in red."
    assert passed_text(para, "first_paragraph") == "COFFEE, the word\non the sign"
    assert passed_text("  x  ", None) == "x"


def test_a_judge_promotion_keeps_the_whole_answer() -> None:
    item = make_item(family="SynthWords", references=["COFFEE"])
    out = judged(item, "the word COFFEE", "CORRECT")
    qa = _only_qa(assemble_rows([out])["SynthWords_RS_nothink"])
    assert qa["answer"] == qa["full_answer"] == "the word COFFEE"


def test_mc_options_travel_with_the_row() -> None:
    item = make_item(
        family="MMBench", protocol="mc", references=["B"], options={"A": "cat", "B": "dog"}
    )
    qa = _only_qa(assemble_rows([accepted(item, "B")])["MMBench_RS_nothink"])
    assert qa["options"] == [{"label": "A", "text": "cat"}, {"label": "B", "text": "dog"}]


def test_two_items_on_one_image_make_one_row_in_line_order() -> None:
    first = make_item("q-a", line=2, references=["COFFEE"], image="shared", question="Word?")
    second = make_item("q-b", line=9, references=["TEA"], image="shared", question="Other?")
    other = make_item("q-c", line=5, references=["MILK"], image="elsewhere")
    splits = assemble_rows([accepted(second), accepted(other), accepted(first)])
    for kind in ("RS_think", "RS_nothink"):
        rows = splits[f"SynthWords_{kind}"]
        assert [r["image_sha256"] for r in rows] == [sha("shared"), sha("elsewhere")]
        assert [qa["id"] for qa in rows[0]["qa"]] == ["q-a", "q-b"]
        assert [qa["question"] for qa in rows[0]["qa"]] == ["Word?", "Other?"]
        assert [p["id"] for p in rows[0]["clean_meta"]["provenance"]] == ["q-a", "q-b"]
        assert [p["line"] for p in rows[0]["clean_meta"]["provenance"]] == [2, 9]


def test_one_image_split_between_accepted_and_rejected() -> None:
    ok = make_item("ok", line=1, references=["COFFEE"], image="shared")
    bad = make_item("bad", line=2, references=["TEA"], image="shared")
    splits = assemble_rows([judged(bad, "COFFEE", "WRONG"), accepted(ok)])
    assert set(splits) == {f"SynthWords_{k}" for k in SPLIT_KINDS}
    assert [qa["id"] for qa in splits["SynthWords_RS_think"][0]["qa"]] == ["ok"]
    assert [qa["id"] for qa in splits["SynthWords_rejected"][0]["qa"]] == ["bad"]


def test_families_get_their_own_splits_sorted() -> None:
    a = make_item("a", line=1, family="ORAND-CAR-A", references=["12"])
    b = make_item("b", line=2, family="DocVQA", protocol="anls", references=["x"])
    splits = assemble_rows([accepted(a), judged(b, "nothing alike at all", "WRONG")])
    assert (
        list(splits)
        == sorted(splits)
        == ["DocVQA_rejected", "ORAND_CAR_A_RS_nothink", "ORAND_CAR_A_RS_think"]
    )


def test_clean_meta() -> None:
    item = make_item("m-1", line=4, image="img", source={"path": "déjà/vu.png", "sha256": "ab"})
    row = assemble_rows([accepted(item)])["SynthWords_RS_think"][0]
    meta = row["clean_meta"]
    assert meta["pool"] == POOL_URI
    assert json.loads(meta["policy"]) == {"version": "clean/1", "provenance": "strict"}
    assert meta["provenance"] == [
        {
            "id": "m-1",
            "line": 4,
            "check": "sha256_match",
            "source": json.dumps(
                {"path": "déjà/vu.png", "sha256": "ab"}, sort_keys=True, ensure_ascii=False
            ),
            "purity": None,
            "mcq": None,
        }
    ]


def test_empty_outcomes_make_no_splits() -> None:
    assert assemble_rows([]) == {}


def test_rows_conform_to_features() -> None:
    shared = "shared-image"
    outcomes = [
        accepted(make_item("a", line=1, image=shared)),
        judged(make_item("b", line=2, image=shared, references=["TEA"]), "the word TEA", "CORRECT"),
        judged(make_item("c", line=3, references=["TEA"]), "COFFEE", "WRONG"),
        judged(make_item("d", line=4, references=["TEA"]), "COFFEE", None),
        failed(make_item("e", line=5), "<think>cut"),
        accepted(
            make_item("f", line=6, family="DocVQA", protocol="anls", references=["two", "2"]), "2"
        ),
    ]
    splits = assemble_rows(outcomes)
    assert sum(len(row["qa"]) for rows in splits.values() for row in rows) == 9
    for split, rows in splits.items():
        with_image = [row | {"image": {"bytes": b"\x89PNG fake", "path": "x"}} for row in rows]
        table = pa.Table.from_pylist(with_image, schema=FEATURES.arrow_schema)
        assert table.num_rows == len(rows), split
        assert table.schema == FEATURES.arrow_schema
        back = table.to_pylist()
        assert [[qa["id"] for qa in r["qa"]] for r in back] == [
            [qa["id"] for qa in r["qa"]] for r in rows
        ]
        assert back[0]["qa"][0]["verification"] == rows[0]["qa"][0]["verification"]
        assert back[0]["clean_meta"] == rows[0]["clean_meta"]


def test_clean_meta_records_each_items_purity_rule_and_mcq_rewrite() -> None:
    item = make_item(
        family="MMBench", protocol="mc", references=["B"], options={"A": "cat", "B": "dog"}
    )
    mcq = {"status": "normalised", "original_question": "Cat or dog?", "original_answer": "dog"}
    item = item.model_copy(
        update={"clean_meta": item.clean_meta | {"purity": "origin", "mcq": mcq}}
    )
    (entry,) = assemble_rows([accepted(item, "B")])["MMBench_RS_nothink"][0]["clean_meta"][
        "provenance"
    ]
    assert entry["purity"] == "origin" and json.loads(entry["mcq"]) == mcq
    plain = assemble_rows([accepted(make_item())])["SynthWords_RS_nothink"][0]
    assert plain["clean_meta"]["provenance"][0]["mcq"] is None
