"""Judge each thing once: the verdict cache, as pure functions (docs/judge.md).

A judge's reply is decided by the judge (its model name and the identity of its weights),
the prompt template, the exact prompt it received (special tokens neutralised), its token
budget and how it is asked (the interface, and what the client adds around the prompt:
the thinking switch of a chat template the client renders, the extra body fields sent to
an OpenAI-compatible server); the judge is always asked greedily
(rsieve.adapters.model.open_model). So a reply is stored once, content-addressed by those
parts, under `judge-cache/` (outside `runs/`: it outlives runs and datasets), and a later
run, or a later shard, that would send the byte-identical prompt to the same judge takes
the stored reply instead of a call.
A reused reply is read exactly as a fresh one (`rsieve.judge.verdicts.read_verdict`), and the
verdict or calibration record says it was reused (`reused`), so the run report and the
card count it apart and the run's token usage does not count it as a call.

What is cached: every answered call, whatever its verdict, `judge_truncated`,
`judge_empty` and `judge_unparsable` included: each is what this judge answers to this
prompt within this budget (the budget is part of the key, so a larger budget asks
again). Never a failed call (`call_failed`: no reply, only an infrastructure error), and
never a reply whose reported user text differs from the prompt looked up (the key would
not name what the judge received).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from rsieve import keys
from rsieve.generate.generation import ModelReply
from rsieve.judge.verdicts import TEMPLATE_SHA256
from rsieve.settings import Settings

__all__ = [
    "CACHE_PREFIX",
    "CACHE_VERSION",
    "CachedReply",
    "JudgeIdentity",
    "cache_entry",
    "judge_identity",
    "prompt_sha256",
    "read_cached",
    "reply_fields",
    "to_send",
    "verdict_key",
]

CACHE_PREFIX = keys.JUDGE_CACHE_PREFIX
CACHE_VERSION = "judge-cache/1"


@dataclass(frozen=True)
class JudgeIdentity:
    """What, besides the prompt, decides a judge's reply."""

    model: str
    weights_sha256: str  # empty: undeclared (the model is known by its name alone)
    max_new_tokens: int
    template_sha256: str = TEMPLATE_SHA256
    # How the judge is asked beyond the prompt (`judge_identity`), as canonical JSON.
    asked: str = ""


def judge_identity(settings: Settings) -> JudgeIdentity:
    """The judge the settings name, and how they ask it: the interface as configured;
    with a chat template the client renders (the vLLM interface, or "auto" with a
    tokenizer), the thinking switch (`reasoning`); on an OpenAI-compatible server, the
    extra body fields merged into every request. Nothing else the settings hold reaches
    the judge (it is greedy whatever the generator samples at)."""
    s = settings
    interface = s.interface_of("judge")
    asked: dict[str, Any] = {"interface": interface}
    if interface == "vllm" or (interface == "auto" and s.judge_tokenizer):
        asked["reasoning"] = s.reasoning
    if interface == "openai":
        asked["extra_body"] = s.openai_extra_body
    return JudgeIdentity(
        model=s.judge_model,
        weights_sha256=s.judge_weights_sha256,
        max_new_tokens=s.judge_max_new_tokens,
        asked=json.dumps(asked, sort_keys=True),
    )


class CachedReply(BaseModel):
    """One stored reply at `verdict_key(...)`: the key's parts (checked on every read) and
    what the judge answered."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    version: Literal["judge-cache/1"] = "judge-cache/1"
    model: str
    weights_sha256: str
    template_sha256: str
    prompt_sha256: str
    max_new_tokens: int
    asked: str
    raw_output: str
    finish_reason: str
    input_tokens: int | None = None
    output_tokens: int | None = None
    # What the judge said it is and which version answered (Triton's model version, or
    # the name an OpenAI-compatible server gave), when the call that made the reply knew.
    model_kind: str | None = None
    model_version: str | None = None


def prompt_sha256(prompt: str) -> str:
    return hashlib.sha256(prompt.encode()).hexdigest()


def verdict_key(judge: JudgeIdentity, prompt: str) -> str:
    """`judge-cache/<sha256>.json`: the sha256 of the key's parts, JSON-encoded (no two
    different tuples of parts encode alike)."""
    parts = [
        CACHE_VERSION,
        judge.model,
        judge.weights_sha256,
        judge.template_sha256,
        prompt_sha256(prompt),
        judge.max_new_tokens,
        judge.asked,
    ]
    digest = hashlib.sha256(json.dumps(parts).encode()).hexdigest()
    return keys.judge_reply(digest)


def _parts(judge: JudgeIdentity, prompt: str) -> dict[str, Any]:
    return {
        "model": judge.model,
        "weights_sha256": judge.weights_sha256,
        "template_sha256": judge.template_sha256,
        "prompt_sha256": prompt_sha256(prompt),
        "max_new_tokens": judge.max_new_tokens,
        "asked": judge.asked,
    }


def read_cached(data: bytes, judge: JudgeIdentity, prompt: str) -> CachedReply | None:
    """A stored reply, if `data` is one for exactly this judge and prompt (an entry that
    does not parse, or names other parts, is a miss: it is asked again and overwritten)."""
    try:
        entry = CachedReply.model_validate_json(data)
    except ValidationError:
        return None
    parts = _parts(judge, prompt)
    return entry if entry.model_dump(include=set(parts)) == parts else None


def to_send(keys: Sequence[str], cached: Mapping[str, CachedReply]) -> list[int]:
    """Indexes of the prompts to send: the first of each key not in the cache (a prompt
    asked twice in one shard is sent once)."""
    seen: set[str] = set()
    out = []
    for k, key in enumerate(keys):
        if key not in cached and key not in seen:
            seen.add(key)
            out.append(k)
    return out


def cache_entry(
    judge: JudgeIdentity,
    prompt: str,
    reply: ModelReply | Exception,
    *,
    model_kind: str | None = None,
    model_version: str | None = None,
) -> CachedReply | None:
    """What to store for a fresh reply to `prompt`, or None: a failed call (an Exception)
    is never stored, nor a reply whose user text as sent is not `prompt`."""
    if isinstance(reply, Exception):
        return None
    if reply.user_text is not None and reply.user_text != prompt:
        return None
    return CachedReply(
        **_parts(judge, prompt),
        raw_output=reply.text,
        finish_reason=reply.finish_reason,
        input_tokens=reply.input_tokens,
        output_tokens=reply.output_tokens,
        model_kind=model_kind,
        model_version=model_version,
    )


def reply_fields(
    reply: ModelReply | Exception | CachedReply, model_kind: str | None = None
) -> dict[str, Any]:
    """The arguments of `rsieve.judge.cascade.apply_verdict` and
    `rsieve.judge.calibration.calibration_record` for a reply: a fresh one (`model_kind`: what
    the judge said it is), a failed call, or a reused one (its stored kind, `reused`)."""
    if isinstance(reply, CachedReply):
        return {
            "raw_output": reply.raw_output,
            "finish_reason": reply.finish_reason,
            "input_tokens": reply.input_tokens,
            "output_tokens": reply.output_tokens,
            "model_kind": reply.model_kind,
            "reused": True,
        }
    if isinstance(reply, Exception):
        return {
            "raw_output": None,
            "finish_reason": "stop",
            "failure": str(reply),
            "model_kind": model_kind,
        }
    return {
        "raw_output": reply.text,
        "finish_reason": reply.finish_reason,
        "input_tokens": reply.input_tokens,
        "output_tokens": reply.output_tokens,
        "model_kind": model_kind,
    }
