"""rsieve's one backoff (rsieve.backoff) and who waits it: the stage task's retries of a
RetryableError (services/stage.py) and the model adapters' `retrying`. Its doubling up to
a minute from a base is pinned in test_stage_failures; the readiness waits' use of it in
test_local_ready."""

from __future__ import annotations

import asyncio
import random

import celery.app.task
import pytest
from celery import Celery
from celery.exceptions import Retry

from rsieve.adapters.retry import Transient, retrying
from rsieve.backoff import BACKOFF_MAX_S, backoff_s
from rsieve.errors import RetryableError
from services.stage import StageTask


def test_the_cap_is_a_minute_and_a_caller_may_lower_it() -> None:
    assert BACKOFF_MAX_S == 60.0
    assert [backoff_s(n, 0.05, max_s=0.5) for n in range(1, 7)] == [0.05, 0.1, 0.2, 0.4, 0.5, 0.5]
    # Retry numbers far past the cap do not overflow the doubling.
    assert backoff_s(10_000, 1.0) == 60.0


def test_the_server_asked_wait_is_honoured_past_the_cap() -> None:
    assert backoff_s(1, 0.5, asked_s=3.0) == 3.0
    assert backoff_s(2, 2.0, asked_s=3.0) == 4.0
    assert backoff_s(20, 1.0, asked_s=120.0) == 120.0


def test_jitter_draws_up_to_the_backoff_but_never_under_the_servers_wait() -> None:
    drawn: list[tuple[float, float]] = []

    def low(lo: float, hi: float) -> float:
        drawn.append((lo, hi))
        return lo

    assert backoff_s(3, 2.0, jitter=low) == 0.0
    assert backoff_s(9, 2.0, jitter=low, asked_s=5.0) == 5.0
    assert drawn == [(0.0, 8.0), (0.0, 60.0)]


def test_retrying_waits_the_one_backoff_capped(monkeypatch: pytest.MonkeyPatch) -> None:
    slept: list[float] = []

    async def fake_sleep(s: float) -> None:
        slept.append(s)

    async def down() -> str:
        raise Transient("unavailable")

    monkeypatch.setattr("rsieve.adapters.retry.asyncio.sleep", fake_sleep)
    with pytest.raises(RetryableError):
        asyncio.run(retrying(down, retries=8, backoff_s=1.0, where="x"))
    assert slept == [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 60.0, 60.0]


def test_a_stage_tasks_retryable_error_waits_the_one_backoff_jittered(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    asked: list[dict[str, object]] = []

    def celery_retry(self: celery.app.task.Task, *args: object, **kwargs: object) -> Retry:
        asked.append(kwargs)
        return Retry()

    monkeypatch.setattr(celery.app.task.Task, "retry", celery_retry)
    monkeypatch.setattr(random, "uniform", lambda lo, hi: hi)  # the top of the draw
    app = Celery("backoff-test", set_as_current=False)

    @app.task(base=StageTask, bind=True, name="rsieve.test_backoff")
    def down(self: StageTask) -> None:
        raise RetryableError("the model is down")

    with pytest.raises(Retry):
        down()  # autoretry_for: Celery's own wrapper asks for the retry, with no delay
    assert asked[0]["countdown"] == 2.0 and isinstance(asked[0]["exc"], RetryableError)

    down.push_request(retries=6)  # a seventh retry: 2 * 2**6 s, past the cap
    try:
        down.retry(exc=RetryableError("still down"))
        down.retry(exc=RetryableError("a delay given"), countdown=5)
    finally:
        down.pop_request()
    assert [a["countdown"] for a in asked[1:]] == [60.0, 5]
