"""The judge's calls, each prompt asked once (rsieve.judge.judgecache, docs/judge.md): every
prompt is looked up in the verdict cache first, only the misses reach the model (a prompt
twice in one shard once), and every answered call is stored for the next run as its batch
returns (`batch` prompts at a time): a shard killed mid-way (a dead worker, its time limit)
and redelivered finds what it had answered in the cache and asks only the rest."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypedDict

from rsieve.adapters.model import ModelRequest
from rsieve.adapters.storage import ObjectStore
from rsieve.adapters.tokenizer import load_chat_template
from rsieve.errors import NotFoundError
from rsieve.generate.generation import Model, ModelReply
from rsieve.generate.progress import batches
from rsieve.judge.judgecache import (
    CachedReply,
    JudgeIdentity,
    cache_entry,
    read_cached,
    reply_fields,
    to_send,
    verdict_key,
)

THREADS = 8  # cache objects read or written at once


class Pacing(TypedDict):
    """`ask_once`'s batching: prompts per batch, and who sees each batch's pace."""

    batch: int
    paced: Callable[[float, int], None] | None


def judge_specials(tokenizer: str) -> tuple[str, ...]:
    """The special tokens the judge's client neutralises (its tokenizer's; none without)."""
    return load_chat_template(tokenizer).specials if tokenizer else ()


def _cached(
    store: ObjectStore, judge: JudgeIdentity, keys: Sequence[str], prompts: Sequence[str]
) -> dict[str, CachedReply]:
    prompt_of = dict(zip(keys, prompts, strict=True))

    def read(key: str) -> tuple[str, CachedReply | None]:
        try:
            return key, read_cached(store.get(key), judge, prompt_of[key])
        except NotFoundError:
            return key, None

    with ThreadPoolExecutor(max_workers=THREADS) as pool:
        found = pool.map(read, list(prompt_of))
        return {key: entry for key, entry in found if entry is not None}


def ask_once(
    store: ObjectStore,
    model: Model,
    judge: JudgeIdentity,
    prompts: Sequence[str],
    *,
    batch: int = 0,
    paced: Callable[[float, int], None] | None = None,
) -> list[dict[str, Any]]:
    """Per prompt, the arguments of `apply_verdict` / `calibration_record` (the prompt as
    the judge received it included): a fresh reply, a failed call, or a reused one. The
    misses are asked `batch` at a time (all at once when 0), each batch's verdicts stored
    before the next is asked; `paced(seconds, answered)` after each batch."""
    keys = [verdict_key(judge, p) for p in prompts]
    cached = _cached(store, judge, keys, prompts)
    send = to_send(keys, cached)
    replies: dict[int, ModelReply | Exception | CachedReply] = {}
    stored: dict[str, CachedReply] = {}
    kind: str | None = None
    started = time.monotonic()
    for part in batches(send, batch):
        answers = model.generate_many([ModelRequest(prompts[k]) for k in part])
        kind = model.info.kind if model.info else None
        version = model.info.version if model.info else None
        replies |= dict(zip(part, answers, strict=True))
        fresh: dict[str, CachedReply] = {}
        for k, answer in zip(part, answers, strict=True):
            entry = cache_entry(judge, prompts[k], answer, model_kind=kind, model_version=version)
            if entry is not None:
                fresh[keys[k]] = entry
        with ThreadPoolExecutor(max_workers=THREADS) as pool:
            puts = [
                pool.submit(
                    store.put, key, e.model_dump_json().encode(), content_type="application/json"
                )
                for key, e in fresh.items()
            ]
            for put in puts:
                put.result()
        stored |= fresh
        if paced is not None:
            paced(time.monotonic() - started, len(replies))
    kind = model.info.kind if model.info else kind
    first = {keys[k]: k for k in send}
    out = []
    for k, key in enumerate(keys):
        # A prompt asked in this call takes its fresh reply; a repeat of it in this shard
        # (no call of its own) the stored one, as a later run would.
        reply = replies[k] if k in replies else cached.get(key) or stored.get(key)
        reply = replies[first[key]] if reply is None else reply  # a failed call, repeated
        received = reply.user_text if isinstance(reply, ModelReply) else None
        out.append(reply_fields(reply, kind) | {"prompt": received or prompts[k]})
    return out
