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
the bytes read at `_STREAM_BYTES_PER_CHAR` per such character, one line at
`_MAX_LINE_BYTES`; past a bound the reply is that item's error.

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
import base64
import email.utils
import hashlib
import json
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import httpx
from pydantic import SecretStr

from rsieve.adapters.gate import EngineGate
from rsieve.adapters.retry import ItemError, Transient, backoff_wait, retrying
from rsieve.adapters.tokenizer import load_chat_template
from rsieve.errors import RetryableError
from rsieve.generate.chat import ChatTemplate
from rsieve.generate.generation import ModelInfo, ModelReply, ModelRequest, singles
from rsieve.generate.loops import LoopRule, LoopWatch
from rsieve.generate.think import CLOSE, LOOP_FINISH, OPEN
from rsieve.images import image_mime
from rsieve.settings import Settings

__all__ = ["OpenAIModel"]

log = logging.getLogger("rsieve")

Role = Literal["generator", "judge"]

# Statuses worth asking again: overloaded, rate limited, restarting, or refusing the key
# or the model (the operator's to fix; the shard waits in the queue meanwhile).
_TRANSIENT_STATUS = frozenset({401, 403, 404, 408, 409, 429, 500, 502, 503, 504})

# One stream's bounds (every input bounded): the text kept, in characters per token asked
# for (a token is rarely over 16; at least _MIN_STREAM_CHARS, _UNBOUNDED_STREAM_CHARS when
# no max_tokens is sent); the bytes read per such character (each chunk's JSON and SSE
# framing around a delta of a few characters: about 60 a character on vLLM); one line.
_STREAM_CHARS_PER_TOKEN = 32
_MIN_STREAM_CHARS = 1 << 16
_UNBOUNDED_STREAM_CHARS = 1 << 22
_STREAM_BYTES_PER_CHAR = 64
_MAX_LINE_BYTES = 1 << 20
# Of a refused request's body, what is read (to say why, and to find `stream_options`).
_ERROR_BODY_BYTES = 1 << 14
# The statuses a server refusing an unknown field answers with.
_BAD_FIELD_STATUS = frozenset({400, 422})


class EndpointError(ItemError):
    """The server refused this item's request (a 4xx other than the transient ones) or
    answered outside the chat completions format."""


def retry_after_s(value: str | None, now: float | None = None) -> float:
    """Seconds a `Retry-After` header asks to wait: delta-seconds or an HTTP date; 0 when
    absent or unreadable."""
    if not value:
        return 0.0
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return 0.0
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


def reply_text(message: dict[str, Any]) -> str:
    """The assistant message as one raw output: separate reasoning, when the server gives
    it, in `<think>` tags before the content."""
    content = message.get("content") or ""
    if isinstance(content, list):  # content parts: keep the text ones, in order
        content = "".join(
            str(p.get("text", ""))
            for p in content
            if isinstance(p, dict) and p.get("type") == "text"
        )
    reasoning = message.get("reasoning_content") or message.get("reasoning")
    if isinstance(reasoning, str) and reasoning.strip():
        return f"{OPEN}{reasoning}{CLOSE}{content}"
    return str(content)


class OpenAIModel:
    """One model on one OpenAI-compatible server; `generate_many` answers a shard's requests."""

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
        sampling: dict[str, Any] = {"temperature": temperature}
        if top_p != 1.0:
            sampling["top_p"] = top_p
        if max_new_tokens is not None:
            sampling["max_tokens"] = max_new_tokens
        if seed is not None:
            sampling["seed"] = seed
        self.extra_body = dict(extra_body or {})
        self.sampling = sampling
        self.info: ModelInfo | None = None
        # Streamed and watched for loops when on; None: one JSON reply per request.
        self.loops = loops if loops is not None and loops.on else None
        # Cleared for good once the server refuses `stream_options`.
        self.stream_options = True
        self.max_stream_chars = (
            max(_MIN_STREAM_CHARS, _STREAM_CHARS_PER_TOKEN * max_new_tokens)
            if max_new_tokens is not None
            else _UNBOUNDED_STREAM_CHARS
        )

    @classmethod
    def from_settings(
        cls,
        settings: Settings,
        role: Role,
        gate: EngineGate | None = None,
        on_ready: Callable[[ModelInfo], None] | None = None,
    ) -> OpenAIModel:
        s = settings
        judge = role == "judge"
        return cls(
            s.openai_url_of(role),
            s.judge_model if judge else s.generator_model,
            api_key=s.openai_key_of(role),
            max_inflight=s.max_inflight,
            timeout_s=s.model_timeout_s,
            retries=s.model_retries,
            backoff_s=s.model_backoff_s,
            max_new_tokens=s.judge_max_new_tokens if judge else s.max_new_tokens,
            temperature=s.temperature,
            top_p=s.top_p,
            seed=s.seed,
            extra_body=s.openai_extra_body,
            tokenizer=s.judge_tokenizer if judge else s.generator_tokenizer,
            kind=s.judge_kind if judge else s.generator_kind,
            gate=gate,
            on_ready=on_ready,
            loops=None if judge else LoopRule.of(s),
        )

    # ------------------------------------------------------------------ public
    def generate_many(self, requests: Sequence[ModelRequest]) -> list[ModelReply | Exception]:
        return asyncio.run(self.generate_many_async(requests))

    async def generate_many_async(
        self, requests: Sequence[ModelRequest]
    ) -> list[ModelReply | Exception]:
        # `n` is never sent: a round's samples go back to back, each with its own seed.
        requests = singles(requests)
        headers = {"Content-Type": "application/json"}
        if self._key.get_secret_value():
            headers["Authorization"] = f"Bearer {self._key.get_secret_value()}"
        client = httpx.AsyncClient(
            base_url=self.base_url,
            headers=headers,
            timeout=httpx.Timeout(self.timeout_s, connect=min(10.0, self.timeout_s)),
            # The gate bounds the requests in flight; the pool must not queue them again.
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=64),
            transport=self.transport,
        )
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

    # ------------------------------------------------------------------ readiness
    async def _listing(self, client: httpx.AsyncClient) -> str | None:
        """Why the endpoint cannot take requests for the model now (None: it can). Asked
        with `GET /models`; an endpoint that keeps no list (404, 405) is taken at its word."""
        try:
            response = await client.get("/models", timeout=10)
        except httpx.HTTPError as exc:
            return f"{type(exc).__name__}: {exc}"
        if response.status_code in (401, 403):
            return f"the endpoint refused the key (HTTP {response.status_code})"
        if response.status_code != 200:
            return None if response.status_code < 500 else f"HTTP {response.status_code}"
        try:
            ids = {str(m.get("id")) for m in response.json().get("data", [])}
        except (ValueError, AttributeError):
            return None
        if ids and self.model not in ids:
            return f"the endpoint serves {sorted(ids)[:5]}, not {self.model!r}"
        return None

    async def _wait_ready(self, client: httpx.AsyncClient) -> None:
        """Wait (with backoff) until the endpoint answers and, where it lists its models,
        lists this one; then say what the model is."""
        for attempt in range(self.retries + 1):
            problem = await self._listing(client)
            if problem is None:
                break
            if attempt == self.retries:
                raise RetryableError(f"endpoint {self.base_url} model {self.model}: {problem}")
            await asyncio.sleep(backoff_wait(self.backoff_s, attempt))
        if self.tokenizer and self.template is None:
            self.template = load_chat_template(self.tokenizer)
        if self.info is None:
            self.info = ModelInfo(
                name=self.model,
                version="",  # the served id the first reply names (_record_version)
                interface="openai",
                sampling=self.sampling
                | ({"extra_body": self.extra_body} if self.extra_body else {}),
                kind=self.kind,
                thinking_mode="server",
            )
        if self.on_ready is not None:
            self.on_ready(self.info)

    # ------------------------------------------------------------------ one request
    def _body(self, user: str, image: bytes | None) -> dict[str, Any]:
        content: str | list[dict[str, Any]] = user
        if image is not None:
            url = f"data:{image_mime(image)};base64,{base64.b64encode(image).decode('ascii')}"
            content = [
                {"type": "image_url", "image_url": {"url": url}},
                {"type": "text", "text": user},
            ]
        return {
            **self.extra_body,
            "model": self.model,
            "messages": [{"role": "user", "content": content}],
            "stream": False,
            **self.sampling,
        }

    async def _one(self, client: httpx.AsyncClient, req: ModelRequest) -> ModelReply | Exception:
        user = self.template.neutralise(req.prompt) if self.template else req.prompt
        body = self._body(user, req.image)
        if req.seed is not None:  # a best-of-n sample's own seed
            body["seed"] = req.seed

        async def attempt() -> ModelReply | Exception:
            try:
                if self.loops is not None:
                    return await self._streamed(client, body, user, self.loops)
                return await self._unary(client, body, user)
            except EndpointError as exc:
                return exc

        return await retrying(
            attempt,
            retries=self.retries,
            backoff_s=self.backoff_s,
            where=f"endpoint {self.base_url} model {self.model}",
        )

    async def _refused(
        self, client: httpx.AsyncClient, status: int, detail: str, retry_after: str | None
    ) -> EndpointError:
        """A status >= 400: raise Transient when worth asking again, else the item's error."""
        if status in _TRANSIENT_STATUS:
            raise Transient(f"HTTP {status} {detail}", retry_after_s(retry_after))
        # The item's own fault only while the endpoint still serves the model.
        problem = await self._listing(client)
        if problem is None:
            return EndpointError(f"HTTP {status} {detail}")
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
                _detail(response.text),
                response.headers.get("retry-after"),
            )
        return self._reply(_json(response.text), response.text, user, _since(start))

    def _reply(self, data: Any, raw: str, user: str, latency: float) -> ModelReply:
        try:
            choice = data["choices"][0]
            message = choice["message"]
            text = reply_text(message)
        except (KeyError, IndexError, TypeError, AttributeError) as exc:
            raise EndpointError(f"not a chat completion: {raw[:200]!r}") from exc
        usage = data.get("usage") if isinstance(data.get("usage"), dict) else {}
        self._record_version(data.get("model"))
        return ModelReply(
            text=text,
            finish_reason=str(choice.get("finish_reason") or "stop"),
            input_tokens=_int(usage.get("prompt_tokens")),
            output_tokens=_int(usage.get("completion_tokens")),
            latency_s=latency,
            prompt_sent_sha256=_sha256(user),
            user_text=user,
        )

    # ------------------------------------------------------------------ streamed
    def _stream_body(self, body: dict[str, Any]) -> dict[str, Any]:
        sent = {k: v for k, v in body.items() if k != "stream_options"}
        sent["stream"] = True
        if self.stream_options:
            asked = body.get("stream_options")
            sent["stream_options"] = {**(asked if isinstance(asked, dict) else {})}
            sent["stream_options"]["include_usage"] = True
        return sent

    async def _streamed(
        self, client: httpx.AsyncClient, body: dict[str, Any], user: str, rule: LoopRule
    ) -> ModelReply | Exception:
        """One streamed request, asked once more without `stream_options` when the server
        refuses that field."""
        start = time.monotonic()
        sent = self._stream_body(body)
        got = await self._stream_once(client, sent, user, rule, start)
        if (
            isinstance(got, _Refusal)
            and got.status in _BAD_FIELD_STATUS
            and "stream_options" in sent
            and "stream_options" in got.body
        ):
            if self.stream_options:
                self.stream_options = False
                log.warning(
                    "endpoint %s refuses stream_options: streaming without it (token "
                    "usage only where the server gives it)",
                    self.base_url,
                )
            sent = self._stream_body(body)
            got = await self._stream_once(client, sent, user, rule, start)
        if isinstance(got, _Refusal):
            return await self._refused(client, got.status, _detail(got.body), got.retry_after)
        return got

    async def _stream_once(
        self,
        client: httpx.AsyncClient,
        body: dict[str, Any],
        user: str,
        rule: LoopRule,
        start: float,
    ) -> ModelReply | _Refusal:
        max_bytes = _STREAM_BYTES_PER_CHAR * self.max_stream_chars
        try:
            async with client.stream("POST", "/chat/completions", json=body) as response:
                if response.status_code >= 400:
                    head, _ = await _read_at_most(response, _ERROR_BODY_BYTES)
                    return _Refusal(
                        response.status_code,
                        head.decode("utf-8", "replace"),
                        response.headers.get("retry-after"),
                    )
                if "json" in response.headers.get("content-type", ""):
                    # A server that does not stream: one chat completion.
                    data, over = await _read_at_most(response, max_bytes)
                    raw = data.decode("utf-8", "replace")
                    if over:
                        raise EndpointError(f"a reply over {max_bytes} bytes")
                    return self._reply(_json(raw), raw, user, _since(start))
                got = await self._read_events(response, LoopWatch(rule), max_bytes)
                # Leaving the block closes the response: a cut loop's generation ends here.
        except httpx.HTTPError as exc:
            raise Transient(f"{type(exc).__name__} while streaming: {exc}") from exc
        cut = got.finish == LOOP_FINISH
        if not cut and got.finish is None and not got.done:
            raise Transient("the stream ended before its finish")
        reasoning, content = "".join(got.reasoning), "".join(got.content)
        if cut and reasoning and not content:
            text = f"{OPEN}{reasoning}"  # cut inside the reasoning (even of blanks): open
        else:
            text = reply_text({"content": content, "reasoning_content": reasoning})
        output_tokens = got.completion_tokens
        if cut and output_tokens is None:  # the server's count never came: estimated
            output_tokens = -(-got.chars // 4)
        if cut:
            log.debug("cut a repetition loop after %d characters", got.chars)
        return ModelReply(
            text=text,
            finish_reason=got.finish or "stop",
            input_tokens=got.prompt_tokens,
            output_tokens=output_tokens,
            latency_s=_since(start),
            prompt_sent_sha256=_sha256(user),
            user_text=user,
        )

    async def _read_events(
        self, response: httpx.Response, watch: LoopWatch, max_bytes: int
    ) -> _Stream:
        """The stream's events until `[DONE]`, its end, or a loop (finish LOOP_FINISH)."""
        got = _Stream()
        pending, read = b"", 0
        data: list[str] = []  # the event's `data:` lines
        async for piece in response.aiter_bytes():
            read += len(piece)
            if read > max_bytes:
                raise EndpointError(f"a stream over {max_bytes} bytes")
            *lines, pending = (pending + piece).split(b"\n")
            if len(pending) > _MAX_LINE_BYTES:
                raise EndpointError(f"a stream line over {_MAX_LINE_BYTES} bytes")
            for raw in lines:
                line = raw.removesuffix(b"\r").decode("utf-8", "replace")
                if line:  # SSE: `field: value` lines, an event's end at an empty line
                    name, _, value = line.partition(":")
                    if name == "data":
                        data.append(value.removeprefix(" "))
                    continue
                if data and self._event("\n".join(data), got, watch):
                    return got
                data = []
                if got.done:
                    return got
        line = pending.removesuffix(b"\r").decode("utf-8", "replace")
        if line.startswith("data:"):
            data.append(line[5:].removeprefix(" "))
        if data:
            self._event("\n".join(data), got, watch)
        return got

    def _event(self, data: str, got: _Stream, watch: LoopWatch) -> bool:
        """Read one event's data into `got`; True when the text now ends in a loop."""
        if data.strip() == "[DONE]":
            got.done = True
            return False
        try:
            chunk = json.loads(data)
        except ValueError as exc:
            raise EndpointError(f"not a chat completion chunk: {data[:200]!r}") from exc
        if not isinstance(chunk, dict):
            raise EndpointError(f"not a chat completion chunk: {data[:200]!r}")
        if chunk.get("error"):
            raise EndpointError(f"the stream failed: {str(chunk['error'])[:300]}")
        self._record_version(chunk.get("model"))
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            prompt, completion = (
                _int(usage.get("prompt_tokens")),
                _int(usage.get("completion_tokens")),
            )
            if prompt is not None:
                got.prompt_tokens = prompt
            if completion is not None:
                got.completion_tokens = completion
        choices = chunk.get("choices") or []
        if not isinstance(choices, list):
            raise EndpointError(f"not a chat completion chunk: {data[:200]!r}")
        deltas: list[str] = []
        for choice in choices:
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            if not isinstance(delta, dict):
                raise EndpointError(f"not a chat completion chunk: {data[:200]!r}")
            reasoning = delta.get("reasoning_content") or delta.get("reasoning")
            if isinstance(reasoning, str) and reasoning:
                got.reasoning.append(reasoning)
                deltas.append(reasoning)
            content = reply_text({"content": delta.get("content")})
            if content:
                got.content.append(content)
                deltas.append(content)
            if choice.get("finish_reason"):
                got.finish = str(choice["finish_reason"])
        for delta in deltas:
            got.chars += len(delta)
            if got.chars > self.max_stream_chars:
                raise EndpointError(f"a reply over {self.max_stream_chars} characters")
            if watch.feed(delta):
                got.finish = LOOP_FINISH
                return True
        return False

    def _record_version(self, served: object) -> None:
        """What answered, as the server names it (a hosted API names a dated snapshot)."""
        if self.info is not None and not self.info.version and isinstance(served, str) and served:
            self.info = replace(self.info, version=served)


@dataclass(frozen=True)
class _Refusal:
    """A streamed request's status >= 400, its body's head and its `Retry-After`."""

    status: int
    body: str
    retry_after: str | None


@dataclass
class _Stream:
    """What one stream said so far."""

    reasoning: list[str] = field(default_factory=list)
    content: list[str] = field(default_factory=list)
    chars: int = 0
    finish: str | None = None
    done: bool = False  # `data: [DONE]` came
    prompt_tokens: int | None = None
    completion_tokens: int | None = None


async def _read_at_most(response: httpx.Response, limit: int) -> tuple[bytes, bool]:
    """The body's first `limit` bytes, and whether there was more."""
    out = bytearray()
    async for piece in response.aiter_bytes():
        out += piece
        if len(out) > limit:
            return bytes(out[:limit]), True
    return bytes(out), False


def _json(raw: str) -> Any:
    try:
        return json.loads(raw)
    except ValueError as exc:
        raise EndpointError(f"not a chat completion: {raw[:200]!r}") from exc


def _since(start: float) -> float:
    return round(time.monotonic() - start, 6)


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _detail(text: str) -> str:
    return text[:300].replace("\n", " ")


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None
