"""Triton's side of the wire, apart from any server: what a model's metadata and config say
it takes (`Served`), the tensors of a request on the rsieve interface and how its result
is read, and how a vendor error is told transient or the request's own.

Pure: tensors in and out, no client, no network, so every request rsieve sends and every
reading of a result can be checked without a server. The session that sends them (the
gate, readiness, retries) is rsieve.adapters.model.TritonModel; vLLM's interface is
rsieve.adapters.vllm_wire. deploy/triton/README.md describes both interfaces.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import grpc
import numpy as np
import tritonclient.grpc.aio as grpcclient
from tritonclient.utils import InferenceServerException

from rsieve.adapters.retry import ItemError
from rsieve.generate.chat import ChatTemplate
from rsieve.generate.generation import ModelInfo, ModelReply, ModelRequest, sent_sha256

__all__ = [
    "MalformedReply",
    "Result",
    "Served",
    "chunks",
    "first_int",
    "in_order",
    "ints",
    "is_transient",
    "items_per_request",
    "model_info",
    "read_served",
    "rsieve_replies",
    "rsieve_request",
    "rsieve_sampling",
    "sent_sha256",
    "status_of",
    "strs",
    "strs_or_none",
    "tensor",
]

# Codes of an error that is the server's state, never the request's.
_TRANSIENT = ("UNAVAILABLE", "DEADLINE_EXCEEDED", "RESOURCE_EXHAUSTED", "CANCELLED")


class MalformedReply(ItemError):
    """The model answered, but not as its interface says (e.g. not one row per item)."""


class Result(Protocol):
    """What a request's result is read through (tritonclient's InferResult)."""

    def as_numpy(self, name: str) -> np.ndarray | None: ...


def status_of(exc: BaseException) -> tuple[str, str]:
    """(status code, message) of a vendor error."""
    if isinstance(exc, InferenceServerException):
        return str(exc.status() or ""), str(exc.message() or "")
    if isinstance(exc, grpc.RpcError):
        code = exc.code() if hasattr(exc, "code") else None
        return str(getattr(code, "name", code)), str(exc)
    return "", repr(exc)


def is_transient(code: str) -> bool:
    """Whether an error of status `code` says the server is overloaded or going away."""
    return any(c in code for c in _TRANSIENT)


def tensor(name: str, values: list[Any], shape: list[int], dtype: str) -> grpcclient.InferInput:
    """One input tensor of BYTES or BOOL elements."""
    out = grpcclient.InferInput(name, shape, dtype)
    np_type = np.object_ if dtype == "BYTES" else np.bool_
    out.set_data_from_numpy(np.array(values, dtype=np_type).reshape(shape))
    return out


@dataclass(frozen=True)
class Served:
    """What one model's metadata and config say: the tensors it takes and gives, its
    interface (an `auto` one decided by a `text_input` input: the vLLM backend), its
    version, `rsieve_kind`, the engine's `max_num_seqs` (capacity) and `max_batch_size`."""

    inputs: frozenset[str]
    outputs: frozenset[str]
    interface: str
    version: str
    kind: str | None
    capacity: int | None
    max_batch_size: int


def read_served(meta: dict[str, Any], config: dict[str, Any], interface: str) -> Served:
    """`Served` from Triton's JSON metadata and config; `interface` as configured."""
    inputs = frozenset(t["name"] for t in meta.get("inputs", []))
    if interface == "auto":
        interface = "vllm" if "text_input" in inputs else "rsieve"
    params = config.get("parameters", {})
    seqs = str(params.get("max_num_seqs", {}).get("string_value") or "")
    versions = meta.get("versions") or [""]
    return Served(
        inputs=inputs,
        outputs=frozenset(t["name"] for t in meta.get("outputs", [])),
        interface=interface,
        version=str(max(versions, key=str)),
        kind=params.get("rsieve_kind", {}).get("string_value") or None,
        capacity=int(seqs) if seqs.isdigit() and int(seqs) > 0 else None,
        max_batch_size=int(config.get("max_batch_size") or 0),
    )


def model_info(
    model: str, served: Served, sampling: dict[str, Any], template: ChatTemplate | None
) -> ModelInfo:
    """What answers, as recorded with every generation: the chat template only where the
    client renders the prompt (the vLLM interface)."""
    rendered = template if served.interface == "vllm" else None
    return ModelInfo(
        name=model,
        version=served.version,
        interface=served.interface,
        sampling=sampling,
        kind=served.kind,
        chat_template=rendered.name if rendered else None,
        chat_template_sha256=rendered.sha256 if rendered else None,
        thinking_mode=rendered.thinking if rendered else "server",
        capacity=served.capacity,
    )


def items_per_request(served: Served, request_items: int, limit: int) -> int:
    """Items one request carries: on the rsieve interface up to the model's
    `max_batch_size` (capped by `request_items` when set, and by the items in flight),
    so the dynamic batcher receives whole batches; vLLM's takes one."""
    if served.interface != "rsieve":
        return 1
    batch = served.max_batch_size
    return max(1, min(batch, request_items or batch, limit))


def rsieve_sampling(
    served: Served, temperature: float, max_new_tokens: int | None
) -> dict[str, Any]:
    """The rsieve interface's sampling as recorded: greedy unless the model takes a
    `temperature` (and then a per-sample `seed`, best-of-n); the budget when accepted."""
    params: dict[str, Any] = {"temperature": temperature if "temperature" in served.inputs else 0.0}
    if max_new_tokens is not None and "max_new_tokens" in served.inputs:
        params["max_new_tokens"] = max_new_tokens
    return params


def chunks(requests: Sequence[ModelRequest], size: int) -> list[list[int]]:
    """Indexes of `requests` in request-sized chunks, those with an image apart from those
    without (an optional input is present for a whole request or absent)."""
    with_image = [i for i, r in enumerate(requests) if r.image is not None]
    without = [i for i, r in enumerate(requests) if r.image is None]
    return [
        group[at : at + size]
        for group in (with_image, without)
        for at in range(0, len(group), size)
    ]


def in_order(
    requests: Sequence[ModelRequest],
    cut: list[list[int]],
    answers: Sequence[list[ModelReply | Exception]],
) -> list[ModelReply | Exception]:
    """A call's replies in the order of its requests (`n` each, a request's outputs in
    order) from the answers to its chunks (`cut`, as `chunks` made them)."""
    at = [0]
    for r in requests:
        at.append(at[-1] + r.n)
    replies: list[ModelReply | Exception] = [Exception("unanswered")] * at[-1]
    for chunk, answer in zip(cut, answers, strict=True):
        outputs = iter(answer)
        for i in chunk:
            for k in range(at[i], at[i + 1]):
                replies[k] = next(outputs)
    return replies


def rsieve_request(
    served: Served,
    users: list[str],
    reqs: list[ModelRequest],
    *,
    max_new_tokens: int | None,
    temperature: float,
    seed: int | None,
) -> tuple[list[grpcclient.InferInput], list[str]]:
    """The inputs of one rsieve-interface request for `reqs` (one row each, `users` their
    prompts as sent) and the outputs it asks for: the optional ones the model declares."""
    n = len(reqs)
    inputs = [tensor("prompt", [u.encode("utf-8") for u in users], [n, 1], "BYTES")]
    if reqs[0].image is not None:  # a chunk is all with or all without (chunks)
        inputs.append(tensor("image", [r.image for r in reqs], [n, 1], "BYTES"))
    if max_new_tokens is not None and "max_new_tokens" in served.inputs:
        budget = grpcclient.InferInput("max_new_tokens", [n, 1], "INT32")
        budget.set_data_from_numpy(np.full((n, 1), max_new_tokens, dtype=np.int32))
        inputs.append(budget)
    if "temperature" in served.inputs:
        heat = grpcclient.InferInput("temperature", [n, 1], "FP32")
        heat.set_data_from_numpy(np.full((n, 1), temperature, dtype=np.float32))
        inputs.append(heat)
    if "seed" in served.inputs:
        seeds = [r.seed if r.seed is not None else (seed or 0) for r in reqs]
        seeded = grpcclient.InferInput("seed", [n, 1], "INT64")
        seeded.set_data_from_numpy(np.array(seeds, dtype=np.int64).reshape(n, 1))
        inputs.append(seeded)
    names = ["text", "finish_reason"] + [
        name for name in ("num_input_tokens", "num_output_tokens") if name in served.outputs
    ]
    return inputs, names


def rsieve_replies(result: Result, names: list[str], users: list[str]) -> list[ModelReply]:
    """One reply per row of an rsieve-interface result; MalformedReply when the rows are
    not one per item."""
    n = len(users)
    texts, finishes = strs(result.as_numpy("text"), n), strs(result.as_numpy("finish_reason"), n)
    n_in = ints(result.as_numpy("num_input_tokens") if "num_input_tokens" in names else None, n)
    n_out = ints(result.as_numpy("num_output_tokens") if "num_output_tokens" in names else None, n)
    return [
        ModelReply(
            text=texts[i] or "",
            finish_reason=finishes[i] or "stop",
            input_tokens=n_in[i],
            output_tokens=n_out[i],
            prompt_sent_sha256=sent_sha256(users[i]),
            user_text=users[i],
        )
        for i in range(n)
    ]


def strs(array: np.ndarray | None, n: int) -> list[str | None]:
    if array is None or array.size != n:
        raise MalformedReply(f"{0 if array is None else array.size} rows for {n} items")
    return [
        v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v) for v in array.reshape(-1)
    ]


def strs_or_none(array: np.ndarray | None) -> list[str] | None:
    if array is None or array.size == 0:
        return None
    return [
        v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v) for v in array.reshape(-1)
    ]


def ints(array: np.ndarray | None, n: int) -> list[int | None]:
    if array is None or array.size != n:
        return [None] * n
    return [int(v) for v in array.reshape(-1)]


def first_int(array: np.ndarray | None, default: int | None = None) -> int | None:
    if array is None or array.size == 0:
        return default
    return int(array.reshape(-1)[0])
