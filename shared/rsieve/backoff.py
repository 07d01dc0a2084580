"""rsieve's one backoff: how long to wait before asking again, whoever asks. A stage task's
retries (services/stage.py: a RetryableError, and a try that raised), the model adapters'
`retrying` (rsieve.adapters.retry) and the local stack's readiness waits
(rsieve_cli.local.ready.wait_ready) all wait `backoff_s`.

Exponential and capped: the first retry waits `base_s`, each next one twice the last, never
more than `max_s` (a minute unless the caller polls something that comes up in seconds).
The model adapters once doubled without a cap; a client that sleeps for hours after a long
outage has stopped being a client, so every wait is capped now, as Celery's and gRPC's are.
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["BACKOFF_MAX_S", "backoff_s"]

# The longest wait between two tries; past it, doubling only delays noticing a recovery.
BACKOFF_MAX_S = 60.0
# 2**62 times any sensible base is past every cap; a larger exponent would overflow a float.
_MAX_DOUBLINGS = 62


def backoff_s(
    retry: int,
    base_s: float,
    *,
    asked_s: float = 0.0,
    max_s: float = BACKOFF_MAX_S,
    jitter: Callable[[float, float], float] | None = None,
) -> float:
    """Seconds before retry number `retry` (1 for the first): `base_s` doubling, at most
    `max_s`; `jitter` (as `random.uniform`) draws it from [0, that] so many callers that
    failed together do not come back together. Never less than the server asked
    (`asked_s`, a Retry-After): the cap bounds our own patience, and asking before the
    server said it is ready only earns another refusal."""
    doublings = min(max(retry - 1, 0), _MAX_DOUBLINGS)
    wait = min(base_s * 2.0**doublings, max_s)
    if jitter is not None:
        wait = jitter(0.0, wait)
    return max(wait, asked_s)
