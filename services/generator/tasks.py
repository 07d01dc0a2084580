"""Generator: asks the VLM behind Triton every clean item's question, at temperature 0
with reasoning on, keeping many requests in flight; stores the raw output and its parse."""

from __future__ import annotations

import hashlib

from rsieve.adapters.model import ModelRequest
from rsieve.schemas import Generation, Quarantined, ShardOutput
from rsieve.think import parse_output
from services.common import Context, StageTask


def register(ctx: Context) -> None:
    @ctx.app.task(name="rsieve.generate", base=StageTask)
    def generate(run: str, shard: str, lines: int) -> None:
        if not ctx.done(run, "generate", shard):
            items = ctx.load(run, "clean", shard).items
            shas = {i.image_sha256 for i in items}
            images = {sha: ctx.store.get(f"images/{sha}") for sha in shas}
            model_name = ctx.settings.generator_model
            replies = ctx.model(model_name).generate_many(
                [ModelRequest(i.question, images[i.image_sha256]) for i in items])
            out = ShardOutput(run=run, shard=shard, stage="generate", lines=lines)
            for item, reply in zip(items, replies, strict=True):
                if isinstance(reply, Exception):
                    out.quarantined.append(Quarantined(
                        id=item.id, line=item.line, family=item.family, stage="generate",
                        reason="model_error", detail=str(reply)[:500]))
                    continue
                parsed = parse_output(reply.text, reply.finish_reason)
                out.generations.append(Generation(
                    item=item, model=model_name, raw_output=reply.text,
                    finish_reason=reply.finish_reason, reasoning=parsed.reasoning,
                    answer=parsed.answer, failure=parsed.failure,
                    image_sent_sha256=hashlib.sha256(images[item.image_sha256]).hexdigest()))
            ctx.save(out)
        ctx.next("rsieve.verify", run=run, shard=shard, lines=lines)
