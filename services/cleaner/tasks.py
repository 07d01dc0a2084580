"""Cleaner: cuts a submitted pool into shards, takes the decisions that need the whole pool
(duplicates, near-duplicates, evaluation sets, task purity: cleaning.json) in the ingest
rounds (rsieve.clean.ingestion), then checks each shard's items
(rsieve.clean.cleaning.clean_line); this reads and writes. Images stay in the pool's packs
(rsieve.run.packs): a shard's images are a few ranged GETs.

Every pool goes through the same rounds: a pool of one range (`ingest_range_items` lines)
runs them all in one task, in memory (ingest.py's `in_process`); a larger one in
`rsieve.ingest_part` tasks (ingest.py), each holding a range or a partition; the last of a
round sends `rsieve.ingest` again, which sends the next."""

from __future__ import annotations

import json

from rsieve import keys, redis_keys
from rsieve.adapters.storage import read_images
from rsieve.clean.cleaning import clean_line, poisoned_line
from rsieve.clean.provenance import verify_source
from rsieve.run.shards import ShardInput
from rsieve.schemas import Item, Quarantined, ShardOutput
from services.cleaner import ingest as ingest_steps
from services.cleaner.sources import resolver
from services.cleaner.sweep import register_sweep
from services.cleaner.watch import register_watch
from services.context import Context


def register(ctx: Context) -> None:
    @ctx.task("rsieve.ingest")
    def ingest(run: str) -> None:
        if not ctx.store.exists(keys.shards(run)):
            the_plan = ingest_steps.plan(ctx, run)
            if len(the_plan.ranges) == 1:  # every round in this task
                ingest_steps.in_process(ctx, run, the_plan)
            else:  # in rounds (ingest.py): each sent once the round before is stored
                ingest_steps.packs(ctx, run)
                for round_ in ingest_steps.ROUNDS:
                    if round_ == "apply":
                        ingest_steps.report(ctx, run, the_plan)
                    total = ingest_steps.count(the_plan, round_)
                    if todo := ingest_steps.missing(ctx, run, round_, total):
                        if ingest_steps.first_send(ctx, run, round_):
                            for part in todo:
                                ctx.next("rsieve.ingest_part", run=run, step=round_, part=part)
                        return
                ingest_steps.commit(ctx, run, the_plan)
        index = json.loads(ctx.store.get(keys.shards(run)))
        for name, count in index["shards"].items():
            ctx.next("rsieve.clean", run=run, shard=name, lines=count)

    @ctx.task("rsieve.ingest_part")
    def ingest_part(run: str, step: str, part: int) -> None:
        the_plan = ingest_steps.plan(ctx, run)
        ingest_steps.step(ctx, run, the_plan, step, part)
        total = ingest_steps.count(the_plan, step)
        if ctx.last_done(redis_keys.ingest_done(run, step), part, total):
            ctx.next("rsieve.ingest", run=run)

    @ctx.task("rsieve.clean")
    def clean(run: str, shard: str, lines: int) -> None:
        if not ctx.done(run, "clean", shard):
            s, spec = ctx.settings, ctx.spec(run)
            shard_in = ShardInput.model_validate_json(ctx.store.get(keys.shard_input(run, shard)))
            sources = resolver(ctx)
            images = read_images(ctx.store, [pl.image for pl in shard_in.lines if pl.image])
            results = ctx.guard("clean", run, shard).run(
                shard_in.lines,
                lambda pl: clean_line(
                    pl,
                    images,
                    pool_uri=spec.pool_uri,
                    text_max_chars=s.text_max_chars,
                    max_pixels=s.image_max_pixels,
                    max_bytes=s.image_max_bytes,
                    policy=s.provenance_policy,
                    purity_threshold=s.purity_threshold,
                    provenance=lambda src, sha: verify_source(
                        src, sha, s.provenance_policy, sources
                    ),
                ),
                poisoned=poisoned_line,
                key=lambda pl: pl.line,
            )
            ctx.save(
                ShardOutput(
                    run=run,
                    shard=shard,
                    stage="clean",
                    lines=lines,
                    items=[r for r in results if isinstance(r, Item)],
                    quarantined=[r for r in results if isinstance(r, Quarantined)],
                )
            )
        ctx.next("rsieve.generate", run=run, shard=shard, lines=lines)

    register_watch(ctx)  # continuous ingestion (watch.py), sent by Celery beat
    register_sweep(ctx)  # stalled runs reconciled (sweep.py), sent by Celery beat
