"""Cleaner: cuts a submitted pool into shards, takes the decisions that need the whole pool
(duplicates, near-duplicates, evaluation sets, task purity: cleaning.json), then checks
each shard's items (rsieve.cleaning's `assess_pool`, `clean_line`); this reads and writes.
Images stay in the pool's packs (rsieve.run.packs): a shard's images are a few ranged GETs.

A pool of one range (`ingest_range_items` lines) is ingested in one task; a larger one in
rounds of `rsieve.ingest_part` tasks (ingest.py, rsieve.clean.ingestion), each holding a range
or a partition; the last of a round sends `rsieve.ingest` again, which sends the next."""

from __future__ import annotations

import json

from rsieve import keys
from rsieve.adapters.storage import read_images
from rsieve.clean.cleaning import (
    assess_pool,
    clean_line,
    family_items,
    line_image_path,
    poisoned_line,
    shard_inputs,
)
from rsieve.clean.provenance import verify_source
from rsieve.run.shards import ShardInput, split_pool
from rsieve.run.submission import ITEMS, REFUSED
from rsieve.schemas import Item, Quarantined, ShardOutput
from services.cleaner import ingest as ingest_steps
from services.cleaner.screen import load_screen
from services.cleaner.sources import pack_index, resolver
from services.cleaner.sweep import register_sweep
from services.cleaner.watch import register_watch
from services.common import Context


def register(ctx: Context) -> None:
    @ctx.task("rsieve.ingest")
    def ingest(run: str) -> None:
        if not ctx.store.exists(keys.shards(run)):
            the_plan = ingest_steps.plan(ctx, run)
            if len(the_plan.ranges) == 1:
                _ingest_whole(run)
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
        if ctx.last_done(f"rsieve:ingest:{run}:{step}", part, total):
            ctx.next("rsieve.ingest", run=run)

    def _ingest_whole(run: str) -> None:
        """A pool of one range: every decision in this task (rsieve.clean.cleaning.assess_pool)."""
        spec, store, s = ctx.spec(run), ctx.store, ctx.settings
        prefix = ingest_steps.pool_key(ctx, run)
        shards, blank = split_pool(store.get(prefix + ITEMS), s.shard_size)
        paths = [p for sh in shards for pl in sh if (p := line_image_path(pl)) is not None]
        packs = pack_index(ctx, prefix, list(dict.fromkeys(paths)))
        sources = resolver(ctx)
        assessment = assess_pool(
            [pl for shard in shards for pl in shard],
            image_sha256=lambda path: ref.sha256 if (ref := packs.images.get(path)) else None,
            refused=ctx.load_json(prefix + REFUSED) or {},
            provenance_policy=s.provenance_policy,
            text_max_chars=s.text_max_chars,
            purity_threshold=s.purity_threshold,
            purity_min_items=s.purity_min_items,
            purity_origins=s.purity_origins,
            embed=ingest_steps.lazy_embed if s.purity_embedding else None,
            provenance=lambda src, sha: verify_source(src, sha, s.provenance_policy, sources),
            screen=load_screen(ctx, spec.dataset),
            image_phash=lambda path: ref.phash if (ref := packs.images.get(path)) else None,
        )
        assessment.report["policy"]["provenance_roots"] = list(s.provenance_roots)
        store.put(
            keys.cleaning(run),
            json.dumps(assessment.report, indent=1, ensure_ascii=False).encode(),
            content_type="application/json",
        )
        inputs = shard_inputs(run, shards, assessment, packs.images)
        for shard_in in inputs:
            store.put(keys.shard_input(run, shard_in.shard), shard_in.model_dump_json().encode())
        index = {
            "shards": {i.shard: len(i.lines) for i in inputs},
            "lines": sum(map(len, shards)),
            "blank_lines": blank,
            # Items per family, for the judge's calibration rates (docs/judge.md).
            "families": family_items(assessment.report),
        }
        # Blank lines are not items; the report expects every other line placed.
        store.put(keys.shards(run), json.dumps(index).encode())  # commit point

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
