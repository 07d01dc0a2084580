"""The local stack's one readiness wait: every launcher (Redis, S3, Triton, the judge
server) and the stack's API wait for their service with `wait_ready`, polling on
rsieve.backoff's wait from 50 ms up to half a second, so a service up in a tenth of a
second is seen within it and a slow one is not polled hundreds of times."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from rsieve.backoff import backoff_s
from rsieve_cli.local.processes import check_alive, log_tail

__all__ = ["READY_FIRST_S", "READY_MAX_S", "wait_ready"]

# The first poll's wait, and the longest: what a slow service's readiness is noticed late by.
READY_FIRST_S = 0.05
READY_MAX_S = 0.5


def wait_ready(
    check: Callable[[], str | None],
    *,
    timeout_s: float,
    what: str,
    errors: tuple[type[Exception], ...] = (),
    proc: subprocess.Popen[bytes] | None = None,
    proc_name: str = "",
    log: Path | None = None,
) -> None:
    """Return as soon as `check()` returns None (ready); else it returns what is missing,
    or raises one of `errors` (a refused connection): both are the last failure seen.

    Raises TimeoutError naming `what`, the timeout and the last failure (and the log's
    tail, `log` given) after `timeout_s`; RuntimeError with the log's tail at once if `proc`
    (named `proc_name`, else `what`) exits while waited for. Any other exception of
    `check` propagates: a check that knows the wait is hopeless says so."""
    deadline = time.monotonic() + timeout_s
    last = "no answer"
    retry = 0
    while True:
        check_alive(proc, proc_name or what, log)
        try:
            missing = check()
        except errors as exc:
            missing = repr(exc)
        if missing is None:
            return
        last = missing
        left = deadline - time.monotonic()
        if left <= 0:
            break
        retry += 1
        time.sleep(min(backoff_s(retry, READY_FIRST_S, max_s=READY_MAX_S), left))
    tail = f"; log tail:\n{log_tail(log)}" if log is not None else ""
    raise TimeoutError(f"{what} not ready after {timeout_s}s: {last}{tail}")
