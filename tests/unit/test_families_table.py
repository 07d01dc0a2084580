"""The family table: which protocol scores which benchmark family."""

from __future__ import annotations

import pytest

from rsieve.families import FAMILY_PROTOCOLS, INSTRUCTIONS, family_key, protocol_for
from rsieve.verify import PROTOCOLS


@pytest.mark.parametrize(
    ("family", "protocol"),
    [
        ("OrandCar", "alnum"),
        ("ORAND-CAR-A", "alnum"),
        ("ORAND-CAR-B", "alnum"),
        ("IIIT5K", "alnum"),
        ("IC13", "alnum"),
        ("IC15", "alnum"),
        ("SVT", "alnum"),
        ("CUTE80", "alnum"),
        ("Total-Text", "alnum"),
        ("SynthWords", "alnum"),
        ("SynthAmounts", "alnum"),
        ("DocVQA", "anls"),
        ("InfographicVQA", "anls"),
        ("ST-VQA", "anls"),
        ("ChartQA", "relaxed"),
        ("PlotQA", "relaxed"),
        ("VQAv2", "vqa"),
        ("TextVQA", "vqa"),
        ("OK-VQA", "vqa"),
        ("MMBench", "mc"),
        ("MMBench-sample-en", "mc"),
        ("ScienceQA", "mc"),
        ("AI2D", "mc"),
        ("SynthChoice", "mc"),
        ("MathVista", "math"),
        ("GeoQA", "math"),
    ],
)
def test_protocol_for_table(family: str, protocol: str) -> None:
    assert protocol_for(family) == protocol


@pytest.mark.parametrize(
    ("family", "protocol"),
    [
        ("docvqa", "anls"),
        ("DOCVQA", "anls"),
        ("Doc_VQA", "anls"),
        ("orand car a", "alnum"),
        ("IC15_1811", "alnum"),
        ("ChartQA-human", "relaxed"),
        ("MathVista_testmini", "math"),
        ("SEED-Bench-2", "mc"),
    ],
)
def test_protocol_for_folds_case_punctuation_and_suffixes(family: str, protocol: str) -> None:
    assert protocol_for(family) == protocol


@pytest.mark.parametrize("family", ["NoSuchBench", "COCO-Captions", "", "VQA", "Doc", "sample-en"])
def test_protocol_for_unknown_is_none(family: str) -> None:
    assert protocol_for(family) is None


def test_item_protocol_overrides_table() -> None:
    assert protocol_for("DocVQA", "exact") == "exact"
    assert protocol_for("NoSuchBench", "number") == "number"
    assert protocol_for("DocVQA", None) == "anls"
    assert protocol_for("DocVQA", "") == "anls"


def test_family_key_folds_case_and_punctuation() -> None:
    assert family_key("ORAND-CAR-A") == "orandcara"
    assert family_key("Total Text_v2") == "totaltextv2"


def test_every_table_protocol_has_an_instruction_entry() -> None:
    assert set(FAMILY_PROTOCOLS.values()) <= set(INSTRUCTIONS)


def test_every_table_protocol_is_registered() -> None:
    assert set(FAMILY_PROTOCOLS.values()) - set(PROTOCOLS) == set()
