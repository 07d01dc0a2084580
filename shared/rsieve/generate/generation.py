"""The generation outcome of a shard, from what the model answered (no I/O): which items
reach the model (a usable image), and for each reply a `Generation` record (raw output,
its parse, what answered) or a quarantine. The generator (services/generator) prepares the
images, asks the model and stores the result; `rsieve.adapters.model` speaks to Triton.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from rsieve.generate.draws import Draw, circular_items
from rsieve.generate.draws import draws as sample_draws
from rsieve.generate.think import parse_output
from rsieve.images import ImageError, PreparedImage
from rsieve.schemas import Generation, Item, Quarantined

__all__ = [
    "AsyncModel",
    "Model",
    "ModelInfo",
    "ModelReply",
    "ModelRequest",
    "image_quarantine",
    "poisoned_item",
    "ready_items",
    "record_generations",
    "round_requests",
    "sampled",
    "singles",
]


def sent_sha256(text: str) -> str:
    """The hash a reply records of the prompt text as it went on the wire (every adapter's,
    so two servers' replies to one prompt carry one hash)."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class ModelRequest:
    prompt: str
    image: bytes | None = None
    # A best-of-n sample's own seed (rsieve.generate.draws); None: the model's configured one.
    seed: int | None = None
    # The seeds of further samples of the same prompt and image (one round of an item's
    # best-of-n, rsieve.generate.adaptive): an engine that takes vLLM's `n` answers them in
    # one request, its prompt and image prefilled once; another asks each with its own
    # seed, back to back (`singles`). Answered with 1 + len(seeds) replies, in order.
    seeds: tuple[int, ...] = ()

    @property
    def n(self) -> int:
        return 1 + len(self.seeds)


@dataclass(frozen=True)
class ModelReply:
    text: str
    finish_reason: str
    input_tokens: int | None = None
    output_tokens: int | None = None
    latency_s: float | None = None
    # sha256 of the exact prompt string on the wire (the rendered chat prompt for vLLM).
    prompt_sent_sha256: str | None = None
    # The user's text as sent: the prompt, with special tokens neutralised.
    user_text: str | None = None
    # The seed this output was drawn with, when not the request's own: output j of a
    # request with `n` and seed s is drawn with s + j (vLLM's parallel sampling).
    seed: int | None = None


@dataclass(frozen=True)
class ModelInfo:
    """What answered: recorded with every generation."""

    name: str
    version: str
    interface: str
    sampling: dict[str, Any] = field(default_factory=dict)
    # The checkpoint whose template the client rendered (vLLM interface), its sha256, and
    # its thinking mode; "server" when the model server renders (rsieve interface).
    chat_template: str | None = None
    chat_template_sha256: str | None = None
    thinking_mode: str | None = None
    # The model's `rsieve_kind` config parameter (rsieve.schemas.MODEL_KINDS), if declared.
    kind: str | None = None
    # Sequences the engine runs at once: its `max_num_seqs` config parameter, if declared.
    capacity: int | None = None


class Model(Protocol):
    """What a stage asks of a model: rsieve.adapters.model.TritonModel, or a fake given to
    `services.worker.bootstrap`. `info` is what answered, known once it was asked."""

    info: ModelInfo | None

    def generate_many(self, requests: Sequence[ModelRequest]) -> list[ModelReply | Exception]: ...


class AsyncModel(Protocol):
    """What the generator asks of its model: answers on the feeder's loop (the adapters'
    TritonModel and OpenAIModel, or a fake given to `services.worker.bootstrap`)."""

    info: ModelInfo | None

    async def generate_many_async(
        self, requests: Sequence[ModelRequest]
    ) -> list[ModelReply | Exception]: ...


def singles(requests: Sequence[ModelRequest]) -> list[ModelRequest]:
    """Each sample of `requests` as its own request with its own seed, in order: for an
    engine that does not take `n` (its prefix cache, when it has one, serves the prompt
    and image again)."""
    return [
        ModelRequest(r.prompt, r.image, seed)
        for r in requests
        for seed in ((r.seed, *r.seeds) if r.seeds else (r.seed,))
    ]


def round_requests(
    entries: Sequence[tuple[tuple[Item, PreparedImage], Draw | None]], positions: Sequence[int]
) -> list[ModelRequest]:
    """The requests that ask `positions` of a shard's entries (`sampled`), in order: the
    consecutive samples of one item with the same question as sent (circular sampling
    rotates it per sample) are one request with the further samples' seeds (`seeds`), one
    round of the item's best-of-n; answered with one reply per position, in order."""
    requests: list[ModelRequest] = []
    last: Item | None = None
    for k in positions:
        (item, image), draw = entries[k]
        same = last is not None and (last.line, last.question) == (item.line, item.question)
        if draw is not None and same:
            requests[-1] = replace(requests[-1], seeds=(*requests[-1].seeds, draw.seed))
        else:
            requests.append(ModelRequest(item.question, image.data, draw.seed if draw else None))
        last = item
    return requests


def _quarantine(item: Item, reason: str, detail: str = "") -> Quarantined:
    return Quarantined(
        id=item.id,
        line=item.line,
        family=item.family,
        stage="generate",
        reason=reason,
        detail=detail[:500],
    )


def image_quarantine(item: Item, error: ImageError | None) -> Quarantined:
    """An item whose image cannot be sent: missing from the packs (None), over the
    limits, or unreadable."""
    if error is None:
        return _quarantine(item, "missing_image", "the image is missing from the pool's packs")
    return _quarantine(item, error.reason, str(error))


def poisoned_item(item: Item) -> Quarantined:
    return _quarantine(item, "max_deliveries", "the worker died on this item each time")


def ready_items(
    items: Sequence[Item], images: Mapping[str, PreparedImage | ImageError | None]
) -> tuple[list[tuple[Item, PreparedImage]], list[Quarantined]]:
    """(items the model can be asked, with the image to send; the quarantined rest).
    `images`: sha256 -> the prepared image, why it cannot be, or None when missing."""
    ready: list[tuple[Item, PreparedImage]] = []
    quarantined: list[Quarantined] = []
    for item in items:
        image = images.get(item.image_sha256)
        if isinstance(image, PreparedImage):
            ready.append((item, image))
        else:
            quarantined.append(image_quarantine(item, image))
    return ready, quarantined


def sampled(
    ready: Sequence[tuple[Item, PreparedImage]],
    samples: int,
    base_seed: int,
    circular: bool = False,
) -> tuple[list[tuple[Item, PreparedImage]], list[Draw | None]]:
    """Every request of a shard: each ready item once, or once per sample (best-of-n,
    rsieve.generate.draws.draws), samples of one item together; and the sample each is. With
    `circular`, sample k asks the item with its options rotated by k (its question, as
    sent, and its references rotated with them)."""
    asked: list[tuple[Item, PreparedImage]] = []
    draws: list[Draw | None] = []
    for item, image in ready:
        its_draws = sample_draws(item.id, samples, base_seed)
        items = circular_items(item, samples) if circular else [item] * len(its_draws)
        for d, it in zip(its_draws, items, strict=True):
            asked.append((it, image))
            draws.append(d)
    return asked, draws


def record_generations(
    ready: Sequence[tuple[Item, PreparedImage]],
    replies: Sequence[ModelReply | Quarantined | Exception],
    info: ModelInfo | None,
    draws: Sequence[Draw | None] | None = None,
) -> tuple[list[Generation], list[Quarantined]]:
    """Each reply as its `Generation` (the raw output and its parse, with what answered:
    `info`, None only when the model was never asked, and the sample it is); a model error
    as `model_error`; an item ItemGuard isolated as it was quarantined. With best-of-n
    (`ready` from `sampled`), an item is quarantined only when none of its samples was
    answered, once; its failed samples are left out (the pass rate counts the answered).
    `draws`: the sample each entry of `ready` is (`sampled`), None with one per item."""
    generations: list[Generation] = []
    failed: dict[int, Quarantined] = {}
    for (item, image), reply, draw in zip(
        ready, replies, draws or [None] * len(ready), strict=True
    ):
        if isinstance(reply, Quarantined):
            failed.setdefault(item.line, reply)
            continue
        if isinstance(reply, Exception):
            failed.setdefault(item.line, _quarantine(item, "model_error", str(reply)))
            continue
        if info is None:
            raise ValueError("a model reply without the model's info")
        parsed = parse_output(reply.text, reply.finish_reason)
        if reply.user_text is not None and reply.user_text != item.question:
            # Special tokens were neutralised: the stored question is what was sent.
            item = item.model_copy(update={"question": reply.user_text})
        generations.append(
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
                sample=draw.index if draw else None,
                seed=(reply.seed if reply.seed is not None else draw.seed) if draw else None,
            )
        )
    answered = {g.item.line for g in generations}
    return generations, [q for line, q in failed.items() if line not in answered]
