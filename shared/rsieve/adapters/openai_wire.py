"""The chat completions wire of an OpenAI-compatible server, apart from any server: the
request body, a completion read into a reply, a stream's Server-Sent Events read as its
bytes come, and which statuses are worth asking again. rsieve.adapters.openai_compat
describes what is sent and read, and sends it (OpenAIModel).

Pure: bytes and JSON in, replies and errors out (`EndpointError`, the item's; `Transient`,
asked again by rsieve.adapters.retry), so each rule is checked without a server.
"""

from __future__ import annotations

import base64
import email.utils
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rsieve.adapters.retry import ItemError, Transient
from rsieve.generate.generation import ModelInfo, ModelReply, sent_sha256
from rsieve.generate.loops import LoopWatch
from rsieve.generate.think import CLOSE, LOOP_FINISH, OPEN
from rsieve.images import image_mime

__all__ = [
    "BAD_FIELD_STATUS",
    "ERROR_BODY_BYTES",
    "TRANSIENT_STATUS",
    "EndpointError",
    "EventReader",
    "Refusal",
    "StreamRead",
    "chat_body",
    "completion_reply",
    "detail",
    "endpoint_info",
    "listing_problem",
    "read_json",
    "refuses_stream_options",
    "reply_text",
    "retry_after_s",
    "sampling_of",
    "stream_body",
    "stream_chars",
    "streamed_reply",
]

# Statuses worth asking again: overloaded, rate limited, restarting, or refusing the key
# or the model (the operator's to fix; the shard waits in the queue meanwhile).
TRANSIENT_STATUS = frozenset({401, 403, 404, 408, 409, 429, 500, 502, 503, 504})

# One stream's bounds (every input bounded): the text kept, in characters per token asked
# for (a token is rarely over 16; at least _MIN_STREAM_CHARS, _UNBOUNDED_STREAM_CHARS when
# no max_tokens is sent); the bytes read per such character (each chunk's JSON and SSE
# framing around a delta of a few characters: about 60 a character on vLLM); one line.
_STREAM_CHARS_PER_TOKEN = 32
_MIN_STREAM_CHARS = 1 << 16
_UNBOUNDED_STREAM_CHARS = 1 << 22
STREAM_BYTES_PER_CHAR = 64
_MAX_LINE_BYTES = 1 << 20
# Of a refused request's body, what is read (to say why, and to find `stream_options`).
ERROR_BODY_BYTES = 1 << 14
# The statuses a server refusing an unknown field answers with.
BAD_FIELD_STATUS = frozenset({400, 422})


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


def sampling_of(
    temperature: float, top_p: float, max_new_tokens: int | None, seed: int | None
) -> dict[str, Any]:
    """The sampling fields every request carries; `top_p` only when it cuts."""
    sampling: dict[str, Any] = {"temperature": temperature}
    if top_p != 1.0:
        sampling["top_p"] = top_p
    if max_new_tokens is not None:
        sampling["max_tokens"] = max_new_tokens
    if seed is not None:
        sampling["seed"] = seed
    return sampling


def stream_chars(max_new_tokens: int | None) -> int:
    """The most characters a stream's text may hold for a budget of `max_new_tokens`."""
    if max_new_tokens is None:
        return _UNBOUNDED_STREAM_CHARS
    return max(_MIN_STREAM_CHARS, _STREAM_CHARS_PER_TOKEN * max_new_tokens)


def chat_body(
    model: str,
    user: str,
    image: bytes | None,
    sampling: dict[str, Any],
    extra_body: dict[str, Any],
    seed: int | None,
) -> dict[str, Any]:
    """One request: the user turn (the image before the text, as a `data:` URL), the
    sampling over `extra_body`, and a best-of-n sample's own `seed`."""
    content: str | list[dict[str, Any]] = user
    if image is not None:
        url = f"data:{image_mime(image)};base64,{base64.b64encode(image).decode('ascii')}"
        content = [
            {"type": "image_url", "image_url": {"url": url}},
            {"type": "text", "text": user},
        ]
    body = {
        **extra_body,
        "model": model,
        "messages": [{"role": "user", "content": content}],
        "stream": False,
        **sampling,
    }
    if seed is not None:
        body["seed"] = seed
    return body


def stream_body(body: dict[str, Any], *, with_options: bool) -> dict[str, Any]:
    """`body` streamed, asking for usage in the last chunk unless `with_options` is off
    (a server that refuses `stream_options`)."""
    sent = {k: v for k, v in body.items() if k != "stream_options"}
    sent["stream"] = True
    if with_options:
        asked = body.get("stream_options")
        sent["stream_options"] = {**(asked if isinstance(asked, dict) else {})}
        sent["stream_options"]["include_usage"] = True
    return sent


@dataclass(frozen=True)
class Refusal:
    """A streamed request's status >= 400, its body's head and its `Retry-After`."""

    status: int
    body: str
    retry_after: str | None


def refuses_stream_options(refusal: Refusal, sent: dict[str, Any]) -> bool:
    """Whether the server refused the `stream_options` that `sent` carried."""
    return (
        refusal.status in BAD_FIELD_STATUS
        and "stream_options" in sent
        and "stream_options" in refusal.body
    )


def listing_problem(model: str, status: int, content: bytes) -> str | None:
    """Why the endpoint's answer to `GET /models` says it cannot take requests for `model`
    now (None: it can). An endpoint that keeps no list (404, 405) is taken at its word."""
    if status in (401, 403):
        return f"the endpoint refused the key (HTTP {status})"
    if status != 200:
        return None if status < 500 else f"HTTP {status}"
    try:
        ids = {str(m.get("id")) for m in json.loads(content).get("data", [])}
    except (ValueError, AttributeError):
        return None
    if ids and model not in ids:
        return f"the endpoint serves {sorted(ids)[:5]}, not {model!r}"
    return None


def endpoint_info(
    model: str, sampling: dict[str, Any], extra_body: dict[str, Any], kind: str | None
) -> ModelInfo:
    """What answers, as recorded with every generation: the server renders the chat, and
    its version is the served id the first reply names (filled in then)."""
    return ModelInfo(
        name=model,
        version="",
        interface="openai",
        sampling=sampling | ({"extra_body": extra_body} if extra_body else {}),
        kind=kind,
        thinking_mode="server",
    )


def detail(text: str) -> str:
    """A refused request's body, as an error message says it."""
    return text[:300].replace("\n", " ")


def read_json(raw: str) -> Any:
    try:
        return json.loads(raw)
    except ValueError as exc:
        raise EndpointError(f"not a chat completion: {raw[:200]!r}") from exc


def completion_reply(data: Any, raw: str, user: str, latency: float) -> ModelReply:
    """A chat completion (`data`, parsed from `raw`) as the reply to `user`'s turn."""
    try:
        choice = data["choices"][0]
        message = choice["message"]
        text = reply_text(message)
    except (KeyError, IndexError, TypeError, AttributeError) as exc:
        raise EndpointError(f"not a chat completion: {raw[:200]!r}") from exc
    usage = data.get("usage") if isinstance(data.get("usage"), dict) else {}
    return ModelReply(
        text=text,
        finish_reason=str(choice.get("finish_reason") or "stop"),
        input_tokens=_int(usage.get("prompt_tokens")),
        output_tokens=_int(usage.get("completion_tokens")),
        latency_s=latency,
        prompt_sent_sha256=sent_sha256(user),
        user_text=user,
    )


@dataclass
class StreamRead:
    """What one stream said so far."""

    reasoning: list[str] = field(default_factory=list)
    content: list[str] = field(default_factory=list)
    chars: int = 0
    finish: str | None = None
    done: bool = False  # `data: [DONE]` came
    prompt_tokens: int | None = None
    completion_tokens: int | None = None


class EventReader:
    """A chat completion stream's Server-Sent Events, read from its bytes as they come
    (`feed`, then `end` when they stop) into `got`: `data:` lines joined per event, an
    event ended by an empty line, `[DONE]` the end. Every delta, reasoning and content in
    the order they come, is fed to `watch`. `served` is told each chunk's `model`."""

    def __init__(
        self,
        watch: LoopWatch,
        *,
        max_chars: int,
        served: Callable[[object], None],
    ) -> None:
        self.got = StreamRead()
        self.watch, self.max_chars, self.served = watch, max_chars, served
        self.max_bytes = STREAM_BYTES_PER_CHAR * max_chars
        self._pending, self._read = b"", 0
        self._data: list[str] = []  # the event's `data:` lines

    def feed(self, piece: bytes) -> bool:
        """Read the next bytes; True once the stream is over: `[DONE]`, or a loop (finish
        LOOP_FINISH)."""
        self._read += len(piece)
        if self._read > self.max_bytes:
            raise EndpointError(f"a stream over {self.max_bytes} bytes")
        *lines, self._pending = (self._pending + piece).split(b"\n")
        if len(self._pending) > _MAX_LINE_BYTES:
            raise EndpointError(f"a stream line over {_MAX_LINE_BYTES} bytes")
        for raw in lines:
            line = raw.removesuffix(b"\r").decode("utf-8", "replace")
            if line:  # SSE: `field: value` lines, an event's end at an empty line
                name, _, value = line.partition(":")
                if name == "data":
                    self._data.append(value.removeprefix(" "))
                continue
            if self._data and self._event("\n".join(self._data)):
                return True
            self._data = []
            if self.got.done:
                return True
        return False

    def end(self) -> StreamRead:
        """The stream ended: its last line, when no newline closed it, is read too."""
        line = self._pending.removesuffix(b"\r").decode("utf-8", "replace")
        if line.startswith("data:"):
            self._data.append(line[5:].removeprefix(" "))
        if self._data:
            self._event("\n".join(self._data))
        return self.got

    def _event(self, data: str) -> bool:
        """Read one event's data into `got`; True when the text now ends in a loop."""
        got = self.got
        if data.strip() == "[DONE]":
            got.done = True
            return False
        chunk = _chunk(data)
        self.served(chunk.get("model"))
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
        return self._deltas(_deltas(chunk, data, got))

    def _deltas(self, deltas: list[str]) -> bool:
        for delta in deltas:
            self.got.chars += len(delta)
            if self.got.chars > self.max_chars:
                raise EndpointError(f"a reply over {self.max_chars} characters")
            if self.watch.feed(delta):
                self.got.finish = LOOP_FINISH
                return True
        return False


def _chunk(data: str) -> dict[str, Any]:
    """One event's data as a chunk; a chunk that says the stream failed is the item's."""
    try:
        chunk = json.loads(data)
    except ValueError as exc:
        raise EndpointError(f"not a chat completion chunk: {data[:200]!r}") from exc
    if not isinstance(chunk, dict):
        raise EndpointError(f"not a chat completion chunk: {data[:200]!r}")
    if chunk.get("error"):
        raise EndpointError(f"the stream failed: {str(chunk['error'])[:300]}")
    return chunk


def _deltas(chunk: dict[str, Any], data: str, got: StreamRead) -> list[str]:
    """The first choice's deltas of `chunk`, reasoning then content, kept in `got` with
    its finish reason."""
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
    return deltas


def streamed_reply(got: StreamRead, user: str, latency: float) -> ModelReply:
    """A stream read to its end (or cut in a loop) as the reply to `user`'s turn; a stream
    that ended before its finish is transient."""
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
    return ModelReply(
        text=text,
        finish_reason=got.finish or "stop",
        input_tokens=got.prompt_tokens,
        output_tokens=output_tokens,
        latency_s=latency,
        prompt_sent_sha256=sent_sha256(user),
        user_text=user,
    )


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None
