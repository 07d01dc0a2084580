"""Generator: asks the VLM behind Triton every clean item's question, at temperature 0
with reasoning on, keeping many requests in flight; stores the raw output, its parse and
what answered (model version, sampling, tokens, latency, the exact image bytes sent)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from rsieve.adapters.model import ModelRequest, TritonModel
from rsieve.images import ImageError, PreparedImage, prepare_image
from rsieve.schemas import Generation, Item, Quarantined, ShardOutput
from rsieve.think import parse_output
from services.common import Context, StageTask


def register(ctx: Context) -> None:
    def prepared(sha: str) -> PreparedImage | ImageError:
        """The bytes the model gets, prepared once per image; re-encoded ones are stored
        content-addressed too, so what the model saw can be fetched by its hash."""
        s = ctx.settings
        try:
            image = prepare_image(ctx.store.get(f"images/{sha}"), max_side=s.image_max_side,
                                  max_pixels=s.image_max_pixels)
        except ImageError as exc:
            return exc
        if image.reencoded and not ctx.store.exists(f"images/{image.sha256}"):
            ctx.store.put(f"images/{image.sha256}", image.data, content_type="image/png")
        return image

    @ctx.app.task(name="rsieve.generate", base=StageTask)
    def generate(run: str, shard: str, lines: int) -> None:
        if not ctx.done(run, "generate", shard):
            items = ctx.load(run, "clean", shard).items
            # Fetched in parallel: the model waits on this between shards.
            shas = sorted({i.image_sha256 for i in items})
            with ThreadPoolExecutor(max_workers=8) as pool:
                images = dict(zip(shas, pool.map(prepared, shas), strict=True))
            out = ShardOutput(run=run, shard=shard, stage="generate", lines=lines)
            ready = []
            for item in items:
                image = images[item.image_sha256]
                if isinstance(image, ImageError):
                    reason = "image_too_large" if "exceeds" in str(image) else "unreadable_image"
                    out.quarantined.append(Quarantined(
                        id=item.id, line=item.line, family=item.family, stage="generate",
                        reason=reason, detail=str(image)[:500]))
                else:
                    ready.append((item, image))
            model = TritonModel.from_settings(ctx.settings, ctx.settings.generator_model)
            replies = ctx.guard("generate", run, shard).batch(
                ready, lambda batch: model.generate_many(
                    [ModelRequest(i.question, im.data) for i, im in batch]),
                poisoned=lambda pair: _poisoned(pair[0]), key=lambda pair: pair[0].line)
            for (item, image), reply in zip(ready, replies, strict=True):
                if isinstance(reply, Quarantined):
                    out.quarantined.append(reply)
                    continue
                if isinstance(reply, Exception):
                    out.quarantined.append(Quarantined(
                        id=item.id, line=item.line, family=item.family, stage="generate",
                        reason="model_error", detail=str(reply)[:500]))
                    continue
                parsed = parse_output(reply.text, reply.finish_reason)
                info = model.info
                assert info is not None
                out.generations.append(Generation(
                    item=item, model=info.name, raw_output=reply.text,
                    finish_reason=reply.finish_reason, reasoning=parsed.reasoning,
                    answer=parsed.answer, failure=parsed.failure,
                    image_sent_sha256=image.sha256, model_version=info.version,
                    interface=info.interface, sampling=info.sampling,
                    chat_template=info.chat_template,
                    prompt_sent_sha256=reply.prompt_sent_sha256,
                    input_tokens=reply.input_tokens, output_tokens=reply.output_tokens,
                    latency_s=reply.latency_s, image_sent=image.meta()))
            ctx.save(out)
        ctx.next("rsieve.verify", run=run, shard=shard, lines=lines)


def _poisoned(item: Item) -> Quarantined:
    return Quarantined(id=item.id, line=item.line, family=item.family, stage="generate",
                       reason="max_deliveries", detail="the worker died on this item each time")
