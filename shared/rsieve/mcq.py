"""Multiple-choice normalisation: options flattened into prose become a lettered block and
the reference becomes the bare letter.

Pure. `normalise_mcq(question, answer, options)` returns an `McqResult` whose `status` says
what was done:

- `normalised`: options were found in prose ("Options: A cat, B dog", "(a) cat (b) dog",
  "choose from cat, dog or bird", inline "A. cat B. dog") or in the item's `options` field
  only, and are re-rendered as "A. cat\\nB. dog"; the reference is the bare letter.
- `lettered`: the question already holds a lettered block; the question is untouched
  (idempotence: a normalised question comes back `lettered`, never re-rendered); an
  option-text reference is still mapped to its letter.
- `ambiguous`: options were seen but cannot be read without a guess (letters out of
  order or repeated, a reference that names no option or several); nothing is changed.
- `none`: no options anywhere; nothing is changed.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass, field
from typing import Literal

__all__ = ["McqResult", "lettered_options", "normalise_mcq", "render_block"]

Status = Literal["normalised", "lettered", "ambiguous", "none"]

# Instructions that may trail the options; kept and re-appended after the block.
_TAIL = re.compile(
    r"\s*((?:please\s+)?answer\s+with\s+(?:the\s+)?(?:option'?s?|correct|letter)\b.*"
    r"|please\s+(?:choose|select)\s+(?:the\s+)?(?:correct|best)\s+(?:option|answer)\b.*)\Z",
    re.I | re.S,
)
# "Options:" / "Choices:" cue before lettered markers without punctuation ("A cat, B dog").
_CUE = re.compile(r"(?:^|[\s.?!:])(options|choices|answer choices|candidates)\s*:\s*", re.I)
# "choose from cat, dog or bird" / "select one of: x, y, z".
_CHOOSE = re.compile(
    r"\b(?:choose|select|pick)(?:\s+(?:one|the\s+answer|an?\s+answer))?\s+"
    r"(?:from|among|between|of)(?:\s+the\s+following)?\s*:?\s*(?P<list>[^?\n]+?)\s*[.?]?\s*\Z",
    re.I,
)


@dataclass(frozen=True)
class McqResult:
    question: str
    answer: str | list[str]
    status: Status
    pattern: str | None = None
    options: dict[str, str] = field(default_factory=dict)
    detail: str = ""

    def meta(self, question: str, answer: str | list[str]) -> dict[str, object] | None:
        """What `clean_meta["mcq"]` records (None when there were no options at all)."""
        if self.status == "none":
            return None
        meta: dict[str, object] = {"status": self.status, "pattern": self.pattern}
        if self.detail:
            meta["detail"] = self.detail
        if self.question != question or self.answer != answer:
            meta |= {
                "original_question": question,
                "original_answer": answer,
                "options": self.options,
            }
        return meta


def render_block(options: dict[str, str]) -> str:
    return "\n".join(f"{letter}. {text}" for letter, text in options.items())


def _fold(text: str) -> str:
    text = unicodedata.normalize("NFKC", text).casefold().strip()
    return re.sub(r"[\s.,;:!?'\"()\[\]]+", " ", text).strip()


def _map_reference(ref: str, options: dict[str, str]) -> str | None:
    """The letter a reference names: the letter itself ("b", "(B)", "B.") or the text of
    exactly one option. None when it names no option or several."""
    bare = re.fullmatch(r"\s*\(?([A-Za-z])[.)]?\s*", ref)
    by_text = [k for k, v in options.items() if _fold(v) == _fold(ref)]
    if bare and bare.group(1).upper() in options:
        letter = bare.group(1).upper()
        if by_text and by_text != [letter]:
            return None  # "B" is both a letter and the text of another option
        return letter
    if len(by_text) == 1:
        return by_text[0]
    # "B. dog" / "(B) dog": the letter and its own text
    lead = re.fullmatch(r"\s*\(?([A-Za-z])[.)]\s*(.+)", ref)
    if (
        lead
        and lead.group(1).upper() in options
        and (_fold(options[lead.group(1).upper()]) == _fold(lead.group(2)))
    ):
        return lead.group(1).upper()
    return None


def _map_answer(
    answer: str | list[str], options: dict[str, str]
) -> tuple[str | list[str] | None, str]:
    refs = [answer] if isinstance(answer, str) else list(answer)
    letters = {_map_reference(r, options) for r in refs}
    if None in letters:
        return None, "the reference names no option, or several"
    if len(letters) != 1:
        return None, f"the references name different options: {sorted(letters)}"  # type: ignore[type-var]
    return letters.pop(), ""


def _sequential(letters: list[str]) -> bool:
    return [c.upper() for c in letters] == [chr(ord("A") + i) for i in range(len(letters))]


def lettered_options(question: str) -> dict[str, str] | None:
    """The options of a question's lettered block (a line per option: `A. text`, `(B) text`,
    letters in order from A), None without one of at least two."""
    return _block_options(question)


def _block_options(question: str) -> dict[str, str] | None:
    lines = question.splitlines()
    found: dict[str, str] = {}
    for line in lines:
        m = re.match(r"^[ \t]*\(?([A-Z])[.)][ \t]+(.*\S)", line)
        if m and m.group(1) == chr(ord("A") + len(found)):
            found[m.group(1)] = m.group(2).strip()
        # any other line continues the option before it (multi-line options, code)
    return found if len(found) >= 2 else None


# Marker styles for options inline in prose, tried in order; each needs A first.
_MARKERS: list[tuple[str, re.Pattern[str], bool]] = [
    ("parenthesised", re.compile(r"(?:^|(?<=[\s,;:]))\(([A-Za-z])\)\s*"), False),
    ("inline_lettered", re.compile(r"(?:^|(?<=[\s,;:]))([A-Z])[.)]\s+"), False),
    ("options_prefix", re.compile(r"(?:^|(?<=[\s,;:]))([A-Z])\s+(?=\S)"), True),
]


def _split_markers(
    text: str, marker: re.Pattern[str], need_cue: bool
) -> tuple[str, dict[str, str]] | Literal["ambiguous"] | None:
    """(stem, options) when `text` ends in options A, B, .. marked by `marker`."""
    if need_cue:
        cue = _CUE.search(text)
        if cue is None:
            return None
        body_start = cue.end()
        stem = text[: cue.start()] + (
            text[cue.start() : cue.start() + 1] if text[cue.start()] in ".?!" else ""
        )
    else:
        body_start, stem = 0, ""
    hits = list(marker.finditer(text, body_start))
    start = next((i for i, m in enumerate(hits) if m.group(1) in "Aa"), None)
    if start is None:
        return None
    hits = hits[start:]
    chosen = [hits[0]]
    for m in hits[1:]:
        want = chr(ord(chosen[-1].group(1)) + 1)
        if m.group(1) == want:
            chosen.append(m)
        elif m.group(1).upper() in "ABCDEFGHIJ" and m.group(1).upper() < want.upper():
            return "ambiguous"  # letters repeat or run backwards
    if len(chosen) < 2:
        return None
    if not need_cue:
        stem = text[: chosen[0].start()]
        cue = _CUE.search(stem)
        if cue and not stem[cue.end() :].strip():
            stem = stem[: cue.start()] + (stem[cue.start()] if stem[cue.start()] in ".?!" else "")
    options: dict[str, str] = {}
    for i, m in enumerate(chosen):
        end = chosen[i + 1].start() if i + 1 < len(chosen) else len(text)
        value = text[m.end() : end].strip().rstrip(",;").strip()
        if not value:
            return "ambiguous"
        options[m.group(1).upper()] = value
    if len(chosen) < len([m for m in hits if m.group(1).upper() in "ABCDEFGHIJ"]):
        return "ambiguous"  # more markers than the sequence explains
    return stem.rstrip(), options


def _split_choose(text: str) -> tuple[str, dict[str, str]] | None:
    m = _CHOOSE.search(text)
    if m is None:
        return None
    items = [x.strip() for x in re.split(r"\s*(?:,|;|\bor\b|\band\b)\s*", m.group("list"))]
    items = [x for x in items if x]
    if len(items) < 2:
        return None
    stem = text[: m.start()].rstrip(" ,:;")
    return stem, {chr(ord("A") + i): x for i, x in enumerate(items)}


def normalise_mcq(
    question: str, answer: str | list[str], options: dict[str, str] | None = None
) -> McqResult:
    """Find options in the question (or the `options` field) and render them as a block."""
    block = _block_options(question)
    if block is not None:
        mapped, why = _map_answer(answer, block)
        if mapped is None:
            return McqResult(question, answer, "ambiguous", "lettered", block, why)
        return McqResult(question, mapped, "lettered", "lettered", block)
    tail_match = _TAIL.search(question)
    tail = tail_match.group(1).strip() if tail_match else ""
    body = question[: tail_match.start()] if tail_match else question
    body = re.sub(r"\s+", " ", body).strip()
    found: tuple[str, dict[str, str]] | None = None
    pattern = None
    for name, marker, need_cue in _MARKERS:
        split = _split_markers(body, marker, need_cue)
        if split == "ambiguous":
            return McqResult(
                question, answer, "ambiguous", name, {}, "option letters repeat or are out of order"
            )
        if split is not None:
            found, pattern = split, name
            break
    if found is None and (choose := _split_choose(body)) is not None:
        found, pattern = choose, "choose_from"
    if found is None and options:
        letters = sorted(options)
        if not _sequential(letters):
            return McqResult(
                question,
                answer,
                "ambiguous",
                "options_field",
                dict(options),
                "the options field is not lettered A, B, ..",
            )
        found, pattern = (body, {k.upper(): v for k, v in sorted(options.items())}), "options_field"
    if found is None:
        return McqResult(question, answer, "none")
    stem, opts = found
    mapped, why = _map_answer(answer, opts)
    if mapped is None:
        return McqResult(question, answer, "ambiguous", pattern, opts, why)
    parts = [stem.strip(), render_block(opts)] + ([tail] if tail else [])
    return McqResult("\n".join(p for p in parts if p), mapped, "normalised", pattern, opts)
