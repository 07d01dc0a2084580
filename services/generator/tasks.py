"""Generator: asks the VLM behind Triton every clean item's question, at temperature 0
with reasoning on, keeping many requests in flight; stores the raw output, its parse and
what answered (model version, sampling, tokens, latency, the exact image bytes sent).

The worker runs `generator_concurrency` prefork children (2) so consecutive shards overlap:
while one shard's last batches run, the next is loaded, its images fetched and its first
requests queued at Triton. Every child's requests hold a slot of one file-locked gate of
`max_inflight` named here, in the main process, before the fork (inflight.py): the worker
never has more than `max_inflight` requests in flight, and a child that dies frees its slots.

Redis restarted or unreachable mid-shard: the worker's main process lives on
(rsieve.adapters.queues), cancels the shard it had handed a child and gets it back with
its unacked messages; a child that meets the outage first gives its shard back to the
queue (StageTask, services/common.py).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import secrets
import tempfile

from rsieve.adapters.model import ModelRequest, TritonModel
from rsieve.images import ImageError, PreparedImage, prepare_image
from rsieve.schemas import Generation, Item, Quarantined, ShardOutput
from rsieve.think import parse_output
from services.common import Context, StageTask
from services.generator.inflight import SlotFile


def _slot_file(slots: int) -> SlotFile:
    """The worker's gate: a lock file unique to this main process, removed when it exits."""
    path = os.path.join(tempfile.gettempdir(),
                        f"rsieve-inflight-{os.getpid()}-{secrets.token_hex(4)}.lock")
    owner = os.getpid()

    def remove() -> None:
        if os.getpid() == owner:
            with contextlib.suppress(OSError):
                os.unlink(path)

    atexit.register(remove)
    return SlotFile(path, slots)


def register(ctx: Context) -> None:
    slots = _slot_file(ctx.settings.max_inflight)

    def prepared(data: bytes | None) -> PreparedImage | ImageError:
        """The bytes the model gets; re-encoded ones are stored content-addressed, so
        what the model saw can be fetched by its hash."""
        s = ctx.settings
        if data is None:
            return ImageError("the image is missing from the pool's packs")
        try:
            image = prepare_image(data, max_side=s.image_max_side,
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
            # A few ranged reads of the pool's packs: the model waits on this between shards.
            raw = ctx.images(items)
            images = {sha: prepared(raw.get(sha)) for sha in {i.image_sha256 for i in items}}
            out = ShardOutput(run=run, shard=shard, stage="generate", lines=lines)
            ready = []
            for item in items:
                image = images[item.image_sha256]
                if isinstance(image, ImageError):
                    reason = ("missing_image" if item.image_sha256 not in raw else
                              "image_too_large" if "exceeds" in str(image) else "unreadable_image")
                    out.quarantined.append(Quarantined(
                        id=item.id, line=item.line, family=item.family, stage="generate",
                        reason=reason, detail=str(image)[:500]))
                else:
                    ready.append((item, image))
            model = TritonModel.from_settings(ctx.settings, ctx.settings.generator_model, slots,
                                              sharers=ctx.settings.generator_concurrency,
                                              tokenizer=ctx.settings.generator_tokenizer)
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
                if reply.user_text is not None and reply.user_text != item.question:
                    # Special tokens were neutralised: the stored question is what was sent.
                    item = item.model_copy(update={"question": reply.user_text})
                out.generations.append(Generation(
                    item=item, model=info.name, raw_output=reply.text,
                    finish_reason=reply.finish_reason, reasoning=parsed.reasoning,
                    answer=parsed.answer, failure=parsed.failure,
                    image_sent_sha256=image.sha256, model_version=info.version,
                    interface=info.interface, model_kind=info.kind, sampling=info.sampling,
                    chat_template=info.chat_template,
                    chat_template_sha256=info.chat_template_sha256,
                    thinking_mode=info.thinking_mode,
                    prompt_sent_sha256=reply.prompt_sent_sha256,
                    input_tokens=reply.input_tokens, output_tokens=reply.output_tokens,
                    latency_s=reply.latency_s, image_sent=image.meta()))
            ctx.save(out)
        ctx.next("rsieve.verify", run=run, shard=shard, lines=lines)


def _poisoned(item: Item) -> Quarantined:
    return Quarantined(id=item.id, line=item.line, family=item.family, stage="generate",
                       reason="max_deliveries", detail="the worker died on this item each time")
