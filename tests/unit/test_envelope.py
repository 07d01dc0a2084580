"""Stored stage outputs are sealed (rsieve.envelope): a reader tells an object as written
from a truncated, garbled or partly written one, in the bytes of its one GET; an object
written before seals is still read (and counted by the reader)."""

from __future__ import annotations

import hashlib
import json

import pytest

from rsieve.envelope import SEAL_KEY, CorruptOutput, Opened, open_envelope, seal
from rsieve.judge.calibration import CalibrationShard
from rsieve.schemas import Item, Quarantined, ShardOutput

OUT = ShardOutput(
    run="r-000000000000",
    shard="00000",
    stage="clean",
    lines=2,
    items=[
        Item(
            id="a",
            line=1,
            family="F",
            protocol="anls",
            question="What?",
            pool_question="What?",
            references=["A"],
            image_sha256="0" * 64,
            clean_meta={},
        )
    ],
    quarantined=[Quarantined(id="b", line=2, family="F", stage="clean", reason="invalid_json")],
)


def read(data: bytes) -> ShardOutput | CorruptOutput:
    """What a reader does (services/outputs.py, opened): the seal, then the model."""
    opened = open_envelope(data)
    if isinstance(opened, CorruptOutput):
        return opened
    try:
        return ShardOutput.model_validate_json(opened.body)
    except ValueError as exc:
        return CorruptOutput("invalid", str(exc))


def test_a_sealed_output_opens_to_its_body() -> None:
    body = OUT.model_dump_json().encode()
    stored = seal(body)
    assert json.loads(stored)[SEAL_KEY] == hashlib.sha256(body).hexdigest()
    assert open_envelope(stored) == Opened(body, sealed=True)
    # Still one JSON object: the models read it as stored (the seal is dropped).
    assert ShardOutput.model_validate_json(stored) == OUT
    assert open_envelope(seal(b"{}")) == Opened(b"{}")
    cal = CalibrationShard(run="r", shard="00000", size=1, rate=0.5, records=[])
    assert CalibrationShard.model_validate_json(seal(cal.model_dump_json().encode())) == cal


def test_every_truncation_is_corrupt() -> None:
    stored = seal(OUT.model_dump_json().encode())
    for cut in range(len(stored)):
        found = open_envelope(stored[:cut])
        assert isinstance(found, CorruptOutput), cut
        assert found.reason == "unparsable"


def test_every_garbled_byte_is_corrupt_or_harmless() -> None:
    """Any one byte changed: the reader sees a corrupt object, never another output."""
    stored = seal(OUT.model_dump_json().encode())
    reasons = set()
    for at in range(len(stored)):
        for flip in (0x01, 0x20):
            garbled = stored[:at] + bytes([stored[at] ^ flip]) + stored[at + 1 :]
            found = read(garbled)
            assert isinstance(found, CorruptOutput) or found == OUT, (at, garbled)
            if isinstance(found, CorruptOutput):
                reasons.add(found.reason)
    assert reasons == {"checksum", "unparsable", "invalid"}


def test_a_wrong_checksum_is_corrupt() -> None:
    body = OUT.model_dump_json().encode()
    other = seal(body.replace(b'"lines":2', b'"lines":3'))
    forged = other[: -len('"}') - 64] + hashlib.sha256(body).hexdigest().encode() + b'"}'
    found = open_envelope(forged)
    assert isinstance(found, CorruptOutput) and found.reason == "checksum"


def test_objects_written_before_seals_are_read_as_unsealed() -> None:
    legacy = OUT.model_dump_json().encode()
    assert open_envelope(legacy) == Opened(legacy, sealed=False)
    # An output rewritten by hand (json.dumps: spaces, the seal kept but no longer at the
    # end as written) is an unsealed object too; the model drops the stale seal.
    rewritten = json.dumps(json.loads(seal(legacy))).encode()
    opened = open_envelope(rewritten)
    assert isinstance(opened, Opened) and not opened.sealed
    assert ShardOutput.model_validate_json(opened.body) == OUT
    for garbage in (b"", b"[1, 2]", b"\xff\xfe", b"null"):
        found = open_envelope(garbage)
        assert isinstance(found, CorruptOutput) and found.reason == "unparsable"


def test_only_json_objects_are_sealed() -> None:
    with pytest.raises(ValueError):
        seal(b"[1]")
