"""The model behind Triton, through tritonclient's asyncio gRPC client.

Speaks the rsieve text-generation interface (deploy/triton/README.md): `prompt` and an
optional `image` (encoded bytes) in, `text` and `finish_reason` out. Keeps up to
`max_inflight` requests in flight so Triton's dynamic batcher can fill its batches.
A server that stays unreachable raises RetryableError (the shard is retried, never scored);
an error the model returns for one request is that request's result.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import tritonclient.grpc.aio as grpcclient
from tritonclient.utils import InferenceServerException

from rsieve.errors import RetryableError

__all__ = ["ModelReply", "ModelRequest", "TritonModel"]

_TRANSIENT = ("UNAVAILABLE", "DEADLINE_EXCEEDED", "RESOURCE_EXHAUSTED", "CANCELLED")


@dataclass(frozen=True)
class ModelRequest:
    prompt: str
    image: bytes | None = None


@dataclass(frozen=True)
class ModelReply:
    text: str
    finish_reason: str


def _bytes_input(name: str, value: bytes) -> grpcclient.InferInput:
    tensor = grpcclient.InferInput(name, [1, 1], "BYTES")
    tensor.set_data_from_numpy(np.array([[value]], dtype=np.object_))
    return tensor


class TritonModel:
    def __init__(self, url: str, model: str, *, max_inflight: int = 16, timeout_s: float = 120,
                 retries: int = 3, backoff_s: float = 1.0) -> None:
        self.url, self.model = url, model
        self.max_inflight, self.timeout_s = max_inflight, timeout_s
        self.retries, self.backoff_s = retries, backoff_s

    def generate_many(self, requests: Sequence[ModelRequest]) -> list[ModelReply | Exception]:
        return asyncio.run(self._generate_many(requests))

    async def _generate_many(self, requests: Sequence[ModelRequest]
                             ) -> list[ModelReply | Exception]:
        gate = asyncio.Semaphore(self.max_inflight)
        client = grpcclient.InferenceServerClient(url=self.url)
        try:
            async def bounded(req: ModelRequest) -> ModelReply | Exception:
                async with gate:
                    return await self._one(client, req)

            return list(await asyncio.gather(*(bounded(r) for r in requests)))
        finally:
            await client.close()

    async def _one(self, client: grpcclient.InferenceServerClient, req: ModelRequest
                   ) -> ModelReply | Exception:
        inputs = [_bytes_input("prompt", req.prompt.encode("utf-8"))]
        if req.image is not None:
            inputs.append(_bytes_input("image", req.image))
        outputs = [grpcclient.InferRequestedOutput("text"),
                   grpcclient.InferRequestedOutput("finish_reason")]
        for attempt in range(self.retries + 1):
            try:
                result = await client.infer(self.model, inputs, outputs=outputs,
                                            client_timeout=self.timeout_s)
                text = result.as_numpy("text").reshape(-1)[0]
                finish = result.as_numpy("finish_reason").reshape(-1)[0]
                return ModelReply(text.decode("utf-8", "replace"),
                                  finish.decode("utf-8", "replace"))
            except InferenceServerException as exc:
                status = str(exc.status() or "")
                if not any(code in status for code in _TRANSIENT):
                    return exc
                if attempt == self.retries:
                    raise RetryableError(f"Triton {self.url} model {self.model}: {status}") from exc
                await asyncio.sleep(self.backoff_s * 2**attempt)
        raise AssertionError("unreachable")
