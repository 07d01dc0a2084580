"""A model behind an OpenAI-compatible server: `POST {base}/chat/completions` over HTTP.

For the users who already run one (vLLM's `vllm serve`, SGLang, TGI, llama.cpp's server,
`transformers serve`, a hosted API): interface "openai" for the generator or the judge
(settings `model_interface` / `judge_interface`, docs/models.md). Triton stays the default.

What is sent: one user turn whose text is the question byte for byte (special tokens of
`tokenizer`, when named, neutralised as on every interface), the image before it as a
`data:` URL; `temperature`, `top_p` (when not 1), `max_tokens`, `seed`, and
`openai_extra_body` merged in; `stream` false, unless the generator watches for loops
(below). The server renders its checkpoint's chat template, so `thinking_mode` is
"server". `n` is never sent: one answer per request (servers such as `transformers serve`
refuse the field); a best-of-n's samples are requests of their own, sent back to back, so
a server's prefix cache serves the repeated prompt and image (vLLM's automatic prefix
caching, SGLang's radix cache, llama.cpp's `cache_prompt`).

What is read: the message's `content`; its reasoning, when the server returns it apart
(`reasoning_content`, or `reasoning` as newer vLLM names it), is stored as
`<think>reasoning</think>content`, so `rsieve.generate.think.parse_output` reads every interface's
output alike (a `<think>` left in `content` is parsed as it is); `finish_reason`; token
usage (`prompt_tokens`, `completion_tokens`), None when the server gives none.

Loops cut short (`loops`, rsieve.generate.loops; the generator's when settings
`loop_window_chars` > 0, never the judge's): each request is sent with `"stream": true`
and `"stream_options": {"include_usage": true}` and read as Server-Sent Events (`data:
{chunk}` lines, `data: [DONE]` at the end, which some servers leave out). The deltas'
`content` and reasoning (`reasoning_content` or `reasoning`) are joined into the same raw
output as above; `finish_reason` and `usage` come from the chunks that carry them (usage
from the last one, with include_usage). Every delta, reasoning and content in the order
they come, is fed to a `LoopWatch`; when the text ends in a loop the response is closed at
once (vLLM, SGLang and llama.cpp's server abort a request whose client went away, so the
loop's remaining tokens are never generated) and the reply is the text so far (an open
`<think>` without its `</think>` when cut inside separate reasoning), finish reason
`repetition_loop`, `output_tokens` the server's count so far when a chunk gave one, else
an estimate: the characters received / 4, rounded up. A server that refuses
`stream_options` (a 400 or 422 whose body names it) is asked again at once without it,
and this model instance stops sending it; a completed reply's usage is then what the
server gives anyway (None when nothing). A server that answers a stream with a JSON
completion is read as one. Every stream is bounded: its text at
`_STREAM_CHARS_PER_TOKEN` characters per `max_tokens` (at least `_MIN_STREAM_CHARS`),
the bytes read at `STREAM_BYTES_PER_CHAR` per such character, one line at
`_MAX_LINE_BYTES` (rsieve.adapters.openai_wire); past a bound the reply is that item's
error.

The wire (the body, a completion or a stream read into a reply, the statuses worth asking
again) is rsieve.adapters.openai_wire, pure; `OpenAIModel` here sends it: the gate, the
endpoint's readiness and every try through rsieve.adapters.retry.retrying.

Errors, as for Triton (rsieve.adapters.model), streamed or not:
    unreachable, timed out, 408/409/429/5xx, a wrong key (401/403) or a model the server
        does not serve, after `retries` with backoff (429 and 503 wait as `Retry-After`
        says, at least the backoff) -> RetryableError: the shard goes back to the queue,
        nothing is scored and nothing is lost; so is a stream that breaks mid-way (the
        connection lost, a read timed out, the stream ended before its finish)
    any other 4xx while the endpoint still serves the model (e.g. a prompt over the
        context length), a reply outside the format, an `error` in a stream's chunk, a
        stream past its bounds -> that item's result: an Exception, quarantined
        `model_error`

The API key is sent as `Authorization: Bearer` and appears in no log, error or record.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import httpx
from pydantic import SecretStr

from rsieve.adapters.gate import EngineGate
from rsieve.adapters.openai_wire import (
    ERROR_BODY_BYTES,
    TRANSIENT_STATUS,
    EndpointError,
    EventReader,
    Refusal,
    StreamRead,
    chat_body,
    completion_reply,
    detail,
    endpoint_info,
    listing_problem,
    read_json,
    refuses_stream_options,
    retry_after_s,
    sampling_of,
    stream_body,
    stream_chars,
    streamed_reply,
)
from rsieve.adapters.retry import Transient, retrying
from rsieve.adapters.roles import role_choice
from rsieve.adapters.tokenizer import load_chat_template
from rsieve.generate.chat import ChatTemplate
from rsieve.generate.generation import ModelInfo, ModelReply, ModelRequest, singles
from rsieve.generate.loops import LoopRule, LoopWatch
from rsieve.generate.think import LOOP_FINISH
from rsieve.settings import Settings
from rsieve.settings.models import ModelRole

__all__ = ["OpenAIModel"]

log = logging.getLogger("rsieve")


class OpenAIModel:
    """One model on one OpenAI-compatible server; `generate_many` answers a shard's requests.

    About 260 lines, a quarter of them the constructor and `from_settings`: one knob per
    setting the endpoint is asked with. What is sent and read is rsieve.adapters.openai_wire;
    what is left is one call's life (gate, readiness, retries, the stream_options fallback)."""

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key: SecretStr | None = None,
        max_inflight: int = 16,
        timeout_s: float = 120,
        retries: int = 3,
        backoff_s: float = 1.0,
        max_new_tokens: int | None = 1024,
        temperature: float = 0.0,
        top_p: float = 1.0,
        seed: int | None = 0,
        extra_body: dict[str, Any] | None = None,
        tokenizer: str = "",
        kind: str | None = None,
        gate: EngineGate | None = None,
        on_ready: Callable[[ModelInfo], None] | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        loops: LoopRule | None = None,
    ) -> None:
        self.base_url, self.model = base_url.rstrip("/"), model
        self._key = api_key or SecretStr("")
        self.max_inflight, self.timeout_s = max_inflight, timeout_s
        self.retries, self.backoff_s = retries, backoff_s
        self.gate, self.on_ready, self.kind = gate, on_ready, kind
        self.tokenizer = tokenizer
        self.template: ChatTemplate | None = None
        self.transport = transport  # tests: httpx.MockTransport
        self.sampling = sampling_of(temperature, top_p, max_new_tokens, seed)
        self.extra_body = dict(extra_body or {})
        self.info: ModelInfo | None = None
        # Streamed and watched for loops when on; None: one JSON reply per request.
        self.loops = loops if loops is not None and loops.on else None
        # Cleared for good once the server refuses `stream_options`.
        self.stream_options = True
        self.max_stream_chars = stream_chars(max_new_tokens)

    @classmethod
    def from_settings(
        cls,
        settings: Settings,
        role: ModelRole,
        gate: EngineGate | None = None,
        on_ready: Callable[[ModelInfo], None] | None = None,
    ) -> OpenAIModel:
        """The role's model (rsieve.adapters.roles) on its endpoint."""
        s, choice = settings, role_choice(settings, role)
        return cls(
            s.openai_url_of(role),
            choice.model,
            api_key=s.openai_key_of(role),
            max_inflight=s.max_inflight,
            timeout_s=s.model_timeout_s,
            retries=s.model_retries,
            backoff_s=s.model_backoff_s,
            max_new_tokens=choice.max_new_tokens,
            temperature=choice.temperature,
            top_p=choice.top_p,
            seed=s.seed,
            extra_body=s.openai_extra_body,
            tokenizer=choice.tokenizer,
            kind=choice.kind,
            gate=gate,
            on_ready=on_ready,
            loops=choice.loops,
        )

    # ------------------------------------------------------------------ public
    def generate_many(self, requests: Sequence[ModelRequest]) -> list[ModelReply | Exception]:
        return asyncio.run(self.generate_many_async(requests))

    async def generate_many_async(
        self, requests: Sequence[ModelRequest]
    ) -> list[ModelReply | Exception]:
        # `n` is never sent: a round's samples go back to back, each with its own seed.
        requests = singles(requests)
        client = self._client()
        lease = (self.gate or EngineGate(self.max_inflight)).lease()
        tasks: list[asyncio.Task[ModelReply | Exception]] = []
        try:
            await self._wait_ready(client)

            async def bounded(req: ModelRequest) -> ModelReply | Exception:
                async with lease.slots(1):
                    return await self._one(client, req)

            # Created in order, so the requests queue at the gate in order (FIFO).
            tasks = [asyncio.create_task(bounded(r)) for r in requests]
            return list(await asyncio.gather(*tasks))
        finally:
            for task in tasks:
                task.cancel()
            if tasks:
                await asyncio.gather(*tasks, return_exceptions=True)
            lease.close()
            await client.aclose()

    def _client(self) -> httpx.AsyncClient:
        headers = {"Content-Type": "application/json"}
        if self._key.get_secret_value():
            headers["Authorization"] = f"Bearer {self._key.get_secret_value()}"
        return httpx.AsyncClient(
            base_url=self.base_url,
            headers=headers,
            timeout=httpx.Timeout(self.timeout_s, connect=min(10.0, self.timeout_s)),
            # The gate bounds the requests in flight; the pool must not queue them again.
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=64),
            transport=self.transport,
        )

    def _where(self) -> str:
        return f"endpoint {self.base_url} model {self.model}"

    # ------------------------------------------------------------------ readiness
    async def _listing(self, client: httpx.AsyncClient) -> str | None:
        """Why the endpoint cannot take requests for the model now (None: it can). Asked
        with `GET /models`; an endpoint that keeps no list (404, 405) is taken at its word."""
        try:
            response = await client.get("/models", timeout=10)
        except httpx.HTTPError as exc:
            return f"{type(exc).__name__}: {exc}"
        return listing_problem(self.model, response.status_code, response.content)

    async def _wait_ready(self, client: httpx.AsyncClient) -> None:
        """Wait (the one retry policy) until the endpoint answers and, where it lists its
        models, lists this one; then say what the model is."""

        async def listed() -> None:
            problem = await self._listing(client)
            if problem is not None:
                raise Transient(problem)

        await retrying(listed, retries=self.retries, backoff_s=self.backoff_s, where=self._where())
        if self.tokenizer and self.template is None:
            self.template = load_chat_template(self.tokenizer)
        if self.info is None:
            self.info = endpoint_info(self.model, self.sampling, self.extra_body, self.kind)
        if self.on_ready is not None:
            self.on_ready(self.info)

    # ------------------------------------------------------------------ one request
    async def _one(self, client: httpx.AsyncClient, req: ModelRequest) -> ModelReply | Exception:
        user = self.template.neutralise(req.prompt) if self.template else req.prompt
        body = chat_body(self.model, user, req.image, self.sampling, self.extra_body, req.seed)

        async def attempt() -> ModelReply | Exception:
            try:
                if self.loops is not None:
                    return await self._streamed(client, body, user, self.loops)
                return await self._unary(client, body, user)
            except EndpointError as exc:
                return exc

        return await retrying(
            attempt, retries=self.retries, backoff_s=self.backoff_s, where=self._where()
        )

    async def _refused(
        self, client: httpx.AsyncClient, status: int, why: str, retry_after: str | None
    ) -> EndpointError:
        """A status >= 400: raise Transient when worth asking again, else the item's error."""
        if status in TRANSIENT_STATUS:
            raise Transient(f"HTTP {status} {why}", retry_after_s(retry_after))
        # The item's own fault only while the endpoint still serves the model.
        problem = await self._listing(client)
        if problem is None:
            return EndpointError(f"HTTP {status} {why}")
        raise Transient(f"HTTP {status}, then {problem}")

    async def _unary(
        self, client: httpx.AsyncClient, body: dict[str, Any], user: str
    ) -> ModelReply | Exception:
        start = time.monotonic()
        try:
            response = await client.post("/chat/completions", json=body)
        except httpx.HTTPError as exc:
            raise Transient(f"{type(exc).__name__}: {exc}") from exc
        if response.status_code >= 400:
            return await self._refused(
                client,
                response.status_code,
                detail(response.text),
                response.headers.get("retry-after"),
            )
        return self._reply(read_json(response.text), response.text, user, start)

    def _reply(self, data: Any, raw: str, user: str, start: float) -> ModelReply:
        reply = completion_reply(data, raw, user, _since(start))
        self._record_version(data.get("model"))
        return reply

    # ------------------------------------------------------------------ streamed
    async def _streamed(
        self, client: httpx.AsyncClient, body: dict[str, Any], user: str, rule: LoopRule
    ) -> ModelReply | Exception:
        """One streamed request, asked once more without `stream_options` when the server
        refuses that field."""
        start = time.monotonic()
        sent = stream_body(body, with_options=self.stream_options)
        got = await self._stream_once(client, sent, user, rule, start)
        if isinstance(got, Refusal) and refuses_stream_options(got, sent):
            if self.stream_options:
                self.stream_options = False
                log.warning(
                    "endpoint %s refuses stream_options: streaming without it (token "
                    "usage only where the server gives it)",
                    self.base_url,
                )
            sent = stream_body(body, with_options=self.stream_options)
            got = await self._stream_once(client, sent, user, rule, start)
        if isinstance(got, Refusal):
            return await self._refused(client, got.status, detail(got.body), got.retry_after)
        return got

    async def _stream_once(
        self,
        client: httpx.AsyncClient,
        body: dict[str, Any],
        user: str,
        rule: LoopRule,
        start: float,
    ) -> ModelReply | Refusal:
        reader = EventReader(
            LoopWatch(rule), max_chars=self.max_stream_chars, served=self._record_version
        )
        try:
            async with client.stream("POST", "/chat/completions", json=body) as response:
                if response.status_code >= 400:
                    head, _ = await _read_at_most(response, ERROR_BODY_BYTES)
                    return Refusal(
                        response.status_code,
                        head.decode("utf-8", "replace"),
                        response.headers.get("retry-after"),
                    )
                if "json" in response.headers.get("content-type", ""):
                    # A server that does not stream: one chat completion.
                    data, over = await _read_at_most(response, reader.max_bytes)
                    raw = data.decode("utf-8", "replace")
                    if over:
                        raise EndpointError(f"a reply over {reader.max_bytes} bytes")
                    return self._reply(read_json(raw), raw, user, start)
                got = await _read_events(response, reader)
                # Leaving the block closes the response: a cut loop's generation ends here.
        except httpx.HTTPError as exc:
            raise Transient(f"{type(exc).__name__} while streaming: {exc}") from exc
        if got.finish == LOOP_FINISH:
            log.debug("cut a repetition loop after %d characters", got.chars)
        return streamed_reply(got, user, _since(start))

    def _record_version(self, served: object) -> None:
        """What answered, as the server names it (a hosted API names a dated snapshot)."""
        if self.info is not None and not self.info.version and isinstance(served, str) and served:
            self.info = replace(self.info, version=served)


async def _read_events(response: httpx.Response, reader: EventReader) -> StreamRead:
    """The stream's events until `[DONE]`, its end, or a loop (finish LOOP_FINISH)."""
    async for piece in response.aiter_bytes():
        if reader.feed(piece):
            return reader.got
    return reader.end()


async def _read_at_most(response: httpx.Response, limit: int) -> tuple[bytes, bool]:
    """The body's first `limit` bytes, and whether there was more."""
    out = bytearray()
    async for piece in response.aiter_bytes():
        out += piece
        if len(out) > limit:
            return bytes(out[:limit]), True
    return bytes(out), False


def _since(start: float) -> float:
    return round(time.monotonic() - start, 6)
