"""rsieve.adapters.openai_compat against an in-process OpenAI-compatible endpoint
(httpx.MockTransport): what is sent, what is read, and every failure's fate. The same
adapter against a real server (`transformers serve`) is tests/e2e/test_openai_judge.py.
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import logging
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from PIL import Image
from pydantic import SecretStr

from rsieve.adapters import openai_compat
from rsieve.adapters.gate import EngineGate
from rsieve.adapters.model import engine_url, open_model
from rsieve.adapters.openai_compat import EndpointError, OpenAIModel, reply_text, retry_after_s
from rsieve.errors import RetryableError
from rsieve.generate.generation import ModelReply, ModelRequest, record_generations
from rsieve.images import image_mime, prepare_image
from rsieve.settings import Settings
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
