"""The family table: which protocol scores which benchmark family, and what the model is
told to append. One table; an item's `protocol` field overrides it."""

from __future__ import annotations

import re

__all__ = [
    "FAMILY_PROTOCOLS",
    "FULL_ANSWER_LISTS",
    "INSTRUCTIONS",
    "family_key",
    "full_answer_list",
    "protocol_for",
]

_ALNUM = [
    "OrandCar",
    "ORAND-CAR",
    "ORAND-CAR-A",
    "ORAND-CAR-B",
    "IIIT5K",
    "SVT",
    "IC13",
    "IC15",
    "CUTE80",
    "WordArt",
    "Total-Text",
    "SynthWords",
    "SynthAmounts",
]
_ANLS = ["DocVQA", "InfoVQA", "InfographicVQA", "ST-VQA"]
_RELAXED = ["ChartQA", "PlotQA"]
_VQA = ["VQAv2", "TextVQA", "VizWiz", "OK-VQA"]
_MC = ["MMBench", "ScienceQA", "AI2D", "SEED-Bench", "MMMU", "CCBench", "SynthChoice"]
_MATH = ["MathVista", "MathVerse", "GeoQA"]

FAMILY_PROTOCOLS: dict[str, str] = {
    family_name: protocol
    for protocol, names in (
        ("alnum", _ALNUM),
        ("anls", _ANLS),
        ("relaxed", _RELAXED),
        ("vqa", _VQA),
        ("mc", _MC),
        ("math", _MATH),
    )
    for family_name in names
}

# Families scored by VQA soft accuracy need their full list of human answers: under the
# official leave-one-out rule a single reference always scores 0, so a pool that gives such
# a family fewer answers is reported per family, not silently rejected.
FULL_ANSWER_LISTS: dict[str, int] = {"VQAv2": 10, "TextVQA": 10, "VizWiz": 10, "OK-VQA": 10}

# Appended to the pool question unless the question already carries it, so the stored
# question stays byte-identical to the prompt. Empty: the pool's wording is kept as is.
INSTRUCTIONS: dict[str, str] = {
    "alnum": "",
    "mc": "Answer with the option's letter from the given choices directly.",
    "anls": "Answer the question using a single word or phrase.",
    "relaxed": "Answer the question using a single word or phrase.",
    "vqa": "Answer the question using a single word or phrase.",
    "math": "",
    "exact": "",
    "number": "",
}


def family_key(family: str) -> str:
    return re.sub(r"[^a-z0-9]", "", family.lower())


_BY_KEY = {family_key(name): proto for name, proto in FAMILY_PROTOCOLS.items()}


def protocol_for(family: str, item_protocol: str | None = None) -> str | None:
    """The item's own protocol, else the family's, else None (never a guess).

    A family matches the table by its name with case and punctuation folded, or by its
    leading part ("MMBench-sample-en" is MMBench, "IC15" is IC15)."""
    if item_protocol:
        return item_protocol
    key = family_key(family)
    if key in _BY_KEY:
        return _BY_KEY[key]
    parts = re.split(r"[-_ ]", family)
    for n in range(len(parts) - 1, 0, -1):
        prefix = family_key("".join(parts[:n]))
        if prefix in _BY_KEY:
            return _BY_KEY[prefix]
    return None


_FULL_BY_KEY = {family_key(name): n for name, n in FULL_ANSWER_LISTS.items()}


def full_answer_list(family: str) -> int | None:
    """How many reference answers the family's protocol expects (None: any number).

    Matched like `protocol_for` (case and punctuation folded, or a leading part)."""
    key = family_key(family)
    if key in _FULL_BY_KEY:
        return _FULL_BY_KEY[key]
    parts = re.split(r"[-_ ]", family)
    for n in range(len(parts) - 1, 0, -1):
        prefix = family_key("".join(parts[:n]))
        if prefix in _FULL_BY_KEY:
            return _FULL_BY_KEY[prefix]
    return None
