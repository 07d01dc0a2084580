"""Cleaning rules: pool lines to validated items, or to a quarantine with a reason.

Pure: the shell hands in bytes (a pool line, an image) and gets back an `Item` or a
`Quarantined`. Images are inspected with a pixel limit before any decode.
"""

from __future__ import annotations

import io
import json
import posixpath
import re
import warnings
from typing import Any

from PIL import Image
from pydantic import ValidationError

from rsieve.families import protocol_for
from rsieve.prompts import build_question
from rsieve.schemas import Item, PoolItem, Quarantined
from rsieve.verify import PROTOCOLS

__all__ = [
    "POLICY_VERSION",
    "check_provenance",
    "clean_item",
    "inspect_image",
    "parse_line",
    "pool_image_path",
]

POLICY_VERSION = "clean/1"
_SHA256 = re.compile(r"[0-9a-fA-F]{64}")


def _quarantine(line: int, reason: str, detail: str = "", *, item_id: str | None = None,
                family: str | None = None) -> Quarantined:
    return Quarantined(id=item_id, line=line, family=family, stage="clean", reason=reason,
                       detail=detail[:500])


def parse_line(raw: bytes, line: int, *, text_max_chars: int) -> PoolItem | Quarantined:
    """One line of items.jsonl (1-based `line`) to a PoolItem, or why not."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return _quarantine(line, "invalid_utf8", str(exc))
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        return _quarantine(line, "invalid_json", str(exc))
    if not isinstance(obj, dict):
        return _quarantine(line, "invalid_json", f"a JSON {type(obj).__name__}, not an object")
    item_id = obj.get("id") if isinstance(obj.get("id"), str) else None
    family = obj.get("family") if isinstance(obj.get("family"), str) else None
    try:
        item = PoolItem.model_validate(obj)
    except ValidationError as exc:
        fields = ", ".join(".".join(map(str, e["loc"])) for e in exc.errors())
        return _quarantine(line, "invalid_item", f"bad fields: {fields}", item_id=item_id,
                           family=family)
    refs = [item.answer] if isinstance(item.answer, str) else list(item.answer)
    if not item.question.strip():
        return _quarantine(line, "empty_question", item_id=item.id, family=item.family)
    if not refs or not all(r.strip() for r in refs):
        return _quarantine(line, "empty_answer_reference", item_id=item.id, family=item.family)
    if len(item.question) > text_max_chars or sum(map(len, refs)) > text_max_chars:
        return _quarantine(line, "text_too_long", f"limit {text_max_chars} characters",
                           item_id=item.id, family=item.family)
    return item


def pool_image_path(image: str) -> str | None:
    """The image's path inside the pool folder, or None when it would leave the folder."""
    if image.startswith(("/", "\\")) or "\\" in image or ":" in image.split("/", 1)[0]:
        return None
    norm = posixpath.normpath(image)
    if norm == ".." or norm.startswith("../") or norm in (".", ""):
        return None
    return norm


def inspect_image(data: bytes, *, max_pixels: int, max_bytes: int) -> tuple[str, str] | None:
    """(reason, detail) if the bytes are not an acceptable image, else None.

    The header is read first and the pixel count checked before any pixel is decoded."""
    if len(data) > max_bytes:
        return "image_too_large", f"{len(data)} bytes > {max_bytes}"
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(data)) as img:
                width, height = img.size
                if width * height > max_pixels:
                    return "image_too_large", f"{width}x{height} > {max_pixels} pixels"
                img.load()
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        return "image_too_large", str(exc)
    except Exception as exc:  # noqa: BLE001 - any decoder failure is the item's fault
        return "unreadable_image", f"{type(exc).__name__}: {exc}"
    return None


def check_provenance(source: Any, image_sha256: str, policy: str) -> tuple[bool, str]:
    """(admitted, check) where check names what was verified.

    A recorded sha256 must equal the attached image's; a source that records where the item
    came from without a hash is admitted as `recorded`; no source at all is admitted only
    under the lenient policy."""
    if isinstance(source, str) and _SHA256.fullmatch(source.strip()):
        recorded: Any = source.strip()  # a bare content hash is a source too
    else:
        recorded = source.get("sha256") if isinstance(source, dict) else None
    if recorded is not None:
        if not isinstance(recorded, str) or not _SHA256.fullmatch(recorded):
            return False, f"recorded sha256 is not a sha256: {str(recorded)[:70]!r}"
        if recorded.lower() == image_sha256:
            return True, "sha256_match"
        return False, f"sha256 mismatch: recorded {recorded[:16]}.., image {image_sha256[:16]}.."
    if source:
        return True, "recorded"
    return (policy == "lenient"), "no_source"


def clean_item(
    item: PoolItem, *, line: int, image_sha256: str, provenance_check: str, policy: str,
    pool_uri: str,
) -> Item | Quarantined:
    protocol = protocol_for(item.family, item.protocol)
    if protocol is None or protocol not in PROTOCOLS:
        return _quarantine(line, "unknown_protocol", f"family {item.family!r} "
                           f"protocol {protocol!r}", item_id=item.id, family=item.family)
    refs = [item.answer] if isinstance(item.answer, str) else list(item.answer)
    return Item(
        id=item.id,
        line=line,
        family=item.family,
        protocol=protocol,
        question=build_question(item.question, protocol),
        pool_question=item.question,
        references=refs,
        options=item.options,
        image_sha256=image_sha256,
        clean_meta={
            "pool": pool_uri,
            "line": line,
            "source": item.source,
            "provenance": provenance_check,
            "policy": {"version": POLICY_VERSION, "provenance": policy},
        },
    )
