"""A small OpenAI-compatible server that answers with crafted replies: what a model would
say, chosen by the test, without a model. It serves `GET /v1/models` and
`POST /v1/chat/completions` (non-streaming) over real HTTP, as the `openai` interface
calls any server (rsieve.adapters.openai_compat).

Rules, per served model id: the first `[needle, reply]` whose needle is in the request's
user text gives the reply; else the model's `default`. A request without an image is
answered by the model's `blind_rules` first, when it has them (what a VLM says when it
cannot see). Every request is logged (model, user text, whether it held an image, reply)
to a JSON-lines file, so a test can say exactly what each model was asked. Run as
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
            with lock, log.open("a") as f:
                record = {"model": model, "user": text, "image": image, "reply": reply}
                f.write(json.dumps(record) + "\n")
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
                            "finish_reason": "stop",
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

    def requests(self, model: str) -> list[dict[str, str]]:
        if not self.log.exists():
            return []
        lines = self.log.read_text().splitlines()
        return [r for r in map(json.loads, lines) if r["model"] == model]


if __name__ == "__main__":
    serve(json.loads(Path(sys.argv[1]).read_text()), int(sys.argv[2]), Path(sys.argv[3]))
