"""Verification protocols: one pure function per rule, registered by name.

A protocol is `(prediction: str, references: Sequence[str], **options) -> float` in [0, 1].
`verify()` tries the prediction whole, as its first line and as its first paragraph (the
card: a model that answers right and then explains is not penalised), and returns a
`Decision` that records protocol, version, constants, threshold, score and the variant
that matched, so any decision can be recomputed from what is stored.

Two numbers per decision: the benchmark's own score and pass (exactly its reference
scorer's), and training acceptance (`TRAINING_RULES`): whether an answer the benchmark
passes is also a training target. Two scorers forgive wrong answers on purpose (ANLS
credits "Jane Smith" for "John Smith"; relaxed accuracy "105" for "100"), which is right
for a score and wrong for a target a model learns to write with confidence.
"""

from __future__ import annotations

import functools
import re
import unicodedata
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import ROUND_HALF_UP, Decimal, InvalidOperation
from typing import Any

from rapidfuzz.distance import Levenshtein

from rsieve.schemas import Decision, TrainingDecision

__all__ = [
    "DEFAULT_TRAINING_RULES",
    "PROTOCOLS",
    "TRAINING_RULES",
    "Protocol",
    "TrainingPolicy",
    "TrainingRule",
    "canonical",
    "check_training_rules",
    "protocol_versions",
    "register",
    "training_rules_view",
    "variants",
    "verify",
]

ProtocolFn = Callable[..., float]


@dataclass(frozen=True)
class Protocol:
    name: str
    fn: ProtocolFn
    version: str
    threshold: float
    constants: dict[str, Any] = field(default_factory=dict)

    def __call__(self, prediction: str, references: Sequence[str], **options: Any) -> float:
        return self.fn(prediction, references, **options)


PROTOCOLS: dict[str, Protocol] = {}


def register(
    name: str, *, version: str, threshold: float = 1.0, **constants: Any
) -> Callable[[ProtocolFn], ProtocolFn]:
    def wrap(fn: ProtocolFn) -> ProtocolFn:
        PROTOCOLS[name] = Protocol(name, fn, version, threshold, dict(constants))
        return fn

    return wrap


def protocol_versions() -> dict[str, str]:
    return {name: p.version for name, p in sorted(PROTOCOLS.items())}


# --- alnum: scene-text recognition (IIIT5K, SVT, IC13/15, CUTE80, ORAND-CAR ...) ---------

_NON_ALNUM = re.compile(r"[^a-z0-9]")


def alnum_norm(text: str) -> str:
    return _NON_ALNUM.sub("", (text or "").lower())


@register("alnum", version="1", pattern="[^a-z0-9]", case="lower")
def alnum(prediction: str, references: Sequence[str], **_: Any) -> float:
    pred = alnum_norm(prediction)
    for ref in references:
        if pred == alnum_norm(ref):
            return 1.0
    return 0.0


# --- exact and number -----------------------------------------------------------------


def _normalise(text: str) -> str:
    return " ".join(unicodedata.normalize("NFKC", text or "").casefold().split()).strip(" .")


@register("exact", version="1", normalisation="NFKC, casefold, collapse spaces, strip ' .'")
def exact(prediction: str, references: Sequence[str], **_: Any) -> float:
    pred = _normalise(prediction)
    return 1.0 if any(pred == _normalise(ref) for ref in references) else 0.0


_NUMBER = re.compile(r"^[-+]?(\d+(\.\d*)?|\.\d+)([eE][-+]?\d+)?$")


_GROUPED = re.compile(r"^[-+]?\d{1,3}(,\d{3})+(\.\d*)?$")


def parse_number(text: str) -> float | None:
    """NFKC, strip, trailing periods and one "%" dropped; commas only as thousands groups."""
    t = unicodedata.normalize("NFKC", text or "").strip().rstrip(".")
    t = t.removesuffix("%").strip()
    if "," in t:
        if not _GROUPED.match(t):
            return None  # "1,2,5" or "12,50" is not a number we can read without guessing
        t = t.replace(",", "")
    if not _NUMBER.match(t):
        return None
    return float(t)


@register(
    "number",
    version="2",
    rel_tol=1e-6,
    abs_tol=1e-9,
    number=_NUMBER.pattern,
    thousands=_GROUPED.pattern,
)
def number(prediction: str, references: Sequence[str], **_: Any) -> float:
    pred = parse_number(prediction)
    if pred is None:
        return 0.0
    for ref in references:
        gold = parse_number(ref)
        if gold is not None and abs(pred - gold) <= max(1e-9, 1e-6 * abs(gold)):
            return 1.0
    return 0.0


# --- anls: DocVQA / InfographicVQA / ST-VQA --------------------------------------------
#
# The official script (RRC DocVQA/InfographicVQA evaluation, as copied into Qwen-VL's
# infographicsvqa_eval.py and lmms-eval's `anls` metric): both sides lower-cased, stripped
# and whitespace-collapsed (`" ".join(s.strip().lower().split())`), Levenshtein distance
# over the longer length, best reference wins, NLS = 1 - distance. Two documented
# deviations (docs/verifiers.md): the length is that of the normalised strings (the script
# uses `len(raw.upper())`, so padding whitespace inflates it and admits wrong answers), and
# a distance of exactly 0.5 scores 0 as the ANLS definition states (NL < tau); the script
# keeps 0.5, which would admit "1" for "12".

ANLS_TAU = 0.5


def anls_norm(text: str) -> str:
    return " ".join((text or "").strip().lower().split())


@register(
    "anls",
    version="1",
    threshold=0.5,
    tau=ANLS_TAU,
    normalisation='" ".join(s.strip().lower().split())',
    distance="Levenshtein (rapidfuzz) / max(len) of the normalised strings",
    boundary="distance < 0.5 scores 1 - distance, else 0",
)
def anls(prediction: str, references: Sequence[str], **_: Any) -> float:
    pred = anls_norm(prediction)
    best = 0.0
    for ref in references:
        gold = anls_norm(ref)
        longest = max(len(pred), len(gold))
        dist = Levenshtein.distance(pred, gold) / longest if longest else 0.0
        if dist < ANLS_TAU:
            best = max(best, 1.0 - dist)
    return best


# --- relaxed: ChartQA relaxed accuracy --------------------------------------------------
#
# lmms-eval's `relaxed_correctness` (from Qwen-VL evaluate_vqa.py; the ChartQA paper, 5.1):
# both sides go through Python `float()` (a trailing "%" divides by 100); when the
# prediction parses and the target parses to a non-zero number, the relative change
# |p - t| / |t| must be <= 0.05; otherwise the strings must be equal after `.lower()`.
# No stripping, no thousands separators: "1,000" is a string, as the toolkit has it.

RELAXED_TOLERANCE = 0.05


def relaxed_float(text: str) -> float | None:
    try:
        if text.endswith("%"):
            return float(text.rstrip("%")) / 100.0
        return float(text)
    except ValueError:
        return None


@register(
    "relaxed",
    version="2",
    max_relative_change=RELAXED_TOLERANCE,
    numbers="float(); trailing % divides by 100; zero target compares as text",
    text="str.lower() equality",
    source="lmms-eval chartqa relaxed_correctness",
)
def relaxed(prediction: str, references: Sequence[str], **_: Any) -> float:
    pred = prediction or ""
    pred_f = relaxed_float(pred)
    for ref in references:
        target_f = relaxed_float(ref)
        if pred_f is not None and target_f:
            if abs(pred_f - target_f) / abs(target_f) <= RELAXED_TOLERANCE:
                return 1.0
        elif pred.lower() == ref.lower():
            return 1.0
    return 0.0


# --- vqa: VQA v2 soft accuracy ----------------------------------------------------------
#
# The official evaluation (GT-Vision-Lab/VQA PythonEvaluationTools/vqaEvaluation/
# vqaEval.py): newlines and tabs to spaces, strip, processPunctuation, processDigitArticle;
# each of the n references is left out in turn and the answer scores
# min(1, matches among the other n-1 / 3); the score is the mean. Deviation: the official
# script trusts its annotation file to hold normalised answers; pool references may be raw,
# so they go through the same normalisation as the prediction (idempotent on annotation
# answers). The mean is computed as one exact division (sum of min(3, k) over 3n), equal to
# the official float sum up to its rounding, so the 0.9 threshold is not at float's mercy.

VQA_CONTRACTIONS = {
    "aint": "ain't",
    "arent": "aren't",
    "cant": "can't",
    "couldve": "could've",
    "couldnt": "couldn't",
    "couldn'tve": "couldn't've",
    "couldnt've": "couldn't've",
    "didnt": "didn't",
    "doesnt": "doesn't",
    "dont": "don't",
    "hadnt": "hadn't",
    "hadnt've": "hadn't've",
    "hadn'tve": "hadn't've",
    "hasnt": "hasn't",
    "havent": "haven't",
    "hed": "he'd",
    "hed've": "he'd've",
    "he'dve": "he'd've",
    "hes": "he's",
    "howd": "how'd",
    "howll": "how'll",
    "hows": "how's",
    "Id've": "I'd've",
    "I'dve": "I'd've",
    "Im": "I'm",
    "Ive": "I've",
    "isnt": "isn't",
    "itd": "it'd",
    "itd've": "it'd've",
    "it'dve": "it'd've",
    "itll": "it'll",
    "let's": "let's",
    "maam": "ma'am",
    "mightnt": "mightn't",
    "mightnt've": "mightn't've",
    "mightn'tve": "mightn't've",
    "mightve": "might've",
    "mustnt": "mustn't",
    "mustve": "must've",
    "neednt": "needn't",
    "notve": "not've",
    "oclock": "o'clock",
    "oughtnt": "oughtn't",
    "ow's'at": "'ow's'at",
    "'ows'at": "'ow's'at",
    "'ow'sat": "'ow's'at",
    "shant": "shan't",
    "shed've": "she'd've",
    "she'dve": "she'd've",
    "she's": "she's",
    "shouldve": "should've",
    "shouldnt": "shouldn't",
    "shouldnt've": "shouldn't've",
    "shouldn'tve": "shouldn't've",
    "somebody'd": "somebodyd",
    "somebodyd've": "somebody'd've",
    "somebody'dve": "somebody'd've",
    "somebodyll": "somebody'll",
    "somebodys": "somebody's",
    "someoned": "someone'd",
    "someoned've": "someone'd've",
    "someone'dve": "someone'd've",
    "someonell": "someone'll",
    "someones": "someone's",
    "somethingd": "something'd",
    "somethingd've": "something'd've",
    "something'dve": "something'd've",
    "somethingll": "something'll",
    "thats": "that's",
    "thered": "there'd",
    "thered've": "there'd've",
    "there'dve": "there'd've",
    "therere": "there're",
    "theres": "there's",
    "theyd": "they'd",
    "theyd've": "they'd've",
    "they'dve": "they'd've",
    "theyll": "they'll",
    "theyre": "they're",
    "theyve": "they've",
    "twas": "'twas",
    "wasnt": "wasn't",
    "wed've": "we'd've",
    "we'dve": "we'd've",
    "weve": "we've",
    "werent": "weren't",
    "whatll": "what'll",
    "whatre": "what're",
    "whats": "what's",
    "whatve": "what've",
    "whens": "when's",
    "whered": "where'd",
    "wheres": "where's",
    "whereve": "where've",
    "whod": "who'd",
    "whod've": "who'd've",
    "who'dve": "who'd've",
    "wholl": "who'll",
    "whos": "who's",
    "whove": "who've",
    "whyll": "why'll",
    "whyre": "why're",
    "whys": "why's",
    "wont": "won't",
    "wouldve": "would've",
    "wouldnt": "wouldn't",
    "wouldnt've": "wouldn't've",
    "wouldn'tve": "wouldn't've",
    "yall": "y'all",
    "yall'll": "y'all'll",
    "y'allll": "y'all'll",
    "yall'd've": "y'all'd've",
    "y'alld've": "y'all'd've",
    "y'all'dve": "y'all'd've",
    "youd": "you'd",
    "youd've": "you'd've",
    "you'dve": "you'd've",
    "youll": "you'll",
    "youre": "you're",
    "youve": "you've",
}
VQA_MANUAL_MAP = {
    "none": "0",
    "zero": "0",
    "one": "1",
    "two": "2",
    "three": "3",
    "four": "4",
    "five": "5",
    "six": "6",
    "seven": "7",
    "eight": "8",
    "nine": "9",
    "ten": "10",
}
VQA_ARTICLES = ("a", "an", "the")
VQA_PUNCT = (
    ";",
    "/",
    "[",
    "]",
    '"',
    "{",
    "}",
    "(",
    ")",
    "=",
    "+",
    "\\",
    "_",
    "-",
    ">",
    "<",
    "@",
    "`",
    ",",
    "?",
    "!",
)
# The official pattern, kept verbatim: "(?!<=\d)" is a lookahead for the literal "<="
# (a typo for a lookbehind), so a period is removed unless a digit follows it.
_VQA_PERIOD_STRIP = re.compile(r"(?!<=\d)(\.)(?!\d)")
_VQA_COMMA_STRIP = re.compile(r"(\d)(\,)(\d)")
# The official call is periodStrip.sub("", text, re.UNICODE): re.UNICODE (32) lands in the
# `count` argument, so at most 32 periods are removed. Kept for exact agreement.
VQA_PERIOD_STRIP_COUNT = int(re.UNICODE)


def vqa_punctuation(text: str) -> str:
    out = text
    comma = _VQA_COMMA_STRIP.search(text) is not None
    for p in VQA_PUNCT:
        if (p + " " in text or " " + p in text) or comma:
            out = out.replace(p, "")
        else:
            out = out.replace(p, " ")
    return _VQA_PERIOD_STRIP.sub("", out, count=VQA_PERIOD_STRIP_COUNT)


def vqa_digit_article(text: str) -> str:
    words = [VQA_MANUAL_MAP.get(w, w) for w in text.lower().split()]
    words = [w for w in words if w not in VQA_ARTICLES]
    return " ".join(VQA_CONTRACTIONS.get(w, w) for w in words)


@functools.lru_cache(maxsize=1 << 16)
def vqa_norm(text: str) -> str:
    """Official normalisation; cached, since the ten references recur for every variant."""
    text = (text or "").replace("\n", " ").replace("\t", " ").strip()
    return vqa_digit_article(vqa_punctuation(text))


@register(
    "vqa",
    version="1",
    threshold=0.9,
    matches_for_full_credit=3,
    aggregation="mean over leave-one-out subsets of min(1, matches / 3)",
    normalisation="vqaEval.py processPunctuation + processDigitArticle, both sides",
    punct="".join(VQA_PUNCT),
    period_strip=_VQA_PERIOD_STRIP.pattern,
    comma_strip=_VQA_COMMA_STRIP.pattern,
    period_strip_count=VQA_PERIOD_STRIP_COUNT,
    articles=list(VQA_ARTICLES),
    manual_map=VQA_MANUAL_MAP,
    contractions=len(VQA_CONTRACTIONS),
)
def vqa(prediction: str, references: Sequence[str], **_: Any) -> float:
    refs = [vqa_norm(r) for r in references]
    if len(refs) < 2:
        return 0.0  # leave-one-out over a single reference leaves nothing to match
    pred = vqa_norm(prediction)
    matches = sum(1 for r in refs if r == pred)
    # Leaving out a matching reference leaves matches - 1; any other leaves matches.
    credit = matches * min(3, matches - 1) + (len(refs) - matches) * min(3, matches)
    return credit / (3 * len(refs))


# --- mc: multiple-choice letter ----------------------------------------------------------
#
# Extraction never guesses. A letter counts only when the answer *states* it: the bare
# letter ("B", "(B)", "B.", "**B**", "\boxed{B}"), the letter followed by a delimiter and
# text ("B. dog", "(B) dog"), or an answer statement ("The answer is B", "Answer: (B)").
# With `options`, an answer equal to exactly one option's text names that option, and an
# answer that states a letter and equals another option's text is a conflict. Two letters,
# or none, give no letter. Deviations from VLMEvalKit's can_infer (docs/verifiers.md): a
# lone capital letter somewhere in prose ("It is B because ...", "A cat") is not a choice,
# and option text must equal the answer, not be a substring of it ("cat" in "concatenate").

_LETTER = r"[(\[]?([A-Z])[)\]]?"
_LETTER_FORMS = [
    re.compile(rf"^{_LETTER}\.?$"),
    re.compile(r"^\\boxed\{([A-Z])\}\.?$"),
    re.compile(rf"^{_LETTER}[.:)]\s*(\S.*)$", re.S),
    re.compile(r"^\(([A-Z])\)\s+(\S.*)$", re.S),
    re.compile(
        rf"^(?i:(?:the\s+)?(?:correct\s+|final\s+|best\s+|right\s+)?"
        rf"(?:answer|option|choice)(?:\s+is)?\s*[:：]?\s*)"
        rf"{_LETTER}(?:[.:)]\s*(.*))?$",
        re.S,
    ),
]


def _mc_text(text: str) -> str:
    return _normalise(text).strip(" .")


def extract_letter(prediction: str, options: dict[str, str] | None = None) -> str | None:
    text = unicodedata.normalize("NFKC", prediction or "").strip()
    text = re.sub(r"^\*\*(.*)\*\*\.?$", r"\1", text, flags=re.S).strip()
    keys = {k.strip().upper(): _mc_text(str(v)) for k, v in (options or {}).items()}
    by_text = {k for k, v in keys.items() if v and v == _mc_text(text)}
    letters: set[str] = set()
    for form in _LETTER_FORMS:
        m = form.match(text)
        if not m:
            continue
        letter, rest = m.group(1), (m.group(2) if m.re.groups >= 2 else None)
        letters.add(letter)
        if rest and keys:
            letters |= {k for k, v in keys.items() if v and v == _mc_text(rest)}
        break
    letters |= by_text
    if keys:
        letters = {x for x in letters if x in keys} if letters <= set(keys) else set()
    return letters.pop() if len(letters) == 1 else None


@register(
    "mc",
    version="2",
    letter_forms=[f.pattern for f in _LETTER_FORMS],
    option_text="NFKC, casefold, collapsed spaces, equality (never substring)",
    ambiguity="two letters or none: no match",
)
def mc(prediction: str, references: Sequence[str], **options: Any) -> float:
    letter = extract_letter(prediction, options.get("options"))
    if letter is None:
        return 0.0
    return 1.0 if any(letter == ref.strip().strip("().").upper() for ref in references) else 0.0


# --- math: Math-Verify -----------------------------------------------------------------


@register(
    "math",
    version="1",
    library="math-verify>=0.7",
    order="gold parsed first",
    gold="wrapped in $...$ unless it contains $",
    extraction="parse() defaults",
    comparison="verify(gold, answer) defaults",
    timeouts="none (SIGALRM is main-thread only)",
)
def math(prediction: str, references: Sequence[str], **_: Any) -> float:
    from math_verify import parse
    from math_verify import verify as mv_verify

    target = parse(prediction, parsing_timeout=None)
    for ref in references:
        gold = parse(ref if "$" in ref else f"${ref}$", parsing_timeout=None)
        if gold and target and mv_verify(gold, target, timeout_seconds=None):
            return 1.0
    return 0.0


# --- training acceptance -----------------------------------------------------------------
#
# A rule is a pure predicate on one form of the answer that the benchmark already passes:
# training acceptance is always the benchmark's pass *and* the rule, so it never accepts
# what the benchmark refuses. `benchmark` adds nothing: the protocols whose pass is already
# exact (alnum, exact, number, mc, math) and vqa (three of ten annotators agreeing is the
# field's own meaning of right) keep it.

TrainingFn = Callable[..., bool]


@dataclass(frozen=True)
class TrainingRule:
    name: str
    fn: TrainingFn
    # The protocols the rule can judge (None: every one).
    protocols: tuple[str, ...] | None
    constants: dict[str, Any] = field(default_factory=dict)


TRAINING_RULES: dict[str, TrainingRule] = {}


def training_rule(
    name: str, *, protocols: tuple[str, ...] | None = None, **constants: Any
) -> Callable[[TrainingFn], TrainingFn]:
    def wrap(fn: TrainingFn) -> TrainingFn:
        TRAINING_RULES[name] = TrainingRule(name, fn, protocols, dict(constants))
        return fn

    return wrap


@training_rule("benchmark", meaning="the benchmark's own pass, nothing more")
def _benchmark(prediction: str, references: Sequence[str], **_: Any) -> bool:
    return True


@training_rule(
    "anls_exact",
    protocols=("anls",),
    normalisation='" ".join(s.strip().lower().split())',
    score=1.0,
    meaning="equal to a reference after ANLS's own normalisation (ANLS 1.0)",
)
def _anls_exact(prediction: str, references: Sequence[str], **_: Any) -> bool:
    pred = anls_norm(prediction)
    return any(pred == anls_norm(ref) for ref in references)


def _relaxed_decimal(text: str) -> Decimal | None:
    """A relaxed-accuracy number as a Decimal, its written precision kept ("10.50" has two
    places); the same strings `relaxed_float` reads, a trailing "%" dividing by 100."""
    percent = text.endswith("%")
    try:
        value = Decimal(text.rstrip("%") if percent else text)
    except (InvalidOperation, ValueError):
        return None
    if not value.is_finite():
        return None
    return value.scaleb(-2) if percent else value


def _at_precision_of(pred: Decimal, ref: Decimal) -> bool:
    try:
        quantum = Decimal(1).scaleb(ref.as_tuple().exponent)  # type: ignore[arg-type]
        return pred.quantize(quantum, rounding=ROUND_HALF_UP) == ref
    except InvalidOperation:  # more digits than the context holds: no agreement to show
        return False


@training_rule(
    "relaxed_precision",
    protocols=("relaxed",),
    numbers="the answer rounded half up to the reference's written precision equals it",
    text="str.lower() equality, as the benchmark",
    zero_reference="text, as the benchmark",
    meaning="10.5 and 10.50 agree; 10.6, 105 for 100 and 2015 for 2020 do not",
)
def _relaxed_precision(prediction: str, references: Sequence[str], **_: Any) -> bool:
    pred = _relaxed_decimal(prediction)
    for ref in references:
        gold = _relaxed_decimal(ref)
        if pred is not None and gold:  # as the benchmark: a zero target compares as text
            if _at_precision_of(pred, gold):
                return True
        elif prediction.lower() == ref.lower():
            return True
    return False


# The rule of each protocol not named here is `benchmark`.
DEFAULT_TRAINING_RULES: dict[str, str] = {"anls": "anls_exact", "relaxed": "relaxed_precision"}


@dataclass(frozen=True)
class TrainingPolicy:
    """Which training rule decides an item: its family's (overriding), else its
    protocol's, else `benchmark`. Built from the settings (`Settings.training_policy`)."""

    by_protocol: Mapping[str, str] = field(default_factory=lambda: dict(DEFAULT_TRAINING_RULES))
    by_family: Mapping[str, str] = field(default_factory=dict)

    def rule_for(self, family: str, protocol: str) -> str:
        name = self.by_family.get(family) or self.by_protocol.get(protocol) or "benchmark"
        rule = TRAINING_RULES.get(name)
        if rule is None:
            raise ValueError(f"unknown training rule {name!r}; known: {sorted(TRAINING_RULES)}")
        if rule.protocols is not None and protocol not in rule.protocols:
            raise ValueError(
                f"the training rule {name!r} judges only {list(rule.protocols)}; the family "
                f"{family!r} is scored by {protocol!r}"
            )
        return name


def check_training_rules(by_protocol: Mapping[str, str], by_family: Mapping[str, str]) -> None:
    """A clear error for a rule that does not exist, or is set on a protocol it cannot
    judge (a family's protocol is known only per item: `TrainingPolicy.rule_for`)."""
    for where, rules in (("protocol", by_protocol), ("family", by_family)):
        for key, name in rules.items():
            rule = TRAINING_RULES.get(name)
            if rule is None:
                raise ValueError(
                    f"the {where} {key!r} names an unknown training rule {name!r}; known: "
                    f"{sorted(TRAINING_RULES)}"
                )
            if where == "protocol" and key not in PROTOCOLS:
                raise ValueError(f"training rule for an unknown protocol {key!r}")
            if where == "protocol" and rule.protocols is not None and key not in rule.protocols:
                raise ValueError(
                    f"the training rule {name!r} judges only {list(rule.protocols)}, not {key!r}"
                )


def training_rules_view() -> dict[str, dict[str, Any]]:
    """Every training rule with its constants and the protocols it judges (the card)."""
    return {
        name: {"protocols": list(r.protocols or []), "constants": r.constants}
        for name, r in sorted(TRAINING_RULES.items())
    }


# --- the decision ----------------------------------------------------------------------


_PARAGRAPH_BREAK = re.compile(r"\n\s*\n")


def _forms(prediction: str) -> Iterator[tuple[str, str]]:
    """whole, first_line, first_paragraph: stripped, repeats skipped, computed lazily."""
    text = (prediction or "").strip()
    yield "whole", text
    if "\n" not in text:
        return
    first_line = text.split("\n", 1)[0].strip()
    if first_line != text:
        yield "first_line", first_line
    first_paragraph = _PARAGRAPH_BREAK.split(text, maxsplit=1)[0].strip()
    if first_paragraph != text and first_paragraph != first_line:
        yield "first_paragraph", first_paragraph


def variants(prediction: str) -> list[tuple[str, str]]:
    """The forms of a prediction that are tried, in order, without repeats."""
    return list(_forms(prediction))


def verify(
    protocol: str,
    prediction: str,
    references: Sequence[str],
    *,
    training: str | None = None,
    **options: Any,
) -> Decision:
    """Score every variant; accept on the first that reaches the protocol's threshold.
    `training`: a training rule's name (`TRAINING_RULES`); the decision then also records
    training acceptance: the first variant the benchmark passes that the rule accepts."""
    proto = PROTOCOLS[protocol]
    best = 0.0
    decision = None
    for name, form in _forms(prediction):
        score = float(proto.fn(form, references, **options))
        if score >= proto.threshold:
            decision = _decision(proto, accepted=True, score=score, variant=name)
            break
        best = max(best, score)
    if decision is None:
        decision = _decision(proto, accepted=False, score=best, variant=None)
    if training is None:
        return decision
    rule = TRAINING_RULES[training]
    variant = None
    if decision.accepted:
        if rule.name == "benchmark":
            variant = decision.variant
        else:
            variant = next(
                (
                    name
                    for name, form in _forms(prediction)
                    if proto.fn(form, references, **options) >= proto.threshold
                    and rule.fn(form, references, **options)
                ),
                None,
            )
    return decision.model_copy(
        update={"training": _training_decision(rule.name, variant is not None, variant)}
    )


@functools.lru_cache(maxsize=1 << 10)
def _training_decision(rule: str, accepted: bool, variant: str | None) -> TrainingDecision:
    return TrainingDecision(
        rule=rule,
        constants=TRAINING_RULES[rule].constants,
        accepted=accepted,
        variant=variant,
    )


def _decision(proto: Protocol, *, accepted: bool, score: float, variant: str | None) -> Decision:
    return _decision_for(proto.name, proto.version, accepted, score, variant)


@functools.lru_cache(maxsize=1 << 14)
def _decision_for(
    name: str, version: str, accepted: bool, score: float, variant: str | None
) -> Decision:
    """Decisions are frozen and most repeat (alnum has four), so equal ones are built once;
    validation was a third of a decision's cost. Keyed by version: re-registering a
    protocol under a new version never returns a stale decision."""
    proto = PROTOCOLS[name]
    return Decision(
        protocol=proto.name,
        version=proto.version,
        constants=proto.constants,
        accepted=accepted,
        score=score,
        variant=variant,
        threshold=proto.threshold,
    )


# The form a protocol reads an answer as: two answers with the same form are the same
# answer to it (best-of-n's `distinct`, rsieve.compact.settle). Each is the protocol's own
# normalisation; a protocol without one (math: equivalence, not a form) has none.
_CANONICAL: dict[str, Callable[[str, dict[str, str] | None], str | None]] = {
    "alnum": lambda text, _: alnum_norm(text),
    "exact": lambda text, _: _normalise(text),
    "anls": lambda text, _: anls_norm(text),
    "vqa": lambda text, _: vqa_norm(text),
    "number": lambda text, _: None if (n := parse_number(text)) is None else repr(n),
    "relaxed": lambda text, _: (
        text.strip().lower() if (f := relaxed_float(text)) is None else repr(f)
    ),
    "mc": lambda text, options: extract_letter(text, options),
}


def canonical(protocol: str, answer: str, options: dict[str, str] | None = None) -> str | None:
    """The answer in the protocol's normal form; None when the protocol has none or the
    answer has no such form (no number, no letter)."""
    form = _CANONICAL.get(protocol)
    return form(answer, options) if form is not None else None
