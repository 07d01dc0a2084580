"""Generator: asks the VLM (behind Triton, or an OpenAI-compatible server) every clean
item's question, at temperature 0 with reasoning on, keeping the engine full; stores the
raw output, its parse and what answered (model version, sampling, tokens, latency, the
exact image bytes sent). The records are rsieve.generation's (`ready_items`, `record_generations`).
With the blind pass (settings.blind_pass), the items the verifier accepts are asked again
without their image before the shard is stored (rsieve.judge.blind).

The worker runs Celery's thread pool, `generator_concurrency` shards open at once, and
every shard's requests go through one feeder (feeder.py): one loop, one FIFO gate sized
from the engine's capacity, so a shard waiting on its slowest item never lowers the number
of sequences in flight while other shards wait. A shard is loaded only when the gate runs
short of waiting work.

A worker that dies (a crash, SIGKILL) takes its open shards with it: their messages are
unacked and come back after the visibility timeout; an item that kills the worker each time
is isolated by ItemGuard after `max_deliveries`. Redis restarted or unreachable mid-shard:
the shard goes back to the queue (StageTask, services/stage.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from functools import partial

from rsieve import keys
from rsieve.adapters.model import ModelInfo, ModelRequest
from rsieve.adapters.roles import engine_url
from rsieve.adapters.tokenizer import preload_chat_template
from rsieve.generate.adaptive import adaptive_of, next_round
from rsieve.generate.draws import Draw
from rsieve.generate.generation import (
    AsyncModel,
    ModelReply,
    poisoned_item,
    ready_items,
    record_generations,
    round_requests,
    sampled,
)
from rsieve.generate.progress import batches
from rsieve.images import ImageError, PreparedImage, prepare_image
from rsieve.judge.blind import blind_asks, blind_passes, with_blind
from rsieve.judge.cascade import verify_generation
from rsieve.schemas import Generation, Item, Quarantined, ShardOutput
from rsieve.settings import Settings
from rsieve.verify import TrainingPolicy
from services.context import Context
from services.generator.feeder import Feeder, Intake
from services.progress import Progress
from services.stage import ItemGuard

Entry = tuple[tuple[Item, PreparedImage], Draw | None]  # one sample: the item, its draw
Answer = ModelReply | Quarantined | Exception


def _passed(
    entry: Entry, reply: Answer, info: ModelInfo | None, policy: TrainingPolicy
) -> bool | None:
    """Whether a sample passed the verifier, as the verifier will judge it (adaptive
    best-of-n stops on it); None when its call failed."""
    if not isinstance(reply, ModelReply) or info is None:
        return None
    (generations, _) = record_generations([entry[0]], [reply], info, [entry[1]])
    return bool(generations) and verify_generation(generations[0], policy).place == "accepted"


def register(ctx: Context) -> None:
    feeder = Feeder(ctx.settings, ctx.redis)
    ctx.app.rsieve_feeder = feeder
    ctx.app.steps["consumer"].add(Intake)
    preload_chat_template(ctx.settings.generator_tokenizer)

    @ctx.task("rsieve.generate")
    def generate(run: str, shard: str, lines: int) -> None:
        if not ctx.done(run, "generate", shard):
            with feeder.intake(lines) as arrived:
                out, progress = generate_shard(ctx, feeder, run, shard, lines, arrived)
            ctx.save(out)
            progress.clear()
        ctx.next("rsieve.verify", run=run, shard=shard, lines=lines)


def prepared(ctx: Context, data: bytes | None) -> PreparedImage | ImageError | None:
    """The bytes the model gets; re-encoded ones are stored content-addressed, so
    what the model saw can be fetched by its hash."""
    s = ctx.settings
    if data is None:
        return None
    try:
        image = prepare_image(data, max_side=s.image_max_side, max_pixels=s.image_max_pixels)
    except ImageError as exc:
        return exc
    if image.reencoded and not ctx.store.exists(keys.image(image.sha256)):
        ctx.store.put(keys.image(image.sha256), image.data, content_type="image/png")
    return image


def ask_blind(
    feeder: Feeder, s: Settings, model: AsyncModel, generations: list[Generation]
) -> list[Generation]:
    """The blind pass (rsieve.judge.blind): the accepted items asked again without
    their image, through the same gate. Not stored as progress: a redelivery asks
    them again."""
    asks = blind_asks(generations, s.training_policy(), s.circular)
    if not asks:
        return generations
    requests = [ModelRequest(a.generation.item.question, None, a.generation.seed) for a in asks]
    replies = feeder.run(model.generate_many_async(requests))
    passes = blind_passes(asks, replies, s.training_policy(), s.blind_policy)
    return with_blind(generations, passes)


def generate_shard(
    ctx: Context, feeder: Feeder, run: str, shard: str, lines: int, arrived: Callable[[], None]
) -> tuple[ShardOutput, Progress]:
    """One shard generated: its items' images read and prepared, every sample asked
    (`ShardAsking`, round by round as adaptive best-of-n decides), recorded, and the blind
    pass asked of what passed."""
    s = ctx.run_settings(run)  # the run's own sampling (best-of-n)
    items = ctx.load(run, "clean", shard).items
    # A few ranged reads of the pool's packs: the model waits on this between shards.
    raw = ctx.images(items)
    ready, quarantined = ready_items(
        items, {sha: prepared(ctx, raw.get(sha)) for sha in {i.image_sha256 for i in items}}
    )

    def on_ready(info: ModelInfo) -> None:
        feeder.sized(engine_url(s, "generator"), info)
        arrived()

    model = ctx.generator_model(feeder.gate, on_ready, s)
    asked, draws = sampled(ready, s.samples, s.seed, s.circular)  # best-of-n
    entries = list(zip(asked, draws, strict=True))
    # What a redelivery of this shard may reuse: the replies an earlier delivery stored
    # as its batches returned (services/progress.py); only the rest is asked.
    progress = Progress(
        ctx,
        run,
        "generate",
        shard,
        [f"{i.line}:{i.id}:{im.sha256}:{d.seed if d else ''}" for (i, im), d in entries],
    )
    guard = partial(ctx.guard, "generate", run, shard)  # made by the first round asked
    asking = ShardAsking(guard, feeder, model, entries, progress)
    replies = asking.rounds(s, len(ready))
    order = sorted(replies)
    info = model.info or progress.info  # nothing left to ask: what answered before
    generations, failed = record_generations(
        [entries[k][0] for k in order],
        [replies[k] for k in order],
        info,
        [entries[k][1] for k in order],
    )
    if s.blind_pass:
        generations = ask_blind(feeder, s, model, generations)
    out = ShardOutput(
        run=run,
        shard=shard,
        stage="generate",
        lines=lines,
        generations=generations,
        quarantined=quarantined + failed,
    )
    return out, progress


class ShardAsking:
    """One delivery's asking of a shard's samples (`entries`) through the feeder's gate:
    replies stored as each batch returns (`progress`), items isolated by the shard's
    guard, rounds decided by adaptive best-of-n (`rounds`). The guard is made once, when
    the first round is asked: it counts a delivery, and the rounds of one delivery are one
    (a guard a round made a shard of more rounds than `max_deliveries` look like one that
    kept killing its worker, and asked it item by item)."""

    def __init__(
        self,
        guard: Callable[[], ItemGuard],
        feeder: Feeder,
        model: AsyncModel,
        entries: list[Entry],
        progress: Progress,
    ) -> None:
        self._new_guard, self.feeder, self.model = guard, feeder, model
        self.entries, self.progress = entries, progress
        self._guard: ItemGuard | None = None

    @property
    def guard(self) -> ItemGuard:
        if self._guard is None:
            self._guard = self._new_guard()
        return self._guard

    async def ask(self, positions: list[int]) -> list[ModelReply | Exception]:
        # One request per item and round: its samples, answered with vLLM's `n` where
        # the engine takes it (one prefill), else back to back.
        answers = await self.model.generate_many_async(round_requests(self.entries, positions))
        await asyncio.to_thread(self.progress.record, positions, answers, self.model.info)
        return answers

    async def ask_all(self, positions: Sequence[int], batch: int) -> list[ModelReply | Exception]:
        # Every batch in flight at once (created in order: FIFO at the gate), each
        # stored as it returns.
        tasks = [asyncio.ensure_future(self.ask(part)) for part in batches(positions, batch)]
        try:
            got = await asyncio.gather(*tasks)
        except BaseException:
            # One batch failed (the shard is retried): the others stop, as one call's
            # requests do, and free their slots at the gate.
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise
        return [answer for part in got for answer in part]

    def answer(self, positions: list[int], batch: int) -> dict[int, Answer]:
        found = self.guard.batch(
            positions,
            lambda part: self.feeder.run(self.ask_all(part, batch)),
            poisoned=lambda k: poisoned_item(self.entries[k][0][0]),
            key=lambda k: self.entries[k][0][0].line,
        )
        return dict(zip(positions, found, strict=True))

    def rounds(self, s: Settings, items: int) -> dict[int, Answer]:
        """Every sample's reply, by position: the stored ones reused, the rest asked round
        by round until adaptive best-of-n (s: the run's settings) asks nothing more."""
        entries, progress, model = self.entries, self.progress, self.model
        counts = [max(1, s.samples)] * items  # each item's samples, laid out in order
        rule, policy = adaptive_of(s), s.training_policy()
        replies: dict[int, Answer] = dict(progress.replies)
        verdicts: dict[int, bool | None] = {}
        stale = progress.reused and progress.info is not None
        while True:
            info = model.info or progress.info
            if stale and model.info is not None and model.info != progress.info:
                # Another model (version) answered the stored replies: asked again, so
                # that one model answered the whole shard.
                replies = {k: r for k, r in replies.items() if k not in progress.reused}
                verdicts, stale = {}, False
            for k, reply in replies.items():
                if k not in verdicts:
                    verdicts[k] = _passed(entries[k], reply, info, policy)
            poisoned = {
                entries[k][0][0].line for k, r in replies.items() if isinstance(r, Quarantined)
            }
            todo = [
                k
                for k in next_round(counts, verdicts, rule)
                if entries[k][0][0].line not in poisoned
            ]
            if not todo:
                return replies
            replies |= self.answer(todo, s.progress_batch_items)
