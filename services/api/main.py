"""The API: submit pools, follow runs, read reports, quarantine, calibration and datasets,
scrape metrics, and review rejected items and judge promotions in a browser.

Routes live in `routes/` (one module per resource), what they do apart from HTTP in
`runs.py`, the models in `models.py`, dependencies (context, bearer token) in `deps.py`,
the layers in front of every route (security headers, the token, body limits) in
`asgi.py`."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from rsieve.errors import CorruptOutputError, NotFoundError, PermanentError, RetryableError
from rsieve.settings import API_TOKEN_MIN_CHARS, api_token_problem, get_settings
from services.api.asgi import Authorise, BodyLimit, SecurityHeaders, UploadSlots, page_csp
from services.api.routes import datasets, ops, review, runs
from services.context import Context

__all__ = ["create_app"]


def create_app(ctx: Context | None = None, *, max_request_bytes: int | None = None) -> FastAPI:
    """The app; `ctx` for tests, else built from RSIEVE_* settings on first request.
    Refuses to start without a token that can guard it (rsieve.settings.api_token_problem),
    unless `api_dev_open` is set (local development, docs/security.md)."""
    settings = ctx.settings if ctx else get_settings()
    token = settings.api_token.get_secret_value() if settings.api_token else None
    problem = api_token_problem(token)
    if problem and not (settings.api_dev_open and not token):
        raise RuntimeError(
            f"the API will not start: {problem}. Set RSIEVE_API_TOKEN to at least "
            f"{API_TOKEN_MIN_CHARS} random characters (python -c 'import secrets; "
            "print(secrets.token_urlsafe(32))'), or RSIEVE_API_DEV_OPEN=true on a laptop"
        )
    app = FastAPI(
        title="rsieve",
        version="0.1.0",
        description="Rejection-sampled SFT data for vision-language models.",
    )
    app.state.ctx = ctx
    for module in (ops, runs, datasets, review):
        app.include_router(module.router)
    # Outermost last: headers on every answer, then the token, then a free upload slot,
    # then the body's size.
    app.add_middleware(
        BodyLimit,
        limit=settings.api_max_json_bytes,
        upload_limit=max_request_bytes or settings.api_max_request_bytes,
    )
    app.add_middleware(UploadSlots, slots=settings.api_upload_slots)
    app.add_middleware(Authorise, token=token)
    app.add_middleware(SecurityHeaders, csp=page_csp(review.PAGE.read_bytes()))

    # Errors of the rsieve tree are answers, not 500s: storage away is 503 (retry).
    @app.exception_handler(RetryableError)
    async def _retryable(request: Request, exc: RetryableError) -> JSONResponse:
        return JSONResponse({"detail": f"storage or queue unavailable: {exc}"}, status_code=503)

    @app.exception_handler(PermanentError)
    async def _permanent(request: Request, exc: PermanentError) -> JSONResponse:
        status = 404 if isinstance(exc, NotFoundError) else 422
        return JSONResponse({"detail": str(exc)}, status_code=status)

    # A stored output found corrupt is moved aside and its stage redone (Context.redo).
    @app.exception_handler(CorruptOutputError)
    async def _corrupt(request: Request, exc: CorruptOutputError) -> JSONResponse:
        detail = f"a stored output was corrupt and its stage is being redone ({exc}); retry"
        return JSONResponse({"detail": detail}, status_code=503)

    return app
