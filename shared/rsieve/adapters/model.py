"""The model behind Triton, through tritonclient's asyncio gRPC client.

Two interfaces (deploy/triton/README.md), chosen by `interface` or, with "auto", from the
model's metadata (a `text_input` input means the vLLM backend):

- "rsieve": `prompt` and an optional `image` (encoded bytes) in, `text` and
  `finish_reason` out; optionally `max_new_tokens` in and `num_input_tokens` /
  `num_output_tokens` out, used when the model declares them. Unary `infer` calls.
- "vllm": Triton's vLLM backend (decoupled). The prompt is rendered client side with the
  chat template (`rsieve.chat`), the image goes base64 in `image`, `sampling_parameters`
  is vLLM SamplingParams JSON, and finish reason and token counts are asked for with the
  backend's `return_*` flags. One gRPC bidirectional stream per request.

Up to `max_inflight` requests are kept in flight so Triton's dynamic batcher (or vLLM's
continuous batching) can fill its batches; a full Triton queue (RESOURCE_EXHAUSTED) is
backpressure, retried with backoff. With `slots` (a limit shared by several processes, e.g.
the generator's `services.generator.inflight.SlotFile`) that limit bounds the requests
instead, across every call that shares it. Before any work the server and the model must be ready.

Errors:
    unreachable, not ready, or transient after `retries` -> RetryableError (the shard is
        retried; never scored)
    an error the model returns for one request while the server and model stay ready
        -> that request's result (an Exception in the returned list)
"""

from __future__ import annotations

import asyncio
import base64
import json
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal, Protocol

import grpc
import numpy as np
import tritonclient.grpc.aio as grpcclient
from tritonclient.utils import InferenceServerException

from rsieve.chat import render_chat
from rsieve.errors import RetryableError
from rsieve.settings import Settings

__all__ = ["Interface", "ModelInfo", "ModelReply", "ModelRequest", "TritonModel"]

Interface = Literal["auto", "rsieve", "vllm"]

_TRANSIENT = ("UNAVAILABLE", "DEADLINE_EXCEEDED", "RESOURCE_EXHAUSTED", "CANCELLED")


@dataclass(frozen=True)
class ModelRequest:
    prompt: str
    image: bytes | None = None


@dataclass(frozen=True)
class ModelReply:
    text: str
    finish_reason: str
    input_tokens: int | None = None
    output_tokens: int | None = None
    latency_s: float | None = None
    # sha256 of the exact prompt string on the wire (the rendered chat prompt for vLLM).
    prompt_sent_sha256: str | None = None


@dataclass(frozen=True)
class ModelInfo:
    """What answered: recorded with every generation."""

    name: str
    version: str
    interface: str
    sampling: dict[str, Any] = field(default_factory=dict)
    chat_template: str | None = None


class _Lease(Protocol):
    async def __aenter__(self) -> None: ...
    async def __aexit__(self, exc_type: Any, exc: Any, tb: Any) -> None: ...
    def close(self) -> None: ...


class SharedSlots(Protocol):
    """An in-flight limit shared beyond one call: one `lease()` per call."""

    def lease(self) -> _Lease: ...


class _Transient(Exception):
    """A failure worth retrying (server unavailable, overloaded, restarting)."""


def _status(exc: BaseException) -> tuple[str, str]:
    """(status code, message) of a vendor error."""
    if isinstance(exc, InferenceServerException):
        return str(exc.status() or ""), str(exc.message() or "")
    if isinstance(exc, grpc.RpcError):
        code = exc.code() if hasattr(exc, "code") else None
        return str(getattr(code, "name", code)), str(exc)
    return "", repr(exc)


def _tensor(name: str, values: list[Any], shape: list[int], dtype: str) -> grpcclient.InferInput:
    tensor = grpcclient.InferInput(name, shape, dtype)
    np_type = np.object_ if dtype == "BYTES" else np.bool_
    tensor.set_data_from_numpy(np.array(values, dtype=np_type).reshape(shape))
    return tensor


def _sha256(text: str) -> str:
    import hashlib

    return hashlib.sha256(text.encode("utf-8")).hexdigest()


class TritonModel:
    """One model on one Triton server; `generate_many` answers a shard's requests."""

    def __init__(self, url: str, model: str, *, max_inflight: int = 16, timeout_s: float = 120,
                 retries: int = 3, backoff_s: float = 1.0, interface: Interface = "auto",
                 max_new_tokens: int | None = 1024, temperature: float = 0.0,
                 seed: int | None = 0, chat_template: str = "qwen2_5_vl",
                 reasoning: bool = True, slots: SharedSlots | None = None) -> None:
        self.url, self.model = url, model
        self.slots = slots
        self.max_inflight, self.timeout_s = max_inflight, timeout_s
        self.retries, self.backoff_s = retries, backoff_s
        self.interface: Interface = interface
        self.max_new_tokens, self.temperature, self.seed = max_new_tokens, temperature, seed
        self.chat_template, self.reasoning = chat_template, reasoning
        self.info: ModelInfo | None = None
        self._inputs: set[str] = set()
        self._outputs: set[str] = set()

    @classmethod
    def from_settings(cls, settings: Settings, model: str,
                      slots: SharedSlots | None = None) -> TritonModel:
        s = settings
        return cls(s.triton_grpc_url, model, max_inflight=s.max_inflight, slots=slots,
                   timeout_s=s.model_timeout_s, retries=s.model_retries,
                   backoff_s=s.model_backoff_s, interface=s.model_interface,
                   max_new_tokens=s.max_new_tokens, temperature=s.temperature,
                   chat_template=s.chat_template, reasoning=s.reasoning)

    # ------------------------------------------------------------------ public
    def generate_many(self, requests: Sequence[ModelRequest]) -> list[ModelReply | Exception]:
        return asyncio.run(self._generate_many(requests))

    async def _generate_many(self, requests: Sequence[ModelRequest]
                             ) -> list[ModelReply | Exception]:
        client = grpcclient.InferenceServerClient(url=self.url)
        lease = self.slots.lease() if self.slots is not None else None
        try:
            await self._wait_ready(client)
            gate = lease if lease is not None else asyncio.Semaphore(self.max_inflight)

            async def bounded(req: ModelRequest) -> ModelReply | Exception:
                async with gate:
                    return await self._one(client, req)

            return list(await asyncio.gather(*(bounded(r) for r in requests)))
        finally:
            if lease is not None:
                lease.close()  # slots of requests a failure left behind go back now
            await client.close()

    # ------------------------------------------------------------------ readiness
    async def _ready(self, client: grpcclient.InferenceServerClient) -> bool:
        try:
            return bool(await client.is_server_ready(client_timeout=10)
                        and await client.is_model_ready(self.model, client_timeout=10))
        except (InferenceServerException, grpc.RpcError, OSError):
            return False

    async def _wait_ready(self, client: grpcclient.InferenceServerClient) -> None:
        """Wait (with backoff) until the server and the model are ready, then read the
        model's metadata: its version, its interface and the optional tensors it has."""
        for attempt in range(self.retries + 1):
            if await self._ready(client):
                try:
                    meta = await client.get_model_metadata(self.model, as_json=True,
                                                           client_timeout=10)
                    break
                except (InferenceServerException, grpc.RpcError):
                    pass
            if attempt == self.retries:
                raise RetryableError(f"Triton {self.url} model {self.model}: not ready")
            await asyncio.sleep(self.backoff_s * 2**attempt)
        self._inputs = {t["name"] for t in meta.get("inputs", [])}
        self._outputs = {t["name"] for t in meta.get("outputs", [])}
        interface = self.interface
        if interface == "auto":
            interface = "vllm" if "text_input" in self._inputs else "rsieve"
        versions = meta.get("versions") or [""]
        self.info = ModelInfo(name=self.model, version=str(max(versions, key=str)),
                              interface=interface, sampling=self._sampling(interface),
                              chat_template=self.chat_template if interface == "vllm" else None)

    def _sampling(self, interface: str) -> dict[str, Any]:
        if interface == "vllm":
            params: dict[str, Any] = {"temperature": self.temperature, "n": 1}
            if self.max_new_tokens is not None:
                params["max_tokens"] = self.max_new_tokens
            if self.seed is not None:
                params["seed"] = self.seed
            return params
        # The rsieve interface is greedy by contract; the budget is sent when accepted.
        params = {"temperature": 0.0}
        if self.max_new_tokens is not None and "max_new_tokens" in self._inputs:
            params["max_new_tokens"] = self.max_new_tokens
        return params

    # ------------------------------------------------------------------ one request
    async def _one(self, client: grpcclient.InferenceServerClient, req: ModelRequest
                   ) -> ModelReply | Exception:
        assert self.info is not None
        call = self._vllm if self.info.interface == "vllm" else self._rsieve
        last = ""
        for attempt in range(self.retries + 1):
            start = time.monotonic()
            try:
                reply = await call(client, req)
                return replace(reply, latency_s=round(time.monotonic() - start, 6))
            except (InferenceServerException, grpc.RpcError, _Transient) as exc:
                code, message = _status(exc)
                last = f"{code} {message}".strip()
                transient = isinstance(exc, _Transient) or any(c in code for c in _TRANSIENT)
                # An error while the server or the model is going away is infrastructure,
                # never the item's result.
                if not transient and await self._ready(client):
                    return exc
            if attempt < self.retries:
                await asyncio.sleep(self.backoff_s * 2**attempt)
        raise RetryableError(f"Triton {self.url} model {self.model}: {last[:300]}")

    async def _rsieve(self, client: grpcclient.InferenceServerClient, req: ModelRequest
                      ) -> ModelReply:
        inputs = [_tensor("prompt", [req.prompt.encode("utf-8")], [1, 1], "BYTES")]
        if req.image is not None:
            inputs.append(_tensor("image", [req.image], [1, 1], "BYTES"))
        if self.max_new_tokens is not None and "max_new_tokens" in self._inputs:
            budget = grpcclient.InferInput("max_new_tokens", [1, 1], "INT32")
            budget.set_data_from_numpy(np.array([[self.max_new_tokens]], dtype=np.int32))
            inputs.append(budget)
        names = ["text", "finish_reason"] + [
            n for n in ("num_input_tokens", "num_output_tokens") if n in self._outputs]
        result = await client.infer(self.model, inputs,
                                    outputs=[grpcclient.InferRequestedOutput(n) for n in names],
                                    client_timeout=self.timeout_s)
        return ModelReply(
            text=_first_str(result.as_numpy("text")) or "",
            finish_reason=_first_str(result.as_numpy("finish_reason")) or "stop",
            input_tokens=_first_int(result.as_numpy("num_input_tokens")
                                    if "num_input_tokens" in names else None),
            output_tokens=_first_int(result.as_numpy("num_output_tokens")
                                     if "num_output_tokens" in names else None),
            prompt_sent_sha256=_sha256(req.prompt))

    async def _vllm(self, client: grpcclient.InferenceServerClient, req: ModelRequest
                    ) -> ModelReply:
        assert self.info is not None
        chat = render_chat(req.prompt, has_image=req.image is not None,
                           template=self.chat_template, reasoning=self.reasoning)
        inputs = [
            _tensor("text_input", [chat.text.encode("utf-8")], [1], "BYTES"),
            _tensor("stream", [False], [1], "BOOL"),
            _tensor("exclude_input_in_output", [True], [1], "BOOL"),
            _tensor("sampling_parameters", [json.dumps(self.info.sampling).encode()], [1],
                    "BYTES"),
        ]
        if req.image is not None:
            inputs.append(_tensor("image", [base64.b64encode(req.image)], [1], "BYTES"))
        flags = ["return_finish_reason", "return_num_input_tokens", "return_num_output_tokens"]
        inputs += [_tensor(f, [True], [1], "BOOL") for f in flags if f in self._inputs]
        names = [n for n in ("text_output", "finish_reason", "num_input_tokens",
                             "num_output_tokens") if n in self._outputs]
        outputs = [grpcclient.InferRequestedOutput(n) for n in names]

        async def one_request() -> AsyncIterator[dict[str, Any]]:
            yield {"model_name": self.model, "inputs": inputs, "outputs": outputs,
                   "request_id": uuid.uuid4().hex}

        text, finish, n_in, n_out = [], None, None, None
        stream = client.stream_infer(one_request(), stream_timeout=self.timeout_s)
        async for result, error in stream:  # until the server closes the stream
            if error is not None:
                raise error
            piece = _first_str(result.as_numpy("text_output"))
            if piece:
                text.append(piece)
            if "finish_reason" in names:
                finish = _first_str(result.as_numpy("finish_reason")) or finish
            if "num_input_tokens" in names:
                n_in = _first_int(result.as_numpy("num_input_tokens"), n_in)
            if "num_output_tokens" in names:
                n_out = _first_int(result.as_numpy("num_output_tokens"), n_out)
        if finish is None and not text:
            raise _Transient("the vLLM stream closed without a response")
        if finish == "abort":
            raise _Transient("vLLM aborted the request")
        # The template may open the reasoning (`<think>`) for the assistant: the raw text
        # stored is what the assistant turn holds, opening tag included.
        return ModelReply(text=chat.prefix + "".join(text), finish_reason=finish or "stop",
                          input_tokens=n_in, output_tokens=n_out,
                          prompt_sent_sha256=_sha256(chat.text))


def _first_str(array: np.ndarray | None) -> str | None:
    if array is None or array.size == 0:
        return None
    value = array.reshape(-1)[0]
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _first_int(array: np.ndarray | None, default: int | None = None) -> int | None:
    if array is None or array.size == 0:
        return default
    return int(array.reshape(-1)[0])
