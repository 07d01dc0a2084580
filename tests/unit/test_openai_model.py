"""rsieve.adapters.openai_compat against an in-process OpenAI-compatible endpoint
(httpx.MockTransport): what is sent, what is read, and every failure's fate, streamed (loops
watched and cut) or not; and, over real HTTP, against the crafted server
(tests/e2e/crafted_server.py): a streamed reply stored as the JSON one, a loop cut and the
server seeing its client go. The same adapter against a real server (`transformers serve`)
is tests/e2e/test_openai_judge.py.
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from typing import Any

import httpx
import pytest
from PIL import Image
from pydantic import SecretStr

from rsieve.adapters import openai_compat
from rsieve.adapters.gate import EngineGate
from rsieve.adapters.model import open_model
from rsieve.adapters.openai_compat import OpenAIModel
from rsieve.adapters.openai_wire import EndpointError, reply_text, retry_after_s
from rsieve.adapters.roles import engine_url
from rsieve.errors import RetryableError
from rsieve.generate.generation import ModelReply, ModelRequest, record_generations
from rsieve.generate.loops import LoopRule, loop_at_end
from rsieve.generate.think import LOOP_FINISH, parse_output
from rsieve.images import image_mime, prepare_image
from rsieve.settings import Settings
from tests.e2e.crafted_server import CraftedServer
from tests.unit._records import make_item

KEY = "sk-test-0123456789abcdefghijklmnopqrstuv"
BASE = "http://endpoint.test/v1"

Handler = Callable[[httpx.Request], httpx.Response]


def completion(
    content: str | None = "42",
    *,
    reasoning: str | None = None,
    finish: str = "stop",
    usage: dict[str, int] | None = None,
    model: str = "m",
) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if reasoning is not None:
        message["reasoning_content"] = reasoning
    body: dict[str, Any] = {
        "id": "x",
        "object": "chat.completion",
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
    }
    if usage is not None:
        body["usage"] = usage
    return body


def endpoint(chat: Handler, models: list[str] | None = None) -> httpx.MockTransport:
    served = ["m"] if models is None else models

    def handle(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/models"):
            return httpx.Response(200, json={"object": "list", "data": [{"id": m} for m in served]})
        return chat(request)

    return httpx.MockTransport(handle)


def model(transport: httpx.BaseTransport, **kw: Any) -> OpenAIModel:
    m = OpenAIModel(BASE, "m", api_key=SecretStr(KEY), backoff_s=0.01, retries=2, **kw)
    m.transport = transport  # type: ignore[assignment]
    return m


@pytest.fixture
def sleeps(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The adapter's waits between attempts, recorded and skipped."""
    waited: list[float] = []
    real = asyncio.sleep

    async def sleep(seconds: float) -> None:
        waited.append(seconds)
        await real(0)

    monkeypatch.setattr(openai_compat.asyncio, "sleep", sleep)
    return waited


def png() -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (8, 6), (200, 10, 10)).save(buf, format="PNG")
    return buf.getvalue()


# --------------------------------------------------------------------------- what is sent
def test_the_request_carries_the_question_byte_for_byte_and_the_image_as_a_data_url() -> None:
    seen: list[httpx.Request] = []

    def chat(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json=completion("B"))

    question = "  What is shown?\n(A) cat  (B) dog \u00e9\u200b "
    image = png()
    m = model(endpoint(chat), temperature=0.0, top_p=0.9, max_new_tokens=64, seed=7)
    [reply] = m.generate_many([ModelRequest(question, image)])
    assert isinstance(reply, ModelReply) and reply.text == "B"
    body = json.loads(seen[0].content)
    [turn] = body["messages"]
    assert turn["role"] == "user"
    assert turn["content"][1] == {"type": "text", "text": question}
    url = turn["content"][0]["image_url"]["url"]
    assert url.startswith("data:image/png;base64,")
    assert base64.b64decode(url.split(",", 1)[1]) == image
    assert (body["temperature"], body["top_p"], body["max_tokens"], body["seed"]) == (
        0.0,
        0.9,
        64,
        7,
    )
    assert body["model"] == "m" and body["stream"] is False and "n" not in body
    assert seen[0].headers["authorization"] == f"Bearer {KEY}"


def test_a_text_only_prompt_is_a_plain_string_and_top_p_1_is_not_sent() -> None:
    seen: list[dict[str, Any]] = []

    def chat(request: httpx.Request) -> httpx.Response:
        seen.append(json.loads(request.content))
        return httpx.Response(200, json=completion("CORRECT"))

    m = model(endpoint(chat), extra_body={"chat_template_kwargs": {"enable_thinking": True}})
    m.generate_many([ModelRequest("judge this")])
    assert seen[0]["messages"] == [{"role": "user", "content": "judge this"}]
    assert "top_p" not in seen[0]
    assert seen[0]["chat_template_kwargs"] == {"enable_thinking": True}
    assert m.info is not None and m.info.sampling["extra_body"] == {
        "chat_template_kwargs": {"enable_thinking": True}
    }


def test_no_key_no_authorization_header() -> None:
    seen: list[httpx.Request] = []

    def chat(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json=completion())

    m = OpenAIModel(BASE, "m", transport=endpoint(chat))
    m.generate_many([ModelRequest("q")])
    assert "authorization" not in seen[0].headers


# --------------------------------------------------------------------------- what is read
def test_separate_reasoning_is_stored_in_think_tags_and_parses_as_every_interface() -> None:
    def chat(request: httpx.Request) -> httpx.Response:
        return httpx.Response(
            200,
            json=completion(
                "Paris",
                reasoning="The capital of France.",
                usage={"prompt_tokens": 31, "completion_tokens": 9, "total_tokens": 40},
                model="org/vlm-2025-01-01",
            ),
        )

    m = model(endpoint(chat), kind="vlm")
    data = png()
    [reply] = m.generate_many([ModelRequest("Capital?", data)])
    assert isinstance(reply, ModelReply)
    assert reply.text == "<think>The capital of France.</think>Paris"
    assert (reply.input_tokens, reply.output_tokens) == (31, 9)
    assert m.info is not None
    assert (m.info.interface, m.info.version, m.info.kind, m.info.thinking_mode) == (
        "openai",
        "org/vlm-2025-01-01",
        "vlm",
        "server",
    )
    # Recorded as any generation: the parse splits reasoning from the answer.
    it = make_item("i0")
    [gen], [] = record_generations(
        [(it, prepare_image(data, max_side=64, max_pixels=10_000))], [reply], m.info
    )
    assert (gen.reasoning, gen.answer, gen.interface, gen.input_tokens) == (
        "The capital of France.",
        "Paris",
        "openai",
        31,
    )


@pytest.mark.parametrize(
    ("message", "text"),
    [
        ({"content": "<think>a</think>b"}, "<think>a</think>b"),
        ({"content": "b", "reasoning": "a"}, "<think>a</think>b"),
        ({"content": None, "reasoning_content": "a"}, "<think>a</think>"),
        ({"content": [{"type": "text", "text": "x"}, {"type": "text", "text": "y"}]}, "xy"),
        ({"content": "b", "reasoning_content": "  "}, "b"),
    ],
)
def test_reply_text(message: dict[str, Any], text: str) -> None:
    assert reply_text(message) == text


def test_missing_usage_is_none_not_zero() -> None:
    m = model(endpoint(lambda r: httpx.Response(200, json=completion("x"))))
    [reply] = m.generate_many([ModelRequest("q")])
    assert isinstance(reply, ModelReply)
    assert (reply.input_tokens, reply.output_tokens) == (None, None)


def test_length_finish_reason_is_kept() -> None:
    m = model(
        endpoint(lambda r: httpx.Response(200, json=completion("<think>abc", finish="length")))
    )
    [reply] = m.generate_many([ModelRequest("q")])
    assert isinstance(reply, ModelReply) and reply.finish_reason == "length"


# --------------------------------------------------------------------------- failures
def test_429_waits_as_retry_after_says_then_answers(sleeps: list[float]) -> None:
    calls = {"n": 0}

    def chat(request: httpx.Request) -> httpx.Response:
        calls["n"] += 1
        if calls["n"] == 1:
            return httpx.Response(429, headers={"Retry-After": "7"}, json={"error": "slow down"})
        return httpx.Response(200, json=completion("ok"))

    [reply] = model(endpoint(chat)).generate_many([ModelRequest("q")])
    assert isinstance(reply, ModelReply) and reply.text == "ok"
    assert sleeps == [7.0]  # Retry-After beats the 0.01 s backoff


def test_retry_after_as_an_http_date() -> None:
    assert retry_after_s("Thu, 01 Jan 2026 00:00:10 GMT", now=1767225600.0) == 10.0
    assert retry_after_s("soon") == 0.0 and retry_after_s(None) == 0.0


@pytest.mark.parametrize("status", [500, 503, 401, 404])
def test_a_failing_endpoint_is_infrastructure_never_a_verdict(
    status: int, sleeps: list[float], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    m = model(endpoint(lambda r: httpx.Response(status, json={"error": "down"})))
    with pytest.raises(RetryableError) as err:
        m.generate_many([ModelRequest("q")])
    assert f"HTTP {status}" in str(err.value)
    assert len(sleeps) == 2  # retries=2, doubling backoff
    assert sleeps[1] == pytest.approx(2 * sleeps[0])
    assert KEY not in str(err.value) and KEY not in caplog.text


def test_an_unreachable_endpoint_is_retryable(sleeps: list[float]) -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    with pytest.raises(RetryableError, match="ConnectError"):
        model(httpx.MockTransport(refuse)).generate_many([ModelRequest("q")])


def test_a_model_the_endpoint_does_not_serve_is_never_asked(sleeps: list[float]) -> None:
    asked: list[httpx.Request] = []

    def chat(request: httpx.Request) -> httpx.Response:
        asked.append(request)
        return httpx.Response(200, json=completion())

    with pytest.raises(RetryableError, match="serves \\['other'\\], not 'm'"):
        model(endpoint(chat, models=["other"])).generate_many([ModelRequest("q")])
    assert asked == []


def test_a_bad_request_is_that_items_error_while_the_model_is_served() -> None:
    def chat(request: httpx.Request) -> httpx.Response:
        if "long" in json.loads(request.content)["messages"][0]["content"]:
            return httpx.Response(400, json={"error": "context length exceeded"})
        return httpx.Response(200, json=completion("fine"))

    replies = model(endpoint(chat)).generate_many([ModelRequest("ok"), ModelRequest("long")])
    assert isinstance(replies[0], ModelReply) and replies[0].text == "fine"
    assert isinstance(replies[1], EndpointError) and "context length" in str(replies[1])


def test_not_a_chat_completion_is_that_items_error() -> None:
    m = model(endpoint(lambda r: httpx.Response(200, json={"choices": []})))
    [reply] = m.generate_many([ModelRequest("q")])
    assert isinstance(reply, EndpointError)


def test_the_gate_bounds_the_requests_in_flight() -> None:
    live = {"now": 0, "peak": 0}

    async def chat(request: httpx.Request) -> httpx.Response:
        live["now"] += 1
        live["peak"] = max(live["peak"], live["now"])
        await asyncio.sleep(0.01)
        live["now"] -= 1
        return httpx.Response(
            200, json=completion(json.loads(request.content)["messages"][0]["content"])
        )

    class Async(httpx.AsyncBaseTransport):
        async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
            if request.url.path.endswith("/models"):
                return httpx.Response(200, json={"data": [{"id": "m"}]})
            return await chat(request)

    m = OpenAIModel(BASE, "m", gate=EngineGate(3), transport=Async())
    replies = m.generate_many([ModelRequest(f"q{i}") for i in range(12)])
    assert [r.text for r in replies if isinstance(r, ModelReply)] == [f"q{i}" for i in range(12)]
    assert live["peak"] == 3


# --------------------------------------------------------------------------- wiring
def test_settings_choose_the_interface_per_role() -> None:
    s = Settings(
        judge_interface="openai",
        judge_openai_url=BASE,
        judge_openai_key=SecretStr(KEY),
        judge_model="m",
    )
    judge = open_model(s, "judge")
    assert isinstance(judge, OpenAIModel) and judge.base_url == BASE
    assert not isinstance(open_model(s, "generator"), OpenAIModel)
    assert engine_url(s, "judge") == BASE and engine_url(s, "generator") == s.triton_grpc_url
    assert KEY not in repr(s) and KEY not in str(s.model_dump())


def test_openai_without_an_endpoint_is_refused_at_start() -> None:
    with pytest.raises(ValueError, match="RSIEVE_JUDGE_OPENAI_URL"):
        Settings(judge_interface="openai")
    # The judge falls back to the generator's endpoint and key.
    s = Settings(
        model_interface="openai", generator_openai_url=BASE, generator_openai_key=SecretStr(KEY)
    )
    assert s.openai_url_of("judge") == BASE
    assert s.openai_key_of("judge").get_secret_value() == KEY


@pytest.mark.parametrize(
    ("fmt", "mime"),
    [("PNG", "image/png"), ("JPEG", "image/jpeg"), ("WEBP", "image/webp"), ("GIF", "image/gif")],
)
def test_image_mime(fmt: str, mime: str) -> None:
    buf = io.BytesIO()
    Image.new("RGB", (4, 4)).save(buf, format=fmt)
    assert image_mime(buf.getvalue()) == mime
    assert image_mime(b"nonsense") == "application/octet-stream"


# --------------------------------------------------------------------------- streamed
def sse(*chunks: dict[str, Any] | str, done: bool = True) -> list[bytes]:
    """Server-Sent Events as a server writes them: one `data:` line an event."""
    events = [f"data: {c if isinstance(c, str) else json.dumps(c)}\n\n" for c in chunks]
    return [e.encode() for e in [*events, *(["data: [DONE]\n\n"] if done else [])]]


def delta(
    content: str | None = None, *, reasoning: str | None = None, key: str = "reasoning_content"
) -> dict[str, Any]:
    d: dict[str, Any] = {}
    if content is not None:
        d["content"] = content
    if reasoning is not None:
        d[key] = reasoning
    return {"model": "m", "choices": [{"index": 0, "delta": d, "finish_reason": None}]}


def finish(reason: str = "stop") -> dict[str, Any]:
    return {"model": "m", "choices": [{"index": 0, "delta": {}, "finish_reason": reason}]}


def usage(prompt: int, completion: int) -> dict[str, Any]:
    return {
        "model": "m",
        "choices": [],
        "usage": {"prompt_tokens": prompt, "completion_tokens": completion},
    }


class Events(httpx.AsyncByteStream):
    """A response body, event by event; then, optionally, a failure; closed: when."""

    def __init__(self, events: Iterable[bytes], fail: Exception | None = None) -> None:
        self.events, self.fail = events, fail
        self.sent, self.closed = 0, False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for event in self.events:
            self.sent += 1
            yield event
        if self.fail is not None:
            raise self.fail

    async def aclose(self) -> None:
        self.closed = True


def streaming(body: Events | list[bytes], status: int = 200) -> httpx.Response:
    stream = body if isinstance(body, Events) else Events(body)
    return httpx.Response(status, headers={"content-type": "text/event-stream"}, stream=stream)


def test_a_streamed_reply_reads_as_the_json_one_and_asks_for_usage() -> None:
    seen: list[dict[str, Any]] = []

    def chat(request: httpx.Request) -> httpx.Response:
        seen.append(json.loads(request.content))
        return streaming(
            sse(
                {"model": "org/vlm-1", "choices": [{"index": 0, "delta": {"role": "assistant"}}]},
                delta(reasoning="The capital "),
                delta(reasoning="of France.", key="reasoning"),  # newer vLLM's name
                delta("Par"),
                delta("is"),
                finish("stop"),
                usage(31, 9),
            )
        )

    m = model(endpoint(chat), loops=LoopRule())
    [reply] = m.generate_many([ModelRequest("Capital?")])
    assert isinstance(reply, ModelReply)
    assert reply.text == reply_text(
        {"content": "Paris", "reasoning_content": "The capital of France."}
    )
    assert (reply.finish_reason, reply.input_tokens, reply.output_tokens) == ("stop", 31, 9)
    assert reply.user_text == "Capital?" and m.info is not None and m.info.version == "org/vlm-1"
    assert seen[0]["stream"] is True and seen[0]["stream_options"] == {"include_usage": True}
    assert "n" not in seen[0]


def test_a_stream_without_done_and_content_parts_as_transformers_serve_sends_it() -> None:
    parts = {
        "model": "m",
        "choices": [{"index": 0, "delta": {"content": [{"type": "text", "text": "B"}]}}],
    }
    body = sse(parts, finish("length"), usage(3, 1), done=False)
    m = model(endpoint(lambda r: streaming(body)), loops=LoopRule())
    [reply] = m.generate_many([ModelRequest("q")])
    assert isinstance(reply, ModelReply)
    assert (reply.text, reply.finish_reason, reply.output_tokens) == ("B", "length", 1)


def test_a_server_that_answers_a_stream_with_json_is_read_as_json() -> None:
    m = model(
        endpoint(
            lambda r: httpx.Response(
                200, json=completion("x", usage={"prompt_tokens": 2, "completion_tokens": 1})
            )
        ),
        loops=LoopRule(),
    )
    [reply] = m.generate_many([ModelRequest("q")])
    assert isinstance(reply, ModelReply) and (reply.text, reply.output_tokens) == ("x", 1)


def test_with_loops_off_nothing_is_streamed() -> None:
    seen: list[dict[str, Any]] = []

    def chat(request: httpx.Request) -> httpx.Response:
        seen.append(json.loads(request.content))
        return httpx.Response(200, json=completion("x"))

    for loops in (None, LoopRule(window_chars=0)):
        m = model(endpoint(chat), loops=loops)
        assert m.loops is None
        m.generate_many([ModelRequest("q")])
    assert all(b["stream"] is False and "stream_options" not in b for b in seen)


def test_settings_stream_the_generator_only() -> None:
    s = Settings(model_interface="openai", generator_openai_url=BASE, judge_interface="openai")
    assert OpenAIModel.from_settings(s, "generator").loops == LoopRule.of(s)
    assert OpenAIModel.from_settings(s, "judge").loops is None
    off = s.model_copy(update={"loop_window_chars": 0})
    assert OpenAIModel.from_settings(off, "generator").loops is None


def test_a_looping_stream_is_closed_and_recorded_as_a_loop() -> None:
    unit = "Wait, let me check again. "

    def forever() -> Iterator[bytes]:
        yield from sse(delta(reasoning="Looking. "), done=False)
        while True:
            yield from sse(delta(reasoning=unit), done=False)

    bodies: list[Events] = []

    def chat(request: httpx.Request) -> httpx.Response:
        bodies.append(Events(forever()))
        return streaming(bodies[-1])

    m = model(endpoint(chat), loops=LoopRule())
    [reply] = m.generate_many([ModelRequest("q")])
    assert isinstance(reply, ModelReply) and reply.finish_reason == LOOP_FINISH
    assert reply.text.startswith("<think>Looking. " + unit) and "</think>" not in reply.text
    assert loop_at_end(reply.text, LoopRule()) is not None
    reasoning = reply.text.removeprefix("<think>")
    assert reply.output_tokens == -(-len(reasoning) // 4)  # no count came: estimated
    assert reply.input_tokens is None
    [body] = bodies
    assert body.closed and body.sent < 40  # cut at the first look past 256 characters
    # Parsed as the loop it is.
    assert parse_output(reply.text, reply.finish_reason).failure == LOOP_FINISH


def test_a_loop_of_blank_lines_in_the_reasoning_keeps_its_open_think() -> None:
    def forever() -> Iterator[bytes]:
        while True:
            yield from sse(delta(reasoning="\n\n"), done=False)

    m = model(endpoint(lambda r: streaming(Events(forever()))), loops=LoopRule())
    [reply] = m.generate_many([ModelRequest("q")])
    assert isinstance(reply, ModelReply) and reply.finish_reason == LOOP_FINISH
    assert reply.text.startswith("<think>\n\n") and not reply.text.strip("\n").removeprefix(
        "<think>"
    )


def test_a_cut_loop_counts_the_tokens_the_server_reported_so_far() -> None:
    def forever() -> Iterator[bytes]:
        n = 0
        while True:  # vLLM's continuous usage: every chunk counts the tokens so far
            n += 1
            yield from sse(
                {**delta("again "), "usage": {"prompt_tokens": 5, "completion_tokens": n}},
                done=False,
            )

    m = model(endpoint(lambda r: streaming(Events(forever()))), loops=LoopRule())
    [reply] = m.generate_many([ModelRequest("q")])
    assert isinstance(reply, ModelReply) and reply.finish_reason == LOOP_FINISH
    assert reply.text.endswith("again ") and "<think>" not in reply.text
    assert (reply.input_tokens, reply.output_tokens) == (5, len(reply.text) // 6)


def test_a_server_that_refuses_stream_options_is_asked_without_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    seen: list[dict[str, Any]] = []

    def chat(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        seen.append(body)
        if "stream_options" in body:
            return httpx.Response(
                400, json={"error": {"message": "Unrecognized request argument: stream_options"}}
            )
        return streaming(sse(delta("ok"), finish()))

    m = model(endpoint(chat), loops=LoopRule())
    [first] = m.generate_many([ModelRequest("q1")])
    [second] = m.generate_many([ModelRequest("q2")])
    assert isinstance(first, ModelReply) and isinstance(second, ModelReply)
    assert (first.text, second.text, first.output_tokens) == ("ok", "ok", None)
    assert ["stream_options" in b for b in seen] == [True, False, False]  # remembered
    assert all(b["stream"] is True for b in seen) and not m.stream_options
    assert "refuses stream_options" in caplog.text


def test_a_bad_request_to_a_stream_is_that_items_error() -> None:
    seen: list[dict[str, Any]] = []

    def chat(request: httpx.Request) -> httpx.Response:
        seen.append(json.loads(request.content))
        return httpx.Response(400, json={"error": "context length exceeded"})

    [reply] = model(endpoint(chat), loops=LoopRule()).generate_many([ModelRequest("q")])
    assert isinstance(reply, EndpointError) and "context length" in str(reply)
    assert len(seen) == 1


def test_a_stream_failing_before_it_starts_is_retried(sleeps: list[float]) -> None:
    calls = {"n": 0}

    def chat(request: httpx.Request) -> httpx.Response:
        calls["n"] += 1
        if calls["n"] == 1:
            return httpx.Response(429, headers={"Retry-After": "3"}, json={"error": "slow"})
        return streaming(sse(delta("ok"), finish()))

    [reply] = model(endpoint(chat), loops=LoopRule()).generate_many([ModelRequest("q")])
    assert isinstance(reply, ModelReply) and reply.text == "ok" and sleeps == [3.0]


@pytest.mark.parametrize(
    "broken",
    [
        Events(sse(delta("partial"), done=False), fail=httpx.ReadError("connection reset")),
        Events(sse(delta("partial"), done=False)),  # ended before its finish
    ],
    ids=["reset", "ended"],
)
def test_a_stream_that_breaks_mid_way_is_retried(broken: Events, sleeps: list[float]) -> None:
    calls = {"n": 0}

    def chat(request: httpx.Request) -> httpx.Response:
        calls["n"] += 1
        return streaming(broken if calls["n"] == 1 else Events(sse(delta("whole"), finish())))

    [reply] = model(endpoint(chat), loops=LoopRule()).generate_many([ModelRequest("q")])
    assert isinstance(reply, ModelReply) and reply.text == "whole" and len(sleeps) == 1


def test_a_stream_that_always_breaks_is_retryable(sleeps: list[float]) -> None:
    def chat(request: httpx.Request) -> httpx.Response:
        return streaming(Events(sse(delta("x"), done=False), fail=httpx.ReadTimeout("slow")))

    with pytest.raises(RetryableError, match="ReadTimeout while streaming"):
        model(endpoint(chat), loops=LoopRule()).generate_many([ModelRequest("q")])


@pytest.mark.parametrize(
    ("events", "message"),
    [
        (sse(delta("a"), {"error": {"message": "CUDA out of memory"}}), "CUDA out of memory"),
        (
            sse(delta("a"), 'data: {"error": "generation failed"}'.removeprefix("data: ")),
            "generation failed",
        ),
        (sse("not json"), "not a chat completion chunk"),
        ([b"data: " + b"x" * (2 << 20)], "line over"),
    ],
    ids=["error-object", "error-string", "not-json", "endless-line"],
)
def test_a_stream_that_says_it_failed_is_that_items_error(
    events: list[bytes], message: str
) -> None:
    m = model(endpoint(lambda r: streaming(events)), loops=LoopRule())
    [reply] = m.generate_many([ModelRequest("q")])
    assert isinstance(reply, EndpointError) and message in str(reply)


def test_a_stream_past_its_bound_is_refused() -> None:
    def endless() -> Iterator[bytes]:
        i = 0
        while True:  # never a loop: every delta differs
            i += 1
            yield from sse(delta(f"{i} "), done=False)

    m = model(
        endpoint(lambda r: streaming(Events(endless()))), loops=LoopRule(), max_new_tokens=100
    )
    [reply] = m.generate_many([ModelRequest("q")])
    assert isinstance(reply, EndpointError) and "over 65536 characters" in str(reply)


# --------------------------------------------------------------------------- over real HTTP
LOOP_UNIT = "Wait, let me check again. "
THINK_REPLY = "<think>The sign is red.\nIt is octagonal.</think>red"
CRAFTED_RULES = {
    "m": {
        "rules": [
            [
                "answer loop",
                {"loop": "B again. ", "prefix": "The answer is ", "max_tokens_chars": 40000},
            ],
            ["loop", {"loop": LOOP_UNIT, "prefix": "<think>Looking. ", "max_tokens_chars": 40000}],
            ["think", THINK_REPLY],
            ["open", "<think>cut off inside"],
        ],
        "default": "plain answer B",
    }
}


@pytest.fixture(scope="module")
def crafted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CraftedServer]:
    with CraftedServer.serving(tmp_path_factory.mktemp("crafted"), CRAFTED_RULES) as server:
        yield server


def logged(server: CraftedServer, user: str, stream: bool) -> dict[str, Any]:
    """The server's record of the request (a streamed one is written once it ends)."""
    deadline = time.monotonic() + 10
    while True:
        found = [r for r in server.requests("m") if r["user"] == user and r["stream"] is stream]
        if found or time.monotonic() > deadline:
            assert found, f"no record of {user!r}"
            return found[-1]
        time.sleep(0.02)


def test_over_http_a_streamed_reply_is_stored_as_the_json_one(crafted: CraftedServer) -> None:
    questions = ["think it over", "an open question", "what?"]
    streamed = OpenAIModel(crafted.url, "m", loops=LoopRule(), max_new_tokens=10_000)
    unary = OpenAIModel(crafted.url, "m", max_new_tokens=10_000)
    got = streamed.generate_many([ModelRequest(q) for q in questions])
    want = unary.generate_many([ModelRequest(q) for q in questions])
    for g, w in zip(got, want, strict=True):
        assert isinstance(g, ModelReply) and isinstance(w, ModelReply)
        assert (g.text, g.finish_reason, g.input_tokens, g.output_tokens) == (
            w.text,
            w.finish_reason,
            w.input_tokens,
            w.output_tokens,
        )
        assert g.prompt_sent_sha256 == w.prompt_sent_sha256
    assert isinstance(got[0], ModelReply) and got[0].text == THINK_REPLY
    for q in questions:
        assert logged(crafted, q, stream=True)["client_closed"] is False
        assert logged(crafted, q, stream=False)


def test_over_http_a_loop_is_cut_and_the_server_sees_the_client_go(
    crafted: CraftedServer,
) -> None:
    m = OpenAIModel(crafted.url, "m", loops=LoopRule(), max_new_tokens=10_000)
    [reply] = m.generate_many([ModelRequest("loop please")])
    assert isinstance(reply, ModelReply) and reply.finish_reason == LOOP_FINISH
    head = "<think>Looking. "
    assert reply.text.startswith(head) and (LOOP_UNIT * 100).startswith(reply.text[len(head) :])
    assert loop_at_end(reply.text, LoopRule()) is not None
    assert reply.output_tokens == -(-(len(reply.text) - len("<think>")) // 4)
    record = logged(crafted, "loop please", stream=True)
    assert record["client_closed"] is True
    # Cut at the first look past 256 characters: the server wrote a few chunks more before
    # it saw the client go, never the 40,000 characters the loop would have run to.
    assert len(reply.text) - len("<think>") <= record["sent_chars"] < 2_000
    # Not streamed, the loop runs to its bound.
    [whole] = OpenAIModel(crafted.url, "m", max_new_tokens=10_000).generate_many(
        [ModelRequest("loop please")]
    )
    assert isinstance(whole, ModelReply) and whole.finish_reason == "length"
    assert len(whole.text) == 40_000


def test_over_http_a_loop_in_the_answer_is_cut_too(crafted: CraftedServer) -> None:
    m = OpenAIModel(crafted.url, "m", loops=LoopRule(), max_new_tokens=10_000)
    [reply] = m.generate_many([ModelRequest("answer loop")])
    assert isinstance(reply, ModelReply) and reply.finish_reason == LOOP_FINISH
    assert reply.text.startswith("The answer is B again. ") and "<think>" not in reply.text
    assert logged(crafted, "answer loop", stream=True)["client_closed"] is True
