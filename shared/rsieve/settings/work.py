"""How the stages' work is delivered, held, limited and redelivered: the queues, the
workers, shards and partitions, the watcher and the sweeper. All operational: none of it
changes what a run decides."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, Field, model_validator

from rsieve.schemas import DATASET_PATTERN
from rsieve.settings.roles import OPERATES


class WorkSettings(BaseModel):
    # Queues (Celery on Redis).
    redis_url: Annotated[str, OPERATES] = "redis://127.0.0.1:16379/0"
    # Seconds before a message delivered to a worker that died is redelivered. Must exceed
    # the longest shard; it comes back after this plus one restore sweep (measured: 20 s + 2 s
    # sweep gave 21.7 s).
    visibility_timeout_s: Annotated[int, OPERATES] = 900
    unacked_restore_interval_s: Annotated[int, OPERATES] = Field(5, ge=1)
    # Every process that runs stage tasks beats every heartbeat_s and records the shards it
    # holds; once its heartbeat is holder_lapse_s old, any worker's heartbeat thread puts
    # those shards back on their queues (rsieve.run.holdings). The visibility timeout is
    # only the last resort (a holding lost with Redis, a message prefetched but not started).
    heartbeat_s: Annotated[float, OPERATES] = Field(5.0, gt=0)
    holder_lapse_s: Annotated[float, OPERATES] = Field(20.0, gt=0)
    # A shard delivered more often than this is processed item by item, and the item that
    # was in flight when a worker died during such a delivery is quarantined (max_deliveries).
    max_deliveries: Annotated[int, OPERATES] = Field(3, ge=1)
    # A shard task that raises an unexpected exception (or a transient one past its own
    # retries) is tried again this many times with backoff (stage_error_backoff_s doubling,
    # at most 60 s); then its items are isolated (bisected) and those that still raise are
    # quarantined `stage_error`. A failure that hits every item stops the run (`failed`,
    # with the reason) until `rsieve reconcile` resumes it (docs/operations.md).
    stage_error_retries: Annotated[int, OPERATES] = Field(3, ge=0)
    stage_error_backoff_s: Annotated[float, OPERATES] = Field(2.0, ge=0)
    # Hard limit on one shard task: a hung task is killed and redelivered (then isolated).
    # The generate and judge shards get their own when sent (rsieve.run.limits): their
    # model's observed seconds per item (an EWMA in Redis, recorded per batch, weight
    # shard_latency_alpha) x the shard's items x shard_time_limit_factor, never under this
    # and never over shard_time_limit_max_s nor the visibility timeout less one restore
    # sweep (a message held longer is restored while its task still runs).
    task_time_limit_s: Annotated[int, OPERATES] = 600
    shard_time_limit_factor: Annotated[float, OPERATES] = Field(3.0, gt=0)
    shard_time_limit_max_s: Annotated[int, OPERATES] = Field(890, ge=1)
    shard_latency_alpha: Annotated[float, OPERATES] = Field(0.3, gt=0, le=1)
    # A generate or judge shard stores its replies every this many items answered (one
    # batch), so that a redelivery (a worker killed, a time limit) asks only the rest
    # (rsieve.generate.progress; the judge through its verdict cache). 0: one batch.
    progress_batch_items: Annotated[int, OPERATES] = Field(32, ge=0)
    # On SIGTERM (warm shutdown) a worker stops taking work and finishes its running shard;
    # on a second signal or SIGQUIT, Celery's soft shutdown gives it this long before the
    # shard is handed back to the queue.
    soft_shutdown_s: Annotated[float, OPERATES] = 60.0

    # Workers.
    worker_concurrency: Annotated[int, OPERATES] = Field(
        1, ge=1, description="Celery prefork children per worker"
    )
    # Shards a generator worker holds open at once (Celery threads). A reasoning model's
    # shard waits minutes on its slowest item while the rest of its slots serve other
    # shards, so keep enough open that the waiting ones cover the engine's share:
    # roughly share / shard_size x (1 + slowest / mean item time) (docs/performance.md).
    generator_concurrency: Annotated[int, OPERATES] = Field(
        32, ge=1, description="shards a generator worker holds open at once (threads)"
    )
    # Sequences the generator's engine runs at once (vLLM's max_num_seqs); 0: learned from
    # the model's Triton config (parameter `max_num_seqs`), else max_inflight. The generator
    # workers feeding one engine share it (docs/performance.md, "Concurrency sized from the
    # engine").
    engine_capacity: Annotated[int, OPERATES] = Field(
        0, ge=0, description="engine sequences at once (0: learn)"
    )

    # Work units.
    shard_size: Annotated[int, OPERATES] = Field(
        128, ge=1, description="pool lines per shard message"
    )
    # Compaction partitions (rsieve.run.partitions): a run of more pool lines than this is
    # compacted one task per partition of about this many, after routing its outcomes in
    # groups of compact_route_shards shards; memory per task is one partition's.
    compact_partition_items: Annotated[int, OPERATES] = Field(20_000, ge=1)
    compact_route_shards: Annotated[int, OPERATES] = Field(64, ge=1)

    # Ingest in rounds (rsieve.clean.ingestion): a pool of more lines than this is ingested by
    # tasks of one range of about this many lines (whole shards) or one key partition.
    ingest_range_items: Annotated[int, OPERATES] = Field(20_000, ge=1)

    # Continuous ingestion: pool folders under this S3 prefix are taken once each by the
    # `rsieve.watch` task (Celery beat, every watch_interval_s); empty = off.
    watch_prefix: Annotated[str, OPERATES] = ""
    watch_interval_s: Annotated[float, OPERATES] = Field(30.0, gt=0)
    # The sweeper (on the beat): every sweep_interval_s (0 = off) it reconciles each run not
    # yet compacted that nothing has happened to for sweep_after_s (twice the visibility
    # timeout by default: a shard in flight comes back within one).
    sweep_interval_s: Annotated[float, OPERATES] = Field(300.0, ge=0)
    sweep_after_s: Annotated[float, OPERATES] = Field(1800.0, gt=0)
    watch_dataset: Annotated[str, OPERATES] = Field("watched", pattern=DATASET_PATTERN)

    @model_validator(mode="after")
    def _heartbeat_beats_before_it_lapses(self) -> WorkSettings:
        if self.holder_lapse_s < 2 * self.heartbeat_s:
            raise ValueError("holder_lapse_s must be at least twice heartbeat_s")
        return self
