"""A model behind an OpenAI-compatible server: `POST {base}/chat/completions` over HTTP.

For the users who already run one (vLLM's `vllm serve`, SGLang, TGI, llama.cpp's server,
`transformers serve`, a hosted API): interface "openai" for the generator or the judge
(settings `model_interface` / `judge_interface`, docs/models.md). Triton stays the default.

What is sent: one user turn whose text is the question byte for byte (special tokens of
`tokenizer`, when named, neutralised as on every interface), the image before it as a
`data:` URL; `temperature`, `top_p` (when not 1), `max_tokens`, `seed`, and
`openai_extra_body` merged in. The server renders its checkpoint's chat template, so
`thinking_mode` is "server". `n` is never sent: one answer per item (servers such as
`transformers serve` refuse the field).

What is read: the message's `content`; its reasoning, when the server returns it apart
(`reasoning_content`, or `reasoning` as newer vLLM names it), is stored as
`<think>reasoning</think>content`, so `rsieve.generate.think.parse_output` reads every interface's
output alike (a `<think>` left in `content` is parsed as it is); `finish_reason`; token
usage (`prompt_tokens`, `completion_tokens`), None when the server gives none.

Errors, as for Triton (rsieve.adapters.model):
    unreachable, timed out, 408/409/429/5xx, a wrong key (401/403) or a model the server
        does not serve, after `retries` with backoff (429 and 503 wait as `Retry-After`
        says, at least the backoff) -> RetryableError: the shard goes back to the queue,
        nothing is scored and nothing is lost
    any other 4xx while the endpoint still serves the model (e.g. a prompt over the
        context length) -> that item's result: an Exception, quarantined `model_error`

The API key is sent as `Authorization: Bearer` and appears in no log, error or record.
"""

from __future__ import annotations

import asyncio
import base64
import email.utils
import hashlib
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any, Literal

import httpx
from pydantic import SecretStr

from rsieve.adapters.gate import EngineGate
from rsieve.adapters.retry import ItemError, Transient, backoff_wait, retrying
from rsieve.adapters.tokenizer import load_chat_template
from rsieve.errors import RetryableError
from rsieve.generate.chat import ChatTemplate
from rsieve.generate.generation import ModelInfo, ModelReply, ModelRequest
from rsieve.generate.think import CLOSE, OPEN
from rsieve.images import image_mime
from rsieve.settings import Settings

__all__ = ["OpenAIModel"]

log = logging.getLogger("rsieve")

Role = Literal["generator", "judge"]

# Statuses worth asking again: overloaded, rate limited, restarting, or refusing the key
# or the model (the operator's to fix; the shard waits in the queue meanwhile).
_TRANSIENT_STATUS = frozenset({401, 403, 404, 408, 409, 429, 500, 502, 503, 504})


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
        )

    # ------------------------------------------------------------------ public
    def generate_many(self, requests: Sequence[ModelRequest]) -> list[ModelReply | Exception]:
        return asyncio.run(self.generate_many_async(requests))

    async def generate_many_async(
        self, requests: Sequence[ModelRequest]
    ) -> list[ModelReply | Exception]:
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
            start = time.monotonic()
            try:
                response = await client.post("/chat/completions", json=body)
            except httpx.HTTPError as exc:
                raise Transient(f"{type(exc).__name__}: {exc}") from exc
            if response.status_code in _TRANSIENT_STATUS:
                raise Transient(
                    f"HTTP {response.status_code} {_detail(response)}",
                    retry_after_s(response.headers.get("retry-after")),
                )
            if response.status_code >= 400:
                # The item's own fault only while the endpoint still serves the model.
                problem = await self._listing(client)
                if problem is None:
                    return EndpointError(f"HTTP {response.status_code} {_detail(response)}")
                raise Transient(f"HTTP {response.status_code}, then {problem}")
            try:
                return self._reply(response, user, round(time.monotonic() - start, 6))
            except EndpointError as exc:
                return exc

        return await retrying(
            attempt,
            retries=self.retries,
            backoff_s=self.backoff_s,
            where=f"endpoint {self.base_url} model {self.model}",
        )

    def _reply(self, response: httpx.Response, user: str, latency: float) -> ModelReply:
        try:
            data = response.json()
            choice = data["choices"][0]
            message = choice["message"]
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            raise EndpointError(f"not a chat completion: {response.text[:200]!r}") from exc
        usage = data.get("usage") or {}
        self._record_version(data.get("model"))
        return ModelReply(
            text=reply_text(message),
            finish_reason=str(choice.get("finish_reason") or "stop"),
            input_tokens=_int(usage.get("prompt_tokens")),
            output_tokens=_int(usage.get("completion_tokens")),
            latency_s=latency,
            prompt_sent_sha256=hashlib.sha256(user.encode("utf-8")).hexdigest(),
            user_text=user,
        )

    def _record_version(self, served: object) -> None:
        """What answered, as the server names it (a hosted API names a dated snapshot)."""
        if self.info is not None and not self.info.version and isinstance(served, str) and served:
            self.info = replace(self.info, version=served)


def _detail(response: httpx.Response) -> str:
    return response.text[:300].replace("\n", " ")


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None
