"""Who holds which shard, the pure part (issue 37): a worker process that runs stage tasks
(its *holder* id, hostname:pid) keeps a heartbeat and records each shard task it runs (a
*holding*) while it runs it. A holding whose holder's heartbeat has lapsed is *orphaned*:
its message is put back on its queue at once, not after the visibility timeout. A holder
whose heartbeat is alive never loses a holding, however long its shard runs.

The Redis side (heartbeat keys, the holdings hash, the claim that requeues an orphan
exactly once) is rsieve.adapters.holdings; the heartbeat thread is services/stage.py.
What status shows of a run (in flight per stage with holder and age, orphaned and
requeued, failed, and whether the run can finish) is decided here."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from pydantic import BaseModel

from rsieve.schemas import TASK_QUEUES

__all__ = [
    "Holding",
    "holder_id",
    "holder_pid",
    "orphaned",
    "run_liveness",
    "stage_eta",
    "stage_of",
]


def stage_of(task: str) -> str:
    return TASK_QUEUES.get(task, task.removeprefix("rsieve."))


def holder_id(hostname: str, pid: int, incarnation: str) -> str:
    """One id per process that runs tasks (a prefork child, a thread-pool worker), unique
    across restarts: `incarnation` is the process's own random token. Hostname and pid
    alone repeat in a container, whose restarted service is PID 1 again under the same
    hostname, and would take over the dead process's heartbeat, so its shards would never
    count as orphaned."""
    return f"{hostname}:{pid}:{incarnation}"


def holder_pid(holder: str) -> int:
    """The process id inside a holder id `hostname:pid:incarnation`."""
    return int(holder.rsplit(":", 2)[1])


class Holding(BaseModel):
    """One delivery of a stage task, recorded while a process runs it."""

    holder: str
    task: str
    queue: str
    kwargs: dict[str, Any] = {}
    delivery_id: str  # the task id (kept when the message is redelivered)
    delivery_tag: str | None = None  # the broker's tag of the message (kombu's unacked hash)
    started_at: float

    @property
    def field(self) -> str:
        """Its field in the holdings hash: one per holder and delivery."""
        return f"{self.holder}|{self.delivery_id}"

    @property
    def run(self) -> str | None:
        run = self.kwargs.get("run")
        return str(run) if run is not None else None

    @property
    def shard(self) -> str | None:
        shard = self.kwargs.get("shard", self.kwargs.get("partition"))
        return str(shard) if shard is not None else None

    @property
    def stage(self) -> str:
        return stage_of(self.task)


def orphaned(holdings: Iterable[Holding], alive: Mapping[str, bool]) -> list[Holding]:
    """The holdings whose holder's heartbeat has lapsed (its key expired, or it never
    beat). A holder that beats keeps every holding, however old."""
    return [h for h in holdings if not alive.get(h.holder, False)]


def stage_eta(
    remaining: int,
    rate_shards_s: float | None,
    *,
    pending_orphans: int,
    orphan_wait_s: float,
    failed: int,
) -> float | None:
    """Seconds until a stage is done: its remaining shards at its rate, plus the wait for
    orphaned shards not yet requeued (their holder's heartbeat lapses, then a watcher
    requeues them); None when unknown or never (a failed shard is never done)."""
    if remaining <= 0:
        return 0.0
    if failed:
        return None
    if rate_shards_s is None or rate_shards_s <= 0:
        return None
    return round(remaining / rate_shards_s + (orphan_wait_s if pending_orphans else 0.0), 1)


def run_liveness(
    run: str,
    holdings: Iterable[Holding],
    alive: Mapping[str, bool],
    requeued: list[dict[str, Any]],
    failed: Mapping[str, str],
    now: float,
) -> dict[str, Any]:
    """What status shows of a run's shards beyond the stored outputs:

    - `in_flight`: stage -> [{shard, task, holder, age_s, orphaned}] (orphaned: the holder
      is dead and a watcher has not requeued it yet),
    - `orphaned`: the records of holdings requeued after their holder died,
    - `failed`: [{shard, reason}] from the run's failed hash,
    - `cannot_finish`: why the run cannot finish without an operator, or None."""
    in_flight: dict[str, list[dict[str, Any]]] = {}
    for h in sorted(holdings, key=lambda h: h.started_at):
        if h.run != run:
            continue
        in_flight.setdefault(h.stage, []).append(
            {
                "shard": h.shard,
                "task": h.task,
                "holder": h.holder,
                "age_s": round(max(0.0, now - h.started_at), 1),
                "orphaned": not alive.get(h.holder, False),
            }
        )
    failures = [{"shard": shard, "reason": reason} for shard, reason in sorted(failed.items())]
    cannot = (
        f"{len(failures)} shard(s) failed and will not be retried: "
        + ", ".join(f"{f['shard']} ({f['reason']})" for f in failures[:5])
        if failures
        else None
    )
    return {
        "in_flight": in_flight,
        "orphaned": requeued,
        "failed": failures,
        "cannot_finish": cannot,
    }
