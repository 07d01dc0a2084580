"""Judge: a text-only second look, by the model named in settings, at every answer the
verifier rejected. Only CORRECT promotes. The last shard judged triggers compaction."""

from __future__ import annotations

import json

from rsieve.adapters.model import ModelRequest
from rsieve.cascade import apply_verdict, judge_prompt, needs_judge
from rsieve.schemas import ShardOutput
from services.common import Context, StageTask


def register(ctx: Context) -> None:
    @ctx.app.task(name="rsieve.judge", base=StageTask)
    def judge(run: str, shard: str, lines: int) -> None:
        if not ctx.done(run, "judge", shard):
            verified = ctx.load(run, "verify", shard).verified
            pending = [o for o in verified if needs_judge(o)]
            prompts = [judge_prompt(o) for o in pending]
            model = ctx.settings.judge_model
            replies = iter(ctx.model(model).generate_many([ModelRequest(p) for p in prompts]))
            prompt_of = dict(zip(map(id, pending), prompts, strict=True))
            outcomes = []
            for outcome in verified:
                if not needs_judge(outcome):
                    outcomes.append(outcome)
                    continue
                reply, prompt = next(replies), prompt_of[id(outcome)]
                if isinstance(reply, Exception):
                    outcomes.append(apply_verdict(outcome, model=model, prompt=prompt,
                                                  raw_output=None, failure=str(reply)))
                else:
                    outcomes.append(apply_verdict(outcome, model=model, prompt=prompt,
                                                  raw_output=reply.text,
                                                  finish_reason=reply.finish_reason))
            ctx.save(ShardOutput(run=run, shard=shard, stage="judge", lines=lines,
                                 outcomes=outcomes))
        # Every shard that finishes checks; whichever sees all of them enqueues the
        # compaction (more than one may: compaction is idempotent).
        shards = json.loads(ctx.store.get(f"runs/{run}/shards.json"))["shards"]
        if sum(1 for _ in ctx.store.list(f"runs/{run}/judge/")) >= len(shards):
            ctx.next("rsieve.compact", run=run)
