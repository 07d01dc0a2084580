"""A small OpenAI-compatible server that answers with crafted replies: what a model would
say, chosen by the test, without a model. It serves `GET /v1/models` and
`POST /v1/chat/completions` over real HTTP, as the `openai` interface calls any server
(rsieve.adapters.openai_compat), in one JSON reply or, when asked `"stream": true`, as
Server-Sent Events.

Rules, per served model id: the first `[needle, reply]` whose needle is in the request's
user text gives the reply; else the model's `default`. A request without an image is
answered by the model's `blind_rules` first, when it has them (what a VLM says when it
cannot see). A reply is the output's text, or a loop: `{"loop": UNIT, "prefix": TEXT,
"max_tokens_chars": N, "delay_s": S}` is the prefix, then the unit again and again until
N characters (default 40000; fewer when `max_tokens` * 4 is), finish "length", streamed
slowly (S seconds a chunk, default 0.002) so that a client's cut shows.

Streamed: the output in chunks of `CHUNK_CHARS` characters; a `<think>...</think>` that
opens the output (a loop's: an open `<think>`) as `reasoning_content` deltas, as servers
that parse reasoning apart send it, then the rest as `content` deltas; then a chunk with
the finish reason, a usage chunk when `stream_options.include_usage`, and `data: [DONE]`.
Usage counts words as the JSON reply does, a loop's output in characters / 4.

Every request is logged (model, user text, whether it held an image, reply, whether it was
streamed) to a JSON-lines file, so a test can say exactly what each model was asked; a
streamed one once it ends, with the characters sent (`sent_chars`) and whether the client
went away first (`client_closed`), before `[DONE]` when it did not. Run as
`python -m tests.e2e.crafted_server RULES.json PORT LOG.jsonl`."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx

from rsieve_cli.local.ports import free_port

ROOT = Path(__file__).resolve().parents[2]
# Characters a streamed delta carries.
CHUNK_CHARS = 5
OPEN, CLOSE = "<think>", "</think>"


def _loop_text(reply: dict[str, Any], max_tokens: object) -> Iterator[str]:
    """A loop reply's output, piece by piece: the prefix, then the unit up to its bound."""
    bound = int(reply.get("max_tokens_chars", 40000))
    if isinstance(max_tokens, int):
        bound = min(bound, 4 * max_tokens)
    prefix, unit, sent = str(reply.get("prefix", "")), str(reply["loop"]), 0
    while sent < bound:
        piece = (prefix if sent == 0 and prefix else unit)[: bound - sent]
        sent += len(piece)
        yield piece


def _deltas(reply: str | dict[str, Any], max_tokens: object) -> Iterator[tuple[str, str]]:
    """The output as a server that parses reasoning apart streams it: (field, text) pieces,
    `reasoning_content` for a `<think>...</think>` that opens it (a loop's: an open
    `<think>` that never closes), then `content`. The client joins them back into the
    text the JSON reply gives."""
    if isinstance(reply, str):
        reasoning, closed, content = reply.removeprefix(OPEN).partition(CLOSE)
        if reply.startswith(OPEN) and closed and reasoning.strip():
            yield "reasoning_content", reasoning
            yield "content", content
        else:
            yield "content", reply
        return
    pieces = _loop_text(reply, max_tokens)
    prefix = next(pieces, "")
    field = "content"
    if prefix.startswith(OPEN) and CLOSE not in prefix:
        field, prefix = "reasoning_content", prefix.removeprefix(OPEN)
    yield field, prefix
    for piece in pieces:
        yield field, piece


def _user_text(body: dict[str, Any]) -> str:
    parts: list[str] = []
    for message in body.get("messages") or []:
        if message.get("role") != "user":
            continue
        content = message.get("content")
        if isinstance(content, str):
            parts.append(content)
        else:
            parts += [c.get("text", "") for c in content or [] if c.get("type") == "text"]
    return "\n".join(parts)


def _has_image(body: dict[str, Any]) -> bool:
    return any(
        c.get("type") == "image_url"
        for message in body.get("messages") or []
        if isinstance(message.get("content"), list)
        for c in message["content"]
    )


def serve(rules: dict[str, Any], port: int, log: Path) -> None:
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def _send(self, status: int, payload: dict[str, Any]) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            if self.path.rstrip("/") == "/v1/models":
                self._send(200, {"object": "list", "data": [{"id": m} for m in rules]})
            else:
                self._send(404, {"error": "not found"})

        def _log(self, record: dict[str, Any]) -> None:
            with lock, log.open("a") as f:
                f.write(json.dumps(record) + "\n")

        def _event(self, payload: dict[str, Any] | str) -> None:
            data = payload if isinstance(payload, str) else json.dumps(payload)
            self.wfile.write(f"data: {data}\n\n".encode())
            self.wfile.flush()

        def _stream(self, body: dict[str, Any], record: dict[str, Any]) -> None:
            reply, model, text = record["reply"], record["model"], record["user"]
            looping = isinstance(reply, dict)
            delay = float(reply.get("delay_s", 0.002)) if looping else 0.0
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            self.end_headers()

            def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
                return {
                    "id": "crafted",
                    "object": "chat.completion.chunk",
                    "model": model,
                    "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
                }

            sent, output = 0, 0  # characters: sent, and of the output (with its tags)
            try:
                self._event(chunk({"role": "assistant", "content": ""}))
                for field, part in _deltas(reply, body.get("max_tokens")):
                    output += len(part)
                    for i in range(0, len(part), CHUNK_CHARS):
                        self._event(chunk({field: part[i : i + CHUNK_CHARS]}))
                        sent += len(part[i : i + CHUNK_CHARS])
                        if delay:
                            time.sleep(delay)
                completion = -(-output // 4) if looping else len(reply.split())
                self._event(chunk({}, "length" if looping else "stop"))
                if (body.get("stream_options") or {}).get("include_usage"):
                    usage = {"prompt_tokens": len(text.split()), "completion_tokens": completion}
                    self._event({**chunk({}), "choices": [], "usage": usage})
                record.update(sent_chars=sent, client_closed=False)
                self._log(record)
                self._event("[DONE]")
            except OSError:  # the client went away (broken pipe, reset)
                if "sent_chars" not in record:
                    record.update(sent_chars=sent, client_closed=True)
                    self._log(record)

        def do_POST(self) -> None:
            if self.path.rstrip("/") != "/v1/chat/completions":
                self._send(404, {"error": "not found"})
                return
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length))
            model = body.get("model")
            if model not in rules:
                self._send(404, {"error": f"no model {model!r}"})
                return
            text, image = _user_text(body), _has_image(body)
            spec = rules[model]
            blind = [] if image else spec.get("blind_rules", [])
            reply = next(
                (r for n, r in [*blind, *spec.get("rules", [])] if n in text), spec["default"]
            )
            streamed = bool(body.get("stream"))
            record = {"model": model, "user": text, "image": image, "reply": reply}
            if streamed:
                self._stream(body, {**record, "stream": True})
                return
            finish = "stop"
            if isinstance(reply, dict):
                reply, finish = "".join(_loop_text(reply, body.get("max_tokens"))), "length"
            self._log({**record, "stream": False})
            self._send(
                200,
                {
                    "id": "crafted",
                    "object": "chat.completion",
                    "model": model,
                    "choices": [
                        {
                            "index": 0,
                            "message": {"role": "assistant", "content": reply},
                            "finish_reason": finish,
                        }
                    ],
                    "usage": {
                        "prompt_tokens": len(text.split()),
                        "completion_tokens": len(reply.split()),
                    },
                },
            )

        def log_message(self, *_: Any) -> None:  # the request log is the JSON-lines file
            return

    ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()


class CraftedServer:
    """The server in a process of its own, on a free port."""

    def __init__(self, root: Path, rules: dict[str, Any]) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/v1"
        self.rules_file, self.log = root / "rules.json", root / "requests.jsonl"
        self.rules_file.write_text(json.dumps(rules))
        self.proc: subprocess.Popen[bytes] | None = None

    @classmethod
    @contextmanager
    def serving(cls, root: Path, rules: dict[str, Any]) -> Iterator[CraftedServer]:
        server = cls(root, rules)
        server.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.e2e.crafted_server",
                str(server.rules_file),
                str(server.port),
                str(server.log),
            ],
            cwd=ROOT,
        )
        try:
            deadline = time.monotonic() + 30
            while True:
                try:
                    httpx.get(f"{server.url}/models", timeout=1).raise_for_status()
                    break
                except httpx.HTTPError:
                    if time.monotonic() > deadline or server.proc.poll() is not None:
                        raise
                    time.sleep(0.1)
            yield server
        finally:
            server.proc.terminate()
            server.proc.wait(10)

    def requests(self, model: str) -> list[dict[str, Any]]:
        if not self.log.exists():
            return []
        lines = self.log.read_text().splitlines()
        return [r for r in map(json.loads, lines) if r["model"] == model]


if __name__ == "__main__":
    serve(json.loads(Path(sys.argv[1]).read_text()), int(sys.argv[2]), Path(sys.argv[3]))
