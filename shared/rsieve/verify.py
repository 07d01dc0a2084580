"""Verification protocols: one pure function per rule, registered by name.

A protocol is `(prediction: str, references: Sequence[str], **options) -> float` in [0, 1].
`verify()` tries the prediction whole, as its first line and as its first paragraph (the
card: a model that answers right and then explains is not penalised), and returns a
`Decision` that records protocol, version, constants, threshold, score and the variant
that matched, so any decision can be recomputed from what is stored.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from rapidfuzz.distance import Levenshtein

from rsieve.schemas import Decision

__all__ = ["PROTOCOLS", "Protocol", "protocol_versions", "register", "variants", "verify"]

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
    return 1.0 if any(pred == alnum_norm(ref) for ref in references) else 0.0


# --- exact and number -----------------------------------------------------------------


def _normalise(text: str) -> str:
    return " ".join(unicodedata.normalize("NFKC", text or "").casefold().split()).strip(" .")


@register("exact", version="1", normalisation="NFKC, casefold, collapse spaces, strip ' .'")
def exact(prediction: str, references: Sequence[str], **_: Any) -> float:
    pred = _normalise(prediction)
    return 1.0 if any(pred == _normalise(ref) for ref in references) else 0.0


_NUMBER = re.compile(r"^[-+]?(\d+(\.\d*)?|\.\d+)([eE][-+]?\d+)?$")


def parse_number(text: str) -> float | None:
    t = unicodedata.normalize("NFKC", text or "").strip().rstrip(".").replace(",", "")
    t = t.removesuffix("%").strip()
    if not _NUMBER.match(t):
        return None
    return float(t)


@register("number", version="1", rel_tol=1e-6, abs_tol=1e-9)
def number(prediction: str, references: Sequence[str], **_: Any) -> float:
    pred = parse_number(prediction)
    if pred is None:
        return 0.0
    for ref in references:
        gold = parse_number(ref)
        if gold is not None and abs(pred - gold) <= max(1e-9, 1e-6 * abs(gold)):
            return 1.0
    return 0.0


# --- anls: DocVQA / InfographicVQA ------------------------------------------------------


@register("anls", version="1", threshold=0.5, tau=0.5, normalisation="lower, collapse spaces")
def anls(prediction: str, references: Sequence[str], **_: Any) -> float:
    pred = " ".join(prediction.strip().lower().split())
    best = 0.0
    for ref in references:
        gold = " ".join(ref.strip().lower().split())
        dist = Levenshtein.normalized_distance(pred, gold)
        best = max(best, 1.0 - dist if dist < 0.5 else 0.0)
    return best


# --- relaxed: ChartQA relaxed accuracy --------------------------------------------------


@register("relaxed", version="1", rel_tol=0.05)
def relaxed(prediction: str, references: Sequence[str], **_: Any) -> float:
    pred = prediction.strip()
    for ref in references:
        gold_n, pred_n = parse_number(ref), parse_number(pred)
        if gold_n is not None and pred_n is not None:
            if gold_n == 0.0 and pred_n == 0.0:
                return 1.0
            if gold_n != 0.0 and abs(pred_n - gold_n) / abs(gold_n) <= 0.05:
                return 1.0
        elif pred.lower() == ref.strip().lower():
            return 1.0
    return 0.0


# --- mc: multiple-choice letter ----------------------------------------------------------

# Forms that state one letter as the answer. Extraction never guesses: text that names
# two different letters, or none, yields no letter (and goes to the judge).
_LETTER_FORMS = [
    re.compile(r"^\(?([A-Z])\)?[.:)]?$"),
    re.compile(r"^\(?([A-Z])[.:)]\s+\S.*$", re.S),
    re.compile(r"^(?:the\s+)?(?:correct\s+)?(?:answer|option|choice)(?:\s+is)?\s*[:：]?\s*"
               r"\(?([A-Z])\)?(?:[.:)]|\s|$)", re.I),
]


def extract_letter(prediction: str, options: dict[str, str] | None = None) -> str | None:
    text = unicodedata.normalize("NFKC", prediction or "").strip()
    letters = {m.group(1).upper() for form in _LETTER_FORMS if (m := form.match(text))}
    if options:
        letters &= {k.upper() for k in options} or letters
        by_text = {k.upper() for k, v in options.items() if _normalise(v) == _normalise(text)}
        letters |= by_text
    return letters.pop() if len(letters) == 1 else None


@register("mc", version="1", letter_forms=[f.pattern for f in _LETTER_FORMS])
def mc(prediction: str, references: Sequence[str], **options: Any) -> float:
    letter = extract_letter(prediction, options.get("options"))
    if letter is None:
        return 0.0
    return 1.0 if any(letter == ref.strip().strip("().").upper() for ref in references) else 0.0


# --- math: Math-Verify -----------------------------------------------------------------


@register("math", version="1", library="math-verify", order="gold parsed first")
def math(prediction: str, references: Sequence[str], **_: Any) -> float:
    from math_verify import parse
    from math_verify import verify as mv_verify

    target = parse(prediction, parsing_timeout=None)
    for ref in references:
        gold = parse(ref if "$" in ref else f"${ref}$", parsing_timeout=None)
        if gold and target and mv_verify(gold, target, timeout_seconds=None):
            return 1.0
    return 0.0


# --- the decision ----------------------------------------------------------------------


def variants(prediction: str) -> list[tuple[str, str]]:
    """The forms of a prediction that are tried, in order, without repeats."""
    text = (prediction or "").strip()
    first_line = text.split("\n", 1)[0].strip()
    first_paragraph = re.split(r"\n\s*\n", text, maxsplit=1)[0].strip()
    out: list[tuple[str, str]] = []
    for name, form in (("whole", text), ("first_line", first_line),
                       ("first_paragraph", first_paragraph)):
        if all(form != seen for _, seen in out):
            out.append((name, form))
    return out


def verify(
    protocol: str, prediction: str, references: Sequence[str], **options: Any
) -> Decision:
    """Score every variant; accept on the first that reaches the protocol's threshold."""
    proto = PROTOCOLS[protocol]
    best = 0.0
    for name, form in variants(prediction):
        score = float(proto(form, references, **options))
        if score >= proto.threshold:
            return _decision(proto, accepted=True, score=score, variant=name)
        best = max(best, score)
    return _decision(proto, accepted=False, score=best, variant=None)


def _decision(proto: Protocol, *, accepted: bool, score: float, variant: str | None) -> Decision:
    return Decision(
        protocol=proto.name,
        version=proto.version,
        constants=proto.constants,
        accepted=accepted,
        score=score,
        variant=variant,
        threshold=proto.threshold,
    )
