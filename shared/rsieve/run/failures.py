"""What happens to a shard task that keeps failing, as pure rules (docs/operations.md,
"Failures"): the isolation of the items that fail (`bisect`), the quarantine detail of
such an item, and the record of a run that stopped because a failure hit every item.

A task that raises is tried again `stage_error_retries` times with rsieve.backoff's wait
(`stage_error_backoff_s` doubling, at most a minute); then its items are isolated: a batch
is split in halves until the items that raise stand alone, and only those are quarantined
(`stage_error`), so a batch of 128 with one bad item costs about 2 log2(128) = 14 calls,
not 128. When every item of the shard raises, the failure is not the items' (a bad
setting, a model that is down): the run stops with a `RunFailure`, and `rsieve reconcile
RUN` resumes it once the cause is fixed."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

from pydantic import BaseModel, ConfigDict

from rsieve.errors import PermanentError

__all__ = [
    "DETAIL_MAX_CHARS",
    "EveryItemFailed",
    "RunFailure",
    "bisect",
    "stage_error_detail",
]

T = TypeVar("T")
R = TypeVar("R")

DETAIL_MAX_CHARS = 300  # of the exception's message, in a quarantine detail or a record


class RunFailure(BaseModel):
    """Why a run stopped: the task and shard whose every item failed, and how."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    run: str
    task: str
    shard: str | None
    error: str  # the exception's type
    message: str
    version: str  # rsieve's, so a fixed release is told apart
    items: int  # how many items the shard had (each of them failed)

    def reason(self) -> str:
        where = f"{self.task} shard {self.shard}" if self.shard else self.task
        return f"{where}: every item failed with {self.error}: {self.message}"


def stage_error_detail(stage: str, exc: BaseException, version: str) -> str:
    """The quarantine detail of an item its stage raised on: stage, type, message, version."""
    message = " ".join(str(exc).split())[:DETAIL_MAX_CHARS]
    return f"{stage}: {type(exc).__name__}: {message} (rsieve {version})"


def bisect(
    items: Sequence[T], call: Callable[[Sequence[T]], list[R]]
) -> tuple[list[R | None], dict[int, Exception]]:
    """`call` over `items` as a whole, and on an exception over each half, down to single
    items: the results in order (None where an item failed) and, by index, the exception
    each failing item raised alone. `call` returns one result per item it is given."""
    results: list[R | None] = [None] * len(items)
    failed: dict[int, Exception] = {}

    def go(lo: int, hi: int) -> None:
        if lo >= hi:
            return
        try:
            out = call(items[lo:hi])
        except Exception as exc:  # noqa: BLE001 - any exception is what is being isolated
            if hi - lo == 1:
                failed[lo] = exc
                return
            mid = (lo + hi) // 2
            go(lo, mid)
            go(mid, hi)
            return
        if len(out) != hi - lo:
            raise ValueError(f"{len(out)} results for {hi - lo} items")
        results[lo:hi] = out

    go(0, len(items))
    return results, failed


class EveryItemFailed(PermanentError):
    """Every item of a shard raised in isolation: the failure is the run's, not the items'
    (a bad setting, a model that is down). Carries the record that stops the run."""

    def __init__(self, failure: RunFailure) -> None:
        super().__init__(failure.reason())
        self.failure = failure
