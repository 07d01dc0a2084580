"""The API's outer layers, pure ASGI, in front of FastAPI: they answer before any route
runs and before any request body is read (FastAPI reads a body before its dependencies).

- `SecurityHeaders`: every response says nosniff, no framing, no referrer, and a content
  security policy that admits only the review page's own inline script and style (by
  their sha256) and requests to this origin.
- `Authorise`: the bearer token, compared in constant time, for every path but the public
  ones (/healthz, the review page's HTML); a request without it gets 401 with its body
  unread. With no token (only in the explicit local-dev mode) it lets everything through.
- `BodyLimit`: a body over its route's limit gets 413, by Content-Length up front or by
  counting a streamed body. Uploads have their own limit; every other body is JSON.
- `UploadSlots`: at most `slots` uploads at once (each holds temporary space); one more
  gets 429 with Retry-After before its body is read."""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
from collections.abc import Iterable
from typing import Any

__all__ = [
    "PUBLIC_PATHS",
    "UPLOAD_PATHS",
    "Authorise",
    "BodyLimit",
    "SecurityHeaders",
    "UploadSlots",
    "page_csp",
]

PUBLIC_PATHS = frozenset({"/healthz", "/review"})
UPLOAD_PATHS = frozenset({"/runs/upload"})
_INLINE = re.compile(rb"<(script|style)>(.*?)</\1>", re.S)


def page_csp(html: bytes) -> bytes:
    """A content security policy admitting exactly the page's inline scripts and styles."""
    hashes: dict[bytes, list[bytes]] = {b"script": [], b"style": []}
    for kind, body in _INLINE.findall(html):
        digest = base64.b64encode(hashlib.sha256(body).digest())
        hashes[kind].append(b"'sha256-" + digest + b"'")
    return (
        b"default-src 'none'; connect-src 'self'; img-src 'self' blob: data:; "
        b"script-src " + b" ".join(hashes[b"script"] or [b"'none'"]) + b"; "
        b"style-src " + b" ".join(hashes[b"style"] or [b"'none'"]) + b"; "
        b"base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    )


class SecurityHeaders:
    def __init__(self, app: Any, csp: bytes) -> None:
        self.app = app
        self.headers = [
            (b"x-content-type-options", b"nosniff"),
            (b"x-frame-options", b"DENY"),
            (b"referrer-policy", b"no-referrer"),
            (b"content-security-policy", csp),
        ]

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def with_headers(message: Any) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *self.headers]
            await send(message)

        await self.app(scope, receive, with_headers)


class Authorise:
    def __init__(self, app: Any, token: str | None, public: Iterable[str] = PUBLIC_PATHS) -> None:
        self.app, self.public = app, frozenset(public)
        self.expected = b"Bearer " + token.encode() if token else None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or self.expected is None or scope["path"] in self.public:
            await self.app(scope, receive, send)
            return
        given = dict(scope.get("headers") or []).get(b"authorization", b"")
        if hmac.compare_digest(given, self.expected):
            await self.app(scope, receive, send)
            return
        await _answer(
            send, 401, b"missing or wrong bearer token", [(b"www-authenticate", b"Bearer")]
        )


class BodyLimit:
    def __init__(
        self, app: Any, limit: int, upload_limit: int, uploads: Iterable[str] = UPLOAD_PATHS
    ) -> None:
        self.app, self.limit, self.upload_limit = app, limit, upload_limit
        self.uploads = frozenset(uploads)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.upload_limit if scope["path"] in self.uploads else self.limit
        length = dict(scope.get("headers") or []).get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > limit):
            await _answer(send, 413, b"request body larger than %d bytes" % limit)
            return
        seen = 0

        async def counted() -> Any:
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > limit:
                raise _TooLarge
            return message

        try:
            await self.app(scope, counted, send)
        except _TooLarge:
            await _answer(send, 413, b"request body larger than %d bytes" % limit)


class UploadSlots:
    def __init__(self, app: Any, slots: int, uploads: Iterable[str] = UPLOAD_PATHS) -> None:
        self.app, self.free, self.uploads = app, slots, frozenset(uploads)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"] not in self.uploads:
            await self.app(scope, receive, send)
            return
        if self.free <= 0:  # one event loop: no lock needed between the check and the take
            await _answer(
                send, 429, b"every upload slot is taken; try again", [(b"retry-after", b"30")]
            )
            return
        self.free -= 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.free += 1


class _TooLarge(Exception):
    pass


async def _answer(
    send: Any, status: int, detail: bytes, headers: list[tuple[bytes, bytes]] | None = None
) -> None:
    body = b'{"detail":"' + detail + b'"}'
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                *(headers or []),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
