"""The model adapters' one retry policy (rsieve.adapters.retry)."""

from __future__ import annotations

import asyncio

import pytest

from rsieve.adapters import model, openai_compat, openai_wire, triton_wire
from rsieve.adapters.retry import ItemError, Transient, retrying
from rsieve.errors import RetryableError


def test_a_transient_failure_is_asked_again_then_given_up_as_retryable() -> None:
    calls: list[int] = []

    async def flaky() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise Transient(f"down {len(calls)}")
        return "up"

    assert asyncio.run(retrying(flaky, retries=2, backoff_s=0.0, where="x")) == "up"
    calls.clear()
    with pytest.raises(RetryableError, match=r"^srv m: down 2$"):
        asyncio.run(retrying(flaky, retries=1, backoff_s=0.0, where="srv m"))
    assert len(calls) == 2  # one try and one retry, no more


def test_the_servers_wait_is_honoured(monkeypatch: pytest.MonkeyPatch) -> None:
    slept: list[float] = []

    async def fake_sleep(s: float) -> None:
        slept.append(s)

    async def busy() -> str:
        raise Transient("429", wait_s=7.0)

    monkeypatch.setattr("rsieve.adapters.retry.asyncio.sleep", fake_sleep)
    with pytest.raises(RetryableError):
        asyncio.run(retrying(busy, retries=2, backoff_s=1.0, where="x"))
    assert slept == [7.0, 7.0]


def test_anything_else_propagates_untouched() -> None:
    async def broken() -> str:
        raise ValueError("a bug")

    with pytest.raises(ValueError, match="a bug"):
        asyncio.run(retrying(broken, retries=5, backoff_s=0.0, where="x"))


def test_both_adapters_item_errors_are_item_errors() -> None:
    assert issubclass(triton_wire.MalformedReply, ItemError)
    assert issubclass(openai_wire.EndpointError, ItemError)
    for module in (model, openai_compat, openai_wire, triton_wire):
        assert not hasattr(module, "_Transient")
