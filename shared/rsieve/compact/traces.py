"""The trace gate (docs/traces.md): checks on the reasoning of every accepted answer that
has some, before it may enter `_RS_think`. Pure and CPU-only.

An accepted answer whose trace fails any check keeps its place in `_RS_nothink` (the
answer passed its protocol; the reasoning is what is unfit to train on) and never enters
`_RS_think`; its qa entry records every check run and why one failed. The checks follow
the filters published recipes describe (Qwen3's post-training drops repetition, guessing,
thinking-summary inconsistency and language mixing; DeepSeek-R1 and Qwen2.5-VL filter
mixed languages, repetition and length), with their constants in settings:

- `repetition`: the share of the trace covered by its most repeated span (a span of
  `TraceLimits.repetition_span` tokens, or a run of one short unit of characters) reaches
  `repetition_max_share`;
- `language_mixing`: the trace is written in another script than the question, or holds a
  run of at least `mixing_min_chars` characters of a script other than its own (Latin in
  a non-Latin trace excepted: numbers, units and names are written so) that neither the
  question, its references nor its options contain;
- `inconsistent`: the trace's last stated conclusion ("so the answer is X", "the word is
  X", `\\boxed{X}`) is not the final answer as the item's protocol reads answers;
- `guessing`: the trace says it cannot see or read the image, or that it guesses;
- `length`: the trace's length in characters lies more than `length_mads` scaled median
  absolute deviations (never less than `length_floor_chars`) from its family's median
  over the run's accepted traces; run only for a family with `length_min_traces` of them.
"""

from __future__ import annotations

import re
import statistics
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Protocol

from rsieve.schemas import TRACE_CHECKS, Outcome, TraceReport
from rsieve.settings import Settings
from rsieve.verify import PROTOCOLS, canonical

__all__ = [
    "TRACE_CHECKS_VERSION",
    "Asked",
    "AskedEntry",
    "LengthBand",
    "TraceLimits",
    "check_trace",
    "conclusion",
    "gate_outcome",
    "gate_summary",
    "guessing_phrase",
    "length_bands",
    "merge_lengths",
    "mixed_run",
    "repeated_share",
    "script_of",
    "trace_lengths",
]

# Bumped whenever a check's patterns change (a row records the version it was gated by).
TRACE_CHECKS_VERSION = "1"


class Asked(Protocol):
    """What the checks read of an item: an Item, or a published qa entry's fields
    (`AskedEntry`, rsieve.dataset.recheck)."""

    @property
    def question(self) -> str: ...
    @property
    def references(self) -> Sequence[str]: ...
    @property
    def options(self) -> dict[str, str] | None: ...
    @property
    def protocol(self) -> str: ...


@dataclass(frozen=True)
class AskedEntry:
    question: str
    references: Sequence[str]
    options: dict[str, str] | None
    protocol: str


@dataclass(frozen=True)
class TraceLimits:
    """The checks a run applies and their constants: its settings' trace_* fields
    (`TraceLimits.of`), where each is described and defaulted."""

    checks: tuple[str, ...]
    repetition_span: int
    repetition_max_share: float
    mixing_min_chars: int
    length_mads: float
    length_floor_chars: int
    length_min_traces: int

    @classmethod
    def of(cls, s: Settings) -> TraceLimits:
        """A run's limits from its settings (the trace_* fields)."""
        return cls(
            checks=tuple(c for c in TRACE_CHECKS if c in s.trace_checks),
            repetition_span=s.trace_repetition_span,
            repetition_max_share=s.trace_repetition_max_share,
            mixing_min_chars=s.trace_mixing_min_chars,
            length_mads=s.trace_length_mads,
            length_floor_chars=s.trace_length_floor_chars,
            length_min_traces=s.trace_length_min_traces,
        )

    @classmethod
    def of_gate(cls, gate: Mapping[str, Any]) -> TraceLimits:
        """The limits a run report's `trace_gate` (`gate_summary`) records."""
        return cls(checks=tuple(gate["checks"]), **gate["constants"])


@dataclass(frozen=True)
class LengthBand:
    """A family's accepted trace lengths (characters): what `length` compares with."""

    median: float
    low: float
    high: float
    traces: int

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


# Scripts by code point. Han and kana are one script (Japanese writes both); Latin covers
# the accented letters of the Latin alphabets.
_SCRIPTS = {
    "latin": "A-Za-z\u00c0-\u024f",
    "cyrillic": "\u0400-\u04ff",
    "greek": "\u0370-\u03ff",
    "cjk": "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff",
    "hangul": "\u1100-\u11ff\uac00-\ud7af",
    "arabic": "\u0600-\u06ff",
    "hebrew": "\u0590-\u05ff",
    "devanagari": "\u0900-\u097f",
    "thai": "\u0e00-\u0e7f",
}
_RUNS = {name: re.compile(f"[{chars}]+") for name, chars in _SCRIPTS.items()}
# Letters outside ASCII that belong to no script above (symbols, punctuation) are ignored.
_NON_LATIN_RUN = re.compile("|".join(f"[{c}]+" for n, c in _SCRIPTS.items() if n != "latin"))
_IDEOGRAPHIC = f"{_SCRIPTS['cjk']}{_SCRIPTS['hangul']}"
# Tokens: a word, or one ideograph (scripts written without spaces repeat per character).
_TOKEN = re.compile(f"[{_IDEOGRAPHIC}]|[^\\s{_IDEOGRAPHIC}]+")
# A unit of at most 8 characters repeated 16 times or more in a row ("hahaha…", "!!!!…").
_CHAR_LOOP = re.compile(r"(.{1,8}?)\1{15,}", re.DOTALL)
_CHAR_LOOP_MIN = 16

# The two phrase checks run their full patterns only around anchors (a word every phrase
# contains) found by one plain scan of the lowercased trace: an alternation tried at every
# position of a long trace would cost more than all the other checks together.
_GUESS_ANCHOR = re.compile("guess|image|picture|photo|figure|chart|diagram")
_GUESS_BEFORE, _GUESS_AFTER = 48, 24  # the window around an anchor the phrase may span
_GUESSING = re.compile(
    r"(?:can ?not|can't|unable to|not able to|don't|do not|couldn't|could not)"
    r" (?:see|view|read|access|make out|open|load|perceive) (?:the |this |any |an )?"
    r"(?:image|picture|photo|figure|chart|diagram)"
    r"|(?:no |without (?:the |an |seeing the |access to the )?)(?:image|picture) (?:is |was )?"
    r"(?:provided|attached|available|given|shown)"
    r"|without (?:seeing|viewing|looking at) the (?:image|picture)"
    r"|i(?:'m| am) (?:just |only )?guessing|i(?:'ll| will) (?:just |have to )?guess"
    r"|(?:a |my |random |best |educated |blind )guess\b"
)

_CONCLUSION_ANCHOR = re.compile(
    "boxed|answer|word|text|number|option|choice|result|value|total|label"
)
_END = r"(?=\.\s|\.$|[\n;!?]|,\s|$)"
# Matched at an anchor of the trace (not searched): the anchor is the pattern's start.
_CONCLUSION = re.compile(
    r"boxed\{(?P<boxed>[^{}]{1,200})\}"
    r"|(?:answer|word|text|number|option|choice|result|value|total|label)"
    r"\s*(?:is|are|was|would be|should be|must be|reads|says|=|:)\s*:?\s*"
    rf"(?P<stated>[^\n]{{1,200}}?){_END}",
    re.IGNORECASE,
)
_QUOTES = " \t\"'`*_“”‘’«»「」()[]"
_WORDS = re.compile(r"\w+")


def script_of(text: str) -> str | None:
    """The script most of `text`'s letters are written in (None: no letters)."""
    if text.isascii():
        return "latin" if any(c.isalpha() for c in text) else None
    counts = {name: sum(map(len, run.findall(text))) for name, run in _RUNS.items()}
    name, count = max(counts.items(), key=lambda kv: kv[1])
    return name if count else None


def _tokens(trace: str) -> list[str]:
    return trace.split() if trace.isascii() else _TOKEN.findall(trace)


def repeated_share(trace: str, span: int, at_least: float = 0.0) -> float:
    """The share of `trace` covered by repeats of its most repeated span: the most frequent
    run of `span` tokens (its occurrences after the first x `span` over the tokens, up to
    1: a trace that says a thing once repeats nothing), or the characters in loops of one
    short unit ("hahaha...", "!!!!..."; `_CHAR_LOOP`), whichever is larger.

    A share under `at_least` may come back as 0.0 (the spans were not counted)."""
    tokens = _tokens(trace)
    share = 0.0
    if len(tokens) >= 2 * span:
        # Each token of a span occurs at least as often as the span: when no token reaches
        # the count a share of `at_least` needs, no span does, and the spans are not
        # counted (both counts run in C; the tokens' is about a fifth of the spans').
        needed = at_least * len(tokens) / span + 1
        if max(Counter(tokens).values()) >= needed:
            grams = Counter(zip(*(tokens[k:] for k in range(span)), strict=False))
            share = min(1.0, (max(grams.values()) - 1) * span / len(tokens))
    # A loop of one unit without spaces is one long token (or, in scripts written without
    # spaces, a run of repeated tokens the spans above count).
    if share < 1.0 and tokens and len(max(tokens, key=len)) >= _CHAR_LOOP_MIN:
        looped = sum(
            m.end() - m.start()
            for token in tokens
            if len(token) >= _CHAR_LOOP_MIN
            for m in _CHAR_LOOP.finditer(token)
        )
        share = max(share, looped / len(trace))
    return share


def mixed_run(trace: str, allowed: str, min_chars: int) -> str | None:
    """The first run of `min_chars` or more characters in a script other than the trace's
    own (Latin in a non-Latin trace excepted) that `allowed` (the question, references and
    options) does not contain; None when there is none."""
    if trace.isascii():
        return None
    own = script_of(trace)
    for match in _NON_LATIN_RUN.finditer(trace):
        run = match.group()
        if len(run) < min_chars or run in allowed:
            continue
        if script_of(run) != own:
            return run
    return None


def _lowered(trace: str) -> str:
    """`trace` lowercased with its positions kept (a letter whose lowercase is longer, as
    U+0130's, stays as it is), and a typographic apostrophe as ' (can\u2019t)."""
    low = trace.lower()
    if len(low) != len(trace):
        low = "".join(c.lower() if len(c.lower()) == 1 else c for c in trace)
    return low.replace("\u2019", "'")


def _word_start(text: str, at: int) -> bool:
    return at == 0 or not text[at - 1].isalnum()


def guessing_phrase(trace: str) -> str | None:
    """The phrase by which the trace says it cannot see the image or guesses, if any."""
    low = _lowered(trace)
    searched = 0  # windows overlap: each position is tried once
    for anchor in _GUESS_ANCHOR.finditer(low):
        start = max(searched, anchor.start() - _GUESS_BEFORE)
        end = anchor.end() + _GUESS_AFTER
        for match in _GUESSING.finditer(low, start, end):
            if _word_start(low, match.start()) and match.start() <= anchor.start():
                return trace[match.start() : match.end()]
        searched = max(searched, anchor.start())
    return None


def conclusion(trace: str) -> str | None:
    """The trace's last stated conclusion: a `\\boxed{}` or the X of "answer is X", "the
    word is X" and the like, without quotes or emphasis; None when it states none."""
    low = _lowered(trace)
    for anchor in reversed(list(_CONCLUSION_ANCHOR.finditer(low))):
        at = anchor.start()
        boxed = low[at - 1 : at] == "\\"
        if not (boxed or _word_start(low, at)):
            continue
        if match := _CONCLUSION.match(trace, at):
            stated = match.group("boxed") or match.group("stated")
            stated = stated.strip(_QUOTES).rstrip(".").strip(_QUOTES)
            if stated:
                return stated
    return None


def _agrees(stated: str, answer: str, item: Asked) -> bool:
    """Whether `stated` is the final `answer` as the item's protocol reads answers: the same
    letter (multiple choice), the same normal form (rsieve.verify.canonical), or, for a
    protocol without one, a full score either way; failing those, the answer's words in
    order inside the statement ("the answer is 42 because ..." states 42). Not the
    protocol's pass mark: ANLS passes "SHOP" for "STOP", which a trace that concludes SHOP
    and answers STOP contradicts."""
    options = item.options
    if item.protocol == "mc":
        mine, theirs = canonical("mc", stated, options), canonical("mc", answer, options)
        return mine is None or theirs is None or mine == theirs
    mine = canonical(item.protocol, stated, options)
    theirs = canonical(item.protocol, answer, options)
    if mine is not None and mine == theirs:
        return True
    proto = PROTOCOLS.get(item.protocol)
    if (
        mine is None
        and proto is not None
        and (
            proto(stated, [answer], **(options or {})) >= 1.0
            or proto(answer, [stated], **(options or {})) >= 1.0
        )
    ):
        return True
    said = _WORDS.findall(stated.lower())
    words = _WORDS.findall(answer.lower())
    if not words:
        return True
    return any(said[k : k + len(words)] == words for k in range(len(said) - len(words) + 1))


def check_trace(
    trace: str,
    answer: str,
    item: Asked,
    limits: TraceLimits,
    band: LengthBand | None = None,
) -> TraceReport:
    """Every check of `limits.checks` on one accepted answer's trace: {check: passed} and,
    for each failed one, its reason. `length` runs only with the family's band."""
    checks: dict[str, bool] = {}
    reasons: list[str] = []
    for name in limits.checks:
        reason: str | None = None
        if name == "repetition":
            share = repeated_share(
                trace, limits.repetition_span, at_least=limits.repetition_max_share
            )
            if share >= limits.repetition_max_share:
                reason = f"repetition: {share:.2f} of the trace is one repeated span"
        elif name == "language_mixing":
            allowed = "\n".join([item.question, *item.references, *(item.options or {}).values()])
            asked, wrote = script_of(item.question), script_of(trace)
            if asked is not None and wrote is not None and asked != wrote:
                reason = f"language_mixing: the question is in {asked}, the trace in {wrote}"
            elif run := mixed_run(trace, allowed, limits.mixing_min_chars):
                reason = f"language_mixing: {script_of(run)} run {run[:40]!r} in a {wrote} trace"
        elif name == "inconsistent":
            stated = conclusion(trace)
            if stated is not None and not _agrees(stated, answer, item):
                reason = (
                    f"inconsistent: the trace concludes {stated[:80]!r}, "
                    f"the answer is {answer[:80]!r}"
                )
        elif name == "guessing":
            if phrase := guessing_phrase(trace):
                reason = f"guessing: {phrase!r}"
        elif name == "length":
            if band is None:
                continue
            n = len(trace)
            if not band.low <= n <= band.high:
                reason = (
                    f"length: {n} characters, outside {band.low:.0f}-{band.high:.0f} "
                    f"(median {band.median:.0f} of {band.traces} traces)"
                )
        else:
            raise ValueError(f"unknown trace check {name!r}; known: {list(TRACE_CHECKS)}")
        checks[name] = reason is None
        if reason is not None:
            reasons.append(reason)
    return TraceReport(checks=checks, reasons=reasons, version=TRACE_CHECKS_VERSION)


def trace_lengths(outcomes: Iterable[Mapping[str, Any]]) -> dict[str, list[int]]:
    """Per family, the length in characters of every accepted trace (best-of-n: every
    accepted sample's), from outcomes as the judge stores them (JSON: the compactor reads
    them unvalidated): what `length_bands` summarises."""
    lengths: dict[str, list[int]] = {}
    for head in outcomes:
        for o in [head, *((head.get("samples") or {}).get("others") or [])]:
            trace = o["generation"].get("reasoning") or ""
            if o["place"] == "accepted" and trace.strip():
                lengths.setdefault(o["generation"]["item"]["family"], []).append(len(trace))
    return lengths


def merge_lengths(parts: Iterable[Mapping[str, Sequence[int]]]) -> dict[str, list[int]]:
    """Several groups' `trace_lengths` as one."""
    merged: dict[str, list[int]] = {}
    for part in parts:
        for family, values in part.items():
            merged.setdefault(family, []).extend(values)
    return merged


def length_bands(
    lengths: Mapping[str, Sequence[int]], limits: TraceLimits
) -> dict[str, LengthBand]:
    """Each family's band of ordinary trace lengths: median +- `length_mads` x the median
    absolute deviation scaled to a normal's sigma (1.4826), the half-width never under
    `length_floor_chars`. A family with fewer than `length_min_traces` traces has none."""
    bands: dict[str, LengthBand] = {}
    for family, values in sorted(lengths.items()):
        if len(values) < limits.length_min_traces:
            continue
        median = statistics.median(values)
        mad = statistics.median(abs(v - median) for v in values)
        half = max(limits.length_mads * 1.4826 * mad, limits.length_floor_chars)
        bands[family] = LengthBand(
            median=median, low=max(0.0, median - half), high=median + half, traces=len(values)
        )
    return bands


def gate_outcome(outcome: Outcome, limits: TraceLimits, bands: Mapping[str, LengthBand]) -> Outcome:
    """`outcome` (and, best-of-n, each of its samples) with its trace report when it was
    accepted with reasoning; rejected answers and answers without reasoning unchanged."""

    def gated(o: Outcome) -> Outcome:
        trace = o.generation.reasoning or ""
        if o.place != "accepted" or not trace.strip() or not limits.checks:
            return o
        band = bands.get(o.generation.item.family)
        report = check_trace(trace, o.generation.answer or "", o.generation.item, limits, band)
        return o.model_copy(update={"trace": report})

    head = gated(outcome)
    if outcome.samples is None:
        return head
    others = [gated(o) for o in outcome.samples.others]
    return head.model_copy(
        update={"samples": outcome.samples.model_copy(update={"others": others})}
    )


def gate_summary(limits: TraceLimits, bands: Mapping[str, LengthBand]) -> dict[str, Any]:
    """What the run report (and the card) says of the gate: its checks, their constants,
    the patterns' version and each family's length band."""
    constants = asdict(limits)
    return {
        "checks": list(constants.pop("checks")),
        "constants": constants,
        "version": TRACE_CHECKS_VERSION,
        "length_bands": {family: band.as_dict() for family, band in sorted(bands.items())},
    }
