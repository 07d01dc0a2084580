"""The model behind Triton, through tritonclient's asyncio gRPC client.

Two interfaces (deploy/triton/README.md), chosen by `interface` or, with "auto", from the
model's metadata (a `text_input` input means the vLLM backend):

- "rsieve": `prompt` and an optional `image` (encoded bytes) in, `text` and
  `finish_reason` out; optionally `max_new_tokens` in and `num_input_tokens` /
  `num_output_tokens` out, used when the model declares them. Unary `infer` calls.
- "vllm": Triton's vLLM backend (decoupled). The prompt is rendered client side with the
  checkpoint's own chat template (`rsieve.generate.chat`, loaded from `tokenizer`: the checkpoint
  folder or GGUF), the image goes base64 in `image`, `sampling_parameters`
  is vLLM SamplingParams JSON, and finish reason and token counts are asked for with the
  backend's `return_*` flags. A call's requests share one gRPC bidirectional stream
  (rsieve.adapters.streams), each answered whole (stream=False); with loop watching on,
  each sample streams (stream=True) on a stream of the call's pool, one sample at a time
  per stream, so that cutting it cancels it alone (`StreamPool`).

With a `tokenizer`, every special or added token of it found in a prompt is neutralised
before the prompt is sent, on either interface (`rsieve.generate.chat.neutralise`); the reply
carries the user text as sent, so the caller stores what the model received.

What the model is (`ModelInfo.kind`) is read from its Triton config parameter
`rsieve_kind` (deploy/triton/README.md).

Up to `max_inflight` items are kept in flight so Triton's dynamic batcher (or vLLM's
continuous batching) can fill its batches; a full Triton queue (RESOURCE_EXHAUSTED) is
backpressure, retried with backoff. With `gate` (an `EngineGate` shared by every call on one
loop, e.g. the generator's feeder, services/generator/feeder.py) that gate's limit bounds
the items instead, across every call that shares it, first come first served. Before any
work the server and the model must be ready; `on_ready` then sees what the model is
(`ModelInfo.capacity`: the engine's `max_num_seqs` config parameter, when declared).

Client-side batching (rsieve interface): one request carries up to the model's
`max_batch_size` items (capped by `request_items`), all with an image or all without, so
the dynamic batcher receives whole batches instead of forming them from single requests
that trickle in (docs/performance.md, "Whole batches"), and the client pays one gRPC call per
batch. A request of several items holds one slot per item, all taken at once (the gate
never lets a request hold part of its slots while it waits). When a multi-item
request fails with an error that is not transient, its items are asked again one by one,
so the error lands on the item that caused it. vLLM's interface is one item per request.

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
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Literal, cast

import grpc
import numpy as np
import tritonclient.grpc.aio as grpcclient
from tritonclient.utils import InferenceServerException

from rsieve.adapters.gate import EngineGate
from rsieve.adapters.retry import ItemError, Transient, backoff_wait, retrying
from rsieve.adapters.streams import InferStream, StreamBroken, StreamPool
from rsieve.adapters.tokenizer import load_chat_template
from rsieve.errors import RetryableError
from rsieve.generate.chat import ChatTemplate, TemplateError
from rsieve.generate.generation import Model, ModelInfo, ModelReply, ModelRequest, singles
from rsieve.generate.loops import LoopRule, LoopWatch
from rsieve.generate.think import LOOP_FINISH
from rsieve.settings import Settings

if TYPE_CHECKING:
    from rsieve.adapters.openai_compat import OpenAIModel

__all__ = [
    "Interface",
    "Model",
    "ModelInfo",
    "ModelReply",
    "ModelRequest",
    "TritonModel",
    "engine_url",
    "open_model",
]

Interface = Literal["auto", "rsieve", "vllm"]

_TRANSIENT = ("UNAVAILABLE", "DEADLINE_EXCEEDED", "RESOURCE_EXHAUSTED", "CANCELLED")


class MalformedReply(ItemError):
    """The model answered, but not as its interface says (e.g. not one row per item)."""


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


@dataclass
class _Streams:
    """The gRPC streams one `generate_many` call opens to the vLLM interface: the shared
    stream whole answers come on (and any that replaced a broken one), and the pool its
    streamed samples reuse."""

    shared: list[InferStream]
    pool: StreamPool


class TritonModel:
    """One model on one Triton server; `generate_many` answers a shard's requests."""

    def __init__(
        self,
        url: str,
        model: str,
        *,
        max_inflight: int = 16,
        timeout_s: float = 120,
        retries: int = 3,
        backoff_s: float = 1.0,
        interface: Interface = "auto",
        max_new_tokens: int | None = 1024,
        temperature: float = 0.0,
        top_p: float = 1.0,
        seed: int | None = 0,
        tokenizer: str = "",
        reasoning: bool = True,
        gate: EngineGate | None = None,
        request_items: int = 0,
        on_ready: Callable[[ModelInfo], None] | None = None,
        loops: LoopRule | None = None,
    ) -> None:
        self.url, self.model = url, model
        # The vLLM interface streams each sample and cuts it in a loop (None: never).
        self.loops = loops or LoopRule(window_chars=0)
        # Streamed samples reuse the call's streams (StreamPool); False: a stream per sample,
        # what bench/bench_streams.py measures the pool against.
        self.reuse_streams = True
        self.gate, self.on_ready = gate, on_ready
        # Items per request (rsieve interface): 0 is the model's max_batch_size.
        self.request_items = request_items
        self._per_request = 1
        self.max_inflight, self.timeout_s = max_inflight, timeout_s
        self.retries, self.backoff_s = retries, backoff_s
        self.interface: Interface = interface
        self.max_new_tokens, self.temperature, self.seed = max_new_tokens, temperature, seed
        self.top_p = top_p
        # The checkpoint's tokenizer files (folder or .gguf): its chat template and special
        # tokens. Required for the vLLM interface; optional (neutralising only) otherwise.
        self.tokenizer, self.reasoning = tokenizer, reasoning
        self.template: ChatTemplate | None = None
        self.info: ModelInfo | None = None
        self._inputs: set[str] = set()
        self._outputs: set[str] = set()
        self._fixed: tuple[list[grpcclient.InferInput], list[str]] | None = None

    @classmethod
    def from_settings(
        cls,
        settings: Settings,
        model: str,
        gate: EngineGate | None = None,
        tokenizer: str = "",
        max_new_tokens: int | None = None,
        url: str | None = None,
        on_ready: Callable[[ModelInfo], None] | None = None,
        interface: Interface | None = None,
        loops: LoopRule | None = None,
    ) -> TritonModel:
        """`tokenizer`: the model's checkpoint files (settings.generator_tokenizer or
        settings.judge_tokenizer); `max_new_tokens`: the budget, when not
        settings.max_new_tokens (the judge's is settings.judge_max_new_tokens); `url`: the
        engine's server, when not settings.triton_grpc_url (the generator's)."""
        s = settings
        return cls(
            url or s.triton_grpc_url,
            model,
            max_inflight=s.max_inflight,
            gate=gate,
            on_ready=on_ready,
            request_items=s.request_items,
            timeout_s=s.model_timeout_s,
            retries=s.model_retries,
            backoff_s=s.model_backoff_s,
            interface=interface or cast(Interface, s.interface_of("generator")),
            top_p=s.top_p,
            seed=s.seed,
            max_new_tokens=max_new_tokens or s.max_new_tokens,
            temperature=s.temperature,
            tokenizer=tokenizer,
            reasoning=s.reasoning,
            loops=loops,
        )

    # ------------------------------------------------------------------ public
    def generate_many(self, requests: Sequence[ModelRequest]) -> list[ModelReply | Exception]:
        return asyncio.run(self.generate_many_async(requests))

    async def generate_many_async(
        self, requests: Sequence[ModelRequest]
    ) -> list[ModelReply | Exception]:
        client = grpcclient.InferenceServerClient(url=self.url)
        lease = (self.gate or EngineGate(self.max_inflight)).lease()
        tasks: list[asyncio.Task[list[ModelReply | Exception]]] = []
        # vLLM: the call's shared stream (and any it replaced), and the pool of streams its
        # streamed samples reuse.
        streams = _Streams([], StreamPool(client, self.model, reuse=self.reuse_streams))
        try:
            await self._wait_ready(client)
            assert self.info is not None
            # vLLM's `n` is sent only on requests answered whole: its streamed outputs come
            # without their index through Triton's vLLM backend (docs/sampling.md).
            if self.info.interface != "vllm" or self.loops.on:
                requests = singles(requests)
            at = [0]
            for r in requests:
                at.append(at[-1] + r.n)

            async def bounded(chunk: list[int]) -> list[ModelReply | Exception]:
                # A request with n outputs runs n sequences at the engine: n slots.
                async with lease.slots(sum(requests[i].n for i in chunk)):
                    return await self._chunk(client, [requests[i] for i in chunk], streams)

            chunks = _chunks(requests, self._per_request)
            # Created in order, so the chunks queue at the gate in order (FIFO).
            tasks = [asyncio.create_task(bounded(c)) for c in chunks]
            answers = await asyncio.gather(*tasks)
            replies: list[ModelReply | Exception] = [Exception("unanswered")] * at[-1]
            for chunk, answer in zip(chunks, answers, strict=True):
                outputs = iter(answer)
                for i in chunk:
                    for k in range(at[i], at[i + 1]):
                        replies[k] = next(outputs)
            return replies
        finally:
            # A failure leaves the call's other requests running: on a shared loop nothing
            # else would stop them, and they would keep their slots.
            for task in tasks:
                task.cancel()
            if tasks:
                await asyncio.gather(*tasks, return_exceptions=True)
            lease.close()
            for stream in streams.shared:
                await stream.close()
            await streams.pool.close()
            await client.close()

    # ------------------------------------------------------------------ readiness
    async def _ready(self, client: grpcclient.InferenceServerClient) -> bool:
        try:
            return bool(
                await client.is_server_ready(client_timeout=10)
                and await client.is_model_ready(self.model, client_timeout=10)
            )
        except (InferenceServerException, grpc.RpcError, OSError):
            return False

    async def _wait_ready(self, client: grpcclient.InferenceServerClient) -> None:
        """Wait (with backoff) until the server and the model are ready, then read the
        model's metadata and config (its version, interface, optional tensors, batch size
        and `rsieve_kind`); a server that goes away meanwhile is waited for again."""
        for attempt in range(self.retries + 1):
            if await self._ready(client):
                try:
                    meta = await client.get_model_metadata(
                        self.model, as_json=True, client_timeout=10
                    )
                    config = (
                        await client.get_model_config(self.model, as_json=True, client_timeout=10)
                    ).get("config", {})
                    break
                except (InferenceServerException, grpc.RpcError):
                    pass  # the server went away between the calls: wait again
            if attempt == self.retries:
                raise RetryableError(f"Triton {self.url} model {self.model}: not ready")
            await asyncio.sleep(backoff_wait(self.backoff_s, attempt))
        self._inputs = {t["name"] for t in meta.get("inputs", [])}
        self._outputs = {t["name"] for t in meta.get("outputs", [])}
        self._fixed = None
        interface = self.interface
        if interface == "auto":
            interface = "vllm" if "text_input" in self._inputs else "rsieve"
        params = config.get("parameters", {})
        kind = params.get("rsieve_kind", {}).get("string_value") or None
        seqs = str(params.get("max_num_seqs", {}).get("string_value") or "")
        capacity = int(seqs) if seqs.isdigit() and int(seqs) > 0 else None
        if self.tokenizer and self.template is None:
            self.template = load_chat_template(self.tokenizer)
        if interface == "vllm" and self.template is None:
            raise TemplateError(
                f"model {self.model} takes a rendered prompt (vLLM interface): "
                "name its checkpoint's tokenizer files (RSIEVE_GENERATOR_"
                "TOKENIZER / RSIEVE_JUDGE_TOKENIZER)"
            )
        client_renders = interface == "vllm" and self.template is not None
        versions = meta.get("versions") or [""]
        self.info = ModelInfo(
            name=self.model,
            version=str(max(versions, key=str)),
            interface=interface,
            sampling=self._sampling(interface),
            kind=kind,
            chat_template=self.template.name if client_renders and self.template else None,
            chat_template_sha256=(
                self.template.sha256 if client_renders and self.template else None
            ),
            thinking_mode=(
                self.template.thinking if client_renders and self.template else "server"
            ),
            capacity=capacity,
        )
        if self.on_ready is not None:
            self.on_ready(self.info)  # may size the gate from the engine's capacity
        self._per_request = 1
        if interface == "rsieve":
            batch = int(config.get("max_batch_size") or 0)
            limit = self.gate.limit if self.gate is not None else self.max_inflight
            self._per_request = max(1, min(batch, self.request_items or batch, limit))

    def _sampling(self, interface: str) -> dict[str, Any]:
        if interface == "vllm":
            params: dict[str, Any] = {"temperature": self.temperature, "n": 1}
            if self.top_p != 1.0:
                params["top_p"] = self.top_p
            if self.max_new_tokens is not None:
                params["max_tokens"] = self.max_new_tokens
            if self.seed is not None:
                params["seed"] = self.seed
            return params
        # The rsieve interface is greedy unless the model takes a `temperature` (and then a
        # per-sample `seed`, best-of-n); the budget is sent when accepted.
        params = {"temperature": self.temperature if "temperature" in self._inputs else 0.0}
        if self.max_new_tokens is not None and "max_new_tokens" in self._inputs:
            params["max_new_tokens"] = self.max_new_tokens
        return params

    # ------------------------------------------------------------------ one request
    async def _chunk(
        self,
        client: grpcclient.InferenceServerClient,
        reqs: list[ModelRequest],
        streams: _Streams,
    ) -> list[ModelReply | Exception]:
        """One request for `reqs`; a model error on several items is asked item by item."""
        answer = await self._one(client, reqs, streams)
        if isinstance(answer, Exception) and len(reqs) > 1:
            # All at once, within the slots the chunk holds: the batcher batches them again.
            each = await asyncio.gather(*(self._chunk(client, [req], streams) for req in reqs))
            return [reply for single in each for reply in single]
        if isinstance(answer, Exception):
            return [answer] * sum(r.n for r in reqs)
        return [*answer]

    async def _one(
        self,
        client: grpcclient.InferenceServerClient,
        reqs: list[ModelRequest],
        streams: _Streams,
    ) -> list[ModelReply] | Exception:
        info = self.info
        assert info is not None

        async def attempt() -> list[ModelReply] | Exception:
            start = time.monotonic()
            try:
                if info.interface == "vllm" and self.loops.on:
                    replies = [await self._vllm_streamed(streams.pool, reqs[0])]
                elif info.interface == "vllm":
                    replies = await self._vllm(client, reqs[0], streams.shared)
                else:
                    replies = await self._rsieve(client, reqs)
            except MalformedReply as exc:
                return exc
            except (InferenceServerException, grpc.RpcError) as exc:
                code, message = _status(exc)
                # An error while the server or the model is going away is infrastructure,
                # never the item's result.
                if not any(c in code for c in _TRANSIENT) and await self._ready(client):
                    return exc
                raise Transient(f"{code} {message}".strip()) from exc
            latency = round(time.monotonic() - start, 6)
            return [replace(r, latency_s=latency) for r in replies]

        return await retrying(
            attempt,
            retries=self.retries,
            backoff_s=self.backoff_s,
            where=f"Triton {self.url} model {self.model}",
        )

    async def _rsieve(
        self, client: grpcclient.InferenceServerClient, reqs: list[ModelRequest]
    ) -> list[ModelReply]:
        n = len(reqs)
        users = [self.template.neutralise(r.prompt) if self.template else r.prompt for r in reqs]
        inputs = [_tensor("prompt", [u.encode("utf-8") for u in users], [n, 1], "BYTES")]
        if reqs[0].image is not None:  # a chunk is all with or all without (_chunks)
            inputs.append(_tensor("image", [r.image for r in reqs], [n, 1], "BYTES"))
        if self.max_new_tokens is not None and "max_new_tokens" in self._inputs:
            budget = grpcclient.InferInput("max_new_tokens", [n, 1], "INT32")
            budget.set_data_from_numpy(np.full((n, 1), self.max_new_tokens, dtype=np.int32))
            inputs.append(budget)
        if "temperature" in self._inputs:
            temperature = grpcclient.InferInput("temperature", [n, 1], "FP32")
            temperature.set_data_from_numpy(np.full((n, 1), self.temperature, dtype=np.float32))
            inputs.append(temperature)
        if "seed" in self._inputs:
            seeds = [r.seed if r.seed is not None else (self.seed or 0) for r in reqs]
            seed = grpcclient.InferInput("seed", [n, 1], "INT64")
            seed.set_data_from_numpy(np.array(seeds, dtype=np.int64).reshape(n, 1))
            inputs.append(seed)
        names = ["text", "finish_reason"] + [
            n for n in ("num_input_tokens", "num_output_tokens") if n in self._outputs
        ]
        result = await client.infer(
            self.model,
            inputs,
            outputs=[grpcclient.InferRequestedOutput(n) for n in names],
            client_timeout=self.timeout_s,
        )
        texts, finishes = (
            _strs(result.as_numpy("text"), n),
            _strs(result.as_numpy("finish_reason"), n),
        )
        n_in = _ints(
            result.as_numpy("num_input_tokens") if "num_input_tokens" in names else None, n
        )
        n_out = _ints(
            result.as_numpy("num_output_tokens") if "num_output_tokens" in names else None, n
        )
        return [
            ModelReply(
                text=texts[i] or "",
                finish_reason=finishes[i] or "stop",
                input_tokens=n_in[i],
                output_tokens=n_out[i],
                prompt_sent_sha256=_sha256(users[i]),
                user_text=users[i],
            )
            for i in range(n)
        ]

    def _vllm_fixed(self) -> tuple[list[grpcclient.InferInput], list[str]]:
        """The inputs every vLLM request carries unchanged, built once per model, and the
        outputs it asks for."""
        assert self.info is not None
        if self._fixed is None:
            inputs = [
                _tensor("stream", [False], [1], "BOOL"),
                _tensor("exclude_input_in_output", [True], [1], "BOOL"),
                _tensor(
                    "sampling_parameters", [json.dumps(self.info.sampling).encode()], [1], "BYTES"
                ),
            ]
            flags = ["return_finish_reason", "return_num_input_tokens", "return_num_output_tokens"]
            inputs += [_tensor(f, [True], [1], "BOOL") for f in flags if f in self._inputs]
            names: list[str] = [
                n
                for n in ("text_output", "finish_reason", "num_input_tokens", "num_output_tokens")
                if n in self._outputs
            ]
            self._fixed = (inputs, names)
        return self._fixed

    def _vllm_inputs(
        self, req: ModelRequest, *, stream: bool
    ) -> tuple[Any, list[grpcclient.InferInput], list[str]]:
        """The rendered chat, the inputs and the output names of one vLLM request: its
        seed and `n` in its sampling parameters."""
        assert self.info is not None
        assert self.template is not None  # _wait_ready refuses the vLLM interface without
        chat = self.template.render(
            req.prompt, has_image=req.image is not None, reasoning=self.reasoning
        )
        fixed, names = self._vllm_fixed()
        sampling = self.info.sampling
        if req.seed is not None:  # a best-of-n sample: its own seed in its parameters
            sampling = sampling | {"seed": req.seed}
        if req.n > 1:
            sampling = sampling | {"n": req.n}
        replaced: dict[str, grpcclient.InferInput] = {}
        if sampling is not self.info.sampling:
            replaced["sampling_parameters"] = _tensor(
                "sampling_parameters", [json.dumps(sampling).encode()], [1], "BYTES"
            )
        if stream:
            replaced["stream"] = _tensor("stream", [True], [1], "BOOL")
        inputs = [
            _tensor("text_input", [chat.text.encode("utf-8")], [1], "BYTES"),
            *(replaced.get(t.name(), t) for t in fixed),
        ]
        if req.image is not None:
            inputs.append(_tensor("image", [base64.b64encode(req.image)], [1], "BYTES"))
        return chat, inputs, names

    async def _vllm(
        self,
        client: grpcclient.InferenceServerClient,
        req: ModelRequest,
        streams: list[InferStream],
    ) -> list[ModelReply]:
        """One request answered whole on the call's current stream (a broken one is
        replaced: the retry): its `n` outputs, one reply each."""
        chat, inputs, names = self._vllm_inputs(req, stream=False)
        outputs = [grpcclient.InferRequestedOutput(n) for n in names]
        if not streams or streams[-1].broken is not None:
            streams.append(InferStream(client, self.model))
        try:
            result = await streams[-1].infer(inputs, outputs, self.timeout_s)
        except StreamBroken as exc:
            raise Transient(f"the stream to {self.model} broke: {exc}") from exc
        n = req.n
        texts = _strs_or_none(result.as_numpy("text_output"))
        finishes = (
            _strs_or_none(result.as_numpy("finish_reason")) if "finish_reason" in names else None
        )
        if texts is None and finishes is None:
            raise Transient("vLLM answered without text or finish reason")
        if len(texts or []) != n or (finishes is not None and len(finishes) != n):
            raise MalformedReply(f"{len(texts or [])} outputs for a request of n={n}")
        n_in = (
            _first_int(result.as_numpy("num_input_tokens")) if "num_input_tokens" in names else None
        )
        n_out = _ints(
            result.as_numpy("num_output_tokens") if "num_output_tokens" in names else None, n
        )
        replies = []
        for j, text in enumerate(texts or []):
            finish = finishes[j] if finishes is not None else None
            if finish == "abort":
                raise Transient("vLLM aborted the request")
            # The template may open the reasoning (`<think>`) for the assistant: the raw
            # text stored is what the assistant turn holds, opening tag included.
            replies.append(
                ModelReply(
                    text=chat.prefix + text,
                    finish_reason=finish or "stop",
                    input_tokens=n_in,
                    output_tokens=n_out[j],
                    prompt_sent_sha256=_sha256(chat.text),
                    user_text=chat.user,
                    # vLLM draws output j of a seeded request with seed + j.
                    seed=req.seed + j if req.seed is not None and n > 1 else None,
                )
            )
        return replies

    async def _vllm_streamed(self, pool: StreamPool, req: ModelRequest) -> ModelReply:
        """One sample streamed, its tail watched for a repetition loop
        (rsieve.generate.loops): a loop cancels the request at once, and the reply is what
        was generated, with finish reason `repetition_loop` and the tokens generated so
        far (the rest of the budget was never spent)."""
        chat, inputs, names = self._vllm_inputs(req, stream=True)
        outputs = [grpcclient.InferRequestedOutput(n) for n in names]
        watch = LoopWatch(self.loops)
        parts: list[str] = []
        finish: str | None = None
        n_in: int | None = None
        n_out: int | None = None
        try:
            async with (
                asyncio.timeout(self.timeout_s),
                pool.streamed(inputs, outputs) as responses,
            ):
                async for got in responses:
                    delta = str(got.get("text_output", ""))
                    parts.append(delta)
                    said = got.get("finish_reason")
                    if said and said != "None":  # the backend's str(None) while it runs
                        finish = str(said)
                    if n_in is None and "num_input_tokens" in got:
                        n_in = int(got["num_input_tokens"])
                    if "num_output_tokens" in got:
                        n_out = (n_out or 0) + int(got["num_output_tokens"])
                    if watch.feed(delta):
                        finish = LOOP_FINISH
                        break
        except StreamBroken as exc:
            raise Transient(f"the stream to {self.model} broke: {exc}") from exc
        except TimeoutError as exc:
            raise Transient(f"no whole answer from {self.model} in {self.timeout_s:g} s") from exc
        if finish == "abort":
            raise Transient("vLLM aborted the request")
        text = "".join(parts)
        if finish is None and not text:
            raise Transient("vLLM answered without text or finish reason")
        return ModelReply(
            text=chat.prefix + text,
            finish_reason=finish or "stop",
            input_tokens=n_in,
            output_tokens=n_out,
            prompt_sent_sha256=_sha256(chat.text),
            user_text=chat.user,
        )


def _strs_or_none(array: np.ndarray | None) -> list[str] | None:
    if array is None or array.size == 0:
        return None
    return [
        v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v) for v in array.reshape(-1)
    ]


def _first_int(array: np.ndarray | None, default: int | None = None) -> int | None:
    if array is None or array.size == 0:
        return default
    return int(array.reshape(-1)[0])


def _chunks(requests: Sequence[ModelRequest], size: int) -> list[list[int]]:
    """Indexes of `requests` in request-sized chunks, those with an image apart from those
    without (an optional input is present for a whole request or absent)."""
    with_image = [i for i, r in enumerate(requests) if r.image is not None]
    without = [i for i, r in enumerate(requests) if r.image is None]
    return [
        group[at : at + size]
        for group in (with_image, without)
        for at in range(0, len(group), size)
    ]


def _strs(array: np.ndarray | None, n: int) -> list[str | None]:
    if array is None or array.size != n:
        raise MalformedReply(f"{0 if array is None else array.size} rows for {n} items")
    return [
        v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v) for v in array.reshape(-1)
    ]


def _ints(array: np.ndarray | None, n: int) -> list[int | None]:
    if array is None or array.size != n:
        return [None] * n
    return [int(v) for v in array.reshape(-1)]


Role = Literal["generator", "judge"]


def open_model(
    settings: Settings,
    role: Role,
    gate: EngineGate | None = None,
    on_ready: Callable[[ModelInfo], None] | None = None,
) -> TritonModel | OpenAIModel:
    """The role's model as settings name it: on an OpenAI-compatible server (interface
    "openai", rsieve.adapters.openai_compat), else on Triton (the role's own engine)."""
    from rsieve.adapters.openai_compat import OpenAIModel

    s = settings
    if role == "judge":  # the judge is greedy, whatever the generator samples at
        s = s.model_copy(update={"temperature": 0.0, "top_p": 1.0})
    if s.interface_of(role) == "openai":
        return OpenAIModel.from_settings(s, role, gate=gate, on_ready=on_ready)
    if role == "judge":
        return TritonModel.from_settings(
            s,
            s.judge_model,
            gate=gate,
            tokenizer=s.judge_tokenizer,
            max_new_tokens=s.judge_max_new_tokens,
            url=s.judge_triton_grpc_url or s.triton_grpc_url,
            on_ready=on_ready,
            interface=cast(Interface, s.interface_of("judge")),
        )
    return TritonModel.from_settings(
        s,
        s.generator_model,
        gate,
        tokenizer=s.generator_tokenizer,
        on_ready=on_ready,
        loops=LoopRule.of(s),
    )


def engine_url(settings: Settings, role: Role) -> str:
    """Where the role's engine is: its OpenAI-compatible base URL or its Triton server."""
    s = settings
    if s.interface_of(role) == "openai":
        return s.openai_url_of(role)
    if role == "judge":
        return s.judge_triton_grpc_url or s.triton_grpc_url
    return s.triton_grpc_url
