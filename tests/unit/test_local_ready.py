"""The local stack's one readiness wait (rsieve_cli.local.ready.wait_ready), on a clock of
its own: it returns as soon as the check does, polls on the one backoff, and fails naming
what did not come up, the last failure seen and the log's tail."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from rsieve_cli.local import ready
from rsieve_cli.local.ready import READY_FIRST_S, READY_MAX_S, wait_ready


class Clock:
    """time.monotonic and time.sleep for `ready`: sleeping advances it, nothing waits."""

    def __init__(self) -> None:
        self.now = 100.0
        self.slept: list[float] = []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


@pytest.fixture()
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    fake = Clock()
    monkeypatch.setattr(ready, "time", fake)
    return fake


def test_a_ready_service_is_not_waited_for(clock: Clock) -> None:
    calls: list[int] = []

    def check() -> str | None:
        calls.append(1)
        return None

    wait_ready(check, timeout_s=30, what="redis on 127.0.0.1:1")
    assert calls == [1] and clock.slept == []


def test_it_returns_at_the_first_ready_check_polling_on_the_one_backoff(clock: Clock) -> None:
    answers = iter(["loading", "loading", ConnectionRefusedError(111, "refused"), "x", None])

    def check() -> str | None:
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer

    wait_ready(check, timeout_s=30, what="s3", errors=(OSError,))
    assert clock.slept == [READY_FIRST_S, 2 * READY_FIRST_S, 4 * READY_FIRST_S, 8 * READY_FIRST_S]
    assert next(answers, "drained") == "drained"


def test_polls_are_capped_and_the_timeout_names_what_and_the_last_failure(
    clock: Clock, tmp_path: Path
) -> None:
    log = tmp_path / "triton.log"
    log.write_text("I1 starting\nE1 failed to load 'judge-smollm2'\n")
    seen = iter(range(1000))

    def check() -> str | None:
        return f"models not ready: try {next(seen)}"

    with pytest.raises(TimeoutError) as timed_out:
        wait_ready(check, timeout_s=10, what="triton on 127.0.0.1:8000", log=log)
    message = str(timed_out.value)
    assert message.startswith("triton on 127.0.0.1:8000 not ready after 10s: models not ready")
    assert f"try {len(clock.slept)}" in message  # the last check's answer, at the deadline
    assert "failed to load 'judge-smollm2'" in message
    assert max(clock.slept) == READY_MAX_S and clock.now == pytest.approx(110.0)


def test_an_unexpected_exception_is_not_a_failure_to_wait_on(clock: Clock) -> None:
    def check() -> str | None:
        raise RuntimeError("the API exited")

    with pytest.raises(RuntimeError, match="the API exited"):
        wait_ready(check, timeout_s=30, what="the API", errors=(OSError,))
    assert clock.slept == []


def test_a_process_that_exits_fails_the_wait_at_once_with_its_log(
    clock: Clock, tmp_path: Path
) -> None:
    log = tmp_path / "redis.log"
    log.write_text("# Address already in use\n")
    proc = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    proc.wait()
    with pytest.raises(RuntimeError, match="redis-server exited with code 3") as exited:
        wait_ready(
            lambda: "no answer",
            timeout_s=30,
            what="redis on 127.0.0.1:1",
            proc=proc,
            proc_name="redis-server",
            log=log,
        )
    assert "Address already in use" in str(exited.value)
