"""Verifier: scores each answer with its family's protocol (whole, first line, first
paragraph) and the run's training rule; what both accept is final, what either refuses
goes to the judge (a benchmark pass that training refuses as a `near_miss`)."""

from __future__ import annotations

from rsieve.judge.cascade import verify_generation
from rsieve.schemas import Generation, Outcome, Quarantined, ShardOutput
from services.context import Context


def register(ctx: Context) -> None:
    @ctx.task("rsieve.verify")
    def verify(run: str, shard: str, lines: int) -> None:
        if not ctx.done(run, "verify", shard):
            generations = ctx.load(run, "generate", shard).generations
            policy = ctx.run_settings(run).training_policy()
            results = ctx.guard("verify", run, shard).run(
                generations,
                lambda g: verify_generation(g, policy),
                poisoned=_poisoned,
                key=lambda g: g.item.line,
            )
            # An item isolated here leaves whole: its other samples (best-of-n) with it.
            quarantined = list({r.line: r for r in results if isinstance(r, Quarantined)}.values())
            gone = {q.line for q in quarantined}
            ctx.save(
                ShardOutput(
                    run=run,
                    shard=shard,
                    stage="verify",
                    lines=lines,
                    verified=[
                        r
                        for r in results
                        if isinstance(r, Outcome) and r.generation.item.line not in gone
                    ],
                    quarantined=quarantined,
                )
            )
        ctx.next("rsieve.judge", run=run, shard=shard, lines=lines)


def _poisoned(gen: Generation) -> Quarantined:
    item = gen.item
    return Quarantined(
        id=item.id, line=item.line, family=item.family, stage="verify", reason="max_deliveries"
    )
