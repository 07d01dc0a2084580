"""Every Redis key rsieve writes, in one place (the bucket's are rsieve.keys): a constant
or a function per key, and how long it is kept. The broker's own keys (Celery's queues,
unacked messages) are Celery's and not listed.

    rsieve:metrics:families                      hash: family -> label (metrics)
    rsieve:metrics:c:<name>                      hash: labels -> counter value
    rsieve:metrics:h:<name>                      hash: labels, bucket -> histogram count
    rsieve:progress:<run>:<stage>                hash: shard -> its items and families done
    rsieve:holdings                              hash: shard held -> its holder (sweeper)
    rsieve:holder:<holder>                       a worker's heartbeat (expires: it died)
    rsieve:run:<run>:orphaned                    list: shards sent again after their holder died
    rsieve:run:<run>:failed                      hash: shard -> why it failed for good
    rsieve:run:<run>:errors                      hash: task + shard -> errors counted
    rsieve:run:<run>:stopped                     why the run was stopped
    rsieve:<task>:<run>:<shard>:deliveries       times a stage task was delivered
    rsieve:<task>:<run>:<shard>:inflight         the items of a delivery in flight
    rsieve:ingest:<run>:<step>                   set: an ingest step's parts done
    rsieve:ingest:<run>:sent:<round>             an ingest round's tasks sent (once)
    rsieve:judged:<run>                          set: the run's shards judged
    rsieve:compact:<run>:<step>                  set: a compaction step's parts done
    rsieve:compact:<run>:sent:<step>             a compaction step's tasks sent (once)
    rsieve:compact:<dataset>                     lock: one commit at a time per dataset
    rsieve:pace:<stage>                          a stage's seconds per item (time limits)
    rsieve:engine-feeders:<url>/<model>          set: the feeders sharing one engine
    rsieve:watch:size:<folder>                   a watched folder's size, first seen
    rsieve:watch:claim:<folder>                  a watched folder being taken
    rsieve:watch:taken:<folder>                  a watched folder taken: its run
    rsieve:watch:looks                           looks the folder watch completed
    rsieve:watch:takes                           hash: folder -> times taken
    rsieve:sweep:done                            set: runs the sweeper found compacted
"""

from __future__ import annotations

__all__ = [
    "HOLDINGS",
    "KEPT_S",
    "METRICS",
    "METRIC_FAMILIES",
    "SWEEP_DONE",
    "WATCH_LOOKS",
    "WATCH_TAKES",
    "compact_done",
    "compact_lock",
    "compact_sent",
    "deliveries",
    "deliveries_pattern",
    "engine_feeders",
    "holder",
    "inflight",
    "ingest_done",
    "ingest_sent",
    "judged",
    "metric_counter",
    "metric_histogram",
    "pace",
    "progress",
    "run_errors",
    "run_failed",
    "run_orphaned",
    "run_stopped",
    "stage_pattern",
    "watch_claim",
    "watch_size",
    "watch_taken",
]

# How long a run's bookkeeping is kept once written (a week: longer than any run).
KEPT_S = 7 * 24 * 3600

_ROOT = "rsieve"

# Metrics (rsieve.adapters.metrics).
METRICS = f"{_ROOT}:metrics"
METRIC_FAMILIES = f"{METRICS}:families"


def metric_counter(name: str) -> str:
    return f"{METRICS}:c:{name}"


def metric_histogram(name: str) -> str:
    return f"{METRICS}:h:{name}"


def progress(run: str, stage: str) -> str:
    return f"{_ROOT}:progress:{run}:{stage}"


# Holdings (rsieve.adapters.holdings): who holds which shard, and whether it is alive.
HOLDINGS = f"{_ROOT}:holdings"


def holder(name: str) -> str:
    return f"{_ROOT}:holder:{name}"


def run_orphaned(run: str) -> str:
    return f"{_ROOT}:run:{run}:orphaned"


def run_failed(run: str) -> str:
    return f"{_ROOT}:run:{run}:failed"


def run_errors(run: str) -> str:
    return f"{_ROOT}:run:{run}:errors"


def run_stopped(run: str) -> str:
    return f"{_ROOT}:run:{run}:stopped"


# A stage task's deliveries and the items it has in flight (services/stage.py ItemGuard).
def deliveries(task: str, run: str, shard: str) -> str:
    return f"{_ROOT}:{task}:{run}:{shard}:deliveries"


def inflight(task: str, run: str, shard: str) -> str:
    return f"{_ROOT}:{task}:{run}:{shard}:inflight"


def stage_pattern(task: str, run: str) -> str:
    """A SCAN pattern for every key of a run's `task` (deliveries and in flight)."""
    return f"{_ROOT}:{task}:{run}:*"


def deliveries_pattern(task: str, run: str) -> str:
    """A SCAN pattern for every deliveries counter of a run's `task`."""
    return f"{_ROOT}:{task}:{run}:*:deliveries"


# Fan-outs: the parts of a step done, and the step's tasks sent once.
def ingest_done(run: str, step: str) -> str:
    return f"{_ROOT}:ingest:{run}:{step}"


def ingest_sent(run: str, round_: str) -> str:
    return f"{_ROOT}:ingest:{run}:sent:{round_}"


def judged(run: str) -> str:
    return f"{_ROOT}:judged:{run}"


def compact_done(run: str, step: str) -> str:
    return f"{_ROOT}:compact:{run}:{step}"


def compact_sent(run: str, step: str) -> str:
    return f"{_ROOT}:compact:{run}:sent:{step}"


def compact_lock(dataset: str) -> str:
    return f"{_ROOT}:compact:{dataset}"


# The generator's engines and the stages' pace.
def pace(stage: str) -> str:
    return f"{_ROOT}:pace:{stage}"


def engine_feeders(url: str, model: str) -> str:
    return f"{_ROOT}:engine-feeders:{url}/{model}"


# The folder watch (services/cleaner/watch.py) and the sweeper (services/cleaner/sweep.py).
_WATCH = f"{_ROOT}:watch"
WATCH_LOOKS = f"{_WATCH}:looks"
WATCH_TAKES = f"{_WATCH}:takes"


def watch_size(folder: str) -> str:
    return f"{_WATCH}:size:{folder}"


def watch_claim(folder: str) -> str:
    return f"{_WATCH}:claim:{folder}"


def watch_taken(folder: str) -> str:
    return f"{_WATCH}:taken:{folder}"


SWEEP_DONE = f"{_ROOT}:sweep:done"
