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

The wire is apart and pure: rsieve.adapters.triton_wire (the metadata read, the rsieve
interface's tensors and rows, which errors are transient) and rsieve.adapters.vllm_wire
(the vLLM interface's tensors, its whole and streamed answers, the call's streams). Which
model a role asks, and how, is rsieve.adapters.roles; `open_model` gives the role's adapter.
Readiness and every request go through rsieve.adapters.retry.retrying, the one policy.

Errors:
    unreachable, not ready, or transient after `retries` -> RetryableError (the shard is
        retried; never scored)
    an error the model returns for one request while the server and model stay ready
        -> that request's result (an Exception in the returned list)
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any, Literal, cast

import grpc
import tritonclient.grpc.aio as grpcclient
from tritonclient.utils import InferenceServerException

from rsieve.adapters.gate import EngineGate
from rsieve.adapters.openai_compat import OpenAIModel
from rsieve.adapters.retry import Transient, retrying
from rsieve.adapters.roles import role_choice
from rsieve.adapters.tokenizer import load_chat_template
from rsieve.adapters.triton_wire import (
    MalformedReply,
    Served,
    chunks,
    in_order,
    is_transient,
    items_per_request,
    model_info,
    read_served,
    rsieve_replies,
    rsieve_request,
    rsieve_sampling,
    status_of,
)
from rsieve.adapters.vllm_wire import Fixed, VllmStreams, fixed_inputs, vllm_request, vllm_sampling
from rsieve.generate.chat import ChatTemplate, RenderedChat, TemplateError
from rsieve.generate.generation import Model, ModelInfo, ModelReply, ModelRequest, singles
from rsieve.generate.loops import LoopRule
from rsieve.settings import Settings
from rsieve.settings.models import ModelRole

__all__ = [
    "Interface",
    "Model",
    "ModelInfo",
    "ModelReply",
    "ModelRequest",
    "TritonModel",
    "open_model",
]

Interface = Literal["auto", "rsieve", "vllm"]


class TritonModel:
    """One model on one Triton server; `generate_many` answers a shard's requests.

    About 270 lines, a quarter of them the constructor and `from_settings`: one knob per
    setting the engine is asked with. What is sent and read is rsieve.adapters.triton_wire
    and vllm_wire; what is left is one call's life (gate, readiness, retries, streams)."""

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
        # What the model's metadata and config said when last ready; the vLLM inputs its
        # requests share, built once from it.
        self.served: Served | None = None
        self._fixed: Fixed | None = None

    @classmethod
    def from_settings(
        cls,
        settings: Settings,
        role: ModelRole,
        gate: EngineGate | None = None,
        on_ready: Callable[[ModelInfo], None] | None = None,
    ) -> TritonModel:
        """The role's model (rsieve.adapters.roles) on its engine's Triton server."""
        s, choice = settings, role_choice(settings, role)
        return cls(
            choice.url,
            choice.model,
            max_inflight=s.max_inflight,
            gate=gate,
            on_ready=on_ready,
            request_items=s.request_items,
            timeout_s=s.model_timeout_s,
            retries=s.model_retries,
            backoff_s=s.model_backoff_s,
            interface=cast(Interface, choice.interface),
            top_p=choice.top_p,
            seed=s.seed,
            max_new_tokens=choice.max_new_tokens,
            temperature=choice.temperature,
            tokenizer=choice.tokenizer,
            reasoning=s.reasoning,
            loops=choice.loops,
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
        streams = VllmStreams(client, self.model, reuse=self.reuse_streams)
        try:
            await self._wait_ready(client)
            assert self.info is not None
            # vLLM's `n` is sent only on requests answered whole: its streamed outputs come
            # without their index through Triton's vLLM backend (docs/sampling.md).
            if self.info.interface != "vllm" or self.loops.on:
                requests = singles(requests)

            async def bounded(chunk: list[int]) -> list[ModelReply | Exception]:
                # A request with n outputs runs n sequences at the engine: n slots.
                async with lease.slots(sum(requests[i].n for i in chunk)):
                    return await self._chunk(client, [requests[i] for i in chunk], streams)

            cut = chunks(requests, self._per_request)
            # Created in order, so the chunks queue at the gate in order (FIFO).
            tasks = [asyncio.create_task(bounded(c)) for c in cut]
            return in_order(requests, cut, await asyncio.gather(*tasks))
        finally:
            # A failure leaves the call's other requests running: on a shared loop nothing
            # else would stop them, and they would keep their slots.
            for task in tasks:
                task.cancel()
            if tasks:
                await asyncio.gather(*tasks, return_exceptions=True)
            lease.close()
            await streams.close()
            await client.close()

    def _where(self) -> str:
        return f"Triton {self.url} model {self.model}"

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
        """Wait (the one retry policy) until the server and the model are ready and their
        metadata and config are read; a server that goes away between the calls is waited
        for again. Then say what the model is (`_describe`)."""

        async def described() -> tuple[dict[str, Any], dict[str, Any]]:
            if not await self._ready(client):
                raise Transient("not ready")
            try:
                meta = await client.get_model_metadata(self.model, as_json=True, client_timeout=10)
                config = await client.get_model_config(self.model, as_json=True, client_timeout=10)
            except (InferenceServerException, grpc.RpcError) as exc:
                raise Transient("not ready") from exc  # gone between the calls
            return meta, config.get("config", {})

        meta, config = await retrying(
            described, retries=self.retries, backoff_s=self.backoff_s, where=self._where()
        )
        self._describe(read_served(meta, config, self.interface))

    def _describe(self, served: Served) -> None:
        """Record what the model is (`info`, seen by `on_ready`) and how many items a
        request carries; the vLLM interface needs the checkpoint's chat template."""
        self.served, self._fixed = served, None
        if self.tokenizer and self.template is None:
            self.template = load_chat_template(self.tokenizer)
        if served.interface == "vllm" and self.template is None:
            raise TemplateError(
                f"model {self.model} takes a rendered prompt (vLLM interface): "
                "name its checkpoint's tokenizer files (RSIEVE_GENERATOR_"
                "TOKENIZER / RSIEVE_JUDGE_TOKENIZER)"
            )
        if served.interface == "vllm":
            sampling = vllm_sampling(self.temperature, self.top_p, self.max_new_tokens, self.seed)
        else:
            sampling = rsieve_sampling(served, self.temperature, self.max_new_tokens)
        self.info = model_info(self.model, served, sampling, self.template)
        if self.on_ready is not None:
            self.on_ready(self.info)  # may size the gate from the engine's capacity
        limit = self.gate.limit if self.gate is not None else self.max_inflight
        self._per_request = items_per_request(served, self.request_items, limit)

    # ------------------------------------------------------------------ one request
    async def _chunk(
        self,
        client: grpcclient.InferenceServerClient,
        reqs: list[ModelRequest],
        streams: VllmStreams,
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
        streams: VllmStreams,
    ) -> list[ModelReply] | Exception:
        """One request's replies, its latency measured; a transient failure asked again."""

        async def attempt() -> list[ModelReply] | Exception:
            start = time.monotonic()
            try:
                replies = await self._ask(client, reqs, streams)
            except MalformedReply as exc:
                return exc
            except (InferenceServerException, grpc.RpcError) as exc:
                code, message = status_of(exc)
                # An error while the server or the model is going away is infrastructure,
                # never the item's result.
                if not is_transient(code) and await self._ready(client):
                    return exc
                raise Transient(f"{code} {message}".strip()) from exc
            latency = round(time.monotonic() - start, 6)
            return [replace(r, latency_s=latency) for r in replies]

        return await retrying(
            attempt, retries=self.retries, backoff_s=self.backoff_s, where=self._where()
        )

    async def _ask(
        self,
        client: grpcclient.InferenceServerClient,
        reqs: list[ModelRequest],
        streams: VllmStreams,
    ) -> list[ModelReply]:
        """Send one request on the model's interface: rsieve's (unary, a row per item),
        vLLM's answered whole, or vLLM's streamed and watched for loops."""
        assert self.info is not None
        if self.info.interface != "vllm":
            return await self._rsieve(client, reqs)
        chat, inputs, names = self.vllm_inputs(reqs[0], stream=self.loops.on)
        if self.loops.on:
            return [await streams.streamed(inputs, names, chat, self.loops, self.timeout_s)]
        return await streams.whole(inputs, names, reqs[0], chat, self.timeout_s)

    async def _rsieve(
        self, client: grpcclient.InferenceServerClient, reqs: list[ModelRequest]
    ) -> list[ModelReply]:
        """One unary request on the rsieve interface, a row per item."""
        assert self.served is not None
        users = [self.template.neutralise(r.prompt) if self.template else r.prompt for r in reqs]
        inputs, names = rsieve_request(
            self.served,
            users,
            reqs,
            max_new_tokens=self.max_new_tokens,
            temperature=self.temperature,
            seed=self.seed,
        )
        result = await client.infer(
            self.model,
            inputs,
            outputs=[grpcclient.InferRequestedOutput(n) for n in names],
            client_timeout=self.timeout_s,
        )
        return rsieve_replies(result, names, users)

    def vllm_inputs(
        self, req: ModelRequest, *, stream: bool
    ) -> tuple[RenderedChat, list[grpcclient.InferInput], list[str]]:
        """The rendered chat, the inputs and the output names of one vLLM request (what
        `generate_many` sends; bench/bench_streams.py sends it with a bare client)."""
        assert self.info is not None and self.served is not None
        assert self.template is not None  # _describe refuses the vLLM interface without
        chat = self.template.render(
            req.prompt, has_image=req.image is not None, reasoning=self.reasoning
        )
        if self._fixed is None:
            self._fixed = fixed_inputs(self.info.sampling, self.served)
        inputs = vllm_request(chat.text, req, self.info.sampling, self._fixed, stream=stream)
        return chat, inputs, self._fixed[1]


def open_model(
    settings: Settings,
    role: ModelRole,
    gate: EngineGate | None = None,
    on_ready: Callable[[ModelInfo], None] | None = None,
) -> TritonModel | OpenAIModel:
    """The role's model as settings name it (rsieve.adapters.roles): on an
    OpenAI-compatible server (interface "openai", rsieve.adapters.openai_compat), else on
    Triton (the role's own engine)."""
    if settings.interface_of(role) == "openai":
        return OpenAIModel.from_settings(settings, role, gate=gate, on_ready=on_ready)
    return TritonModel.from_settings(settings, role, gate=gate, on_ready=on_ready)
