"""Cleaning rules: pool lines, image paths, image bytes, provenance, and clean items."""

from __future__ import annotations

import hashlib
import io
import json
import struct
import zlib
from typing import Any

import pytest
from PIL import Image, ImageFile

from rsieve.clean.cleaning import (
    POLICY_VERSION,
    clean_item,
    inspect_image,
    parse_line,
    pool_image_path,
)
from rsieve.clean.prompts import build_question
from rsieve.clean.provenance import verify_source
from rsieve.families import INSTRUCTIONS
from rsieve.schemas import Item, PoolItem, Quarantined

LIMIT = 200
GOOD: dict[str, Any] = {
    "id": "SynthWords-0001",
    "family": "SynthWords",
    "image": "images/w1.png",
    "question": "What word is shown?",
    "answer": "COFFEE",
    "source": {"generator": "test"},
}


def _line(**changes: Any) -> bytes:
    obj = {k: v for k, v in (GOOD | changes).items() if v is not _DROP}
    return json.dumps(obj).encode()


_DROP = object()


def _parse(raw: bytes, line: int = 3, limit: int = LIMIT) -> PoolItem | Quarantined:
    return parse_line(raw, line, text_max_chars=limit)


def _quarantined(result: PoolItem | Quarantined) -> Quarantined:
    assert isinstance(result, Quarantined), result
    assert result.stage == "clean"
    return result


# --- parse_line ------------------------------------------------------------------------


def test_parse_line_valid_keeps_fields_and_extras() -> None:
    item = _parse(_line(extra_field=1, options={"A": "cat", "B": "dog"}, protocol="mc"))
    assert isinstance(item, PoolItem)
    assert (item.id, item.family, item.image, item.question, item.answer) == (
        "SynthWords-0001",
        "SynthWords",
        "images/w1.png",
        "What word is shown?",
        "COFFEE",
    )
    assert item.options == {"A": "cat", "B": "dog"}
    assert item.protocol == "mc"


def test_parse_line_list_answer_is_valid() -> None:
    item = _parse(_line(answer=["two", "2"]))
    assert isinstance(item, PoolItem)
    assert item.answer == ["two", "2"]


def test_invalid_utf8() -> None:
    q = _quarantined(_parse(b'{"id": "x", "family": "F", "q": "\xff\xfe"}', line=7))
    assert (q.reason, q.line, q.id, q.family) == ("invalid_utf8", 7, None, None)


@pytest.mark.parametrize(
    "raw",
    [
        b'{"id": "a", "family": ',
        b"not json",
        b"[1, 2, 3]",
        b'[{"id": "a", "family": "F"}]',
        b'"a string"',
        b"42",
        b"null",
    ],
)
def test_invalid_json_including_non_objects(raw: bytes) -> None:
    q = _quarantined(_parse(raw, line=12))
    assert (q.reason, q.line, q.id, q.family) == ("invalid_json", 12, None, None)


def test_json_array_line_detail_names_the_type() -> None:
    q = _quarantined(_parse(b'["SynthWords-0001"]'))
    assert q.reason == "invalid_json"
    assert "list" in q.detail


@pytest.mark.parametrize(
    ("changes", "item_id", "family", "field"),
    [
        ({"question": _DROP}, "SynthWords-0001", "SynthWords", "question"),
        ({"answer": _DROP}, "SynthWords-0001", "SynthWords", "answer"),
        ({"image": _DROP}, "SynthWords-0001", "SynthWords", "image"),
        ({"image": ""}, "SynthWords-0001", "SynthWords", "image"),
        ({"id": _DROP}, None, "SynthWords", "id"),
        ({"id": 17}, None, "SynthWords", "id"),
        ({"family": _DROP}, "SynthWords-0001", None, "family"),
        ({"family": ["SynthWords"]}, "SynthWords-0001", None, "family"),
        ({"question": 5}, "SynthWords-0001", "SynthWords", "question"),
        ({"answer": 5}, "SynthWords-0001", "SynthWords", "answer"),
        ({"answer": ["a", 1]}, "SynthWords-0001", "SynthWords", "answer"),
        ({"options": ["cat", "dog"]}, "SynthWords-0001", "SynthWords", "options"),
        ({"source": 3}, "SynthWords-0001", "SynthWords", "source"),
    ],
)
def test_invalid_item_records_id_and_family_when_known(
    changes: dict[str, Any], item_id: str | None, family: str | None, field: str
) -> None:
    q = _quarantined(_parse(_line(**changes), line=4))
    assert (q.reason, q.line, q.id, q.family) == ("invalid_item", 4, item_id, family)
    assert field in q.detail


@pytest.mark.parametrize("question", ["", "   ", "\n\t "])
def test_empty_question(question: str) -> None:
    q = _quarantined(_parse(_line(question=question), line=9))
    assert (q.reason, q.line, q.id, q.family) == (
        "empty_question",
        9,
        "SynthWords-0001",
        "SynthWords",
    )


@pytest.mark.parametrize("answer", ["", "  ", [], ["two", " "], [""]])
def test_empty_answer_reference(answer: str | list[str]) -> None:
    q = _quarantined(_parse(_line(answer=answer), line=2))
    assert (q.reason, q.line, q.id, q.family) == (
        "empty_answer_reference",
        2,
        "SynthWords-0001",
        "SynthWords",
    )


@pytest.mark.parametrize(
    "changes",
    [
        {"question": "q" * (LIMIT + 1)},
        {"answer": "a" * (LIMIT + 1)},
        {"answer": ["a" * 150, "b" * 51]},
    ],
)
def test_text_too_long(changes: dict[str, Any]) -> None:
    q = _quarantined(_parse(_line(**changes), line=5))
    assert (q.reason, q.line, q.id, q.family) == (
        "text_too_long",
        5,
        "SynthWords-0001",
        "SynthWords",
    )
    assert str(LIMIT) in q.detail


def test_text_at_the_limit_passes() -> None:
    assert isinstance(_parse(_line(question="q" * LIMIT, answer=["a" * 100, "b" * 100])), PoolItem)


def test_question_checked_before_answer() -> None:
    q = _quarantined(_parse(_line(question=" ", answer="")))
    assert q.reason == "empty_question"


# --- pool_image_path -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("image", "expected"),
    [
        ("a.png", "a.png"),
        ("images/sub/a.png", "images/sub/a.png"),
        ("./images/a.png", "images/a.png"),
        ("images//a.png", "images/a.png"),
        ("images/x/../a.png", "images/a.png"),
    ],
)
def test_pool_image_path_normal(image: str, expected: str) -> None:
    assert pool_image_path(image) == expected


@pytest.mark.parametrize(
    "image",
    [
        "/etc/passwd",
        "/pool/a.png",
        "../a.png",
        "..",
        "images/../../a.png",
        "a/b/../../../etc/passwd",
        "\\server\\share\\a.png",
        "images\\a.png",
        "..\\a.png",
        "C:a.png",
        "C:/images/a.png",
        "c:\\images\\a.png",
        ".",
        "images/..",
        "",
    ],
)
def test_pool_image_path_refuses_escapes(image: str) -> None:
    assert pool_image_path(image) is None


def test_pool_image_path_allows_names_starting_with_two_dots() -> None:
    assert pool_image_path("..hidden/a.png") == "..hidden/a.png"


# --- inspect_image ---------------------------------------------------------------------


def _png(size: tuple[int, int] = (8, 6), mode: str = "RGB") -> bytes:
    buf = io.BytesIO()
    Image.new(mode, size, 0).save(buf, "PNG")
    return buf.getvalue()


def _png_header_only(width: int, height: int) -> bytes:
    """A PNG that declares width x height, with pixel data that cannot decode."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        crc = zlib.crc32(kind + body) & 0xFFFFFFFF
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", crc)

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", ihdr)
        + chunk(b"IDAT", b"garbage")
        + chunk(b"IEND", b"")
    )


def test_valid_png_passes() -> None:
    data = _png()
    assert inspect_image(data, max_pixels=48, max_bytes=len(data)) is None


def test_truncated_png_is_unreadable() -> None:
    data = _png((64, 64), "RGB")
    problem = inspect_image(data[: len(data) // 2], max_pixels=10**6, max_bytes=10**6)
    assert problem is not None and problem[0] == "unreadable_image"


@pytest.mark.parametrize(
    "data", [b"", b"\x00" * 100, bytes(range(256)) * 4, hashlib.sha256(b"seed").digest() * 50]
)
def test_random_bytes_are_unreadable(data: bytes) -> None:
    problem = inspect_image(data, max_pixels=10**6, max_bytes=10**6)
    assert problem is not None and problem[0] == "unreadable_image"


def test_corrupt_pixel_data_is_unreadable_when_small() -> None:
    problem = inspect_image(_png_header_only(10, 10), max_pixels=10**6, max_bytes=10**6)
    assert problem is not None and problem[0] == "unreadable_image"


def test_header_over_pixel_limit_is_too_large_without_decoding(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    data = _png((5000, 5000), "L")  # one colour: compresses to a few tens of kB
    assert len(data) < 100_000

    def no_decode(self: ImageFile.ImageFile) -> None:
        raise AssertionError("pixels decoded before the pixel limit was checked")

    monkeypatch.setattr(ImageFile.ImageFile, "load", no_decode)
    problem = inspect_image(data, max_pixels=1_000_000, max_bytes=10**6)
    assert problem is not None
    assert problem[0] == "image_too_large"
    assert "5000x5000" in problem[1]


def test_header_over_pixel_limit_wins_over_undecodable_pixels() -> None:
    problem = inspect_image(_png_header_only(5000, 5000), max_pixels=1_000_000, max_bytes=10**6)
    assert problem is not None and problem[0] == "image_too_large"


def test_decompression_bomb_header_is_too_large() -> None:
    # Beyond PIL's own bomb limit: refused at open, even with a generous max_pixels.
    problem = inspect_image(_png_header_only(100_000, 100_000), max_pixels=10**12, max_bytes=10**6)
    assert problem is not None and problem[0] == "image_too_large"


def test_pixel_limit_is_inclusive() -> None:
    data = _png((10, 10))
    assert inspect_image(data, max_pixels=100, max_bytes=10**6) is None
    problem = inspect_image(data, max_pixels=99, max_bytes=10**6)
    assert problem is not None and problem[0] == "image_too_large"


def test_bytes_over_limit_is_too_large() -> None:
    data = _png()
    assert inspect_image(data, max_pixels=10**6, max_bytes=len(data)) is None
    problem = inspect_image(data, max_pixels=10**6, max_bytes=len(data) - 1)
    assert problem is not None
    assert problem[0] == "image_too_large"
    assert str(len(data)) in problem[1]


def test_byte_limit_checked_before_opening() -> None:
    problem = inspect_image(b"\x00" * 1000, max_pixels=10**6, max_bytes=10)
    assert problem is not None and problem[0] == "image_too_large"


# --- provenance: one decision (rsieve.clean.provenance.verify_source) -----------------------

IMAGE_SHA = hashlib.sha256(b"image bytes").hexdigest()
OTHER_SHA = hashlib.sha256(b"other bytes").hexdigest()


@pytest.mark.parametrize("policy", ["strict", "lenient"])
def test_provenance_sha_match(policy: str) -> None:
    source = {"sha256": IMAGE_SHA, "dataset": "x/y"}
    assert verify_source(source, IMAGE_SHA, policy, None) == (True, "sha256_match")


def test_provenance_sha_match_ignores_case() -> None:
    assert verify_source({"sha256": IMAGE_SHA.upper()}, IMAGE_SHA, "strict", None) == (
        True,
        "sha256_match",
    )


@pytest.mark.parametrize("policy", ["strict", "lenient"])
def test_provenance_sha_mismatch_is_refused(policy: str) -> None:
    admitted, check = verify_source({"sha256": OTHER_SHA}, IMAGE_SHA, policy, None)
    assert admitted is False
    assert check.startswith("sha256 mismatch")
    assert OTHER_SHA[:16] in check and IMAGE_SHA[:16] in check


@pytest.mark.parametrize("source", [{"dataset": "x/y", "row": 3}, "https://example.org/a.png"])
@pytest.mark.parametrize("policy", ["strict", "lenient"])
def test_provenance_source_without_hash_is_recorded(source: Any, policy: str) -> None:
    assert verify_source(source, IMAGE_SHA, policy, None) == (True, "recorded")


@pytest.mark.parametrize("source", [{"path": "coco/val2014/1.jpg"}, "s3://bucket/a.png"])
def test_provenance_location_nobody_resolved_strict_vs_lenient(source: Any) -> None:
    """A location the stage could not read proves nothing: strict refuses it."""
    admitted, check = verify_source(source, IMAGE_SHA, "strict", None)
    assert admitted is False and "unresolvable under strict policy" in check
    assert verify_source(source, IMAGE_SHA, "lenient", None) == (True, "unresolved")


@pytest.mark.parametrize("source", [None, {}, ""])
def test_provenance_no_source_strict_vs_lenient(source: Any) -> None:
    assert verify_source(source, IMAGE_SHA, "strict", None) == (False, "no_source")
    assert verify_source(source, IMAGE_SHA, "lenient", None) == (True, "no_source")


# --- clean_item ------------------------------------------------------------------------


def _pool_item(**changes: Any) -> PoolItem:
    return PoolItem.model_validate(GOOD | changes)


def _clean(item: PoolItem, line: int = 6) -> Item | Quarantined:
    return clean_item(
        item,
        line=line,
        image_sha256=IMAGE_SHA,
        provenance_check="recorded",
        policy="strict",
        pool_uri="s3://pools/p/",
    )


def test_clean_item_unknown_family_is_quarantined() -> None:
    q = _clean(_pool_item(id="x-1", family="NoSuchBench"), line=11)
    assert isinstance(q, Quarantined)
    assert (q.reason, q.line, q.id, q.family, q.stage) == (
        "unknown_protocol",
        11,
        "x-1",
        "NoSuchBench",
        "clean",
    )


def test_clean_item_unregistered_item_protocol_is_quarantined() -> None:
    q = _clean(_pool_item(protocol="telepathy"))
    assert isinstance(q, Quarantined) and q.reason == "unknown_protocol"


def test_clean_item_item_protocol_overrides_family() -> None:
    item = _clean(_pool_item(family="NoSuchBench", protocol="exact"))
    assert isinstance(item, Item) and item.protocol == "exact"
    item = _clean(_pool_item(family="SynthWords", protocol="anls", question="Who signed?"))
    assert isinstance(item, Item) and item.protocol == "anls"
    assert item.question == f"Who signed?\n{INSTRUCTIONS['anls']}"


def test_clean_item_fields_and_meta() -> None:
    pool = _pool_item(answer=["two", "2"], family="DocVQA", question="  How many?  ")
    item = _clean(pool, line=6)
    assert isinstance(item, Item)
    assert (item.id, item.line, item.family, item.protocol) == (
        "SynthWords-0001",
        6,
        "DocVQA",
        "anls",
    )
    assert item.references == ["two", "2"]
    assert item.pool_question == "  How many?  "
    assert item.question == f"How many?\n{INSTRUCTIONS['anls']}"
    assert item.image_sha256 == IMAGE_SHA
    assert item.clean_meta == {
        "pool": "s3://pools/p/",
        "line": 6,
        "source": {"generator": "test"},
        "provenance": "recorded",
        "policy": {"version": POLICY_VERSION, "provenance": "strict"},
    }


def test_clean_item_single_reference_becomes_a_list() -> None:
    item = _clean(_pool_item())
    assert isinstance(item, Item) and item.references == ["COFFEE"]


def test_clean_item_alnum_question_has_no_instruction() -> None:
    item = _clean(_pool_item(family="IIIT5K"))
    assert isinstance(item, Item)
    assert item.protocol == "alnum" and item.question == "What word is shown?"


def test_clean_item_appends_instruction_once() -> None:
    question = "Which animal is shown?\nA. cat\nB. dog"
    item = _clean(
        _pool_item(
            family="MMBench-sample-en",
            question=question,
            answer="A",
            options={"A": "cat", "B": "dog"},
        )
    )
    assert isinstance(item, Item)
    assert item.protocol == "mc"
    assert item.question == f"{question}\n{INSTRUCTIONS['mc']}"
    assert item.question.count(INSTRUCTIONS["mc"]) == 1
    assert item.options == {"A": "cat", "B": "dog"}
    # Cleaning the stored question again changes nothing.
    again = _clean(_pool_item(family="MMBench-sample-en", question=item.question, answer="A"))
    assert isinstance(again, Item)
    assert again.question == item.question


@pytest.mark.parametrize("protocol", sorted(INSTRUCTIONS))
def test_build_question_is_idempotent(protocol: str) -> None:
    once = build_question("  What is written here?  ", protocol)
    assert build_question(once, protocol) == once
    if INSTRUCTIONS[protocol]:
        assert once.endswith("\n" + INSTRUCTIONS[protocol])
        assert once.count(INSTRUCTIONS[protocol]) == 1
    else:
        assert once == "What is written here?"


def test_clean_item_vqa_family_is_cleaned() -> None:
    item = _clean(_pool_item(family="VQAv2", answer=["two", "2"], question="How many?"))
    assert isinstance(item, Item)
    assert item.protocol == "vqa"
    assert item.question == f"How many?\n{INSTRUCTIONS['vqa']}"


@pytest.mark.parametrize("fmt", ["PPM", "ICO", "PCX", "TGA"])
def test_formats_outside_the_accepted_ones_are_never_decoded(fmt: str) -> None:
    from PIL import Image

    from rsieve.images import IMAGE_FORMATS, ImageError, prepare_image

    buf = io.BytesIO()
    Image.new("RGB", (8, 8), "white").save(buf, format=fmt)
    assert fmt not in IMAGE_FORMATS
    problem = inspect_image(buf.getvalue(), max_pixels=10**6, max_bytes=10**6)
    assert problem is not None and problem[0] == "unreadable_image"
    with pytest.raises(ImageError):
        prepare_image(buf.getvalue(), max_side=64, max_pixels=10**6)
