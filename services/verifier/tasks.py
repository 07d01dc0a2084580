"""Verifier: scores each answer with its family's protocol (whole, first line, first
paragraph); what it accepts is final, what it rejects goes to the judge."""

from __future__ import annotations

from rsieve.cascade import verify_generation
from rsieve.schemas import ShardOutput
from services.common import Context, StageTask


def register(ctx: Context) -> None:
    @ctx.app.task(name="rsieve.verify", base=StageTask)
    def verify(run: str, shard: str, lines: int) -> None:
        if not ctx.done(run, "verify", shard):
            generated = ctx.load(run, "generate", shard)
            ctx.save(ShardOutput(run=run, shard=shard, stage="verify", lines=lines,
                                 verified=[verify_generation(g) for g in generated.generations]))
        ctx.next("rsieve.judge", run=run, shard=shard, lines=lines)
