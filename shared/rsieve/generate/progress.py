"""A shard's progress that survives its worker (issue 37, "Nothing stalls"): the replies a
shard has had so far, stored as they come (per batch) so that a redelivered shard asks only
the rest. Rules only: what is stored, whether a stored progress is this shard's, which
requests are still to ask, in which batches. The services read and write it
(services/progress.py) at rsieve.keys.progress.

A stored progress is reused only by the same asking: the same requests in the same order
(`asked_digest` of each request's identity: item, image, sample seed). A shard whose run
settings or clean output changed since starts over. Failed calls are never stored: they are
asked again, as an uninterrupted shard's retry would."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence

from pydantic import BaseModel, ConfigDict

from rsieve.generate.generation import ModelInfo, ModelReply

__all__ = ["ShardProgress", "asked_digest", "batches", "resumed", "to_ask"]


class ShardProgress(BaseModel):
    """The replies one shard's stage has had, by position in its asked list."""

    model_config = ConfigDict(extra="forbid")

    run: str
    shard: str
    stage: str
    asked: str  # asked_digest of the shard's requests
    info: ModelInfo | None = None  # what answered the stored replies
    replies: dict[int, ModelReply] = {}


def asked_digest(identities: Iterable[str]) -> str:
    """One digest of a shard's requests, each by its identity, in order."""
    h = hashlib.sha256()
    for identity in identities:
        h.update(hashlib.sha256(identity.encode("utf-8")).digest())
    return h.hexdigest()


def resumed(progress: ShardProgress | None, digest: str, total: int) -> dict[int, ModelReply]:
    """The stored replies this asking may reuse: none unless the progress is of the same
    requests; only positions inside the shard."""
    if progress is None or progress.asked != digest:
        return {}
    return {k: r for k, r in progress.replies.items() if 0 <= k < total}


def to_ask(total: int, done: Mapping[int, object]) -> list[int]:
    """The positions still to ask, in order."""
    return [k for k in range(total) if k not in done]


def batches(positions: Sequence[int], size: int) -> list[list[int]]:
    """`positions` in consecutive batches of at most `size` (all in one when size < 1)."""
    if size < 1 or len(positions) <= size:
        return [list(positions)] if positions else []
    return [list(positions[i : i + size]) for i in range(0, len(positions), size)]
