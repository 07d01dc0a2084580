"""docs/verifiers.md: its snippets run, and state exactly what PROTOCOLS computes."""

from __future__ import annotations

import json
import math as _math
import re
from pathlib import Path
from typing import Any

import pytest

from rsieve.families import FAMILY_PROTOCOLS, FULL_ANSWER_LISTS, full_answer_list
from rsieve.verify import PROTOCOLS

DOC = Path(__file__).resolve().parents[2] / "docs" / "verifiers.md"
CASES = Path(__file__).parent / "cases"
SNIPPETS = re.findall(r"```python\n(.*?)```", DOC.read_text(encoding="utf-8"), re.S)


def _namespace() -> dict[str, Any]:
    ns: dict[str, Any] = {"__name__": "verifiers_md"}
    for snippet in SNIPPETS:
        exec(compile(snippet, str(DOC), "exec"), ns)
    return ns


NS = _namespace()
EXTRA: list[tuple[str, str, list[str], dict[str, Any]]] = [
    ("exact", "  The  Eiffel Tower. ", ["the eiffel tower"], {}),
    ("exact", "Eiffel", ["the eiffel tower"], {}),
    ("exact", "ＡＢＣ", ["abc"], {}),
    ("number", "1,250", ["1250"], {}),
    ("number", "1250.5", ["1250"], {}),
    ("number", "twelve", ["12"], {}),
    ("number", "50%", ["50"], {}),
    ("number", "１２", ["12"], {}),
    ("number", "1e3", ["1000.0000001"], {}),
    ("mc", "B", ["B"], {}),
    ("mc", "The answer is D.", ["D"], {}),
    ("mc", "A or B", ["A"], {}),
]


def _corpus() -> list[tuple[str, str, list[str], dict[str, Any]]]:
    out = []
    for path in sorted(CASES.glob("conformance_*.jsonl")):
        for line in path.read_text(encoding="utf-8").splitlines():
            c = json.loads(line)
            opts = {"options": c["options"]} if "options" in c else {}
            out.append((c["protocol"], c["prediction"], c["references"], opts))
    return out + EXTRA


def test_the_doc_has_a_snippet_for_every_protocol() -> None:
    for name in PROTOCOLS:
        assert callable(NS.get(name)), name
        assert f"## `{name}`" in DOC.read_text(encoding="utf-8") or name in ("exact", "number")


@pytest.mark.parametrize("protocol", sorted(PROTOCOLS))
def test_snippet_equals_protocol_on_every_case(protocol: str) -> None:
    cases = [c for c in _corpus() if c[0] == protocol]
    assert cases, protocol
    for _, pred, refs, opts in cases:
        want = PROTOCOLS[protocol](pred, refs, **opts)
        got = NS[protocol](pred, refs, **opts)
        assert _math.isclose(got, want, abs_tol=1e-12), (pred, refs, got, want)


def test_doc_table_states_registered_versions_and_thresholds() -> None:
    text = DOC.read_text(encoding="utf-8")
    for name, proto in PROTOCOLS.items():
        row = re.search(rf"^\| `{name}` \| (\S+) \| (\S+) \|", text, re.M)
        assert row, name
        assert row.group(1) == proto.version and float(row.group(2)) == proto.threshold


def test_full_answer_lists_cover_the_vqa_families() -> None:
    assert {f for f, p in FAMILY_PROTOCOLS.items() if p == "vqa"} == set(FULL_ANSWER_LISTS)
    assert full_answer_list("VQAv2") == 10 and full_answer_list("textvqa-val") == 10
    assert full_answer_list("DocVQA") is None
    assert PROTOCOLS["vqa"]("2", ["2"]) == 0.0  # a single reference always scores 0
