"""Keys of the test-only Triton ``replay`` model (``tests/triton_models/replay``).

The replay model answers a request with a recorded output looked up by
``sha256(prompt utf-8 bytes + b"\\0" + image bytes)`` (image bytes empty when the optional
image input is absent). Tests use :func:`replay_key` to write the replay file, a JSON
object mapping key -> ``{"text": str, "finish_reason": str}``.
"""

from __future__ import annotations

import hashlib

__all__ = ["replay_key"]


def replay_key(prompt: str, image: bytes | None) -> str:
    """The replay file key of one request: sha256 hex of ``prompt + b"\\0" + image``."""
    digest = hashlib.sha256()
    digest.update(prompt.encode("utf-8"))
    digest.update(b"\0")
    digest.update(image or b"")
    return digest.hexdigest()
