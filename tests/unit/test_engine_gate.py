"""The engine gate: FIFO across callers, whole requests, resizable, nothing leaked."""

from __future__ import annotations

import asyncio

import pytest

from rsieve.adapters.gate import EngineGate


def run(coro):  # type: ignore[no-untyped-def]
    return asyncio.run(coro)


def test_waiters_are_served_in_arrival_order_across_callers() -> None:
    async def main() -> list[str]:
        gate, order = EngineGate(1), []
        await gate.acquire()

        async def take(name: str) -> None:
            await gate.acquire()
            order.append(name)

        tasks = [asyncio.create_task(take(n)) for n in ("a1", "b1", "a2", "c1")]
        await asyncio.sleep(0)
        assert gate.waiting == 4
        for _ in tasks:
            gate.release()
            await asyncio.sleep(0)
        await asyncio.gather(*tasks)
        return order

    assert run(main()) == ["a1", "b1", "a2", "c1"]


def test_a_request_takes_all_its_slots_at_once_so_batching_callers_never_deadlock() -> None:
    async def main() -> int:
        gate, peak, done = EngineGate(8), 0, 0

        async def request(n: int) -> None:
            nonlocal peak, done
            lease = gate.lease()
            async with lease.slots(n):
                peak = max(peak, gate.in_flight)
                await asyncio.sleep(0.001)
            done += 1

        # 12 callers each batching 5 items: an item-at-a-time gate can have every caller
        # hold part of a batch and wait for ever.
        await asyncio.wait_for(asyncio.gather(*(request(5) for _ in range(12))), 5)
        assert peak <= 8
        return done

    assert run(main()) == 12


def test_a_slow_holder_keeps_one_slot_and_the_rest_flow() -> None:
    async def main() -> tuple[int, int]:
        gate = EngineGate(4)
        slow_started = asyncio.Event()
        release_slow = asyncio.Event()
        finished = 0
        low = 4

        async def slow() -> None:
            async with gate.lease().slots(1):
                slow_started.set()
                await release_slow.wait()

        async def quick() -> None:
            nonlocal finished
            async with gate.lease().slots(1):
                await asyncio.sleep(0.001)
            finished += 1

        slow_task = asyncio.create_task(slow())
        await slow_started.wait()
        quick_tasks = [asyncio.create_task(quick()) for _ in range(40)]
        while finished < 37:  # the gate stays full while work waits
            await asyncio.sleep(0)
            if gate.waiting:
                low = min(low, gate.in_flight)
        release_slow.set()
        await asyncio.gather(slow_task, *quick_tasks)
        return finished, low

    finished, low = run(main())
    assert finished == 40
    assert low >= 3  # never fewer in flight than the limit minus one, while work waited


def test_resize_up_admits_waiters_and_resize_down_drains() -> None:
    async def main() -> None:
        gate = EngineGate(1)
        await gate.acquire()
        waiter = asyncio.create_task(gate.acquire(2))
        await asyncio.sleep(0)
        assert not waiter.done() and gate.waiting == 2
        gate.resize(3)
        await asyncio.sleep(0)
        assert waiter.done() and gate.in_flight == 3 and gate.waiting == 0
        gate.resize(1)
        third = asyncio.create_task(gate.acquire())
        gate.release(2)
        await asyncio.sleep(0)
        assert not third.done()  # still 1 in flight, the limit is 1
        gate.release()
        await asyncio.sleep(0)
        assert third.done() and gate.in_flight == 1

    run(main())


def test_a_request_larger_than_the_limit_takes_the_empty_gate() -> None:
    async def main() -> int:
        gate = EngineGate(2)
        async with gate.lease().slots(5):
            return gate.in_flight

    assert run(main()) == 5


def test_cancelled_waiters_and_early_close_leak_nothing() -> None:
    async def main() -> None:
        gate = EngineGate(1)
        lease = gate.lease()
        holder = asyncio.create_task(_hold(lease))
        await asyncio.sleep(0)
        waiter = asyncio.create_task(gate.acquire(1))
        await asyncio.sleep(0)
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        assert gate.waiting == 0
        holder.cancel()
        with pytest.raises(asyncio.CancelledError):
            await holder
        lease.close()
        assert gate.in_flight == 0 and lease.held == 0
        await asyncio.wait_for(gate.acquire(1), 1)

    run(main())


async def _hold(lease) -> None:  # type: ignore[no-untyped-def]
    async with lease.slots(1):
        await asyncio.sleep(60)


def test_limits_below_one_are_refused() -> None:
    with pytest.raises(ValueError):
        EngineGate(0)
