"""Triton's vLLM backend on the wire (deploy/triton/README.md, "vllm"): the prompt rendered
client side with the checkpoint's chat template, the image base64 in `image`,
`sampling_parameters` as vLLM SamplingParams JSON, finish reason and token counts asked for
with the backend's `return_*` flags.

The request's tensors and the reading of its answer (whole, or a streamed sample's
responses) are pure functions here, checked without a server. `VllmStreams` holds the
gRPC streams one call opens (rsieve.adapters.streams): the shared stream whole answers
come on, and the pool its streamed samples reuse, so that cutting a sample in a loop
cancels it alone.
"""

from __future__ import annotations

import asyncio
import base64
import json
from dataclasses import dataclass, field
from typing import Any

import tritonclient.grpc.aio as grpcclient

from rsieve.adapters.retry import Transient
from rsieve.adapters.streams import InferStream, StreamBroken, StreamPool
from rsieve.adapters.triton_wire import (
    MalformedReply,
    Result,
    Served,
    first_int,
    ints,
    sent_sha256,
    strs_or_none,
    tensor,
)
from rsieve.generate.chat import RenderedChat
from rsieve.generate.generation import ModelReply, ModelRequest
from rsieve.generate.loops import LoopRule, LoopWatch
from rsieve.generate.think import LOOP_FINISH

__all__ = [
    "Fixed",
    "StreamedReply",
    "VllmStreams",
    "fixed_inputs",
    "vllm_request",
    "vllm_sampling",
    "whole_replies",
]

# The inputs every request to one model carries unchanged, and the outputs it asks for.
Fixed = tuple[list[grpcclient.InferInput], list[str]]

_FLAGS = ("return_finish_reason", "return_num_input_tokens", "return_num_output_tokens")
_OUTPUTS = ("text_output", "finish_reason", "num_input_tokens", "num_output_tokens")


def vllm_sampling(
    temperature: float, top_p: float, max_new_tokens: int | None, seed: int | None
) -> dict[str, Any]:
    """SamplingParams as sent (and recorded); `top_p` only when it cuts."""
    params: dict[str, Any] = {"temperature": temperature, "n": 1}
    if top_p != 1.0:
        params["top_p"] = top_p
    if max_new_tokens is not None:
        params["max_tokens"] = max_new_tokens
    if seed is not None:
        params["seed"] = seed
    return params


def fixed_inputs(sampling: dict[str, Any], served: Served) -> Fixed:
    """The inputs every request carries unchanged (built once per model: a request only
    replaces those it changes) and the outputs the model declares of those read."""
    inputs = [
        tensor("stream", [False], [1], "BOOL"),
        tensor("exclude_input_in_output", [True], [1], "BOOL"),
        tensor("sampling_parameters", [json.dumps(sampling).encode()], [1], "BYTES"),
    ]
    inputs += [tensor(f, [True], [1], "BOOL") for f in _FLAGS if f in served.inputs]
    return inputs, [name for name in _OUTPUTS if name in served.outputs]


def vllm_request(
    prompt: str,
    req: ModelRequest,
    sampling: dict[str, Any],
    fixed: Fixed,
    *,
    stream: bool,
) -> list[grpcclient.InferInput]:
    """The inputs of one request: the rendered `prompt`, the fixed inputs with the
    request's seed and `n` in its sampling parameters, and its image."""
    asked = sampling
    if req.seed is not None:  # a best-of-n sample: its own seed in its parameters
        asked = asked | {"seed": req.seed}
    if req.n > 1:
        asked = asked | {"n": req.n}
    replaced: dict[str, grpcclient.InferInput] = {}
    if asked is not sampling:
        replaced["sampling_parameters"] = tensor(
            "sampling_parameters", [json.dumps(asked).encode()], [1], "BYTES"
        )
    if stream:
        replaced["stream"] = tensor("stream", [True], [1], "BOOL")
    inputs = [
        tensor("text_input", [prompt.encode("utf-8")], [1], "BYTES"),
        *(replaced.get(t.name(), t) for t in fixed[0]),
    ]
    if req.image is not None:
        inputs.append(tensor("image", [base64.b64encode(req.image)], [1], "BYTES"))
    return inputs


def whole_replies(
    result: Result, names: list[str], req: ModelRequest, chat: RenderedChat
) -> list[ModelReply]:
    """A request answered whole: its `n` outputs, one reply each. No text and no finish
    reason, or an aborted output, is transient; outputs not `n` are MalformedReply."""
    n = req.n
    texts = strs_or_none(result.as_numpy("text_output"))
    finishes = strs_or_none(result.as_numpy("finish_reason")) if "finish_reason" in names else None
    if texts is None and finishes is None:
        raise Transient("vLLM answered without text or finish reason")
    if len(texts or []) != n or (finishes is not None and len(finishes) != n):
        raise MalformedReply(f"{len(texts or [])} outputs for a request of n={n}")
    n_in = first_int(result.as_numpy("num_input_tokens")) if "num_input_tokens" in names else None
    n_out = ints(result.as_numpy("num_output_tokens") if "num_output_tokens" in names else None, n)
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
                prompt_sent_sha256=sent_sha256(chat.text),
                user_text=chat.user,
                # vLLM draws output j of a seeded request with seed + j.
                seed=req.seed + j if req.seed is not None and n > 1 else None,
            )
        )
    return replies


@dataclass
class StreamedReply:
    """One streamed sample's responses read so far (each as rsieve.adapters.streams'
    `first_elements`): its deltas, finish reason and token counts."""

    parts: list[str] = field(default_factory=list)
    finish: str | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None

    def feed(self, got: dict[str, str | int]) -> str:
        """Read one response; its text delta."""
        delta = str(got.get("text_output", ""))
        self.parts.append(delta)
        said = got.get("finish_reason")
        if said and said != "None":  # the backend's str(None) while it runs
            self.finish = str(said)
        if self.input_tokens is None and "num_input_tokens" in got:
            self.input_tokens = int(got["num_input_tokens"])
        if "num_output_tokens" in got:
            self.output_tokens = (self.output_tokens or 0) + int(got["num_output_tokens"])
        return delta

    def reply(self, chat: RenderedChat) -> ModelReply:
        """The sample's reply; an aborted or empty stream is transient."""
        if self.finish == "abort":
            raise Transient("vLLM aborted the request")
        text = "".join(self.parts)
        if self.finish is None and not text:
            raise Transient("vLLM answered without text or finish reason")
        return ModelReply(
            text=chat.prefix + text,
            finish_reason=self.finish or "stop",
            input_tokens=self.input_tokens,
            output_tokens=self.output_tokens,
            prompt_sent_sha256=sent_sha256(chat.text),
            user_text=chat.user,
        )


class VllmStreams:
    """The gRPC streams one `generate_many` call opens to a model on the vLLM interface:
    the shared stream whole answers come on (and any that replaced a broken one), and the
    pool its streamed samples reuse (`reuse` False: a stream per sample)."""

    def __init__(
        self, client: grpcclient.InferenceServerClient, model: str, *, reuse: bool
    ) -> None:
        self._client, self._model = client, model
        self.shared: list[InferStream] = []
        self.pool = StreamPool(client, model, reuse=reuse)

    async def whole(
        self,
        inputs: list[grpcclient.InferInput],
        names: list[str],
        req: ModelRequest,
        chat: RenderedChat,
        timeout_s: float,
    ) -> list[ModelReply]:
        """One request answered whole on the call's current stream (a broken one is
        replaced: the retry)."""
        outputs = [grpcclient.InferRequestedOutput(n) for n in names]
        if not self.shared or self.shared[-1].broken is not None:
            self.shared.append(InferStream(self._client, self._model))
        try:
            result = await self.shared[-1].infer(inputs, outputs, timeout_s)
        except StreamBroken as exc:
            raise Transient(f"the stream to {self._model} broke: {exc}") from exc
        return whole_replies(result, names, req, chat)

    async def streamed(
        self,
        inputs: list[grpcclient.InferInput],
        names: list[str],
        chat: RenderedChat,
        loops: LoopRule,
        timeout_s: float,
    ) -> ModelReply:
        """One sample streamed, its tail watched for a repetition loop
        (rsieve.generate.loops): a loop cancels the request at once, and the reply is what
        was generated, with finish reason `repetition_loop` and the tokens generated so
        far (the rest of the budget was never spent)."""
        outputs = [grpcclient.InferRequestedOutput(n) for n in names]
        watch, got = LoopWatch(loops), StreamedReply()
        try:
            async with (
                asyncio.timeout(timeout_s),
                self.pool.streamed(inputs, outputs) as responses,
            ):
                async for response in responses:
                    if watch.feed(got.feed(response)):
                        got.finish = LOOP_FINISH
                        break
        except StreamBroken as exc:
            raise Transient(f"the stream to {self._model} broke: {exc}") from exc
        except TimeoutError as exc:
            raise Transient(f"no whole answer from {self._model} in {timeout_s:g} s") from exc
        return got.reply(chat)

    async def close(self) -> None:
        for stream in self.shared:
            await stream.close()
        await self.pool.close()
