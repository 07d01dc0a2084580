"""The API: submit pools, follow runs, read reports, quarantine, calibration and datasets,
scrape metrics, and review rejected items and judge promotions in a browser.

Routes live in `routes/` (one module per resource), what they do apart from HTTP in
`runs.py`, the models in `models.py`, dependencies (context, bearer token) in `deps.py`."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from rsieve.errors import NotFoundError, PermanentError, RetryableError
from services.api.routes import datasets, ops, review, runs
from services.common import Context

__all__ = ["create_app"]


class BodyLimit:
    """Refuses a request body over `limit` bytes with 413, by Content-Length up front or
    by counting a streamed body (pure ASGI, so uploads are never read twice)."""

    def __init__(self, app: Any, limit: int) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = dict(scope.get("headers") or []).get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.limit):
            await _too_large(send, self.limit)
            return
        seen = 0

        async def counted() -> Any:
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > self.limit:
                raise _TooLarge
            return message

        try:
            await self.app(scope, counted, send)
        except _TooLarge:
            await _too_large(send, self.limit)


class _TooLarge(Exception):
    pass


async def _too_large(send: Any, limit: int) -> None:
    body = b'{"detail":"request body larger than %d bytes"}' % limit
    await send(
        {
            "type": "http.response.start",
            "status": 413,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


def create_app(ctx: Context | None = None, *, max_request_bytes: int | None = None) -> FastAPI:
    """The app; `ctx` for tests, else built from RSIEVE_* settings on first request."""
    app = FastAPI(
        title="rsieve",
        version="0.1.0",
        description="Rejection-sampled SFT data for vision-language models.",
    )
    app.state.ctx = ctx
    for module in (ops, runs, datasets, review):
        app.include_router(module.router)
    if max_request_bytes is None:
        from rsieve.settings import get_settings

        max_request_bytes = (ctx.settings if ctx else get_settings()).api_max_request_bytes
    app.add_middleware(BodyLimit, limit=max_request_bytes)

    # Errors of the rsieve tree are answers, not 500s: storage away is 503 (retry).
    @app.exception_handler(RetryableError)
    async def _retryable(request: Request, exc: RetryableError) -> JSONResponse:
        return JSONResponse({"detail": f"storage or queue unavailable: {exc}"}, status_code=503)

    @app.exception_handler(PermanentError)
    async def _permanent(request: Request, exc: PermanentError) -> JSONResponse:
        status = 404 if isinstance(exc, NotFoundError) else 422
        return JSONResponse({"detail": str(exc)}, status_code=status)

    return app
