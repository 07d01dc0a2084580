"""One feeder per generator worker: every open shard's requests go through one asyncio loop
and one FIFO in-flight gate sized from the engine (docs/performance.md, "Concurrency sized
from the engine").

The worker runs Celery's thread pool: each thread holds one shard (a reasoning model's
shard waits on its slowest item, minutes behind the rest), and all of them submit to this
loop. The gate (rsieve.adapters.gate) keeps exactly the worker's share of the engine in
flight, takes waiting items oldest first, and hands a finished item's slot to the next
waiting item whatever its shard, so a shard's long tail never idles the engine while other
shards wait.

The share: the engine's capacity (RSIEVE_ENGINE_CAPACITY, else its `max_num_seqs` config
parameter, else max_inflight) divided among the generator workers feeding the same engine,
counted live in Redis (each worker refreshes its entry every `HEARTBEAT_S`; entries older
than `STALE_S` are dropped), so the workers' limits add up to the engine's capacity however
many KEDA runs.

The worker is hungry while fewer than a full share of items wait at the gate, counting
those of shards loaded but not yet at the gate: then enough work is queued to refill every
slot, and no more is held in memory than that. Hunger also decides which messages the
worker takes from the queue: its prefetch (Celery's QoS, a consumer bootstep attaches it) is
kept at the shards it has open, plus one while hungry. So a worker never sits on shards it
cannot start, which another worker feeding another engine could (without this, a worker
reserves as many shards as it has threads, and two engines end a pool unevenly).
`intake` is the last guard: a shard that arrives anyway waits there for room, one thread
at a time, on a lock (no CPU).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable, Coroutine, Iterator
from typing import Any, ClassVar, TypeVar

import redis
from celery import bootsteps

from rsieve import redis_keys
from rsieve.adapters.gate import EngineGate
from rsieve.adapters.model import ModelInfo
from rsieve.settings import Settings

__all__ = ["Feeder", "engine_share"]

log = logging.getLogger("rsieve")
T = TypeVar("T")
HEARTBEAT_S = 10.0
STALE_S = 3 * HEARTBEAT_S


def engine_share(capacity: int, feeders: int) -> int:
    """One worker's in-flight limit. Rounded up: a few sequences over the capacity wait in
    the engine's own queue, a few under would idle it."""
    return max(1, math.ceil(capacity / max(1, feeders)))


class Feeder:
    def __init__(self, settings: Settings, registry: redis.Redis | None = None) -> None:
        self.settings = settings
        self.registry = registry
        self.member = f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"
        self.capacity: int | None = None
        self.feeders = 1
        self._key: str | None = None
        self.loop = asyncio.new_event_loop()
        self.gate = EngineGate(settings.engine_capacity or settings.max_inflight)
        threading.Thread(target=self.loop.run_forever, name="engine-feeder", daemon=True).start()
        self._stop = threading.Event()
        self._intake = threading.Lock()
        self._count = threading.Lock()
        self.pending = 0  # items of shards loaded (or loading) but not yet at the gate
        self.open = 0  # shards in hand
        self._qos: Any = None

    @property
    def hungry(self) -> bool:
        return self.gate.waiting + self.pending < self.gate.limit

    def attach(self, qos: Any) -> None:
        """Celery's consumer QoS (kombu.common.QoS): from now on the feeder sets the
        prefetch, every `poll_s`."""
        first = self._qos is None
        self._qos = qos  # a consumer restarted after a broker outage brings a new one
        if first:
            threading.Thread(target=self._steer, name="engine-intake", daemon=True).start()

    def _steer(self, poll_s: float = 0.05) -> None:
        while not self._stop.wait(poll_s):
            # Never 0: a prefetch of 0 means no limit.
            want = max(1, self.open + (1 if self.hungry else 0))
            have = self._qos.value
            if want > have:
                self._qos.increment_eventually(want - have)
            elif want < have:
                self._qos.decrement_eventually(have - want)

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run one shard's requests on the feeder's loop; blocks the calling thread."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    @contextlib.contextmanager
    def intake(self, lines: int, poll_s: float = 0.02) -> Iterator[Callable[[], None]]:
        """Wait for room for a shard of `lines` items, then count them as pending until the
        returned `arrived()` is called (when its requests reach the gate) or the block ends."""
        with self._count:
            self.open += 1
        with self._intake:
            while not self.hungry and not self._stop.is_set():
                time.sleep(poll_s)
            with self._count:
                self.pending += lines
        done = False

        def arrived() -> None:
            nonlocal done
            with self._count:
                if not done:
                    done = True
                    self.pending -= lines

        try:
            yield arrived
        finally:
            arrived()
            with self._count:
                self.open -= 1

    def sized(self, url: str, info: ModelInfo) -> None:
        """On the loop, when a shard's model is ready: size the gate from the engine."""
        capacity = self.settings.engine_capacity or info.capacity or self.settings.max_inflight
        key = redis_keys.engine_feeders(url, info.name)
        first = self._key is None
        self.capacity, self._key = capacity, key
        if first:
            self._beat()
            threading.Thread(target=self._heartbeat, name="engine-feeders", daemon=True).start()
        self.gate.resize(engine_share(capacity, self.feeders))

    def _beat(self) -> None:
        if self.registry is None or self._key is None:
            return
        now = time.time()
        try:
            pipe = self.registry.pipeline()
            pipe.zadd(self._key, {self.member: now})
            pipe.zremrangebyscore(self._key, "-inf", now - STALE_S)
            pipe.zcard(self._key)
            pipe.expire(self._key, int(10 * STALE_S))
            feeders = int(pipe.execute()[2])
        except redis.RedisError as exc:  # keep the last share; the engine keeps running
            log.warning("engine feeders not counted: %s", exc)
            return
        if feeders != self.feeders:
            log.info("generator workers on %s: %d", self._key, feeders)
        self.feeders = max(1, feeders)

    def _heartbeat(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            self._beat()
            if self.capacity is not None:
                share = engine_share(self.capacity, self.feeders)
                self.loop.call_soon_threadsafe(self.gate.resize, share)

    def close(self) -> None:
        self._stop.set()
        if self.registry is not None and self._key is not None:
            with contextlib.suppress(redis.RedisError):
                self.registry.zrem(self._key, self.member)
        self.loop.call_soon_threadsafe(self.loop.stop)


class Intake(bootsteps.StartStopStep):
    """Hands the consumer's prefetch (QoS) to the worker's feeder, which takes a shard only
    when its engine share runs short of work (module docstring)."""

    requires: ClassVar[set[str]] = {"celery.worker.consumer.tasks:Tasks"}

    def start(self, c: Any) -> None:
        c.app.rsieve_feeder.attach(c.qos)
