"""Regenerate the conformance corpora: `python -m tests.unit.cases.generate`.

Inputs are built from seed answers and perturbations (the tricky cases issue 11 lists);
every case's `score` is what THE REFERENCE implementation (references.py) gives. Where
rsieve's protocol deliberately differs, the case carries `deviation` (a reason documented
in docs/verifiers.md) and `rsieve` (rsieve's score). An undocumented disagreement aborts.
"""

from __future__ import annotations

import functools
import json
import math
import re
import unicodedata
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from rsieve.verify import _LETTER_FORMS, PROTOCOLS, _mc_text, vqa_norm
from tests.unit.cases import references as R

HERE = Path(__file__).parent

SOURCES = {
    "alnum": "the card's alnum_norm/alnum_pair (docs/verifiers.md alnum)",
    "anls": "lmms-eval lmms_eval/api/metrics.py anls (Qwen-VL infographicsvqa_eval.py)",
    "relaxed": "lmms-eval lmms_eval/tasks/chartqa/utils.py relaxed_correctness",
    "vqa": "GT-Vision-Lab/VQA PythonEvaluationTools/vqaEvaluation/vqaEval.py",
    "mc": "VLMEvalKit vlmeval/utils/matching_util.py can_infer",
    "math": "huggingface/Math-Verify README usage (parse gold in $..$, then verify)",
    "exact": "docs/verifiers.md exact (rsieve's own rule; no public reference)",
    "number": "docs/verifiers.md number (rsieve's own rule; no public reference)",
}
DOC = HERE.parents[2] / "docs" / "verifiers.md"


@functools.cache
def doc_snippets() -> dict[str, Any]:
    ns: dict[str, Any] = {"__name__": "verifiers_md"}
    for snippet in re.findall(r"```python\n(.*?)```", DOC.read_text(encoding="utf-8"), re.S):
        exec(compile(snippet, str(DOC), "exec"), ns)
    return ns


NBSP, ZWSP, FW = "\u00a0", "\u200b", str.maketrans("0123456789", "０１２３４５６７８９")


def reference_score(protocol: str, case: dict[str, Any]) -> float:
    pred, refs = case["prediction"], case["references"]
    if protocol == "alnum":
        return R.card_alnum(pred, refs)
    if protocol == "anls":
        return float(R.lmms_anls(refs, [pred]))
    if protocol == "relaxed":
        return R.lmms_relaxed(pred, refs)
    if protocol == "vqa":
        return R.official_vqa(pred, refs)
    if protocol == "mc":
        return R.vlmeval_mc(pred, refs, case["options"])
    if protocol == "math":
        return R.math_verify_reference(pred, refs)
    if protocol in ("exact", "number"):
        return float(doc_snippets()[protocol](pred, refs))
    raise KeyError(protocol)


def rsieve_score(protocol: str, case: dict[str, Any]) -> float:
    options = {"options": case["options"]} if "options" in case else {}
    return PROTOCOLS[protocol](case["prediction"], case["references"], **options)


def same(protocol: str, a: float, b: float) -> bool:
    return math.isclose(a, b, abs_tol=1e-9) if protocol == "vqa" else a == b


def classify(protocol: str, case: dict[str, Any], ref: float, ours: float) -> str | None:
    """The documented reason a case disagrees with the reference, or None."""
    pred, refs = case["prediction"], case["references"]
    if protocol == "anls":
        if ref == 0.5 and ours == 0.0:
            return "anls_exact_half_scores_zero"
        if any(len(r.upper()) != len(" ".join(r.strip().lower().split())) for r in refs) or (
            len(pred.upper()) != len(" ".join(pred.strip().lower().split()))
        ):
            return "anls_length_of_normalised_strings"
    if protocol == "vqa":
        if math.isclose(R.official_vqa(pred, [vqa_norm(r) for r in refs]), ours, abs_tol=1e-9):
            return "vqa_references_normalised"
    if protocol == "mc":
        options = case["options"]
        folded = unicodedata.normalize("NFKC", pred)
        if folded != pred and R.vlmeval_mc(folded, refs, options) == ours:
            return "mc_nfkc_before_extraction"
        stated = [m for f in _LETTER_FORMS if (m := f.match(pred.strip()))]
        if (
            ours == 0.0
            and stated
            and stated[0].re.groups >= 2
            and stated[0].group(2)
            and any(
                _mc_text(v) == _mc_text(stated[0].group(2))
                for k, v in options.items()
                if k != stated[0].group(1)
            )
        ):
            return "mc_letter_contradicts_option_text"
        if R.vlmeval_can_infer_option(pred, dict(options)):
            return "mc_lone_letter_is_not_a_choice"
        if ref == 1.0 and ours == 0.0:
            return "mc_option_text_must_equal"
    return None


# --- seeds and perturbations ------------------------------------------------------------


def perturb(text: str) -> Iterator[str]:
    yield text
    yield text.upper()
    yield text.lower()
    yield text.title()
    yield f"  {text}  "
    yield f"{text}."
    yield f"{text}!"
    yield f'"{text}"'
    yield text.replace(" ", "  ")
    yield text.replace(" ", NBSP)
    yield text.replace(" ", ZWSP) if " " in text else text + ZWSP
    yield text.translate(FW)
    yield text[:-1]
    yield text + "s"
    yield text[::-1]
    yield ""
    yield "   "
    yield f"<think>hmm</think>{text}"
    yield f"{text}\nbecause it is written there"


ALNUM_REFS = [
    "11850",
    "1432",
    "11956",
    "13581",
    "bridgestone",
    "HELLO",
    "Café",
    "isn't",
    "STOP",
    "2,500",
    "42.50",
    "A4",
    "Straße",
    "İstanbul",
    "ﬁsh",
    "coca-cola",
    "007",
    "ORANGE",
    "U.S.A.",
    "12:30",
]
ANLS_REFS = [
    "bridgestone",
    "Total revenue",
    "$1,250.00",
    "March 3, 2019",
    "ab",
    "abcd",
    "12",
    "Dr. John Smith",
    "ACME Corp.",
    "New York",
    "0.5%",
    "straße",
    "Table 4",
    "ITC Limited",
    "yes",
    "  padded  answer ",
    "x",
]
RELAXED_REFS = [
    "10",
    "100",
    "1",
    "12.5",
    "0",
    "45%",
    "0.45",
    "1,000",
    "1000",
    "2012",
    "-3.2",
    "Yes",
    "North America",
    "0.05",
    "1e3",
    "50",
    "7.1",
]
RELAXED_PREDS = [
    "10",
    "10.5",
    "10.4",
    "10.6",
    "9.5",
    "9.49",
    "105",
    "95",
    "105.1",
    "1.05",
    "0.95",
    "1.04",
    "12.5",
    "13.125",
    "13.13",
    "11.875",
    "0",
    "0.0",
    "45%",
    "45",
    "0.45",
    "0.4725",
    "1,000",
    "1000",
    "1050",
    "1e3",
    "2015",
    "2012",
    "-3.2",
    "3.2",
    "-3.36",
    "yes",
    "Yes",
    "YES",
    "north america",
    "North America.",
    "5%",
    "0.05",
    "50",
    "52.5",
    "52.6",
    "７.1",
    "7.1 ",
    " 7.1",
    "nan",
    "inf",
    "",
    "  ",
    "1_000",
    "½",
    "12.5%",
    "10%",
    "7.455",
    "7.456",
]
VQA_LISTS = [
    ["2"] * 10,
    ["2"] * 6 + ["3"] * 4,
    ["2"] * 3 + ["3"] * 7,
    ["2"] * 1 + ["3"] * 9,
    ["yes"] * 9 + ["no"],
    ["yes"] * 2 + ["no"] * 8,
    ["red"] * 3 + ["blue"] * 3 + ["green"] * 4,
    ["t-shirt"] * 10,
    ["t-shirt"] * 5 + ["shirt"] * 5,
    ["dog"] * 4 + ["dogs"] * 6,
    ["3,000"] * 5 + ["3000"] * 5,
    ["isn't"] * 10,
    ["10"] * 10,
    ["0"] * 7 + ["1"] * 3,
    ["new york"] * 6 + ["nyc"] * 4,
    ["2"],
    ["tennis"] * 3,
    ["3.5"] * 10,
    ["black and white"] * 8 + ["black"] * 2,
    ["Two"] * 5 + ["2"] * 5,
]
VQA_PREDS = [
    "2",
    "two",
    "Two.",
    "2 ",
    "the 2",
    "3",
    "three",
    "yes",
    "Yes!",
    "yes.",
    "no",
    "No.",
    "red",
    "Red.",
    "blue",
    "green",
    "t-shirt",
    "T-Shirt",
    "t shirt",
    "shirt",
    "dog",
    "a dog",
    "the dogs",
    "3,000",
    "3000",
    "3, 000",
    "isnt",
    "isn't",
    "ten",
    "10",
    "none",
    "zero",
    "0",
    "one",
    "New York",
    "new york.",
    "nyc",
    "tennis",
    "3.5",
    "3.5.",
    "black and white",
    "black & white",
    "black",
    "",
    "  ",
    "<think>2</think>2",
    "2\nbecause",
    "a.b.c",
]
MC_OPTION_SETS = [
    {"A": "cat", "B": "dog", "C": "bird", "D": "fish"},
    {"A": "3", "B": "5", "C": "7", "D": "9"},
    {"A": "A red car", "B": "A blue car", "C": "No car", "D": "Two cars"},
]
MC_PREDS = [
    "A",
    "B",
    "C",
    "D",
    "(B)",
    "B.",
    "B)",
    "[B]",
    "**B**",
    "\\boxed{B}",
    "B. dog",
    "(B) dog",
    "B: dog",
    "The answer is B.",
    "Answer: B",
    "answer: (B)",
    "The correct answer is B",
    "The answer is (B) dog",
    "dog",
    "Dog.",
    "5",
    "A blue car",
    "a blue car.",
    "It is B because it is larger",
    "I choose B",
    "A cat",
    "A dog sits",
    "concatenate",
    "the dogs are here",
    "A or B",
    "B and C",
    "Either A or C",
    "",
    "  ",
    "E",
    "b",
    "Option B",
    "<think>A</think>B",
    "The answer is B because it barks",
    "B\nThe others are wrong",
    "C. dog",
    "B. cat",
    "Z",
    "Cannot determine the answer",
    "No car",
    "Two cars or a blue car",
    "Ｂ",
    "B．",
]
EXACT_REFS = [
    "the eiffel tower",
    "New York",
    "Mr. Smith",
    "ＡＢＣ",
    "straße",
    "İstanbul",
    "café",
    "2 apples",
    "U.S.A.",
    "yes",
    "Ünïcödé",
    "x",
    "a  b",
    "end.",
]
NUMBER_REFS = [
    "12",
    "1250",
    "1,250",
    "0.5",
    "-3",
    "1e3",
    "50%",
    "3.14159",
    "0",
    "1000000",
    "12.",
    "+7",
    "１２",
    "1,000,000.5",
]
NUMBER_PREDS = [
    "12",
    "12.0",
    "12.000001",
    "12.0001",
    "1250",
    "1,250",
    "1 250",
    "12,50",
    "1,2,5",
    "0.5",
    ".5",
    "1/2",
    "-3",
    "−3",
    "3",
    "1000",
    "1e3",
    "1E3",
    "50",
    "50%",
    "0.50",
    "3.14159",
    "3.1416",
    "0",
    "-0",
    "0.0",
    "1,000,000",
    "1000000.0",
    "12.",
    "+7",
    "7",
    "１２",
    "twelve",
    "",
    "  ",
    "nan",
    "inf",
    "1,000,000.5",
    "12 cm",
    "<think>12</think>12",
    "12\nbecause",
]
MATH_PAIRS = [
    (
        "\\frac{1}{2}",
        [
            "0.5",
            "1/2",
            "\\frac{2}{4}",
            "$\\frac{1}{2}$",
            "\\boxed{\\frac12}",
            "0.50",
            "2",
            "\\frac{1}{3}",
            "",
            "The answer is $\\frac{1}{2}$.",
        ],
    ),
    ("0.5", ["\\frac{1}{2}", "1/2", "50\\%", "0.5", ".5", "5"]),
    ("\\frac{L}{n-1}", ["\\frac{L}{n}", "\\frac{L}{n-1}", "L/(n-1)", "\\frac{L}{-1+n}"]),
    ("\\sqrt{2}", ["1.414", "\\sqrt{2}", "2^{1/2}", "\\sqrt{3}", "$\\sqrt 2$"]),
    ("3", ["3", "3.0", "three", "\\boxed{3}", "x = 3", "03", "4", "$3$"]),
    ("x^2+1", ["1+x^2", "x^2 + 1", "x^2", "(x+1)^2", "$x^{2}+1$"]),
    ("30^\\circ", ["30", "30^\\circ", "30°", "\\frac{\\pi}{6}", "60"]),
    ("1,000", ["1000", "1,000", "1 000", "100"]),
    ("50\\%", ["50", "0.5", "50\\%", "50%", "5"]),
    ("\\pi/2", ["\\frac{\\pi}{2}", "1.5708", "90", "\\pi"]),
    ("(1,2)", ["(1,2)", "(1, 2)", "[1,2]", "(2,1)"]),
    ("\\{1,2\\}", ["\\{2,1\\}", "\\{1,2\\}", "1,2", "\\{1\\}"]),
    ("x=2", ["2", "x=2", "x = 2", "y=2", "3"]),
    ("-\\frac{3}{4}", ["-0.75", "\\frac{-3}{4}", "0.75", "-3/4"]),
    ("2\\sqrt{3}", ["\\sqrt{12}", "2\\sqrt{3}", "3.464", "\\sqrt{6}"]),
    ("10", ["10", "１０", "10.0", "ten", "\\boxed{10}", "  10  ", "1e1"]),
    ("\\infty", ["\\infty", "infinity", "no finite answer", "\\infty."]),
    ("A", ["A", "a", "B", "(A)"]),
    ("12", ["12", "12.00", "12.1", "$12$ cm", "12 cm"]),
    ("\\frac{\\sqrt{3}}{2}", ["\\sqrt{3}/2", "0.866", "\\frac{1}{2}\\sqrt{3}", "\\frac{3}{2}"]),
]


def cases_for(protocol: str) -> Iterator[dict[str, Any]]:
    if protocol == "alnum":
        for ref in ALNUM_REFS:
            for pred in perturb(ref):
                yield {"prediction": pred, "references": [ref]}
        yield {"prediction": "ll.850", "references": ["11850"]}
        yield {"prediction": "M. Este", "references": ["11956"]}
        yield {"prediction": "cat", "references": ["dog", "CAT"]}
        yield {"prediction": "...", "references": ["-"]}
    elif protocol == "anls":
        for ref in ANLS_REFS:
            for pred in perturb(ref):
                yield {"prediction": pred, "references": [ref]}
        for pred, ref in [
            ("abxx", "abcd"),
            ("abcx", "abcd"),
            ("1", "12"),
            ("13", "12"),
            ("ab", "cd"),
            ("abc", "abcdef"),
            ("abcd", "abcdefgh"),
            ("x     y     z", "abc"),
            ("a    b", "ab"),
            ("ß", "ss"),
            ("ﬁ", "fi"),
            ("İ", "i"),
            ("", ""),
            ("", "a"),
            ("abcx", "zzzz"),
        ]:
            yield {"prediction": pred, "references": [ref]}
        yield {"prediction": "abcx", "references": ["zzzz", "abcd"]}
        yield {"prediction": "Bridgeston", "references": ["bridgestone", "Bridgestone Corp"]}
    elif protocol == "relaxed":
        for ref in RELAXED_REFS:
            for pred in RELAXED_PREDS:
                yield {"prediction": pred, "references": [ref]}
    elif protocol == "vqa":
        for refs in VQA_LISTS:
            for pred in VQA_PREDS:
                yield {"prediction": pred, "references": refs}
    elif protocol == "mc":
        for options in MC_OPTION_SETS:
            for pred in MC_PREDS:
                for letter in ("B", "A"):
                    yield {"prediction": pred, "references": [letter], "options": options}
    elif protocol == "math":
        for gold, preds in MATH_PAIRS:
            for pred in preds:
                yield {"prediction": pred, "references": [gold]}
                yield {
                    "prediction": f"The final answer is $\\boxed{{{pred}}}$",
                    "references": [gold],
                }


def more_cases(protocol: str) -> Iterator[dict[str, Any]]:
    if protocol == "exact":
        for ref in EXACT_REFS:
            for pred in perturb(ref):
                yield {"prediction": pred, "references": [ref]}
    elif protocol == "number":
        for ref in NUMBER_REFS:
            for pred in NUMBER_PREDS:
                yield {"prediction": pred, "references": [ref]}


def build(protocol: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    seen: set[str] = set()
    for raw in [*cases_for(protocol), *more_cases(protocol)]:
        key = json.dumps(raw, sort_keys=True)
        if key in seen:
            continue
        seen.add(key)
        case = {"protocol": protocol, **raw}
        ref, ours = reference_score(protocol, case), rsieve_score(protocol, case)
        case["score"] = ref
        case["source"] = SOURCES[protocol]
        if not same(protocol, ref, ours):
            reason = classify(protocol, case, ref, ours)
            if reason is None:
                raise SystemExit(f"undocumented disagreement: {case} rsieve={ours}")
            case["deviation"] = reason
            case["rsieve"] = ours
        out.append(case)
    return out


def main(protocols: Callable[[], list[str]] = lambda: list(SOURCES)) -> None:
    for protocol in protocols():
        cases = build(protocol)
        path = HERE / f"conformance_{protocol}.jsonl"
        path.write_text("".join(json.dumps(c, ensure_ascii=False) + "\n" for c in cases))
        dev = sum(1 for c in cases if "deviation" in c)
        print(f"{protocol}: {len(cases)} cases, {dev} documented deviations -> {path.name}")


if __name__ == "__main__":
    main()
