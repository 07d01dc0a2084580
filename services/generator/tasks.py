"""Generator: asks the VLM behind Triton every clean item's question, at temperature 0
with reasoning on, keeping the engine full; stores the raw output, its parse and what
answered (model version, sampling, tokens, latency, the exact image bytes sent).

The worker runs Celery's thread pool, `generator_concurrency` shards open at once, and
every shard's requests go through one feeder (feeder.py): one loop, one FIFO gate sized
from the engine's capacity, so a shard waiting on its slowest item never lowers the number
of sequences in flight while other shards wait. A shard is loaded only when the gate runs
short of waiting work.

A worker that dies (a crash, SIGKILL) takes its open shards with it: their messages are
unacked and come back after the visibility timeout; an item that kills the worker each time
is isolated by ItemGuard after `max_deliveries`. Redis restarted or unreachable mid-shard:
the shard goes back to the queue (StageTask, services/common.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from celery import bootsteps

from rsieve.adapters.model import ModelInfo, ModelRequest, TritonModel
from rsieve.adapters.tokenizer import preload_chat_template
from rsieve.images import ImageError, PreparedImage, prepare_image
from rsieve.schemas import Generation, Item, Quarantined, ShardOutput
from rsieve.think import parse_output
from services.common import Context, StageTask
from services.generator.feeder import Feeder


class _Intake(bootsteps.StartStopStep):
    """Hands the consumer's prefetch (QoS) to the feeder, which takes a shard only when
    its engine share runs short of work (feeder.py)."""

    requires = {"celery.worker.consumer.tasks:Tasks"}

    def start(self, c: Any) -> None:
        feeder = c.app.rsieve_feeder
        feeder.attach(c.qos)


def register(ctx: Context) -> None:
    feeder = Feeder(ctx.settings, ctx.redis)
    ctx.app.rsieve_feeder = feeder
    ctx.app.steps["consumer"].add(_Intake)
    preload_chat_template(ctx.settings.generator_tokenizer)

    def prepared(data: bytes | None) -> PreparedImage | ImageError:
        """The bytes the model gets; re-encoded ones are stored content-addressed, so
        what the model saw can be fetched by its hash."""
        s = ctx.settings
        if data is None:
            return ImageError("the image is missing from the pool's packs")
        try:
            image = prepare_image(data, max_side=s.image_max_side, max_pixels=s.image_max_pixels)
        except ImageError as exc:
            return exc
        if image.reencoded and not ctx.store.exists(f"images/{image.sha256}"):
            ctx.store.put(f"images/{image.sha256}", image.data, content_type="image/png")
        return image

    @ctx.app.task(name="rsieve.generate", base=StageTask)
    def generate(run: str, shard: str, lines: int) -> None:
        if not ctx.done(run, "generate", shard):
            with feeder.intake(lines) as arrived:
                out = generate_shard(run, shard, lines, arrived)
            ctx.save(out)
        ctx.next("rsieve.verify", run=run, shard=shard, lines=lines)

    def generate_shard(
        run: str, shard: str, lines: int, arrived: Callable[[], None]
    ) -> ShardOutput:
        items = ctx.load(run, "clean", shard).items
        # A few ranged reads of the pool's packs: the model waits on this between shards.
        raw = ctx.images(items)
        images = {sha: prepared(raw.get(sha)) for sha in {i.image_sha256 for i in items}}
        out = ShardOutput(run=run, shard=shard, stage="generate", lines=lines)
        ready = []
        for item in items:
            image = images[item.image_sha256]
            if isinstance(image, ImageError):
                reason = (
                    "missing_image"
                    if item.image_sha256 not in raw
                    else "image_too_large"
                    if "exceeds" in str(image)
                    else "unreadable_image"
                )
                out.quarantined.append(
                    Quarantined(
                        id=item.id,
                        line=item.line,
                        family=item.family,
                        stage="generate",
                        reason=reason,
                        detail=str(image)[:500],
                    )
                )
            else:
                ready.append((item, image))
        s = ctx.settings

        def on_ready(info: ModelInfo) -> None:
            feeder.sized(s.triton_grpc_url, info)
            arrived()

        model = TritonModel.from_settings(
            s, s.generator_model, feeder.gate, tokenizer=s.generator_tokenizer, on_ready=on_ready
        )
        replies = ctx.guard("generate", run, shard).batch(
            ready,
            lambda batch: feeder.run(
                model.generate_many_async([ModelRequest(i.question, im.data) for i, im in batch])
            ),
            poisoned=lambda pair: _poisoned(pair[0]),
            key=lambda pair: pair[0].line,
        )
        for (item, image), reply in zip(ready, replies, strict=True):
            if isinstance(reply, Quarantined):
                out.quarantined.append(reply)
                continue
            if isinstance(reply, Exception):
                out.quarantined.append(
                    Quarantined(
                        id=item.id,
                        line=item.line,
                        family=item.family,
                        stage="generate",
                        reason="model_error",
                        detail=str(reply)[:500],
                    )
                )
                continue
            parsed = parse_output(reply.text, reply.finish_reason)
            info = model.info
            assert info is not None
            if reply.user_text is not None and reply.user_text != item.question:
                # Special tokens were neutralised: the stored question is what was sent.
                item = item.model_copy(update={"question": reply.user_text})
            out.generations.append(
                Generation(
                    item=item,
                    model=info.name,
                    raw_output=reply.text,
                    finish_reason=reply.finish_reason,
                    reasoning=parsed.reasoning,
                    answer=parsed.answer,
                    failure=parsed.failure,
                    image_sent_sha256=image.sha256,
                    model_version=info.version,
                    interface=info.interface,
                    model_kind=info.kind,
                    sampling=info.sampling,
                    chat_template=info.chat_template,
                    chat_template_sha256=info.chat_template_sha256,
                    thinking_mode=info.thinking_mode,
                    prompt_sent_sha256=reply.prompt_sent_sha256,
                    input_tokens=reply.input_tokens,
                    output_tokens=reply.output_tokens,
                    latency_s=reply.latency_s,
                    image_sent=image.meta(),
                )
            )
        return out


def _poisoned(item: Item) -> Quarantined:
    return Quarantined(
        id=item.id,
        line=item.line,
        family=item.family,
        stage="generate",
        reason="max_deliveries",
        detail="the worker died on this item each time",
    )
