"""One in-flight limit for a whole generator worker, however many prefork children it runs.

The generator runs more than one child so that a shard's load, image fetch and first
requests overlap the last batches of the shard before it; without that the model idles at
every shard boundary (docs/performance.md). Triton must still see at most `max_inflight`
requests from the worker. Each request holds one of `max_inflight` slots: a one-byte
`fcntl` record lock on a file the worker's main process names before it forks. The kernel
drops a process's locks when it dies, so a child killed mid-shard (SIGKILL, a poison item's
crash) gives its slots back: no count can leak.

Within one shard (one `Lease`, one asyncio loop) a slot freed while requests of the same
shard wait goes straight to the next of them; only when none is left waiting does it go back
to the file, where the other child's shard, polling every `poll_s` (backing off to 8 x
`poll_s` while none is free), takes it. So the shard
being answered keeps its slots and the next shard's requests fill its tail: they are
queued at Triton while its last batch runs.
"""

from __future__ import annotations

import asyncio
import errno
import fcntl
import os
import threading
from collections import deque
from types import TracebackType

__all__ = ["Lease", "SlotFile"]


class SlotFile:
    """`slots` record locks on one file, shared by every process that opens it. POSIX record
    locks belong to a process (a second lock on the same byte by the same process succeeds),
    so the slots this process holds are also kept in a set."""

    def __init__(self, path: str, slots: int) -> None:
        self.path, self.slots = path, slots
        self._fd = -1
        self._pid = -1
        self._held: set[int] = set()
        self._lock = threading.Lock()

    def _file(self) -> int:
        if self._pid != os.getpid():  # first use in this process (locks are not inherited)
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
            self._pid, self._held = os.getpid(), set()
        return self._fd

    def try_acquire(self) -> int | None:
        with self._lock:
            fd = self._file()
            for slot in range(self.slots):
                if slot in self._held:
                    continue
                try:
                    fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, slot)
                except OSError as exc:
                    if exc.errno in (errno.EACCES, errno.EAGAIN):
                        continue
                    raise
                self._held.add(slot)
                return slot
        return None

    def release(self, slot: int) -> None:
        with self._lock:
            if slot in self._held and self._pid == os.getpid():
                fcntl.lockf(self._fd, fcntl.LOCK_UN, 1, slot)
                self._held.discard(slot)

    def held(self) -> int:
        return len(self._held) if self._pid == os.getpid() else 0

    def lease(self, poll_s: float = 0.01) -> Lease:
        return Lease(self, poll_s)


class Lease:
    """One call's (one shard's) use of the slots, as an async context manager per request,
    like a semaphore. `close()` gives back whatever it still holds (a call that failed
    early leaves requests behind that the loop's teardown cancels)."""

    def __init__(self, slots: SlotFile, poll_s: float) -> None:
        self._slots, self._poll_s = slots, poll_s
        self._owned: set[int] = set()
        self._in_use: list[int] = []
        self._waiters: deque[asyncio.Future[int]] = deque()
        self._poller: asyncio.Task[None] | None = None
        self._closed = False

    async def __aenter__(self) -> None:
        if self._closed:
            raise RuntimeError("the in-flight lease is closed")
        slot = None if self._live_waiters() else self._take()
        if slot is None:
            waiter: asyncio.Future[int] = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            if self._poller is None or self._poller.done():
                self._poller = asyncio.create_task(self._poll())
            try:
                slot = await waiter
            except asyncio.CancelledError:
                if waiter.done() and not waiter.cancelled():
                    self._give(waiter.result())
                raise
        self._in_use.append(slot)

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        if self._in_use:
            self._give(self._in_use.pop())

    def _take(self) -> int | None:
        slot = self._slots.try_acquire()
        if slot is not None:
            self._owned.add(slot)
        return slot

    def _live_waiters(self) -> bool:
        while self._waiters and self._waiters[0].done():
            self._waiters.popleft()
        return bool(self._waiters)

    def _give(self, slot: int) -> None:
        """To this call's next waiter, else back to the file."""
        if not self._closed and self._live_waiters():
            self._waiters.popleft().set_result(slot)
            return
        if slot in self._owned:
            self._owned.discard(slot)
            self._slots.release(slot)

    async def _poll(self) -> None:
        # Each look tries every slot's lock (a syscall each): while none is free, look
        # less often, up to 8 x poll_s (within one batch of any model worth overlapping).
        wait = self._poll_s
        while self._live_waiters():
            slot = self._take()
            if slot is None:
                await asyncio.sleep(wait)
                wait = min(2 * wait, 8 * self._poll_s)
            else:
                self._give(slot)
                wait = self._poll_s

    def close(self) -> None:
        self._closed = True
        if self._poller is not None:
            self._poller.cancel()
        for waiter in self._waiters:
            waiter.cancel()
        self._waiters.clear()
        for slot in list(self._owned):
            self._owned.discard(slot)
            self._slots.release(slot)
        self._in_use.clear()
