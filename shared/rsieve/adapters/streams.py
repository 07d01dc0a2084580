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

A request that may be stopped early (a streamed sample cut in a repetition loop) cannot
share a stream with others: Triton cancels a whole stream, never one request on it.
`StreamPool` keeps such samples on streams that carry one request at a time and are
reused once it is answered to its final response; only a cut sample's stream is
cancelled (and with it the request at the engine) and replaced.
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

__all__ = ["InferStream", "StreamBroken", "StreamPool", "first_elements"]


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
        request = _request(self._model, inputs, outputs, request_id)
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


def _request(
    model: str,
    inputs: list[grpcclient.InferInput],
    outputs: list[grpcclient.InferRequestedOutput],
    request_id: str,
) -> service_pb2.ModelInferRequest:
    return _get_inference_request(
        model_name=model,
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


class _SampleStream:
    """One gRPC stream that carries one streamed request at a time, written and read
    message by message (grpc.aio's write/read on a call opened without a request
    iterator). Cancelling it cancels the request on it, and the stream with it."""

    def __init__(self, client: grpcclient.InferenceServerClient) -> None:
        self.call: Any = client._client_stub.ModelStreamInfer(
            metadata=client._get_metadata(None), timeout=None
        )
        self.samples = 0  # requests carried, for the pool's figures

    def usable(self) -> bool:
        return not self.call.done()

    async def close(self) -> None:
        """No more requests: the server ends the stream (bounded: else it is cancelled)."""
        if not self.usable():
            return
        with contextlib.suppress(grpc.RpcError, asyncio.CancelledError):
            try:
                async with asyncio.timeout(5):
                    await self.call.done_writing()
                    while await self.call.read() is not grpc.aio.EOF:
                        pass
            except TimeoutError:
                self.call.cancel()


class StreamPool:
    """Streams to `model` that samples reuse (issue 53): a sample takes a free stream,
    sends its one request and reads it to its final response, then gives the stream back,
    so a stream's setup is paid once per stream rather than once per sample. Only a
    sample left before its final response (cut in a loop, failed, timed out) cancels its
    stream, which Triton turns into the request's cancellation at the engine (the vLLM
    backend aborts the generation): Triton cancels whole streams, never one request on
    one, so a stream carries one request at a time and a cut stream is never reused.

    `opened` and `reused` count streams set up and samples that found one free. `reuse`
    False opens a stream per sample (what a sample cost before the pool: bench/bench_streams.py
    measures both side by side)."""

    def __init__(
        self, client: grpcclient.InferenceServerClient, model: str, *, reuse: bool = True
    ) -> None:
        self._client, self._model, self._reuse = client, model, reuse
        self._free: list[_SampleStream] = []
        self._open: set[_SampleStream] = set()
        self.opened = 0
        self.reused = 0

    def _take(self) -> _SampleStream:
        while self._free:
            stream = self._free.pop()
            if stream.usable():
                self.reused += 1
                return stream
            self._open.discard(stream)
        stream = _SampleStream(self._client)
        self._open.add(stream)
        self.opened += 1
        return stream

    @contextlib.asynccontextmanager
    async def streamed(
        self,
        inputs: list[grpcclient.InferInput],
        outputs: list[grpcclient.InferRequestedOutput],
    ) -> AsyncIterator[AsyncIterator[dict[str, str | int]]]:
        """One request streamed on a pooled stream, for a caller that may stop it early
        (a generation cut in a loop, rsieve.generate.loops): its responses as they come,
        each as its outputs' first elements (`first_elements`), to the final one
        (Triton's empty-final-response flag marks it). Leaving the block before then
        cancels the request at the engine. An error response raises
        InferenceServerException; the stream breaking, StreamBroken."""
        stream = self._take()
        request_id = uuid.uuid4().hex
        request = _request(self._model, inputs, outputs, request_id)
        request.parameters["triton_enable_empty_final_response"].bool_param = True
        ended = False
        layout: Layout | None = None

        async def responses() -> AsyncGenerator[dict[str, str | int], None]:
            nonlocal ended, layout
            try:
                await stream.call.write(request)
                stream.samples += 1
                while (response := await stream.call.read()) is not grpc.aio.EOF:
                    if response.error_message:
                        raise InferenceServerException(msg=response.error_message)
                    if response.infer_response.id != request_id:
                        continue  # never: one request at a time; a stray is not ours
                    got = response.infer_response
                    final = got.parameters.get("triton_final_response")
                    if final is not None and final.bool_param:
                        ended = True
                    if got.outputs and (layout is None or len(got.outputs) != len(layout)):
                        layout = layout_of(got)
                    yield first_elements(got, layout)
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
            await reading.aclose()
            if ended and stream.usable() and self._reuse:
                self._free.append(stream)
            elif ended:
                self._open.discard(stream)
                await stream.close()
            else:
                # Cut, failed or broken: the request (if still running) is aborted with
                # the stream, and the stream is not used again.
                stream.call.cancel()
                self._open.discard(stream)

    async def close(self) -> None:
        """End every stream (free ones close cleanly; none should be busy)."""
        streams, self._open, self._free = list(self._open), set(), []
        for stream in streams:
            await stream.close()


_INTS = {"UINT32": (4, False), "INT32": (4, True), "UINT64": (8, False), "INT64": (8, True)}

# An output's name and how its first element is read: 0 for BYTES (text), else the
# integer's width in bytes (negative: signed); None: a type not read.
Layout = list[tuple[str, int | None]]


def layout_of(response: service_pb2.ModelInferResponse) -> Layout:
    """How a response's outputs are read (`first_elements`). A streamed request's responses
    all carry the outputs it asked for in one order, so this is read once per request."""
    out: Layout = []
    for tensor in response.outputs:
        if tensor.datatype == "BYTES":
            out.append((tensor.name, 0))
        elif tensor.datatype in _INTS:
            width, signed = _INTS[tensor.datatype]
            out.append((tensor.name, -width if signed else width))
        else:
            out.append((tensor.name, None))
    return out


def first_elements(
    response: service_pb2.ModelInferResponse, layout: Layout | None = None
) -> dict[str, str | int]:
    """Each output's first element, read straight off the raw contents: a BYTES element as
    text (its 4-byte length, then its bytes), an integer as an int. A streamed sample gets
    a response per engine tick (per token from vLLM's backend), so what InferResult.as_numpy
    costs (a numpy array per output per response) is paid hundreds of times per sample;
    this is the cheap read. `layout`: the request's (`layout_of`), when already read."""
    out: dict[str, str | int] = {}
    raw = response.raw_output_contents
    for (name, kind), data in zip(layout or layout_of(response), raw, strict=False):
        if kind == 0:
            if len(data) >= 4:
                size = int.from_bytes(data[:4], "little")
                out[name] = data[4 : 4 + size].decode("utf-8", "replace")
        elif kind is not None and data:
            out[name] = int.from_bytes(data[: abs(kind)], "little", signed=kind < 0)
    return out
