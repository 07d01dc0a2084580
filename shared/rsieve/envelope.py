"""Stored stage outputs, sealed: every stage output (runs/<run>/<stage>/<shard>.json) and
every calibration shard carries the sha256 of its body, so a reader tells an object as it
was written from a truncated, garbled or partly written one in the one GET it makes.

The seal is a last member of the JSON object, `"_sha256":"<hex>"`, the sha256 of the body
as it was before the member was added (`{...}` -> `{...,"_sha256":"<hex>"}`): the object
stays one JSON object (any S3-compatible store keeps it; `json.loads` and the models read
it, ShardOutput and CalibrationShard drop the member with `unseal`), and the body is the
stored bytes less the member, so verifying it needs no second serialisation.

`open_envelope` says what a reader holds: the body (`Opened`, `sealed` False for an object
written before seals: accepted when it is a JSON object, and the reader counts it), or
`CorruptOutput` with the reason: `checksum` (sealed, the body changed), `unparsable` (no
seal and not a JSON object: truncated, garbled, a partial write). A body that parses but
does not validate is the reader's `invalid`. Pure: bytes in, bytes out."""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from typing import Any

__all__ = ["SEAL_KEY", "CorruptOutput", "Opened", "open_envelope", "seal", "unseal"]

SEAL_KEY = "_sha256"
# The seal as `seal` writes it, at the very end of the object: a comma unless the body
# is `{}`.
_TRAILER = re.compile(rb',?"_sha256":"([0-9a-f]{64})"\}\Z')
CORRUPT_REASONS = ("checksum", "unparsable", "invalid")


@dataclass(frozen=True)
class Opened:
    """A stored object's body as it was written; `sealed` False: written before seals."""

    body: bytes
    sealed: bool = True


@dataclass(frozen=True)
class CorruptOutput:
    """A stored object that is not what its writer stored: `reason` one of
    CORRUPT_REASONS, `detail` for the operator."""

    reason: str
    detail: str


def seal(body: bytes) -> bytes:
    """`body` (one compact JSON object) with the sha256 of its bytes as its last member."""
    if not (body.startswith(b"{") and body.endswith(b"}")):
        raise ValueError("only a JSON object is sealed")
    inner = body[:-1]
    comma = b"" if inner.strip() == b"{" else b","
    digest = hashlib.sha256(body).hexdigest().encode()
    return inner + comma + b'"' + SEAL_KEY.encode() + b'":"' + digest + b'"}'


def open_envelope(data: bytes) -> Opened | CorruptOutput:
    """The body of a stored object, or why it is corrupt."""
    found = _TRAILER.search(data)
    if found is not None:
        body = data[: found.start()] + b"}"
        actual = hashlib.sha256(body).hexdigest()
        if actual != found.group(1).decode():
            return CorruptOutput(
                "checksum",
                f"body sha256 {actual[:16]}... is not the sealed {found.group(1).decode()[:16]}..."
                f" ({len(data)} bytes)",
            )
        return Opened(body)
    # No seal: an object written before seals, or one whose end is lost or garbled.
    try:
        parsed = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        return CorruptOutput("unparsable", f"no seal and not JSON ({len(data)} bytes): {exc}")
    if not isinstance(parsed, dict):
        return CorruptOutput("unparsable", f"no seal and not a JSON object ({len(data)} bytes)")
    return Opened(data, sealed=False)


def unseal(data: Any) -> Any:
    """A model's input without its seal member (a `mode="before"` validator's body)."""
    if isinstance(data, dict) and SEAL_KEY in data:
        return {k: v for k, v in data.items() if k != SEAL_KEY}
    return data
