"""The model adapters' one retry policy (Triton's gRPC client, rsieve.adapters.model, and
OpenAI-compatible endpoints, rsieve.adapters.openai_compat) and their errors:

- `Transient`: infrastructure that may come back (server unavailable, overloaded,
  restarting, the model not served now). Asked again after rsieve.backoff's wait
  (`backoff_s` doubling, at most a minute), or longer when the server said how long
  (`Retry-After`); after `retries` more tries it becomes rsieve.errors.RetryableError, so
  the shard goes back to the queue and no item is given a result it did not earn.
- `ItemError`: the model answered, but this item's reply cannot be used (a malformed
  reply, a request the server refused for its own content). Returned as the item's
  result, never retried.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

from rsieve import backoff
from rsieve.errors import RetryableError

__all__ = ["ItemError", "Transient", "retrying"]

T = TypeVar("T")


class Transient(Exception):
    """A failure worth asking again; `wait_s`: what the server asked to wait, at least."""

    def __init__(self, message: str, wait_s: float = 0.0) -> None:
        super().__init__(message)
        self.wait_s = wait_s


class ItemError(Exception):
    """The model answered, and this item's reply is unusable: the item's own result."""


async def retrying(
    call: Callable[[], Awaitable[T]], *, retries: int, backoff_s: float, where: str
) -> T:
    """`call()`'s result; a `Transient` it raises is retried up to `retries` times, then
    becomes RetryableError naming `where` and the last failure. Anything else propagates."""
    last = ""
    for attempt in range(retries + 1):
        try:
            return await call()
        except Transient as exc:
            last = str(exc)
            if attempt < retries:
                await asyncio.sleep(backoff.backoff_s(attempt + 1, backoff_s, asked_s=exc.wait_s))
    raise RetryableError(f"{where}: {last[:300]}")
