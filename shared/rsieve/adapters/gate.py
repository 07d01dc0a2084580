"""The in-flight limit in front of one engine: a FIFO, resizable counting gate on one
asyncio loop.

Every request holds as many slots as it carries items for as long as it is at the engine.
Waiters are served strictly in arrival order and a request takes all its slots at once, so:

- across shards (the generator holds many shards open in one process, all on one loop), the
  items of a shard queued earlier go first, and a shard's slow last item holds one slot,
  not the engine: the freed slots go to the next shard's items (no head-of-line blocking);
- a multi-item request never holds part of its slots while it waits for the rest, so no set
  of partly gathered requests can hold every slot (the deadlock an item-at-a-time gate has
  when several callers batch).

`resize` changes the limit at any time (the engine's capacity is learned from its config,
and several workers feeding one engine share it): a larger limit admits waiters at once; a
smaller one lets the surplus drain.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncIterator

__all__ = ["EngineGate", "GateLease"]


class EngineGate:
    """`limit` slots; not thread-safe: use it from the loop it runs on."""

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError("an in-flight limit is at least 1")
        self.limit = limit
        self.in_flight = 0
        # Slots asked for by requests that wait (items queued in front of the engine): a
        # plain int, so another thread may read it (the generator's intake does).
        self.waiting = 0
        self._waiters: deque[tuple[int, asyncio.Future[None]]] = deque()

    async def acquire(self, n: int = 1) -> None:
        # A request larger than the whole limit would wait for ever: it takes the whole gate.
        n = max(1, n)
        if not self._waiters and self._fits(n):
            self.in_flight += n
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append((n, fut))
        self.waiting += n
        try:
            await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                self.release(n)  # granted and cancelled in the same turn: give it back
            else:
                self.waiting -= n
                self._wake()  # a cancelled head may have been what blocked the others
            raise

    def release(self, n: int = 1) -> None:
        self.in_flight = max(0, self.in_flight - max(1, n))
        self._wake()

    def resize(self, limit: int) -> None:
        self.limit = max(1, limit)
        self._wake()

    def lease(self) -> GateLease:
        return GateLease(self)

    def _fits(self, n: int) -> bool:
        return self.in_flight + n <= self.limit or self.in_flight == 0

    def _wake(self) -> None:
        while self._waiters:
            n, fut = self._waiters[0]
            if fut.done():  # cancelled while waiting
                self._waiters.popleft()
                continue
            if not self._fits(n):
                return  # strict FIFO: nobody overtakes the head
            self._waiters.popleft()
            self.waiting -= n
            self.in_flight += n
            fut.set_result(None)


class GateLease:
    """One call's use of the gate (one shard): `close()` gives back whatever the call
    still holds when it ends early (its requests cancelled by a failure)."""

    def __init__(self, gate: EngineGate) -> None:
        self.gate = gate
        self.held = 0

    @contextlib.asynccontextmanager
    async def slots(self, n: int) -> AsyncIterator[None]:
        await self.gate.acquire(n)
        self.held += n
        try:
            yield
        finally:
            if self.held >= n:  # not already given back by close()
                self.held -= n
                self.gate.release(n)

    def close(self) -> None:
        if self.held:
            self.gate.release(self.held)
            self.held = 0
