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

import functools
import re
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Protocol

import numpy as np

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
TRACE_CHECKS_VERSION = "2"


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
    # With its punctuation and full-width forms (。，：), which only CJK text uses.
    "cjk": "\u3000-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uff00-\uffef",
    "hangul": "\u1100-\u11ff\uac00-\ud7af",
    "arabic": "\u0600-\u06ff",
    "hebrew": "\u0590-\u05ff",
    "devanagari": "\u0900-\u097f",
    "thai": "\u0e00-\u0e7f",
}
# Runs of letters of the other scripts: one scan finds them all (a class, not an
# alternation of classes, which sre tries one by one at every position), and each run is
# then told its script; a run that joins two scripts is split by `_OTHER_RUN_NAMED`.
_OTHER_RUN = re.compile(
    "[" + "".join(chars for name, chars in _SCRIPTS.items() if name != "latin") + "]+"
)
_OTHER_SCRIPT = {
    name: re.compile(f"[{chars}]+") for name, chars in _SCRIPTS.items() if name != "latin"
}
# Each code point of the Basic Multilingual Plane's script, by index into _SCRIPT_NAMES.
_SCRIPT_NAMES = ("", *_SCRIPTS)
_SCRIPT_OF_CHAR = bytearray(0x10000)
for _index, _chars in enumerate(_SCRIPTS.values(), start=1):
    for _range in re.findall(r"(.)-(.)", _chars):
        _SCRIPT_OF_CHAR[ord(_range[0]) : ord(_range[1]) + 1] = bytes([_index]) * (
            ord(_range[1]) - ord(_range[0]) + 1
        )
_OTHER_RUN_NAMED = re.compile(
    "|".join(f"(?P<{name}>[{chars}]+)" for name, chars in _SCRIPTS.items() if name != "latin")
)
_IDEOGRAPHIC = f"{_SCRIPTS['cjk']}{_SCRIPTS['hangul']}"
# The same as numpy tables over the Basic Multilingual Plane: each code point's script
# (an index into _SCRIPT_NAMES, 0: none), and whether `str.split` splits on it.
_SCRIPT_TABLE = np.frombuffer(bytes(_SCRIPT_OF_CHAR), dtype=np.uint8)
_LATIN = _SCRIPT_NAMES.index("latin")
_IDEOGRAPHIC_TABLE = np.isin(
    _SCRIPT_TABLE, [_SCRIPT_NAMES.index("cjk"), _SCRIPT_NAMES.index("hangul")]
)
_SPACE_TABLE = np.array([chr(c).isspace() for c in range(0x10000)], dtype=bool)
# A unit of at most 8 characters repeated 16 times or more in a row ("hahaha…", "!!!!…"),
# looked for only inside runs of 16 or more characters without a space or an ideograph
# (a loop of ideographs is a loop of tokens, which the spans count).
_CHAR_LOOP = re.compile(r"(.{1,8}?)\1{15,}", re.DOTALL)
_CHAR_LOOP_MIN = 16
# Polynomial hashing mod 2**64 (uint64 arithmetic wraps): of a word's code points, then
# of a span's word hashes (an odd base, so that it has an inverse: a run's hash is read
# off prefix sums). Two different words or
# spans share a hash with a chance of about one in 2**64 per pair.
_HASH_BASE = 0x9E3779B97F4A7C15

# The two phrase checks run their full patterns only around anchors found by plain
# substring search of the lowercased trace (an alternation tried at every position of a
# long trace would cost more than all the other checks together).
# Every guessing phrase contains one of these, at most `_GUESS_BEFORE` characters into it
# ("I will have to guess"), and is shorter than `_GUESS_WINDOW`. English and Chinese.
_GUESS_ANCHORS = ("n't", "not", "unable", "without", "no ", "guess", "看不", "无法", "没有", "猜")
_GUESS_BEFORE, _GUESS_WINDOW = 16, 96
_GUESSING = re.compile(
    r"(?:can ?not|can't|unable to|not able to|don't|do not|couldn't|could not)"
    r" (?:see|view|read|access|make out|open|load|perceive) (?:the |this |any |an )?"
    r"(?:image|picture|photo|figure|chart|diagram)"
    r"|(?:no |without (?:the |an |seeing the |access to the )?)(?:image|picture) (?:is |was )?"
    r"(?:provided|attached|available|given|shown)"
    r"|without (?:seeing|viewing|looking at) the (?:image|picture)"
    r"|i(?:'m| am) (?:just |only )?guessing|i(?:'ll| will) (?:just |have to )?guess"
    r"|(?:a |my |random |best |educated |blind )guess\b"
    r"|(?:看不到|看不清|看不见|无法看到|无法看清|无法查看|无法读取|无法识别)(?:这张|这个|该)?"
    r"(?:图片|图像|图)"
    r"|没有(?:提供|给出|附上)?(?:图片|图像)"
    r"|我(?:只能|只好)?猜|只能猜"
)

_CONCLUSION_ANCHOR = re.compile(
    "boxed|answer|word|text|number|option|choice|result|value|total|label|答案"
)
# The last conclusion is nearly always in the trace's last lines: they are searched first.
_CONCLUSION_TAIL = 512
_END = r"(?=\.\s|\.$|[\n;!?]|,\s|$)"
_END_ZH = r"(?=[。，；！？\n]|\.\s|\.$|$)"
# Matched at an anchor of the trace (not searched): the anchor is the pattern's start.
_CONCLUSION = re.compile(
    r"boxed\{(?P<boxed>[^{}]{1,200})\}"
    r"|(?:answer|word|text|number|option|choice|result|value|total|label)"
    r"\s*(?:is|are|was|would be|should be|must be|reads|says|=|:)\s*:?\s*"
    rf"(?P<stated>[^\n]{{1,200}}?){_END}"
    r"|答案(?:应该|应|就)?(?:是|为|:|：)\s*"
    rf"(?P<zh>[^\n]{{1,200}}?){_END_ZH}",
    re.IGNORECASE,
)
_QUOTES = " \t\"'`*_“”‘’«»「」()[]"
_WORDS = re.compile(r"\w+")


@functools.lru_cache(maxsize=8)
def _points(text: str) -> np.ndarray:
    """`text`'s code points (uint32, read-only), cached: several checks read them."""
    if text.isascii():
        points = np.frombuffer(text.encode("ascii"), dtype=np.uint8).astype(np.uint32)
    else:
        points = np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype=np.uint32)
    points.flags.writeable = False
    return points


def _bmp(points: np.ndarray) -> np.ndarray:
    """Indexes into the per-code-point tables (beyond the BMP: U+FFFF, no script, no space)."""
    return np.minimum(points, 0xFFFF)


def _letters(text: str) -> tuple[str | None, list[tuple[str, str]]]:
    """The script most of `text`'s letters are written in (None: no letters), and, when it
    holds letters of a script other than that one and Latin, its runs of letters in
    scripts other than Latin, each with its script's name (else none: nothing to find)."""
    scripts = _SCRIPT_TABLE[_bmp(_points(text))]
    counts = np.bincount(scripts, minlength=len(_SCRIPT_NAMES))
    counts[0] = 0
    own = int(counts.argmax())
    main = _SCRIPT_NAMES[own] if counts[own] else None
    if not ((scripts > _LATIN) & (scripts != own)).any():
        return main, []
    runs: list[tuple[str, str]] = []
    for run in _OTHER_RUN.findall(text):
        name = _SCRIPT_NAMES[_SCRIPT_OF_CHAR[ord(run[0])]]
        if _OTHER_SCRIPT[name].fullmatch(run):
            runs.append((name, run))
        else:
            runs.extend((m.lastgroup or "", m.group()) for m in _OTHER_RUN_NAMED.finditer(run))
    return main, runs


def script_of(text: str) -> str | None:
    """The script most of `text`'s letters are written in (None: no letters)."""
    if text.isascii():
        return "latin" if any(c.isalpha() for c in text) else None
    return _letters(text)[0]


@functools.lru_cache(maxsize=4)
def _powers(size: int) -> tuple[np.ndarray, np.ndarray]:
    """_HASH_BASE**i and its inverse**i mod 2**64, i < size."""
    tables = []
    for base in (_HASH_BASE, pow(_HASH_BASE, -1, 2**64)):
        table = np.full(size, base, dtype=np.uint64)
        table[0] = 1
        tables.append(np.cumprod(table, out=table))
    return tables[0], tables[1]


def _tokens(trace: str) -> tuple[np.ndarray, list[str]]:
    """The trace's tokens as 64-bit hashes, and its runs of `_CHAR_LOOP_MIN` characters or
    more without a space or an ideograph (where a loop of characters may be). Tokens are
    its words (as `str.split` splits them) or, in a trace with an ideograph (scripts
    written without spaces repeat per character), every character that is not a space.
    All in numpy: a word's hash is a polynomial one over its code points, read off the
    trace's prefix sums."""
    points = _points(trace)
    ascii = trace.isascii()
    index = points if ascii else _bmp(points)
    space = _SPACE_TABLE[index]
    ideographic = _IDEOGRAPHIC_TABLE[index] if not ascii else np.zeros(len(points), dtype=bool)
    starts, ends = _runs(~space & ~ideographic)
    long = (
        [
            trace[a:e]
            for a, e in zip(starts.tolist(), ends.tolist(), strict=True)
            if e - a >= _CHAR_LOOP_MIN
        ]
        if len(starts) and int((ends - starts).max()) >= _CHAR_LOOP_MIN
        else []
    )
    if ideographic.any():
        return points[~space].astype(np.uint64), long
    if not len(starts):
        return np.empty(0, dtype=np.uint64), []
    n = len(points)
    powers, inverses = _powers(1 << max(12, n.bit_length()))
    prefix = np.zeros(n + 1, dtype=np.uint64)
    np.cumsum((points + np.uint64(1)) * powers[:n], out=prefix[1:])
    return (prefix[ends] - prefix[starts]) * inverses[starts], long


def _runs(mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Where each run of True in `mask` starts and ends (exclusive)."""
    padded = np.concatenate(([False], mask, [False])).view(np.int8)
    edges = padded[1:] - padded[:-1]  # np.diff, without its per-call overhead
    return np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)


def repeated_share(trace: str, span: int) -> float:
    """The share of `trace` covered by repeats of its most repeated span: the most frequent
    run of `span` tokens (its occurrences after the first x `span` over the tokens, up to
    1: a trace that says a thing once repeats nothing), or the characters in loops of one
    short unit ("hahaha...", "!!!!..."; `_CHAR_LOOP`), whichever is larger. Spans are
    counted by hash in numpy."""
    tokens, unspaced = _tokens(trace)
    share = 0.0
    n = len(tokens) - span + 1
    if len(tokens) >= 2 * span:
        # Each span's polynomial hash over its tokens, read off their prefix sums.
        powers, inverses = _powers(1 << max(12, len(tokens).bit_length()))
        prefix = np.zeros(len(tokens) + 1, dtype=np.uint64)
        np.cumsum(tokens * powers[: len(tokens)], out=prefix[1:])
        spans = (prefix[span:] - prefix[:n]) * inverses[:n]
        spans.sort()
        # The longest run of one value in the sorted hashes: its occurrences.
        bounds = np.concatenate(([-1], np.flatnonzero(spans[1:] != spans[:-1]), [n - 1]))
        most = int((bounds[1:] - bounds[:-1]).max())
        share = min(1.0, (most - 1) * span / len(tokens))
    if share < 1.0:
        looped = sum(m.end() - m.start() for run in unspaced for m in _CHAR_LOOP.finditer(run))
        share = max(share, looped / len(trace)) if looped else share
    return share


def mixed_run(trace: str, allowed: str, min_chars: int) -> str | None:
    """The first run of `min_chars` or more characters in a script other than the trace's
    own (Latin in a non-Latin trace excepted) that `allowed` (the question, references and
    options) does not contain; None when there is none."""
    if trace.isascii():
        return None
    own, runs = _letters(trace)
    return _foreign_run(own, runs, allowed, min_chars)


def _foreign_run(
    own: str | None, runs: Sequence[tuple[str, str]], allowed: str, min_chars: int
) -> str | None:
    for name, run in runs:
        if name != own and len(run) >= min_chars and run not in allowed:
            return run
    return None


@functools.lru_cache(maxsize=8)
def _lowered(trace: str) -> str:
    """`trace` lowercased with its positions kept (a letter whose lowercase is longer, as
    U+0130's, stays as it is), and a typographic apostrophe as ' (can\u2019t)."""
    low = trace.lower()
    if len(low) != len(trace):
        low = "".join(c.lower() if len(c.lower()) == 1 else c for c in trace)
    return low.replace("\u2019", "'")


def _word_start(text: str, at: int) -> bool:
    """Whether a phrase may start at `at`: not inside a word (scripts written without
    spaces have no word starts to keep to)."""
    return at == 0 or not text[at].isascii() or not text[at - 1].isalnum()


def guessing_phrase(trace: str) -> str | None:
    """The phrase by which the trace says it cannot see the image or guesses, if any."""
    low = _lowered(trace)
    for anchor in _GUESS_ANCHORS:
        at = low.find(anchor)
        while at >= 0:
            start = max(0, at - _GUESS_BEFORE)
            for match in _GUESSING.finditer(low, start, at + _GUESS_WINDOW):
                if match.start() > at:
                    break
                if match.end() > at and _word_start(low, match.start()):
                    return trace[match.start() : match.end()]
            at = low.find(anchor, at + 1)
    return None


def conclusion(trace: str) -> str | None:
    """The trace's last stated conclusion: a `\\boxed{}` or the X of "answer is X", "the
    word is X" and the like, without quotes or emphasis; None when it states none."""
    low = _lowered(trace)
    cut = max(0, len(low) - _CONCLUSION_TAIL)
    return _last_stated(trace, low, cut, len(low)) or _last_stated(trace, low, 0, cut)


def _last_stated(trace: str, low: str, start: int, end: int) -> str | None:
    """The last conclusion stated at an anchor that starts in [start, end)."""
    anchors = _CONCLUSION_ANCHOR.finditer(low, start, min(len(low), end + 8))
    for anchor in reversed([a for a in anchors if a.start() < end]):
        at = anchor.start()
        boxed = low[at - 1 : at] == "\\"
        if not (boxed or _word_start(low, at)):
            continue
        if match := _CONCLUSION.match(trace, at):
            stated = match.group("boxed") or match.group("stated") or match.group("zh")
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


def _mixing(trace: str, item: Asked, min_chars: int) -> str | None:
    """Why the trace fails `language_mixing`, if it does."""
    if trace.isascii():
        runs: list[tuple[str, str]] = []
        wrote = script_of(trace)
    else:
        wrote, runs = _letters(trace)
    asked = script_of(item.question)
    if asked is not None and wrote is not None and asked != wrote:
        return f"language_mixing: the question is in {asked}, the trace in {wrote}"
    allowed = "\n".join([item.question, *item.references, *(item.options or {}).values()])
    if run := _foreign_run(wrote, runs, allowed, min_chars):
        return f"language_mixing: {script_of(run)} run {run[:40]!r} in a {wrote} trace"
    return None


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
            share = repeated_share(trace, limits.repetition_span)
            if share >= limits.repetition_max_share:
                reason = f"repetition: {share:.2f} of the trace is one repeated span"
        elif name == "language_mixing":
            reason = _mixing(trace, item, limits.mixing_min_chars)
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
