"""Compactor: adds a finished run to its dataset under datasets/<dataset>/: new Parquet
shards per split (only items the dataset does not hold yet), the key index, the card, the
run's report and quarantine, and the manifest last (the commit point).

`rsieve.compact` drives a run's compaction from what is stored (steps.py): a run of one
partition is compacted in that task; a larger one is routed (`rsieve.compact_route`, one
task per group of shards), compacted one task per partition
(`rsieve.compact_partition`), and committed. Each of those tasks, the last of its kind to
finish, sends `rsieve.compact` again; so does the sweeper for a run left stalled. Each
fan-out is sent once per `sweep_after_s`, however often the coordinator is called. Memory
per task is one partition's (rsieve.run.partitions), and a Redis lock is held for the commit
alone. A run whose partitions another run's commit overtook is compacted again against
the dataset as it now is."""

from __future__ import annotations

from rsieve import keys, redis_keys
from rsieve.errors import CorruptOutputError
from services.compactor import steps
from services.context import Context


def register(ctx: Context) -> None:
    @ctx.task("rsieve.compact")
    def compact(run: str) -> None:
        previous = ctx.load_json(keys.manifest(ctx.spec(run).dataset))
        if previous and run in previous.get("runs", []):
            return
        gen, the_plan = steps.generation(previous), steps.plan(ctx, run)
        count, groups = the_plan["partitions"], len(the_plan["groups"])
        if count > 1:
            # Each fan-out is sent once per sweep_after_s (Context.send_once): this
            # coordinator is called by every late last task and by redeliveries.
            if missing := steps.missing_routes(ctx, run, groups):
                if ctx.send_once(redis_keys.compact_sent(run, "routes")):
                    for group in missing:
                        ctx.next("rsieve.compact_route", run=run, group=group)
                return
            steps.calibration(ctx, run, groups)
            if missing := steps.missing_partitions(ctx, run, count, gen):
                if ctx.send_once(redis_keys.compact_sent(run, f"g{gen}")):
                    for partition in missing:
                        ctx.next("rsieve.compact_partition", run=run, partition=partition, gen=gen)
                return
        elif not steps.compact_partition(ctx, run, 0, gen):
            ctx.next("rsieve.compact", run=run)  # overtaken: against the dataset as it is now
            return
        if not steps.commit(ctx, run, gen, count):
            ctx.next("rsieve.compact", run=run)

    @ctx.task("rsieve.compact_route")
    def compact_route(run: str, group: int) -> None:
        try:
            steps.route(ctx, run, group)
        except CorruptOutputError:
            # A judged shard of the group is being redone (Context.redo); its judge sends
            # rsieve.compact again, which must send this group's route again then.
            ctx.redis.delete(redis_keys.compact_sent(run, "routes"))
            raise
        groups = len(steps.plan(ctx, run)["groups"])
        if ctx.last_done(redis_keys.compact_done(run, "routes"), group, groups):
            ctx.next("rsieve.compact", run=run)

    @ctx.task("rsieve.compact_partition")
    def compact_partition(run: str, partition: int, gen: int) -> None:
        if not steps.compact_partition(ctx, run, partition, gen):
            ctx.next("rsieve.compact", run=run)  # overtaken: against the dataset as it is now
            return
        count = steps.plan(ctx, run)["partitions"]
        if ctx.last_done(redis_keys.compact_done(run, f"g{gen}"), partition, count):
            ctx.next("rsieve.compact", run=run)
