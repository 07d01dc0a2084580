"""Many requests to one decoupled Triton model on one gRPC bidirectional stream.

Triton's vLLM backend is decoupled: it is reached through ModelStreamInfer, and a stream
carries any number of requests, each answered (stream=False) by one response that names
the request's id. Opening a stream per request costs the client about 0.7 ms of CPU
(call setup, headers, half-close, trailers: half a dozen completion-queue events, each a
wake-up of the event loop), more than everything else it does for an item; a shard's
requests share one stream instead, each a message out and a message in.

tritonclient's `stream_infer` drops the request id of an error response, so an error
could not be told apart from its neighbours'; this reads the raw responses from the client's
stub (`_client_stub.ModelStreamInfer`, as `stream_infer` itself does) and matches every
response, error or not, to its request by id.

The stream breaking (Triton restarting, the connection lost) fails every pending request
with `StreamBroken`, a transient error: the caller retries on a new stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

import grpc
import tritonclient.grpc.aio as grpcclient
from tritonclient.grpc import InferResult, service_pb2
from tritonclient.grpc._utils import _get_inference_request
from tritonclient.utils import InferenceServerException

__all__ = ["InferStream", "StreamBroken", "first_elements", "streamed"]


class StreamBroken(Exception):
    """The stream ended before this request's response came (transient)."""


class InferStream:
    """One stream to `model`, opened on the first request; `close()` ends it."""

    def __init__(self, client: grpcclient.InferenceServerClient, model: str) -> None:
        self._client, self._model = client, model
        self._queue: asyncio.Queue[service_pb2.ModelInferRequest | None] = asyncio.Queue()
        self._pending: dict[str, asyncio.Future[InferResult]] = {}
        self._reader: asyncio.Task[None] | None = None
        self._call: Any = None
        self.broken: str | None = None

    async def infer(
        self,
        inputs: list[grpcclient.InferInput],
        outputs: list[grpcclient.InferRequestedOutput],
        timeout_s: float,
    ) -> InferResult:
        """One request's response; its error as InferenceServerException; StreamBroken if
        the stream went away first."""
        if self.broken is not None:
            raise StreamBroken(self.broken)
        if self._reader is None:
            self._open()
        request_id = uuid.uuid4().hex
        request = _get_inference_request(
            model_name=self._model,
            inputs=inputs,
            model_version="",
            request_id=request_id,
            outputs=outputs,
            sequence_id=0,
            sequence_start=False,
            sequence_end=False,
            priority=0,
            timeout=None,
            parameters=None,
        )
        future: asyncio.Future[InferResult] = asyncio.get_running_loop().create_future()
        self._pending[request_id] = future
        self._queue.put_nowait(request)
        try:
            async with asyncio.timeout(timeout_s):
                return await future
        except TimeoutError as exc:
            # The request may still run at the engine; the stream stays usable.
            raise StreamBroken(f"no response in {timeout_s:g} s") from exc
        finally:
            self._pending.pop(request_id, None)

    def _open(self) -> None:
        async def requests() -> AsyncIterator[service_pb2.ModelInferRequest]:
            while (request := await self._queue.get()) is not None:
                yield request

        self._call = self._client._client_stub.ModelStreamInfer(
            requests(), metadata=self._client._get_metadata(None), timeout=None
        )
        self._reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        reason = "the server closed the stream"
        try:
            async for response in self._call:
                future = self._pending.get(response.infer_response.id)
                if future is None or future.done():
                    continue  # timed out meanwhile
                if response.error_message:
                    future.set_exception(InferenceServerException(msg=response.error_message))
                else:
                    future.set_result(InferResult(response.infer_response))
        except grpc.RpcError as exc:
            code = exc.code() if hasattr(exc, "code") else None
            reason = f"{getattr(code, 'name', code)} {exc}"
        finally:
            self.broken = reason
            for future in self._pending.values():
                if not future.done():
                    future.set_exception(StreamBroken(reason))

    async def close(self) -> None:
        if self._reader is None:
            return
        self._queue.put_nowait(None)  # no more requests: the server ends the stream
        if self._pending:
            self._call.cancel()
        with contextlib.suppress(asyncio.CancelledError, grpc.RpcError):
            try:
                await asyncio.wait_for(asyncio.shield(self._reader), 5)
            except TimeoutError:
                self._call.cancel()
                self._reader.cancel()


@contextlib.asynccontextmanager
async def streamed(
    client: grpcclient.InferenceServerClient,
    model: str,
    inputs: list[grpcclient.InferInput],
    outputs: list[grpcclient.InferRequestedOutput],
) -> AsyncIterator[AsyncIterator[dict[str, str | int]]]:
    """One request streamed on a stream of its own, for a caller that may stop it early
    (a generation cut in a loop, rsieve.generate.loops): its responses as they come, each
    as its outputs' first elements (`first_elements`), to the final one (Triton's
    empty-final-response flag marks it); leaving the block before then
    cancels the stream, and with it the request at the engine (Triton's request
    cancellation; the vLLM backend aborts the generation). A request of its own costs a
    stream's setup (the module docstring), the price of being able to cancel it alone.
    An error response raises InferenceServerException; the stream breaking, StreamBroken."""
    request = _get_inference_request(
        model_name=model,
        inputs=inputs,
        model_version="",
        request_id=uuid.uuid4().hex,
        outputs=outputs,
        sequence_id=0,
        sequence_start=False,
        sequence_end=False,
        priority=0,
        timeout=None,
        parameters=None,
    )
    request.parameters["triton_enable_empty_final_response"].bool_param = True
    finished = asyncio.Event()

    async def requests() -> AsyncIterator[service_pb2.ModelInferRequest]:
        yield request
        await finished.wait()  # the request side stays open until the last response

    call = client._client_stub.ModelStreamInfer(
        requests(), metadata=client._get_metadata(None), timeout=None
    )

    ended = False

    async def responses() -> AsyncGenerator[dict[str, str | int], None]:
        nonlocal ended
        try:
            async for response in call:
                if response.error_message:
                    raise InferenceServerException(msg=response.error_message)
                final = response.infer_response.parameters.get("triton_final_response")
                if final is not None and final.bool_param:
                    ended = True
                yield first_elements(response.infer_response)
                if ended:
                    return
        except grpc.RpcError as exc:
            code = exc.code() if hasattr(exc, "code") else None
            raise StreamBroken(f"{getattr(code, 'name', code)} {exc}") from exc
        raise StreamBroken("the server closed the stream before the final response")

    reading = responses()
    try:
        yield reading
    finally:
        # The request side closes; a request answered to its final response lets the
        # server end the call, any other is cancelled (and aborted at the engine).
        finished.set()
        await reading.aclose()
        if not ended and not call.done():
            call.cancel()


_INTS = {"UINT32": (4, False), "INT32": (4, True), "UINT64": (8, False), "INT64": (8, True)}


def first_elements(response: service_pb2.ModelInferResponse) -> dict[str, str | int]:
    """Each output's first element, read straight off the raw contents: a BYTES element as
    text (its 4-byte length, then its bytes), an integer as an int. A streamed sample gets
    a response per engine tick, so what InferResult.as_numpy costs (a numpy array per
    output per response) is paid hundreds of times per sample; this is the cheap read."""
    out: dict[str, str | int] = {}
    raw = response.raw_output_contents
    for tensor, data in zip(response.outputs, raw, strict=False):
        if tensor.datatype == "BYTES":
            if len(data) >= 4:
                size = int.from_bytes(data[:4], "little")
                out[tensor.name] = data[4 : 4 + size].decode("utf-8", "replace")
        elif tensor.datatype in _INTS and data:
            width, signed = _INTS[tensor.datatype]
            out[tensor.name] = int.from_bytes(data[:width], "little", signed=signed)
    return out
