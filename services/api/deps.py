"""What every route depends on: the Context (built once, lazily) and the bearer token."""

from __future__ import annotations

import hmac
from typing import Annotated

from fastapi import Depends, HTTPException, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from services.context import Context
from services.worker import bootstrap

__all__ = ["Authorised", "Ctx", "context"]


def context(request: Request) -> Context:
    state = request.app.state
    if getattr(state, "ctx", None) is None:
        state.ctx = bootstrap()
    return state.ctx


Ctx = Annotated[Context, Depends(context)]


_bearer = HTTPBearer(auto_error=False, description="RSIEVE_API_TOKEN")


def authorised(
    ctx: Ctx, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)] = None
) -> Context:
    """Every route but /healthz and the static review page needs the token
    (RSIEVE_API_TOKEN), compared in constant time; services/api/asgi.py checks it first,
    before any route runs, and this documents it in the OpenAPI schema."""
    token = ctx.settings.api_token
    if token is None:
        return ctx
    given = credentials.credentials if credentials else ""
    if not hmac.compare_digest(given.encode(), token.get_secret_value().encode()):
        raise HTTPException(
            401, "missing or wrong bearer token", headers={"WWW-Authenticate": "Bearer"}
        )
    return ctx


Authorised = Annotated[Context, Depends(authorised)]
