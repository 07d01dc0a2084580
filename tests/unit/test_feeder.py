"""The generator's feeder: the share of an engine, the gate sized from the engine's config,
the prefetch steered by hunger, and intake that waits for room."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from rsieve.adapters.model import ModelInfo
from rsieve.settings import Settings
from services.generator.feeder import Feeder, engine_share


class FakeQoS:
    """kombu.common.QoS's thread-safe half: the consumer applies `value` later."""

    def __init__(self, value: int) -> None:
        self.value = value

    def increment_eventually(self, n: int = 1) -> int:
        self.value += n
        return self.value

    def decrement_eventually(self, n: int = 1) -> int:
        self.value = max(1, self.value - n)
        return self.value


@pytest.fixture
def feeder() -> Iterator[Feeder]:
    f = Feeder(Settings(max_inflight=4), registry=None)
    yield f
    f.close()


def _until(check, timeout: float = 2.0) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.01)
    return False


def test_the_share_adds_up_to_the_capacity_rounded_up() -> None:
    assert engine_share(256, 1) == 256
    assert engine_share(256, 3) == 86  # 3 x 86 = 258: a few wait inside the engine
    assert engine_share(256, 0) == 256
    assert engine_share(2, 5) == 1


def test_the_gate_is_sized_from_the_engines_config_unless_overridden(feeder: Feeder) -> None:
    info = ModelInfo(name="vlm", version="1", interface="vllm", capacity=256)
    feeder.loop.call_soon_threadsafe(feeder.sized, "engine:8001", info)
    assert _until(lambda: feeder.gate.limit == 256)
    fixed = Feeder(Settings(max_inflight=4, engine_capacity=64), registry=None)
    try:
        fixed.loop.call_soon_threadsafe(fixed.sized, "engine:8001", info)
        assert _until(lambda: fixed.gate.limit == 64)
        bare = ModelInfo(name="ocr", version="1", interface="rsieve")
        fixed.settings = Settings(max_inflight=4)
        fixed.loop.call_soon_threadsafe(fixed.sized, "engine:8001", bare)
        assert _until(lambda: fixed.gate.limit == 4)  # no capacity declared: max_inflight
    finally:
        fixed.close()


def test_prefetch_is_the_open_shards_plus_one_while_hungry(feeder: Feeder) -> None:
    qos = FakeQoS(32)  # Celery starts it at the thread count
    feeder.attach(qos)
    assert _until(lambda: qos.value == 1)  # nothing open, hungry: one shard
    with feeder.intake(4) as arrived:  # a full share (4) of items pending: not hungry
        assert _until(lambda: qos.value == 1)  # one open, none more
        arrived()
        assert _until(lambda: qos.value == 2)  # its items left the queue: hungry again
    assert _until(lambda: qos.value == 1)


class WatchedFeeder(Feeder):
    """A feeder that says when a shard asked for room and was refused: proof that intake
    looked and waited, with no number of seconds."""

    def __init__(self, settings: Settings) -> None:
        super().__init__(settings, registry=None)
        self.refused = threading.Event()

    @property
    def hungry(self) -> bool:
        room = super().hungry
        if not room:
            self.refused.set()
        return room


def test_intake_waits_for_room_one_shard_at_a_time() -> None:
    feeder = WatchedFeeder(Settings(max_inflight=4))
    entered: list[int] = []

    def take(n: int) -> None:
        with feeder.intake(4) as arrived:
            entered.append(n)
            arrived()

    try:
        first = feeder.intake(4)
        first.__enter__()  # 4 pending: the share is full
        waiter = threading.Thread(target=take, args=(2,))
        waiter.start()
        assert _until(lambda: feeder.refused.is_set() or bool(entered))
        assert feeder.refused.is_set() and entered == []  # it asked, found no room, waits
        first.__exit__(None, None, None)  # its items reached the gate (and were answered)
        waiter.join(2)
        assert entered == [2]
        assert feeder.pending == 0 and feeder.open == 0
    finally:
        feeder.close()
